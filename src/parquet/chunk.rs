//! A column chunk's pages for the direct path, read without arrow-rs's page reader: each page's
//! header (Thrift's compact protocol, `headers.rs`), then its bytes in place when they are not
//! compressed, or decompressed into a buffer that the thread kept from an earlier page. arrow-rs
//! allocates, zeroes and frees a buffer for each page, and those buffers, mapped and unmapped by
//! the system each time, were a fifth of a snappy read.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use parquet::basic::{Compression, Encoding};
use parquet::column::page::Page;

use super::headers::{self, Kind};

/// Buffers of decompressed pages kept on each thread for the next pages: at most this many, of
/// at most this many bytes in all (what a thread holds between reads).
const SPARE: usize = 16;
const SPARE_BYTES: usize = 32 << 20;

thread_local! {
    static SPARES: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    /// A zstd context kept for the thread's next chunk: making one (its 160 KB mapped and
    /// set up anew) for each chunk was 2% of a zstd read's profile.
    static ZSTD: RefCell<Option<Box<Zstd>>> = const { RefCell::new(None) };
}

type Zstd = zstd::bulk::Decompressor<'static>;

/// Keeps the memory of a page's bytes for a later page of this thread, when nothing else holds
/// them and they are a buffer this module made (not the file's own bytes). No copy.
pub fn recycle(bytes: Bytes) {
    if let Ok(buf) = bytes.try_into_mut() {
        SPARES.with(|s| {
            let mut s = s.borrow_mut();
            let held: usize = s.iter().map(BytesMut::capacity).sum();
            if s.len() < SPARE && held + buf.capacity() <= SPARE_BYTES {
                s.push(buf);
            }
        });
    }
}

/// A buffer of `len` bytes for a page: one this thread kept, large enough if one is (its old
/// bytes left as they are, to be overwritten; only growth is zeroed), or a new one.
fn spare(len: usize) -> BytesMut {
    let kept = SPARES.with(|s| {
        let mut s = s.borrow_mut();
        let fits = s.iter().position(|b| b.capacity() >= len);
        fits.map(|i| s.swap_remove(i)).or_else(|| s.pop())
    });
    let mut buf = kept.unwrap_or_default();
    if buf.len() >= len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0);
    }
    buf
}

/// A decompressor for a chunk's codec (zstd's context is taken from the thread, or made, for
/// the chunk's first page).
enum Codec {
    None,
    Snappy(snap::raw::Decoder),
    Zstd(Option<Box<Zstd>>),
    Lz4,
}

impl Codec {
    /// The decompressor of `codec`, or None for a codec the direct path does not take: the one
    /// list of them. Allocates nothing.
    fn of(codec: Compression) -> Option<Codec> {
        Some(match codec {
            Compression::UNCOMPRESSED => Codec::None,
            Compression::SNAPPY => Codec::Snappy(snap::raw::Decoder::new()),
            Compression::ZSTD(_) => Codec::Zstd(None),
            Compression::LZ4_RAW => Codec::Lz4,
            _ => return None,
        })
    }
}

/// Whether the direct path reads chunks compressed with `codec`.
pub fn takes(codec: Compression) -> bool {
    Codec::of(codec).is_some()
}

/// The pages of one column chunk, read in order.
pub struct Chunk {
    data: Bytes,
    at: usize,
    end: usize,
    codec: Codec,
    /// The most bytes a page may declare uncompressed (what its rows can fill).
    limit: usize,
}

impl Chunk {
    /// The pages of the chunk at `data[start..start + len]`, compressed with `codec` (one the
    /// direct path takes); a page that declares more than `limit` bytes uncompressed is refused
    /// before anything is allocated for it.
    ///
    /// # Errors
    /// A chunk past the data, or a codec the direct path does not take.
    pub fn new(data: Bytes, start: u64, len: u64, codec: Compression, limit: u64) -> Result<Chunk, String> {
        let end =
            start.checked_add(len).filter(|&e| e <= data.len() as u64).ok_or("a chunk past the file")?;
        let codec = Codec::of(codec).ok_or_else(|| format!("a chunk compressed {codec}"))?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok(Chunk { data, at: start as usize, end: end as usize, codec, limit })
    }

    /// The next data or dictionary page (index pages are skipped); None at the chunk's end.
    ///
    /// # Errors
    /// What is malformed: a header, a page past the chunk, a page that declares more than the
    /// limit, an encoding or page type Parquet does not define, a codec's failure, or a page
    /// whose bytes decompress to another size than its header says.
    pub fn next_page(&mut self) -> Result<Option<Page>, String> {
        while self.at < self.end {
            let page_at = self.at;
            let (h, stored) = headers::page_at(&self.data, page_at, self.end)?;
            self.at = stored.end;
            if h.uncompressed > self.limit {
                return Err(format!(
                    "the page at byte {page_at} declares {} bytes uncompressed, more than its rows can fill ({})",
                    h.uncompressed, self.limit
                ));
            }
            let encoding = |e: i32| encoding(e).ok_or_else(|| format!("an encoding numbered {e}"));
            // A V2 page's levels are stored as they are, before its (maybe compressed) values.
            let (levels, compressed) = match h.kind {
                Kind::Index => continue,
                Kind::DataV2 { def, rep, compressed, .. } => (def as usize + rep as usize, compressed),
                _ => (0, true),
            };
            let buf = self.bytes(stored, levels, compressed, h.uncompressed, page_at)?;
            let (num_values, values) = (h.values, encoding(h.encoding)?);
            return Ok(Some(match h.kind {
                Kind::Index => unreachable!("skipped above"),
                Kind::Dictionary { sorted } => {
                    Page::DictionaryPage { buf, num_values, encoding: values, is_sorted: sorted }
                }
                Kind::Data { def, rep } => Page::DataPage {
                    buf,
                    num_values,
                    encoding: values,
                    def_level_encoding: encoding(def)?,
                    rep_level_encoding: encoding(rep)?,
                    statistics: None,
                },
                Kind::DataV2 { nulls, rows, def, rep, compressed } => Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding: values,
                    num_nulls: nulls,
                    num_rows: rows,
                    def_levels_byte_len: def,
                    rep_levels_byte_len: rep,
                    is_compressed: compressed,
                    statistics: None,
                },
            }));
        }
        Ok(None)
    }

    /// A page's bytes: `stored` of the data in place when nothing in it is compressed, else its
    /// first `levels` bytes as they are and the rest decompressed, `size` bytes in all.
    fn bytes(
        &mut self,
        stored: std::ops::Range<usize>,
        levels: usize,
        compressed: bool,
        size: usize,
        page_at: usize,
    ) -> Result<Bytes, String> {
        if matches!(self.codec, Codec::None) || !compressed {
            if stored.len() != size {
                return Err(format!("the page at byte {page_at} stores {} bytes of {size}", stored.len()));
            }
            return Ok(self.data.slice(stored));
        }
        let raw = &self.data[stored];
        let head =
            raw.get(..levels).ok_or_else(|| format!("the page at byte {page_at}: levels past its end"))?;
        if size < levels {
            return Err(format!("the page at byte {page_at}: levels past its size"));
        }
        let mut buf = spare(size);
        buf[..levels].copy_from_slice(head);
        let (src, out) = (&raw[levels..], &mut buf[levels..]);
        let failed = |e: String| format!("the page at byte {page_at} does not decompress: {e}");
        // Each codec writes at most `out`'s bytes: a page that decompresses to more is refused.
        let written = match &mut self.codec {
            Codec::Snappy(s) => s.decompress(src, out).map_err(|e| failed(e.to_string()))?,
            Codec::Zstd(z) => {
                let z = match z {
                    Some(z) => z,
                    None => match ZSTD.with(|k| k.borrow_mut().take()) {
                        Some(kept) => z.insert(kept),
                        None => z.insert(Box::new(Zstd::new().map_err(|e| failed(e.to_string()))?)),
                    },
                };
                z.decompress_to_buffer(src, out).map_err(|e| failed(e.to_string()))?
            }
            Codec::Lz4 => lz4_flex::block::decompress_into(src, out).map_err(|e| failed(e.to_string()))?,
            Codec::None => unreachable!("stored pages are read in place"),
        };
        if written != size - levels {
            return Err(format!(
                "the page at byte {page_at} decompresses to {written} bytes, not {}",
                size - levels
            ));
        }
        Ok(buf.freeze())
    }
}

impl Drop for Chunk {
    /// The zstd context goes back to the thread for its next chunk.
    fn drop(&mut self) {
        if let Codec::Zstd(z) = &mut self.codec
            && let Some(z) = z.take()
        {
            ZSTD.with(|k| {
                k.borrow_mut().get_or_insert(z);
            });
        }
    }
}

/// Parquet's encoding numbered `e`.
fn encoding(e: i32) -> Option<Encoding> {
    Some(match e {
        0 => Encoding::PLAIN,
        2 => Encoding::PLAIN_DICTIONARY,
        3 => Encoding::RLE,
        #[allow(deprecated)]
        4 => Encoding::BIT_PACKED,
        5 => Encoding::DELTA_BINARY_PACKED,
        6 => Encoding::DELTA_LENGTH_BYTE_ARRAY,
        7 => Encoding::DELTA_BYTE_ARRAY,
        8 => Encoding::RLE_DICTIONARY,
        9 => Encoding::BYTE_STREAM_SPLIT,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Float64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::column::page::PageReader;
    use parquet::file::metadata::ParquetMetaDataReader;
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use parquet::file::serialized_reader::SerializedPageReader;

    use super::*;

    /// 3,000 rows of a float64 column with a null every 11th row and few distinct values, in
    /// pages of 500 rows (and a dictionary page), written with `codec` in `version`.
    fn file(
        codec: Compression,
        version: WriterVersion,
        dictionary: bool,
    ) -> (Bytes, Arc<parquet::file::metadata::ParquetMetaData>) {
        let col = Float64Array::from_iter((0..3000).map(|i| (i % 11 != 0).then_some((i % 97) as f64 * 0.25)));
        let batch = RecordBatch::try_from_iter([("x", Arc::new(col) as ArrayRef)]).unwrap();
        let props = WriterProperties::builder()
            .set_compression(codec)
            .set_writer_version(version)
            .set_dictionary_enabled(dictionary)
            .set_data_page_row_count_limit(500)
            .set_write_batch_size(500)
            .build();
        let mut out = Vec::new();
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let data = Bytes::from(out);
        let meta = ParquetMetaDataReader::new().parse_and_finish(&data).unwrap();
        (data, Arc::new(meta))
    }

    #[test]
    fn pages_read_as_arrow_rs_reads_them_for_every_codec_and_page_version() {
        let mut pages = 0;
        for codec in crate::parquet::tests::codecs() {
            for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
                for dictionary in [false, true] {
                    let (data, meta) = file(codec, version, dictionary);
                    let c = meta.row_group(0).column(0);
                    let (start, len) = c.byte_range();
                    let mut ours = Chunk::new(data.clone(), start, len, c.compression(), 1 << 20).unwrap();
                    let mut theirs =
                        SerializedPageReader::new(Arc::new(data.clone()), c, 3000, None).unwrap();
                    while let Some(want) = theirs.get_next_page().unwrap() {
                        let got = ours.next_page().unwrap().expect("as many pages");
                        assert_eq!(got.page_type(), want.page_type(), "{codec} {version:?}");
                        assert_eq!(got.num_values(), want.num_values());
                        assert_eq!(got.encoding(), want.encoding());
                        assert_eq!(
                            got.buffer(),
                            want.buffer(),
                            "{codec} {version:?} dictionary={dictionary}"
                        );
                        pages += 1;
                    }
                    assert!(ours.next_page().unwrap().is_none());
                }
            }
        }
        assert!(pages >= 16 * 6, "{pages} pages");
    }

    #[test]
    fn a_codec_the_direct_path_does_not_take_is_refused_by_its_one_list() {
        for codec in crate::parquet::tests::codecs() {
            assert!(takes(codec), "{codec}");
        }
        // Hadoop's framed LZ4, which only arrow-rs's route reads.
        let (data, meta) = file(Compression::LZ4, WriterVersion::PARQUET_1_0, false);
        let c = meta.row_group(0).column(0);
        assert!(!takes(c.compression()));
        let (start, len) = c.byte_range();
        let e = Chunk::new(data, start, len, c.compression(), 1 << 20).err().expect("refused");
        assert!(e.contains("LZ4"), "{e}");
    }

    #[test]
    fn a_buffer_given_back_is_the_next_one_of_a_size_it_holds() {
        let first = spare(1000).freeze();
        let at = first.as_ptr();
        let shared = first.clone();
        recycle(first);
        assert_ne!(spare(800).as_ptr(), at, "not while another handle holds its bytes");
        recycle(shared);
        let again = spare(800);
        assert_eq!((again.as_ptr(), again.len()), (at, 800));
        recycle(again.freeze());
        assert_eq!(spare(1000).as_ptr(), at, "its first 1,000 bytes still");
        // The file's own bytes are never kept, nor more than SPARE_BYTES in all.
        let file = Bytes::from_static(b"not a buffer of ours");
        recycle(file);
        assert!(SPARES.with(|s| s.borrow().is_empty()));
        let (half, more) = (spare(SPARE_BYTES / 2).freeze(), spare(SPARE_BYTES / 2 + 1).freeze());
        recycle(half);
        recycle(more);
        assert_eq!(SPARES.with(|s| s.borrow().len()), 1);
    }

    #[test]
    fn a_zstd_context_goes_back_to_the_thread_for_its_next_chunk() {
        let (data, meta) = file(Compression::ZSTD(Default::default()), WriterVersion::PARQUET_1_0, false);
        let c = meta.row_group(0).column(0);
        let (start, len) = c.byte_range();
        let read = || {
            let mut chunk = Chunk::new(data.clone(), start, len, c.compression(), 1 << 20).unwrap();
            let first = chunk.next_page().unwrap().unwrap().buffer().clone();
            let Codec::Zstd(Some(z)) = &chunk.codec else { panic!("a context made for the first page") };
            (std::ptr::from_ref::<Zstd>(z), first)
        };
        ZSTD.with(|k| k.borrow_mut().take());
        let (made, first) = read();
        assert!(ZSTD.with(|k| k.borrow().is_some()), "kept when the chunk is dropped");
        let (taken, again) = read();
        assert_eq!(taken, made, "the kept context is the next chunk's");
        assert_eq!(first, again);
    }

    #[test]
    fn a_pages_bytes_go_back_to_the_thread_and_a_page_past_the_limit_is_refused() {
        let (data, meta) = file(Compression::SNAPPY, WriterVersion::PARQUET_1_0, false);
        let c = meta.row_group(0).column(0);
        let (start, len) = c.byte_range();
        let mut chunk = Chunk::new(data.clone(), start, len, c.compression(), 1 << 20).unwrap();
        SPARES.with(|s| s.borrow_mut().clear());
        let page = chunk.next_page().unwrap().unwrap();
        let bytes = page.buffer().clone();
        drop(page);
        recycle(bytes);
        assert_eq!(SPARES.with(|s| s.borrow().len()), 1, "a decompressed page's buffer is kept");
        // A limit below a page's size refuses it before it is decompressed.
        let mut small = Chunk::new(data, start, len, c.compression(), 100).unwrap();
        let e = small.next_page().unwrap_err();
        assert!(e.contains("more than its rows can fill (100)"), "{e}");
    }
}

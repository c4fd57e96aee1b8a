//! The page headers of a column chunk, read for the direct path's page reader (`chunk.rs`):
//! Thrift's compact protocol, the fields that reader needs (a page's type, sizes, values,
//! encodings and levels) read and the others skipped, nesting bounded. The sizes are read before
//! anything is allocated for a page, so that a header that lies (a decompression bomb) is refused
//! first. No copy: the file's bytes, read in place.

use std::ops::Range;

/// Nesting deeper than this in a page header is refused (a header nests three structs deep).
const DEPTH: usize = 16;

/// What the direct path reads of a page header.
#[derive(Debug)]
pub(crate) struct PageHeader {
    /// The page's type, and what its type's own header says.
    pub(crate) kind: Kind,
    /// The page's bytes once decompressed.
    pub(crate) uncompressed: usize,
    /// The page's bytes as stored.
    pub(crate) compressed: usize,
    /// Its values (levels included, nulls too).
    pub(crate) values: u32,
    /// The values' encoding, as Parquet numbers them.
    pub(crate) encoding: i32,
    /// The header's own bytes.
    pub(crate) header_len: usize,
}

/// A page's type, with what its own header says (encodings as Parquet numbers them).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// A data page of format v1: its levels' encodings.
    Data { def: i32, rep: i32 },
    /// An index page (skipped).
    Index,
    /// A dictionary page.
    Dictionary { sorted: bool },
    /// A data page of format v2: its nulls, rows, levels' bytes (stored before the values,
    /// never compressed), and whether its values are compressed.
    DataV2 { nulls: u32, rows: u32, def: u32, rep: u32, compressed: bool },
}

/// The header of the page at byte `at` of a column chunk that ends at byte `end` of `data`, and
/// where the page's stored bytes lie. Read in place, before anything is allocated for the page.
///
/// # Errors
/// What [`page_header`] refuses, or a page whose stored bytes run past the chunk; each says the
/// byte of the page.
pub(crate) fn page_at(data: &[u8], at: usize, end: usize) -> Result<(PageHeader, Range<usize>), String> {
    let h = page_header(&data[at..end]).map_err(|why| format!("the page header at byte {at}: {why}"))?;
    let body = at + h.header_len;
    let stored = body.checked_add(h.compressed).filter(|&e| e <= end);
    let stored = stored.ok_or_else(|| format!("the page at byte {at} runs past its column chunk"))?;
    Ok((h, body..stored))
}

/// The header at the start of `bytes`.
///
/// # Errors
/// A header cut short, nested too deep, of an unknown page type, without a field the page's
/// type requires, or with a negative size or count.
pub(crate) fn page_header(bytes: &[u8]) -> Result<PageHeader, String> {
    let mut r = Reader { b: bytes, at: 0 };
    let (mut kind, mut sizes, mut values) = (None, (None, None), None);
    let (mut data, mut dict, mut v2) = (None, None, None);
    let mut last = 0i64;
    while let Some((id, k)) = r.field(&mut last)? {
        match (id, k) {
            (1, 5) => kind = Some(r.int()?),
            (2, 5) => sizes.0 = Some(r.size()?),
            (3, 5) => sizes.1 = Some(r.size()?),
            (5 | 7 | 8, 12) => {
                // The page type's own header: fields 1 (values) and 2 or 4 (encoding) and the
                // levels' encodings or lengths.
                let mut f = [None::<i64>; 8];
                let mut sub = 0i64;
                while let Some((i, k)) = r.field(&mut sub)? {
                    match (i, k) {
                        (1..=7, 5) => f[i as usize] = Some(r.int()?),
                        (3 | 7, 1 | 2) => f[i as usize] = Some(i64::from(k == 1)),
                        _ => r.skip(k, 1)?,
                    }
                }
                let count = |i: usize| {
                    f[i].and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| format!("no count in field {id}.{i}"))
                };
                values = Some(count(1)?);
                match id {
                    5 => data = Some((f[2], f[3], f[4])),
                    7 => dict = Some((f[2], f[3] == Some(1))),
                    _ => {
                        v2 = Some((f[4], count(2)?, count(3)?, count(5)?, count(6)?, f[7] != Some(0)));
                    }
                }
            }
            _ => r.skip(k, 0)?,
        }
    }
    let need = |what: &str| format!("no {what}");
    let (uncompressed, compressed) =
        (sizes.0.ok_or_else(|| need("uncompressed size"))?, sizes.1.ok_or_else(|| need("compressed size"))?);
    let (kind, e) = match kind.ok_or_else(|| need("page type"))? {
        0 => match data {
            Some((e, Some(def), Some(rep))) => (Kind::Data { def: def as i32, rep: rep as i32 }, e),
            _ => return Err(need("data page header with its levels' encodings")),
        },
        1 => (Kind::Index, Some(0)),
        2 => dict
            .map(|(e, sorted)| (Kind::Dictionary { sorted }, e))
            .ok_or_else(|| need("dictionary page header"))?,
        3 => v2
            .map(|(e, nulls, rows, def, rep, compressed)| {
                (Kind::DataV2 { nulls, rows, def, rep, compressed }, e)
            })
            .ok_or_else(|| need("data page v2 header"))?,
        t => return Err(format!("a page of type {t}")),
    };
    Ok(PageHeader {
        kind,
        uncompressed: uncompressed as usize,
        compressed: compressed as usize,
        values: values.unwrap_or(0),
        encoding: e.ok_or_else(|| need("encoding"))? as i32,
        header_len: r.at,
    })
}

/// A reader of Thrift's compact protocol over a page header's bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// An i32 field.
    fn int(&mut self) -> Result<i64, String> {
        let v = zigzag(self.varint()?);
        (i64::from(i32::MIN)..=i64::from(i32::MAX))
            .contains(&v)
            .then_some(v)
            .ok_or_else(|| format!("an i32 of {v}"))
    }

    /// A size field: an i32 that is not negative.
    fn size(&mut self) -> Result<u64, String> {
        let v = zigzag(self.varint()?);
        u64::try_from(v).ok().filter(|&v| v <= i32::MAX as u64).ok_or_else(|| format!("a size of {v}"))
    }

    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.b.get(self.at).ok_or("truncated")?;
        self.at += 1;
        Ok(b)
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let to = (self.at as u64).checked_add(n).filter(|&t| t <= self.b.len() as u64).ok_or("truncated")?;
        self.at = to as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift.min(63);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint of more than 10 bytes".into())
    }

    /// The next field's id and type, None at the struct's end.
    fn field(&mut self, last: &mut i64) -> Result<Option<(i64, u8)>, String> {
        let h = self.byte()?;
        if h == 0 {
            return Ok(None);
        }
        let delta = i64::from(h >> 4);
        *last = if delta == 0 { zigzag(self.varint()?) } else { *last + delta };
        Ok(Some((*last, h & 0x0f)))
    }

    /// Skips a value of compact type `kind`.
    fn skip(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        if depth > DEPTH {
            return Err("nested too deep".into());
        }
        match kind {
            1 | 2 => Ok(()),
            3 => self.advance(1),
            4..=6 => self.varint().map(drop),
            7 => self.advance(8),
            8 => {
                let n = self.varint()?;
                self.advance(n)
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                (0..n).try_for_each(|_| self.element(h & 0x0f, depth))
            }
            11 => {
                let n = self.varint()?;
                let kinds = if n > 0 { self.byte()? } else { 0 };
                (0..n).try_for_each(|_| {
                    self.element(kinds >> 4, depth)?;
                    self.element(kinds & 0x0f, depth)
                })
            }
            12 => {
                let mut last = 0;
                while let Some((_, k)) = self.field(&mut last)? {
                    self.skip(k, depth + 1)?;
                }
                Ok(())
            }
            k => Err(format!("a field of type {k}")),
        }
    }

    /// Skips an element of a list, set or map: a bool is a byte there.
    fn element(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        match kind {
            1 | 2 => self.advance(1),
            k => self.skip(k, depth + 1),
        }
    }
}

fn zigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of a data page: type 0, the sizes, a nested data page header (num_values 7,
    /// encodings), a list of bools and a binary field that the check skips.
    fn header(uncompressed: u32, compressed: u32) -> Vec<u8> {
        let zz = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
        let varint = |mut v: u64, out: &mut Vec<u8>| loop {
            if v < 0x80 {
                out.push(v as u8);
                break;
            }
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        };
        let mut h = vec![0x15]; // field 1 (type), an i32
        varint(zz(0), &mut h);
        h.push(0x15); // field 2
        varint(zz(uncompressed.into()), &mut h);
        h.push(0x15); // field 3
        varint(zz(compressed.into()), &mut h);
        // Field 5, a struct: num_values 7, encodings PLAIN, RLE and RLE, then a list of two bools
        // that the reader skips.
        h.push(0x2c);
        h.extend([0x15, 14, 0x15, 0, 0x15, 6, 0x15, 6, 0x19, 0x21, 0x01, 0x02, 0x00]);
        h.extend([0x08, 0x1a, 0x03, b'a', b'b', b'c']); // field 13 by its id: binary "abc"
        h.push(0x00);
        h
    }

    #[test]
    fn a_data_page_header_is_read_and_a_header_cut_short_is_refused() {
        let h = header(100, 10);
        let read = page_header(&h).unwrap();
        assert!(matches!(read.kind, Kind::Data { def: 3, rep: 3 }));
        assert_eq!((read.uncompressed, read.compressed, read.values, read.encoding), (100, 10, 7, 0));
        assert_eq!(read.header_len, h.len());
        for cut in 0..h.len() {
            assert!(page_header(&h[..cut]).is_err(), "cut at {cut}");
        }
        // A header of 2^31 - 1 bytes uncompressed reads as it says (the page reader refuses it
        // by its size, before allocating).
        assert_eq!(page_header(&header(i32::MAX as u32, 1)).unwrap().uncompressed, i32::MAX as usize);
    }

    #[test]
    fn any_bytes_end_in_a_result_never_a_panic_or_a_hang() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..4000 {
            let bytes: Vec<u8> = (0..(n % 97))
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            if let Ok(h) = page_header(&bytes) {
                assert!(h.header_len <= bytes.len());
            }
        }
        // Deep nesting is refused, not followed.
        let mut deep = vec![0x15, 0x00, 0x15, 0x00, 0x15, 0x00];
        deep.extend(std::iter::repeat_n(0x1c, 100));
        assert!(page_header(&deep).unwrap_err().contains("deep"));
    }
}

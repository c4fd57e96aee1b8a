use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use super::*;
use crate::options::{CopyPolicy, Scalar};

/// A file of `batch` written with `props` (row groups of `group` rows, pages of 37 rows, so that
/// a row group holds several pages and the last of each is short).
fn written(batch: &RecordBatch, props: WriterProperties) -> ParquetFile {
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
    ParquetFile::from_bytes("t.parquet".into(), Bytes::from(out)).unwrap()
}

fn props(codec: Compression, dictionary: bool, version: WriterVersion, group: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(codec)
        .set_dictionary_enabled(dictionary)
        .set_writer_version(version)
        .set_max_row_group_row_count(Some(group))
        .set_data_page_row_count_limit(37)
        .set_write_batch_size(37)
        .build()
}

/// 1,000 rows of three float32 columns; the second with a null every 7th row, the third with
/// few distinct values (a dictionary that holds).
fn floats() -> RecordBatch {
    let n = 1000;
    let a = Float32Array::from_iter_values((0..n).map(|i| i as f32 * 0.5));
    let b = Float32Array::from_iter((0..n).map(|i| (i % 7 != 3).then(|| -(i as f32))));
    let c = Float32Array::from_iter_values((0..n).map(|i| (i % 5) as f32));
    RecordBatch::try_from_iter([
        ("a", Arc::new(a) as ArrayRef),
        ("b", Arc::new(b) as ArrayRef),
        ("c", Arc::new(c) as ArrayRef),
    ])
    .unwrap()
}

fn filled(v: f64) -> ExportOptions {
    ExportOptions { nulls: NullPolicy::Fill(Scalar::Float(v)), ..ExportOptions::default() }
}

fn bits(c: &Converted) -> (Vec<i64>, Vec<u8>) {
    let t = &c.values;
    (t.shape().to_vec(), t.as_bytes().unwrap().to_vec())
}

/// The codecs the direct path reads, as the tests write them.
pub(super) fn codecs() -> [Compression; 4] {
    [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::ZSTD(ZstdLevel::default()),
        Compression::LZ4_RAW,
    ]
}

#[test]
fn every_codec_encoding_and_page_version_reads_as_arrow_rs_reads_it() {
    let batch = floats();
    let mut cases = 0;
    for codec in codecs() {
        for dictionary in [false, true] {
            for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
                // Row groups of uneven size: 300, 300, 300, 100.
                let f = written(&batch, props(codec, dictionary, version, 300));
                assert_eq!(f.units(), [300, 300, 300, 100]);
                let all: Vec<usize> = (0..4).collect();
                for opts in
                    [filled(-1.0), ExportOptions { nulls: NullPolicy::Nan, ..ExportOptions::default() }]
                {
                    assert_eq!(f.route(&all, &opts), Route::Direct, "{codec} {dictionary} {version:?}");
                    let direct = f.read(&all, &opts).unwrap();
                    let reference = f.through_arrow(&all, &opts).unwrap();
                    assert_eq!(
                        bits(&direct),
                        bits(&reference),
                        "{codec} dictionary={dictionary} {version:?}"
                    );
                    cases += 1;
                }
                // A subset, out of order: the rows of units 3 then 1.
                let some = f.read(&[3, 1], &filled(0.0)).unwrap();
                assert_eq!(bits(&some), bits(&f.through_arrow(&[3, 1], &filled(0.0)).unwrap()));
                assert_eq!(some.values.shape(), [400, 3]);
            }
        }
    }
    assert_eq!(cases, 32);
    // The values themselves: row 11 of unit 0 is (5.5, -11.0, 1.0); row 3 of b is null.
    let f = written(&batch, props(Compression::SNAPPY, true, WriterVersion::PARQUET_1_0, 300));
    let m = f.read(&[0], &filled(9.0)).unwrap();
    let v = m.values.as_slice::<f32>().unwrap();
    assert_eq!(&v[33..36], &[5.5, -11.0, 1.0]);
    assert_eq!(v[3 * 3 + 1], 9.0);
    assert!(m.values.copied());
}

/// Pages longer than a tile: a tile without a null is written a whole row at a time, PLAIN
/// values and a dictionary-encoded column (the third) side by side, or every column's a
/// dictionary's; the others (a null in one column, a page that ends inside the tile) column by
/// column, the two mixed within a row group; 1 to 9 columns (9: past the widths written a row
/// at a time).
#[test]
fn tiles_written_a_row_at_a_time_read_as_arrow_rs_reads_them() {
    let n = 5000;
    for (k, all_dictionary) in [1, 2, 3, 8, 9].into_iter().flat_map(|k| [(k, false), (k, true)]) {
        let cols = (0..k).map(|j| {
            let col: ArrayRef = match j {
                // Nulls in rows 1100..1150 only: in the second tile, which no page ends in.
                1 => Arc::new(Float64Array::from_iter(
                    (0..n).map(|i| (!(1100..1150).contains(&i)).then_some(i as f64 * 1.5)),
                )),
                _ => Arc::new(Float64Array::from_iter_values((0..n).map(|i| (i * (j + 1)) as f64 - 7.0))),
            };
            (format!("c{j}"), col)
        });
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        // Row groups of 3,000 and 2,000 rows; pages of 2,500 rows, so one ends in a tile.
        let props = WriterProperties::builder()
            .set_dictionary_enabled(all_dictionary)
            .set_column_dictionary_enabled(ColumnPath::from("c2"), true)
            .set_max_row_group_row_count(Some(3000))
            .set_data_page_row_count_limit(2500)
            .set_write_batch_size(2500)
            .build();
        let f = written(&batch, props);
        assert_eq!(f.units(), [3000, 2000]);
        let dictionary = f.meta.row_group(0).columns().iter().map(|c| c.dictionary_page_offset().is_some());
        assert!(dictionary.enumerate().all(|(j, d)| d == (all_dictionary || j == 2)));
        let direct = f.read(&[0, 1], &filled(-1.0)).unwrap();
        let case = format!("{k} columns, all dictionaries: {all_dictionary}");
        assert_eq!(bits(&direct), bits(&f.through_arrow(&[0, 1], &filled(-1.0)).unwrap()), "{case}");
        let v = direct.values.as_slice::<f64>().unwrap();
        assert_eq!(v[4999 * k], 4999.0 - 7.0, "{case}");
    }
}

/// Dictionaries of 96 KB (past the first level of the cache, read where the page holds them),
/// with nulls, beside a column of a small dictionary, in row groups of uneven size, every
/// codec, read as arrow-rs reads them.
#[test]
fn columns_of_large_dictionaries_read_as_arrow_rs_reads_them() {
    let n = 27_000;
    // Values of random mantissas, so that no codec makes the dictionary small.
    let distinct = 24_576;
    let value = |k: usize| f32::from_bits(0x3f80_0000 | ((k as u32).wrapping_mul(2_654_435_761) >> 9));
    let big = move |seed: usize| (0..n).map(move |i| value((i * 7919 + seed) % distinct));
    let a = Float32Array::from_iter_values(big(1));
    let b = Float32Array::from_iter(big(2).enumerate().map(|(i, v)| (i % 11 != 4).then_some(v)));
    let c = Float32Array::from_iter_values((0..n).map(|i| (i % 3) as f32));
    let batch = RecordBatch::try_from_iter([
        ("a", Arc::new(a) as ArrayRef),
        ("b", Arc::new(b) as ArrayRef),
        ("c", Arc::new(c) as ArrayRef),
    ])
    .unwrap();
    for codec in [Compression::UNCOMPRESSED, Compression::SNAPPY, Compression::ZSTD(ZstdLevel::default())] {
        let props = WriterProperties::builder()
            .set_compression(codec)
            .set_max_row_group_row_count(Some(20_000))
            .set_dictionary_page_size_limit(1 << 20)
            .build();
        let f = written(&batch, props);
        assert_eq!(f.units(), [20_000, 7_000]);
        let meta = f.meta.row_group(0).column(0);
        let dict = meta.data_page_offset() - meta.dictionary_page_offset().expect("a dictionary page");
        assert!(dict >= 64 << 10, "{codec}: a dictionary of {dict} bytes");
        for units in [vec![0, 1], vec![1, 0]] {
            let opts = filled(-7.0);
            assert_eq!(f.route(&units, &opts), Route::Direct);
            let direct = f.read(&units, &opts).unwrap();
            assert_eq!(bits(&direct), bits(&f.through_arrow(&units, &opts).unwrap()), "{codec} {units:?}");
        }
        let e = f.read(&[0, 1], &ExportOptions::default()).unwrap_err();
        assert!(e.to_string().contains("'b'"), "{e}");
    }
}

#[test]
fn every_fixed_width_type_reads_directly_and_mixed_types_or_casts_go_through_arrow() {
    let n = 100;
    let cols: [(ArrayRef, DType); 4] = [
        (Arc::new(Int32Array::from_iter_values(0..n)), DType::Int32),
        (Arc::new(Int64Array::from_iter_values((0..n as i64).map(|i| i << 40))), DType::Int64),
        (Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32 / 3.0))), DType::Float32),
        (Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64 / 7.0))), DType::Float64),
    ];
    for (array, dtype) in &cols {
        let batch = RecordBatch::try_from_iter([("x", array.clone()), ("y", array.clone())]).unwrap();
        let f = written(
            &batch,
            props(Compression::ZSTD(ZstdLevel::default()), false, WriterVersion::PARQUET_1_0, 64),
        );
        let opts = ExportOptions::default();
        assert_eq!(f.route(&[0, 1], &opts), Route::Direct);
        // Format 2 writes integers DELTA_BINARY_PACKED, which arrow-rs's reader decodes.
        let v2 = written(
            &batch,
            props(Compression::ZSTD(ZstdLevel::default()), false, WriterVersion::PARQUET_2_0, 64),
        );
        let delta = matches!(*dtype, DType::Int32 | DType::Int64);
        assert_eq!(
            matches!(v2.route(&[0, 1], &opts), Route::Arrow(why) if why.contains("DELTA_BINARY_PACKED")),
            delta
        );
        assert_eq!(bits(&v2.read(&[0, 1], &opts).unwrap()), bits(&f.read(&[0, 1], &opts).unwrap()));
        let m = f.read(&[0, 1], &opts).unwrap();
        assert_eq!(m.values.dtype(), *dtype);
        assert_eq!(bits(&m), bits(&f.through_arrow(&[0, 1], &opts).unwrap()));
        // A cast is the table conversion's (checked there).
        let cast = ExportOptions { dtype: Some(DType::Float64), ..ExportOptions::default() };
        if *dtype != DType::Float64 {
            assert!(matches!(f.route(&[0], &cast), Route::Arrow(why) if why.contains("cast")));
        }
    }
    let mixed = RecordBatch::try_from_iter([("i", cols[0].0.clone()), ("f", cols[2].0.clone())]).unwrap();
    let f = written(&mixed, props(Compression::UNCOMPRESSED, false, WriterVersion::PARQUET_1_0, 64));
    let opts = ExportOptions { dtype: Some(DType::Float32), ..ExportOptions::default() };
    assert!(matches!(f.route(&[0], &opts), Route::Arrow(why) if why.contains("different types")));
    assert_eq!(f.read(&[0, 1], &opts).unwrap().values.shape(), [100, 2]);
}

#[test]
fn nulls_are_refused_by_name_or_masked_through_arrow_and_copy_false_is_refused() {
    let f = written(&floats(), props(Compression::SNAPPY, false, WriterVersion::PARQUET_1_0, 500));
    let e = f.read(&[0, 1], &ExportOptions::default()).unwrap_err();
    assert!(matches!(&e, Error::Nulls { column, null_count: 143 } if column == "'b'"), "{e}");
    let mask = ExportOptions { nulls: NullPolicy::Mask, ..ExportOptions::default() };
    assert!(matches!(f.route(&[0], &mask), Route::Arrow(_)));
    let masked = f.read(&[0], &mask).unwrap();
    assert_eq!(masked.mask.unwrap().shape(), [500, 3]);
    let never = ExportOptions { copy: CopyPolicy::Never, ..filled(0.0) };
    assert!(matches!(f.read(&[0], &never), Err(Error::CopyRequired { .. })));
    // An integer fill that float32 holds only rounded is refused on both routes, as data is.
    let inexact =
        ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(16_777_217)), ..ExportOptions::default() };
    assert_eq!(f.route(&[0], &inexact), Route::Direct);
    for e in [f.read(&[0], &inexact).unwrap_err(), f.through_arrow(&[0], &inexact).unwrap_err()] {
        assert!(matches!(&e, Error::InexactCast { value, .. } if value == "16777217"), "{e}");
    }
    // A fill that an integer column cannot hold is refused as the conversion refuses it.
    let ints =
        RecordBatch::try_from_iter([("i", Arc::new(Int32Array::from(vec![Some(1), None])) as ArrayRef)])
            .unwrap();
    let f = written(&ints, props(Compression::UNCOMPRESSED, false, WriterVersion::PARQUET_1_0, 10));
    assert!(matches!(f.read(&[0], &filled(0.5)), Err(Error::ValueOutOfRange { .. })));
    assert_eq!(f.read(&[0], &filled(7.0)).unwrap().values.as_slice::<i32>().unwrap(), [1, 7]);
}

#[test]
fn a_string_column_goes_through_arrow_and_says_why() {
    let batch = RecordBatch::try_from_iter([
        ("x", Arc::new(Float32Array::from(vec![1.0, 2.0])) as ArrayRef),
        ("s", Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef),
    ])
    .unwrap();
    let f = written(&batch, props(Compression::UNCOMPRESSED, false, WriterVersion::PARQUET_1_0, 10));
    assert!(
        matches!(f.route(&[0], &ExportOptions::default()), Route::Arrow(why) if why.contains("'s' is Utf8"))
    );
    // The table conversion then refuses the string column, naming it.
    assert!(f.read(&[0], &ExportOptions::default()).unwrap_err().to_string().contains('s'));
}

#[test]
fn hostile_files_are_errors_that_name_the_file_never_a_crash() {
    for codec in [Compression::UNCOMPRESSED, Compression::SNAPPY] {
        hostile(codec);
    }
}

fn hostile(codec: Compression) {
    let batch = floats();
    let mut good = Vec::new();
    let mut w = ArrowWriter::try_new(
        &mut good,
        batch.schema(),
        Some(props(codec, true, WriterVersion::PARQUET_1_0, 300)),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let named = |e: Error| {
        assert!(e.to_string().starts_with("t.parquet: not a readable Parquet file"), "{e}");
    };
    // Truncated: no footer, or a footer cut.
    for cut in [0, 4, 11, good.len() / 2, good.len() - 1] {
        named(ParquetFile::from_bytes("t.parquet".into(), Bytes::from(good[..cut].to_vec())).err().unwrap());
    }
    // Every byte of the data region overwritten in turn with values that lie (page sizes,
    // levels, indices, values): each read ends in its values or an error, never a panic or a
    // read past the data.
    let footer = u32::from_le_bytes(good[good.len() - 8..good.len() - 4].try_into().unwrap()) as usize;
    let data_end = good.len() - 8 - footer;
    let (mut errors, mut reads) = (0, 0);
    for at in (4..data_end).step_by(11) {
        for value in [0x00u8, 0x7f, 0xff] {
            let mut bad = good.clone();
            bad[at] = value;
            let Ok(f) = ParquetFile::from_bytes("t.parquet".into(), Bytes::from(bad)) else { continue };
            match std::panic::catch_unwind(|| f.read(&[0, 1, 2, 3], &filled(0.0))) {
                Ok(Ok(_)) => reads += 1,
                Ok(Err(e)) => {
                    if let Error::InvalidParquet { .. } = e {
                        named(e);
                    }
                    errors += 1;
                }
                Err(_) => panic!("{codec}: byte {at} set to {value:#x} panicked"),
            }
        }
    }
    assert!(errors > 50 && reads > 0, "{codec}: {errors} errors, {reads} reads");
    // A unit the file lacks.
    let f = ParquetFile::from_bytes("t.parquet".into(), Bytes::from(good)).unwrap();
    named(f.read(&[4], &filled(0.0)).unwrap_err());
}

#[test]
fn a_file_on_disk_is_mapped_and_a_missing_one_is_named() {
    let dir = std::env::temp_dir().join(format!("dlframe-parquet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f.parquet");
    let batch = floats();
    let file = std::fs::File::create(&path).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let f = ParquetFile::open(&path).unwrap();
    assert_eq!(f.read(&[0], &filled(0.0)).unwrap().values.shape(), [1000, 3]);
    let e = ParquetFile::open(&dir.join("missing.parquet")).err().unwrap();
    assert!(e.to_string().contains("missing.parquet"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_that_pyarrow_wrote_read_directly_as_arrow_rs_reads_them() {
    // The fuzz seeds: written by pyarrow (PLAIN v1, dictionary + snappy v2, zstd in row groups of
    // 20), a float32 column and one with a null every fifth row.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parquet_file");
    let mut read = 0;
    for name in ["plain_v1", "dict_snappy_v2", "zstd_groups"] {
        let f = ParquetFile::open(&dir.join(format!("{name}.parquet"))).unwrap();
        let all: Vec<usize> = (0..f.units().len()).collect();
        assert_eq!(f.route(&all, &filled(0.0)), Route::Direct, "{name}");
        let direct = f.read(&all, &filled(-1.0)).unwrap();
        assert_eq!(bits(&direct), bits(&f.through_arrow(&all, &filled(-1.0)).unwrap()), "{name}");
        let v = direct.values.as_slice::<f32>().unwrap();
        assert_eq!((v[2 * 5], v[2 * 5 + 1], v[2 * 6 + 1]), (5.0, -1.0, 6.0), "{name}");
        read += 1;
    }
    assert_eq!(read, 3);
}

#[test]
fn a_page_that_declares_more_than_its_rows_can_fill_is_refused_before_it_is_decompressed() {
    // One snappy page of 4,096 float32 values: 16 KB uncompressed, a size of three varint bytes.
    let a = Float32Array::from_iter_values((0..4096).map(|i| i as f32));
    let batch = RecordBatch::try_from_iter([("a", Arc::new(a) as ArrayRef)]).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_dictionary_enabled(false)
        .set_data_page_row_count_limit(1 << 20)
        .set_write_batch_size(1 << 20)
        .build();
    let f = written(&batch, props);
    let mut bytes = f.data.to_vec();
    let at = f.meta.row_group(0).column(0).data_page_offset() as usize;
    // The header: field 1 (the page type, 0), then field 2, the uncompressed size.
    assert_eq!(bytes[at..at + 3], [0x15, 0x00, 0x15]);
    assert_eq!(bytes[at + 5] & 0x80, 0, "three varint bytes");
    let opts = filled(0.0);
    ParquetFile::from_bytes("t.parquet".into(), Bytes::from(bytes.clone()))
        .unwrap()
        .read(&[0], &opts)
        .unwrap();
    // 1,048,575 bytes declared, for 4,096 rows that fill at most 114,688.
    bytes[at + 3..at + 6].copy_from_slice(&[0xfe, 0xff, 0x7f]);
    let f = ParquetFile::from_bytes("t.parquet".into(), Bytes::from(bytes)).unwrap();
    let e = f.read(&[0], &opts).unwrap_err().to_string();
    assert!(e.contains("t.parquet") && e.contains("declares 1048575 bytes uncompressed"), "{e}");
}

/// The pages of the one column chunk of a file of `values` (float64, required, dictionary
/// pages, one row group, one data page): the dictionary page's bytes and the data page's.
fn dictionary_pages(values: &[f64]) -> (Vec<u8>, Vec<u8>) {
    let col = Float64Array::from(values.to_vec());
    let batch = RecordBatch::try_from_iter([("x", Arc::new(col) as ArrayRef)]).unwrap();
    let f = written(&batch, props(Compression::UNCOMPRESSED, true, WriterVersion::PARQUET_1_0, 10_000));
    let c = f.meta.row_group(0).column(0);
    let (start, len) = c.byte_range();
    let (start, end) = (start as usize, (start + len) as usize);
    let (_, dict) = headers::page_at(&f.data, start, end).unwrap();
    let (_, data) = headers::page_at(&f.data, dict.end, end).unwrap();
    assert_eq!(data.end, end, "one data page");
    (f.data[start..dict.end].to_vec(), f.data[dict.end..data.end].to_vec())
}

/// A chunk whose second dictionary page is smaller than its first, then a data page whose
/// indices lie only in the first: the indices are checked against the dictionary in force
/// (the one a lookup reads), an error, never a read past it.
#[test]
fn indices_are_checked_against_the_dictionary_that_replaced_an_earlier_one() {
    let wide: Vec<f64> = (0..30).map(f64::from).collect();
    let (big, data) = dictionary_pages(&wide);
    let (small, _) = dictionary_pages(&[7.0, 8.0, 7.0, 8.0]);
    let per = wide.len();
    let read = |pages: Vec<u8>, rows: usize| {
        let len = pages.len() as u64;
        let chunk = Chunk::new(Bytes::from(pages), 0, len, Compression::UNCOMPRESSED, 1 << 20).unwrap();
        let mut cursor = Cursor::<f64>::new(chunk, rows, 0, OnNull::Refuse);
        // A page's rows at a time: each page's rows are handed out whole, as lookups.
        let mut out = vec![0.0; rows];
        for tile in out.chunks_mut(per) {
            let r = cursor.rows(per)?.expect("a page's rows, without nulls");
            pages::rows_into(&[r], tile);
        }
        Ok::<_, String>(out)
    };
    // The pages as written read back (the second pair: the big dictionary again).
    let twice = [&big[..], &data, &big, &data].concat();
    let mut want = wide.clone();
    want.extend(&wide);
    assert_eq!(read(twice, 2 * per).unwrap(), want);
    // The small dictionary in the big one's place before the second data page.
    let hostile = [&big[..], &data, &small, &data].concat();
    let e = read(hostile, 2 * per).unwrap_err();
    assert!(e.contains("of a dictionary of 2"), "{e}");
}

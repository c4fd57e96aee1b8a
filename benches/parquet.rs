//! Parquet into one `(rows, 8)` matrix against the floors, in the same group and run: 8 f32
//! columns x 4M rows (128 MB of values, pseudo-random so that the codecs keep their work) in 8
//! row groups, written uncompressed, with snappy and with zstd (PLAIN pages).
//! - `dlframe`: [`ParquetFile::read`] of every row group (the direct path: pages written into
//!   the matrix, a row group per thread);
//! - `dlframe_batches`: the same file as `dlframe.batches` reads it, unshuffled: row groups
//!   read a group at a time ([`ParquetFiles::reads`]) and cut into batches of 65,536 rows;
//! - `arrow_rs_decode`: arrow-rs's reader decoding every row group into record batches, and
//!   nothing else (the decode every loader waits on today);
//! - `arrow_rs_then_table`: the same, then the table conversion into the matrix (dlframe's
//!   route before this reader);
//! - `pages`: the chunks' pages read and decompressed, not decoded (the codec's floor);
//! - `memcpy`: the 128 MB copied once into a buffer that is already mapped.
//!
//! `cargo bench --features parquet --bench parquet -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, RecordBatch};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dlframe::Device;
use dlframe::batches::BatchOptions;
use dlframe::batches::pass::{Setup, produce};
use dlframe::options::ExportOptions;
use dlframe::parquet::ParquetFile;
use dlframe::parquet::files::ParquetFiles;
use dlframe::table::{Columns, table_on};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

const COLS: usize = 8;
const ROWS: usize = 4 << 20;
const GROUP: usize = ROWS / 8;

/// The job's file written with `codec`, once per run.
fn file(codec: Compression, name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("dlframe-bench-{name}-{}.parquet", std::process::id()));
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let cols: Vec<(String, ArrayRef)> = (0..COLS)
        .map(|j| {
            let values = (0..ROWS).map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / 1024.0
            });
            (format!("c{j}"), Arc::new(values.collect::<Float32Array>()) as ArrayRef)
        })
        .collect();
    let batch = RecordBatch::try_from_iter(cols).expect("a batch");
    let props = WriterProperties::builder()
        .set_compression(codec)
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(GROUP))
        .build();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(&path).expect("a file"), batch.schema(), Some(props))
            .expect("a writer");
    w.write(&batch).expect("written");
    w.close().expect("closed");
    path
}

fn arrow_rs_columns(path: &PathBuf) -> Vec<Vec<ArrayRef>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).expect("open"))
        .expect("a reader")
        .with_batch_size(GROUP)
        .build()
        .expect("built");
    let mut cols = vec![Vec::new(); COLS];
    for b in reader {
        for (c, a) in cols.iter_mut().zip(b.expect("a batch").columns()) {
            c.push(a.clone());
        }
    }
    cols
}

fn bench(c: &mut Criterion) {
    let bytes = (ROWS * COLS * 4) as u64;
    let src = vec![1u8; bytes as usize];
    let mut dst = vec![0u8; bytes as usize];
    for (codec, name) in [
        (Compression::UNCOMPRESSED, "uncompressed"),
        (Compression::SNAPPY, "snappy"),
        (Compression::ZSTD(ZstdLevel::default()), "zstd"),
    ] {
        let path = file(codec, name);
        let f = ParquetFile::open(&path).expect("opened");
        let units: Vec<usize> = (0..f.units().len()).collect();
        let opts = ExportOptions::default();
        let fields = f.fields().to_vec();
        let mut g = c.benchmark_group(format!("parquet_{name}"));
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function("dlframe", |b| b.iter(|| black_box(f.read(&units, &opts).expect("read"))));
        let files = Arc::new(ParquetFiles::open(std::slice::from_ref(&path)).expect("opened"));
        g.bench_function("dlframe_batches", |b| {
            b.iter(|| {
                let mut reads = files.reads(units.iter().copied(), opts);
                let setup = Setup::in_order(BatchOptions::new(65_536).expect("a batch size"));
                let stop = std::sync::atomic::AtomicBool::new(false);
                let mut batches = 0;
                produce(
                    || reads.next(),
                    setup,
                    2,
                    |t| {
                        black_box(t).is_ok_and(|_| {
                            batches += 1;
                            true
                        })
                    },
                    &stop,
                );
                assert_eq!(batches, ROWS / 65_536);
            })
        });
        g.bench_function("arrow_rs_decode", |b| b.iter(|| black_box(arrow_rs_columns(&path))));
        g.bench_function("arrow_rs_then_table", |b| {
            b.iter(|| {
                let cols = arrow_rs_columns(&path);
                black_box(table_on(&fields, &cols, Columns::Stack, &opts, Device::Cpu).expect("a matrix"))
            })
        });
        g.bench_function("pages", |b| {
            b.iter(|| {
                let reader =
                    SerializedFileReader::new(std::fs::File::open(&path).expect("open")).expect("a reader");
                for rg in 0..reader.num_row_groups() {
                    let rg = reader.get_row_group(rg).expect("a row group");
                    for col in 0..COLS {
                        let mut pages = rg.get_column_page_reader(col).expect("pages");
                        while let Some(p) = pages.get_next_page().expect("a page") {
                            black_box(p);
                        }
                    }
                }
            })
        });
        g.bench_function("memcpy", |b| b.iter(|| dst.copy_from_slice(black_box(&src))));
        g.finish();
        std::fs::remove_file(&path).ok();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

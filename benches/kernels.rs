//! Each copy kernel against a plain memcpy of the same output bytes, measured in the same
//! group and run. Kernels run on a one-thread rayon pool (`kernel`); a `kernel_parallel`
//! entry shows the global pool, for information. Inputs are deterministic (an LCG).
//!
//! `cargo bench --bench kernels -- --warm-up-time 1 --measurement-time 3`, then
//! `python3 benches/ratios.py` prints the ratios against their targets.

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float32Array};
use arrow_schema::{DataType, Field, FieldRef};
use criterion::{
    BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime,
};
use dlframe::arrow::{columns_to_tensor, to_tensor};
use dlframe::kernels::{BitSlice, Column, HostBuffer, concat_into, fill_nulls, interleave, unpack_bits};
use dlframe::options::{ExportOptions, Inexact, Order, Ragged, Scalar};

/// A deterministic LCG (Knuth's MMIX constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// `n` bits, about `pct` percent of them 0, at random places.
fn bitmap(n: usize, pct: u64) -> Vec<u8> {
    let mut rng = Lcg(0x9E37_79B9_7F4A_7C15);
    let mut out = vec![0u8; n.div_ceil(8)];
    for i in 0..n {
        if rng.next() % 100 >= pct {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Lcg(seed);
    (0..n).map(|_| rng.next() as f32).collect()
}

fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a 1-thread pool")
}

/// The yardstick: the same output bytes copied from a source of the same size.
fn memcpy<T: Copy>(src: &[T], dst: &mut [T]) {
    dst.copy_from_slice(black_box(src));
    black_box(dst);
}

/// A copy into freshly allocated memory, as every new tensor needs: the yardstick for the
/// entries that allocate their output (the conversions from Arrow).
fn fresh_copy(src: &[f32]) -> arrow_buffer::Buffer {
    let mut buf = HostBuffer::zeroed(std::mem::size_of_val(src)).expect("an allocation");
    buf.typed_mut::<f32>().copy_from_slice(black_box(src));
    buf.into_buffer()
}

fn group<'a>(c: &'a mut Criterion, name: &str, bytes: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10).throughput(Throughput::Bytes(bytes as u64));
    g
}

fn bench(c: &mut Criterion) {
    let pool = one_thread();

    // Null fill: 10M f32, 10% nulls, into a 40 MB output.
    let n = 10_000_000;
    let values = floats(n, 1);
    let valid = bitmap(n, 10);
    let validity = BitSlice::new(&valid, 0, n).expect("a bitmap");
    let mut out = vec![0f32; n];
    let mut g = group(c, "null_fill_f32_10M_10pct", n * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&values, &mut out)));
    g.bench_function("kernel", |b| {
        pool.install(|| b.iter(|| fill_nulls(&values, Some(validity), 0.0, &mut out).expect("fill")))
    });
    g.bench_function("kernel_parallel", |b| {
        b.iter(|| fill_nulls(&values, Some(validity), 0.0, &mut out).expect("fill"))
    });
    g.finish();

    // Bool unpack: 10M bits into 10 MB of 0/1 bytes.
    let bits = bitmap(n, 50);
    let bools = BitSlice::new(&bits, 0, n).expect("a bitmap");
    let bytes_src = vec![1u8; n];
    let mut bytes = vec![0u8; n];
    let mut g = group(c, "bool_unpack_10M", n);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&bytes_src, &mut bytes)));
    g.bench_function("kernel", |b| pool.install(|| b.iter(|| unpack_bits(bools, &mut bytes))));
    g.bench_function("kernel_parallel", |b| b.iter(|| unpack_bits(bools, &mut bytes)));
    g.finish();

    // Interleave: 8 f32 columns of 2M rows into a (2M, 8) C-order matrix of 64 MB.
    let rows = 2_000_000;
    let typed: Vec<Vec<f32>> = (0..8).map(|j| floats(rows, 10 + j)).collect();
    let cols: Vec<Column> = typed.iter().map(|v| Column::new(&v[..])).collect();
    let flat = floats(rows * 8, 2);
    let mut matrix = vec![0f32; rows * 8];
    let arrays: Vec<Vec<ArrayRef>> =
        typed.iter().map(|v| vec![Arc::new(Float32Array::from(v.clone())) as ArrayRef]).collect();
    let fields: Vec<FieldRef> =
        (0..8).map(|j| Arc::new(Field::new(format!("c{j}"), DataType::Float32, false))).collect();
    let opts = ExportOptions::default();
    let mut g = group(c, "interleave_8xf32_2M_c", rows * 8 * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&flat, &mut matrix)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| interleave(&cols, Order::C, None, Inexact::Error, &mut matrix).expect("interleave"))
        })
    });
    g.bench_function("kernel_parallel", |b| {
        b.iter(|| interleave(&cols, Order::C, None, Inexact::Error, &mut matrix).expect("interleave"))
    });
    // The same from Arrow columns into a new tensor, against a copy into fresh memory.
    g.bench_function("memcpy_fresh", |b| b.iter(|| fresh_copy(&flat)));
    g.bench_function("to_tensor", |b| {
        pool.install(|| b.iter(|| black_box(columns_to_tensor(&fields, &arrays, &opts).expect("convert"))))
    });
    g.bench_function("to_tensor_parallel", |b| {
        b.iter(|| black_box(columns_to_tensor(&fields, &arrays, &opts).expect("convert")))
    });
    g.finish();

    // The same matrix from columns with 10% nulls each, filled in the same pass.
    let valid8: Vec<Vec<u8>> = (0..8).map(|_| bitmap(rows, 10)).collect();
    let with_nulls: Vec<Column> = cols
        .iter()
        .zip(&valid8)
        .map(|(c, v)| c.with_validity(Some(BitSlice::new(v, 0, rows).expect("a bitmap"))))
        .collect();
    let mut g = group(c, "interleave_fill_8xf32_2M_c", rows * 8 * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&flat, &mut matrix)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| {
                interleave(&with_nulls, Order::C, Some(0.0), Inexact::Error, &mut matrix).expect("interleave")
            })
        })
    });
    g.bench_function("kernel_parallel", |b| {
        b.iter(|| {
            interleave(&with_nulls, Order::C, Some(0.0), Inexact::Error, &mut matrix).expect("interleave")
        })
    });
    g.finish();

    // Chunk concat: 100 chunks of 100K f32 into one 40 MB buffer.
    let pieces: Vec<Vec<f32>> = (0..100).map(|c| floats(100_000, 100 + c)).collect();
    let refs: Vec<&[f32]> = pieces.iter().map(|p| &p[..]).collect();
    let chunks: Vec<ArrayRef> =
        pieces.iter().map(|p| Arc::new(Float32Array::from(p.clone())) as ArrayRef).collect();
    let field: FieldRef = Arc::new(Field::new("x", DataType::Float32, false));
    let mut g = group(c, "chunk_concat_100x100k_f32", n * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&values, &mut out)));
    g.bench_function("kernel", |b| pool.install(|| b.iter(|| concat_into(&refs, &mut out).expect("concat"))));
    g.bench_function("kernel_parallel", |b| b.iter(|| concat_into(&refs, &mut out).expect("concat")));
    g.bench_function("memcpy_fresh", |b| b.iter(|| fresh_copy(&values)));
    g.bench_function("arrow_to_tensor", |b| {
        pool.install(|| b.iter(|| black_box(to_tensor(&field, &chunks, &opts).expect("convert"))))
    });
    g.finish();

    // Float narrowing: 10M f64 into f32, checked value by value for overflow (a finite value
    // that would become inf is an error), against a memcpy of the same 40 MB of output.
    let wide: Vec<f64> = floats(n, 7).into_iter().map(f64::from).collect();
    let wide_cols = [Column::new(&wide[..])];
    let mut g = group(c, "cast_f64_to_f32_10M", n * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&values, &mut out)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| interleave(&wide_cols, Order::C, None, Inexact::Error, &mut out).expect("cast"))
        })
    });
    g.finish();

    // float8: 10M f32 into e4m3fn (rounded once, each value checked against 448 and for
    // infinity), and back to f32 (exact), against a memcpy of the output bytes (10 MB, 40 MB).
    let small: Vec<f32> = floats(n, 8).into_iter().map(|v| (v % 800.0) - 400.0).collect();
    let small_cols = [Column::new(&small[..])];
    let mut f8_out = vec![dlframe::dtype::F8E4M3FN::default(); n];
    let f8_bytes = vec![0u8; n];
    let mut byte_out = vec![0u8; n];
    let mut g = group(c, "cast_f32_to_float8_e4m3fn_10M", n);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&f8_bytes, &mut byte_out)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| interleave(&small_cols, Order::C, None, Inexact::Error, &mut f8_out).expect("cast"))
        })
    });
    g.finish();
    let f8_cols = [Column::new(&f8_out[..])];
    let mut g = group(c, "cast_float8_e4m3fn_to_f32_10M", n * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&values, &mut out)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| interleave(&f8_cols, Order::C, None, Inexact::Error, &mut out).expect("cast"))
        })
    });
    g.finish();

    // Ragged lists: 1M rows of 0..=63 f32 (about 31.5M values), padded to (1M, 64) or read
    // jagged (a LargeList, zero-copy). The yardstick is a memcpy of the padded bytes.
    let mut rng = Lcg(11);
    let lengths: Vec<usize> = (0..1_000_000).map(|_| (rng.next() % 64) as usize).collect();
    let total: usize = lengths.iter().sum();
    let offsets = arrow_buffer::OffsetBuffer::<i64>::from_lengths(lengths.iter().copied());
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let list: ArrayRef = Arc::new(arrow_array::LargeListArray::new(
        item.clone(),
        offsets,
        Arc::new(Float32Array::from(floats(total, 12))),
        None,
    ));
    let list_field: FieldRef = Arc::new(Field::new("tokens", DataType::LargeList(item), false));
    let padded_bytes = lengths.len() * 64 * 4;
    let flat = floats(padded_bytes / 4, 13);
    let mut padded_out = vec![0f32; padded_bytes / 4];
    let pad = ExportOptions { ragged: Ragged::Pad { pad: Scalar::Int(0), max_len: None }, ..opts };
    let jagged = ExportOptions { ragged: Ragged::Jagged, ..opts };
    let mut g = group(c, "ragged_pad_1M_rows_f32", padded_bytes);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&flat, &mut padded_out)));
    g.bench_function("memcpy_fresh", |b| b.iter(|| fresh_copy(&flat)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| black_box(to_tensor(&list_field, std::slice::from_ref(&list), &pad).expect("pad")))
        })
    });
    g.bench_function("kernel_parallel", |b| {
        b.iter(|| black_box(to_tensor(&list_field, std::slice::from_ref(&list), &pad).expect("pad")))
    });
    g.bench_function("jagged_zero_copy", |b| {
        b.iter(|| black_box(to_tensor(&list_field, std::slice::from_ref(&list), &jagged).expect("jagged")))
    });
    g.finish();

    // A tensor column of 1M rows of (4, 4) f32 cells (64 MB) laid out in F order: one gather
    // with the rows innermost, against a copy of the same bytes.
    let rows = 1_000_000;
    let leaf = Arc::new(Field::new("item", DataType::Float32, false));
    let inner = arrow_array::FixedSizeListArray::new(
        leaf,
        4,
        Arc::new(Float32Array::from(floats(rows * 16, 14))),
        None,
    );
    let inner_field = Arc::new(Field::new("item", inner.data_type().clone(), false));
    let cells: ArrayRef =
        Arc::new(arrow_array::FixedSizeListArray::new(inner_field, 4, Arc::new(inner), None));
    let cells_field: FieldRef = Arc::new(Field::new("cells", cells.data_type().clone(), false));
    let fortran = ExportOptions { order: Order::F, ..opts };
    let flat = floats(rows * 16, 15);
    let mut out = vec![0f32; rows * 16];
    let mut g = group(c, "tensor_column_f_order_1Mx4x4_f32", rows * 16 * 4);
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&flat, &mut out)));
    g.bench_function("memcpy_fresh", |b| b.iter(|| fresh_copy(&flat)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| black_box(to_tensor(&cells_field, std::slice::from_ref(&cells), &fortran).expect("F")))
        })
    });
    g.bench_function("kernel_parallel", |b| {
        b.iter(|| black_box(to_tensor(&cells_field, std::slice::from_ref(&cells), &fortran).expect("F")))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Each fused kernel against a plain memcpy of the same output bytes, in the same group and
//! run, on one rayon thread (a `*_parallel` entry shows the global pool for information).
//! `python3 benches/ratios.py` prints the ratios against the targets of issue 3.

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array};
use arrow_schema::{Field, FieldRef};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dlframe::arrow::{ExportOptions, columns_to_tensor, to_tensor};
use dlframe::kernels::{
    BitSlice, Column, ColumnRef, HostBuffer, Order, concat_into, fill_nulls, interleave, unpack_bits,
};

/// Deterministic pseudo-random bits with about `pct` percent zeros.
fn bitmap(n: usize, pct: u64) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut out = vec![0u8; n.div_ceil(8)];
    for i in 0..n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if (x >> 33) % 100 >= pct {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a 1-thread pool")
}

fn memcpy<T: Copy>(src: &[T], dst: &mut [T]) {
    dst.copy_from_slice(black_box(src));
}

/// A copy into freshly allocated memory, as every new tensor needs (the yardstick for the
/// allocating paths): the same huge-page-backed allocation the kernels use.
fn fresh_copy(src: &[f32]) -> arrow_buffer::Buffer {
    let mut buf = HostBuffer::zeroed(std::mem::size_of_val(src)).unwrap();
    buf.typed_mut::<f32>().copy_from_slice(black_box(src));
    buf.into_buffer()
}

fn bench(c: &mut Criterion) {
    let pool = one_thread();

    let n = 10_000_000;
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let valid = bitmap(n, 10);
    let mut out = vec![0f32; n];
    let mut g = c.benchmark_group("null_fill_f32_10M_10pct");
    g.sample_size(10).throughput(Throughput::Bytes((n * 4) as u64));
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&values, &mut out)));
    g.bench_function("kernel", |b| {
        pool.install(|| {
            b.iter(|| fill_nulls(&values, Some(BitSlice::new(&valid, 0, n).unwrap()), 0.0, &mut out).unwrap())
        })
    });
    g.bench_function("kernel_parallel", |b| {
        b.iter(|| fill_nulls(&values, Some(BitSlice::new(&valid, 0, n).unwrap()), 0.0, &mut out).unwrap())
    });
    g.finish();

    let bits = bitmap(n, 50);
    let bytes_src = vec![1u8; n];
    let mut bytes = vec![0u8; n];
    let mut g = c.benchmark_group("bool_unpack_10M");
    g.sample_size(10).throughput(Throughput::Bytes(n as u64));
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&bytes_src, &mut bytes)));
    g.bench_function("kernel", |b| {
        pool.install(|| b.iter(|| unpack_bits(BitSlice::new(&bits, 0, n).unwrap(), &mut bytes)))
    });
    g.finish();

    let rows = 2_000_000;
    let cols: Vec<ArrayRef> = (0..8)
        .map(|j| Arc::new(Float32Array::from_iter_values((0..rows).map(|i| (i + j) as f32))) as ArrayRef)
        .collect();
    let fields: Vec<FieldRef> = (0..8)
        .map(|j| Arc::new(Field::new(format!("c{j}"), arrow_schema::DataType::Float32, false)))
        .collect();
    let chunks: Vec<Vec<ArrayRef>> = cols.iter().map(|c| vec![c.clone()]).collect();
    let flat: Vec<f32> = (0..rows * 8).map(|i| i as f32).collect();
    let mut flat_out = vec![0f32; rows * 8];
    let mut g = c.benchmark_group("interleave_8xf32_2M_c");
    g.sample_size(10).throughput(Throughput::Bytes((rows * 8 * 4) as u64));
    let typed: Vec<Vec<f32>> = (0..8).map(|j| (0..rows).map(|i| (i + j) as f32).collect()).collect();
    let names: Vec<String> = (0..8).map(|j| format!("c{j}")).collect();
    let kcols: Vec<Column> = typed
        .iter()
        .zip(&names)
        .map(|(v, n)| Column { values: ColumnRef::F32(v), validity: None, name: n })
        .collect();
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&flat, &mut flat_out)));
    g.bench_function("memcpy_fresh", |b| b.iter(|| fresh_copy(&flat)));
    g.bench_function("kernel", |b| {
        pool.install(|| b.iter(|| interleave(&kcols, Order::C, None, &mut flat_out).unwrap()))
    });
    g.bench_function("to_tensor", |b| {
        pool.install(|| {
            b.iter(|| black_box(columns_to_tensor(&fields, &chunks, &ExportOptions::default()).unwrap()))
        })
    });
    g.bench_function("to_tensor_parallel", |b| {
        b.iter(|| black_box(columns_to_tensor(&fields, &chunks, &ExportOptions::default()).unwrap()))
    });
    g.finish();

    let pieces: Vec<Vec<f32>> =
        (0..100).map(|c| (0..100_000).map(|i| (c * 100_000 + i) as f32).collect()).collect();
    let refs: Vec<&[f32]> = pieces.iter().map(|p| p.as_slice()).collect();
    let arrays: Vec<ArrayRef> =
        pieces.iter().map(|p| Arc::new(Float32Array::from(p.clone())) as ArrayRef).collect();
    let field: FieldRef = Arc::new(Field::new("x", arrow_schema::DataType::Float32, false));
    let mut g = c.benchmark_group("chunk_concat_100x100k_f32");
    g.sample_size(10).throughput(Throughput::Bytes((n * 4) as u64));
    g.bench_function("memcpy", |b| b.iter(|| memcpy(&values, &mut out)));
    g.bench_function("memcpy_fresh", |b| b.iter(|| fresh_copy(&values)));
    g.bench_function("kernel", |b| pool.install(|| b.iter(|| concat_into(&refs, &mut out).unwrap())));
    g.bench_function("arrow_to_tensor", |b| {
        pool.install(|| b.iter(|| black_box(to_tensor(&field, &arrays, &ExportOptions::default()).unwrap())))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

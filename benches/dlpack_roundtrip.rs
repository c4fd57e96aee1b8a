//! Export and import cost must not grow with the column length (zero-copy): compares 1K and
//! 10M rows for Arrow -> versioned DLPack, DLPack -> Arrow, and the whole round trip; and for
//! the Arrow C Device data interface on the CPU, a tensor exported as an `ArrowDeviceArray` and
//! a producer's device array imported (taken, checked, validated) as an Arrow array.
//! `python3 benches/ratios.py` prints the 10M / 1K ratios (target <= 1.5).

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use dlframe::arrow::device::import_on_host;
use dlframe::arrow::device_export::export_tensor;
use dlframe::arrow::{array_to_tensor, tensor_to_array};
use dlframe::{ForeignTensor, export_versioned};

fn column(n: usize) -> ArrayRef {
    Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32)))
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("dlpack_constant_cost");
    for n in [1_000usize, 10_000_000] {
        let array = column(n);
        g.bench_with_input(BenchmarkId::new("export", n), &array, |b, a| {
            b.iter(|| drop(black_box(export_versioned(array_to_tensor(a.as_ref()).unwrap()))))
        });
        g.bench_with_input(BenchmarkId::new("import", n), &array, |b, a| {
            b.iter_batched(
                || export_versioned(array_to_tensor(a.as_ref()).unwrap()).into_raw(),
                |raw| {
                    // SAFETY: each iteration imports one fresh export exactly once.
                    let t = unsafe { ForeignTensor::from_versioned(raw) }.unwrap().into_tensor();
                    black_box(tensor_to_array(&t).unwrap())
                },
                criterion::BatchSize::SmallInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("round_trip", n), &array, |b, a| {
            b.iter(|| {
                let raw = export_versioned(array_to_tensor(a.as_ref()).unwrap()).into_raw();
                // SAFETY: imported exactly once.
                let t = unsafe { ForeignTensor::from_versioned(raw) }.unwrap().into_tensor();
                black_box(tensor_to_array(&t).unwrap())
            })
        });
        g.bench_with_input(BenchmarkId::new("device_export", n), &array, |b, a| {
            let t = array_to_tensor(a.as_ref()).unwrap();
            b.iter(|| drop(black_box(export_tensor(&t, None).unwrap())))
        });
        g.bench_with_input(BenchmarkId::new("device_import", n), &array, |b, a| {
            let t = array_to_tensor(a.as_ref()).unwrap();
            b.iter_batched(
                || export_tensor(&t, None).unwrap(),
                |(schema, mut device_array)| {
                    // SAFETY: each iteration takes one fresh export exactly once.
                    black_box(unsafe { import_on_host(&mut device_array, &schema) }.unwrap())
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);

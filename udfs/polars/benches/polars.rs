//! The Polars paths against their yardsticks, in one run: Series -> tensor and tensor ->
//! Series must cost the same for 1K and 10M rows (zero-copy), and a DataFrame of 8 f32 columns
//! x 2M rows -> one (2M, 8) tensor, directly or through the `to_tensor` plugin's work, against
//! a copy of the same 64 MB into fresh memory. `benches/ratios.py` prints the ratios.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use dlframe::Tensor;
use dlframe::kernels::HostBuffer;
use dlframe::options::{CopyPolicy, ExportOptions, NullPolicy, Scalar};
use dlframe::polars::{dataframe_to_tensor, series_to_tensor, tensor_to_series};
use dlframe_polars::{ToTensorKwargs, to_tensor_impl};
use polars_core::prelude::*;

const ROWS: usize = 2_000_000;
const COLS: usize = 8;

fn columns(nulls: bool) -> Vec<Series> {
    (0..COLS)
        .map(|c| {
            let name = format!("c{c}");
            if nulls {
                let v = (0..ROWS).map(|r| (r % 10 != c).then_some((r * COLS + c) as f32));
                Series::new(name.into(), v.collect::<Vec<_>>())
            } else {
                Series::new(name.into(), (0..ROWS).map(|r| (r * COLS + c) as f32).collect::<Vec<_>>())
            }
        })
        .collect()
}

/// The yardstick: the output bytes copied into freshly allocated memory, as a new tensor needs.
fn fresh_copy(src: &[f32]) -> arrow_buffer::Buffer {
    let mut buf = HostBuffer::zeroed(std::mem::size_of_val(src)).expect("an allocation");
    buf.typed_mut::<f32>().copy_from_slice(black_box(src));
    buf.into_buffer()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("polars_constant_cost");
    for n in [1_000usize, 10_000_000] {
        let s = Series::new("x".into(), (0..n).map(|v| v as f32).collect::<Vec<_>>());
        let opts = ExportOptions::default();
        g.bench_function(format!("series_to_tensor/{n}"), |b| {
            b.iter(|| black_box(series_to_tensor(black_box(&s), &opts).unwrap()))
        });
        let t = Tensor::from_vec((0..n).map(|v| v as f32).collect(), vec![n as i64 / 4, 4]).unwrap();
        g.bench_function(format!("tensor_to_series/{n}"), |b| {
            b.iter(|| black_box(tensor_to_series(black_box(&t), "t", CopyPolicy::Never).unwrap()))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("polars_8xf32_2M_c");
    g.sample_size(10);
    let plain = columns(false);
    let flat: Vec<f32> = (0..ROWS * COLS).map(|v| v as f32).collect();
    g.bench_function("memcpy_fresh", |b| b.iter(|| black_box(fresh_copy(&flat))));
    let df = DataFrame::new_infer_height(plain.iter().cloned().map(Column::from).collect()).unwrap();
    g.bench_function("dataframe_to_tensor", |b| {
        b.iter(|| black_box(dataframe_to_tensor(&df, &ExportOptions::default()).unwrap()))
    });
    g.bench_function("plugin_to_tensor", |b| {
        b.iter(|| black_box(to_tensor_impl(&plain, &ToTensorKwargs::default()).unwrap()))
    });
    let holes = columns(true);
    let fill = ToTensorKwargs { fill_value: Some(dlframe_polars::Fill::Int(0)), ..Default::default() };
    g.bench_function("plugin_to_tensor_fill_10pct", |b| {
        b.iter(|| black_box(to_tensor_impl(&holes, &fill).unwrap()))
    });
    let df_holes = DataFrame::new_infer_height(holes.iter().cloned().map(Column::from).collect()).unwrap();
    let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..Default::default() };
    g.bench_function("dataframe_to_tensor_fill_10pct", |b| {
        b.iter(|| black_box(dataframe_to_tensor(&df_holes, &opts).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

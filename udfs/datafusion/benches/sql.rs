//! `SELECT to_tensor(c0, ..., c7)` on a MemTable of 8 f32 columns x 10M rows, against the
//! plain projection and `make_array`, and collecting the result into one tensor against a
//! memcpy of the output bytes. `benches/ratios.py` prints the ratios and targets.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Float32Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use criterion::{Criterion, criterion_group, criterion_main};
use datafusion::catalog::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use dlframe_datafusion::{collect_tensor, register};

const ROWS: usize = 10_000_000;
const COLS: usize = 8;
const BATCH: usize = 8192;

fn context() -> SessionContext {
    let schema = Arc::new(Schema::new(
        (0..COLS).map(|c| Field::new(format!("c{c}"), DataType::Float32, false)).collect::<Vec<_>>(),
    ));
    let columns: Vec<ArrayRef> = (0..COLS)
        .map(|c| {
            Arc::new(Float32Array::from_iter_values((0..ROWS).map(|r| (r * COLS + c) as f32))) as ArrayRef
        })
        .collect();
    let all = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let partitions = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Batches of DataFusion's default size, dealt round-robin to one partition per core.
    let mut parts = vec![Vec::new(); partitions];
    for (i, start) in (0..ROWS).step_by(BATCH).enumerate() {
        parts[i % partitions].push(all.slice(start, BATCH.min(ROWS - start)));
    }
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(partitions));
    ctx.register_table("t", Arc::new(MemTable::try_new(schema, parts).unwrap())).unwrap();
    register(&ctx);
    ctx
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ctx = context();
    let cols: Vec<String> = (0..COLS).map(|c| format!("c{c}")).collect();
    let cols = cols.join(", ");
    let mut g = c.benchmark_group("sql_8xf32_10M");
    g.sample_size(10).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(1));
    for (name, sql) in [
        ("select", format!("SELECT {cols} FROM t")),
        ("to_tensor", format!("SELECT to_tensor({cols}) FROM t")),
        ("make_array", format!("SELECT make_array({cols}) FROM t")),
    ] {
        g.bench_function(name, |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(ctx.sql(&sql).await.unwrap().collect().await.unwrap()) })
        });
    }
    g.finish();

    let df = rt.block_on(ctx.sql(&format!("SELECT to_tensor({cols}) AS x FROM t"))).unwrap();
    let schema = df.schema().as_arrow().clone();
    let batches = rt.block_on(df.collect()).unwrap();
    let bytes = ROWS * COLS * 4;
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut g = c.benchmark_group("collect_tensor_8xf32_10M");
    g.sample_size(10).measurement_time(Duration::from_secs(6)).warm_up_time(Duration::from_secs(1));
    g.bench_function("collect", |b| b.iter(|| black_box(collect_tensor(&schema, &batches, "x").unwrap())));
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Exact-size batches against a memcpy of the same bytes, in the same group and run:
//! 8 f32 columns x 4M rows (128 MB) in input batches of 1M rows (and of 8,192 rows, DataFusion's
//! size), cut into batches of 65,536 rows and each made a (65,536, 8) C-order tensor.
//! - `batches`: [`Batches`] over the record batches, each batch converted when asked for;
//! - `batches_ahead`: a [`Batcher`] and [`Ahead`] with 2 windows converted at once while the
//!   next input is pushed, as the Python binding's thread drives them;
//! - `batches_shuffled`: the same with a shuffle (blocks of one batch permuted by a seed,
//!   each batch gathered and interleaved in one pass), as `dlframe.batches(shuffle=True)`;
//! - `memcpy`: the 128 MB copied once into a buffer that is already mapped.
//!
//! `cargo bench --bench batches -- --warm-up-time 1 --measurement-time 3`, then
//! `python3 benches/ratios.py` prints the ratios against their targets.

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dlframe::batches::plan::runs;
use dlframe::batches::{
    Ahead, BatchOptions, Batcher, Batches, Course, Layout, Rank, Router, Shuffle, SlotCourse, Training,
    TrainingPlan,
};

const COLS: usize = 8;
const ROWS: usize = 4 << 20;
const BATCH: usize = 65_536;

fn input(chunk: usize) -> (SchemaRef, Vec<RecordBatch>) {
    let fields: Vec<Field> =
        (0..COLS).map(|j| Field::new(format!("c{j}"), DataType::Float32, false)).collect();
    let schema = Arc::new(Schema::new(fields));
    let batches = (0..ROWS)
        .step_by(chunk)
        .map(|start| {
            let n = chunk.min(ROWS - start);
            let cols: Vec<ArrayRef> = (0..COLS)
                .map(|j| {
                    Arc::new((start..start + n).map(|i| (i * COLS + j) as f32).collect::<Float32Array>())
                        as ArrayRef
                })
                .collect();
            RecordBatch::try_new(schema.clone(), cols).expect("a batch")
        })
        .collect();
    (schema, batches)
}

/// Every batch of `input` through [`Batches`], dropped as soon as it is made.
fn batches(schema: &SchemaRef, input: &[RecordBatch]) {
    let options = BatchOptions::new(BATCH).expect("options");
    for b in Batches::new(schema.clone(), input.iter().cloned().map(Ok), options) {
        black_box(b.expect("a batch"));
    }
}

/// The same through a [`Batcher`] and [`Ahead`] of depth 2, shuffled with `seed` in blocks of
/// one batch (one split, the order before splits), or over 8 splits of an elastic epoch.
fn batches_ahead(schema: &SchemaRef, input: &[RecordBatch], seed: Option<u64>, splits: Option<usize>) {
    let fields = schema.fields().iter().cloned().collect();
    let options = BatchOptions::new(BATCH).expect("options");
    let (course, router, order) = match (seed, splits) {
        (_, Some(k)) => {
            let units = Layout::Units(input.iter().map(|b| b.num_rows() as u64).collect());
            let training = Training {
                shuffle: seed.map(|seed| Shuffle { seed, buffer: None }),
                splits: Some(k),
                ..Training::in_order()
            };
            let plan = TrainingPlan::new(&units, &options, &training, Rank::single(), 0).expect("a plan");
            let reads = plan.reads(0);
            let router = Router::new(runs(&reads, plan.unit_rows()));
            (plan.course(0), Some(router), reads.iter().map(|r| r.unit).collect())
        }
        (Some(_), None) => {
            let slots = vec![SlotCourse { per_step: BATCH, rows: None, seed }];
            (Course { slots, ..Course::in_order(BATCH) }, None, (0..input.len()).collect())
        }
        (None, None) => (Course::in_order(BATCH), None, (0..input.len()).collect::<Vec<usize>>()),
    };
    let mut batcher =
        Batcher::new(fields, true, options).and_then(|b| b.on_course(course)).expect("a batcher");
    if let Some(router) = router {
        batcher = batcher.routing(router);
    }
    let mut ahead = Ahead::new(2);
    let drive = |batcher: &mut Batcher, ahead: &mut Ahead| {
        while let Some(w) = batcher.next_window() {
            if ahead.is_full() {
                black_box(ahead.pop().expect("pushed").expect("a batch"));
            }
            ahead.push(w);
        }
    };
    for &u in &order {
        batcher.push(input[u].columns().to_vec()).expect("pushed");
        drive(&mut batcher, &mut ahead);
    }
    batcher.end();
    drive(&mut batcher, &mut ahead);
    while let Some(b) = ahead.pop() {
        black_box(b.expect("a batch"));
    }
}

fn bench(c: &mut Criterion) {
    let (schema, big) = input(1 << 20);
    let (_, small) = input(8192);
    let flat: Vec<f32> = (0..ROWS * COLS).map(|i| i as f32).collect();
    let mut out = vec![0f32; flat.len()];
    let mut g = c.benchmark_group("batches_8xf32_4M");
    g.throughput(Throughput::Bytes((ROWS * COLS * 4) as u64)).sample_size(10);
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            out.copy_from_slice(black_box(&flat));
            black_box(&out);
        })
    });
    g.bench_function("batches", |b| b.iter(|| batches(&schema, &big)));
    g.bench_function("batches_ahead", |b| b.iter(|| batches_ahead(&schema, &big, None, None)));
    g.bench_function("batches_ahead_8192_chunks", |b| b.iter(|| batches_ahead(&schema, &small, None, None)));
    g.bench_function("batches_shuffled", |b| b.iter(|| batches_ahead(&schema, &big, Some(7), None)));
    g.bench_function("batches_shuffled_8_splits", |b| {
        b.iter(|| batches_ahead(&schema, &big, Some(7), Some(8)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

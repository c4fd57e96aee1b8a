//! Exact-size tensor batches of a running query: DataFusion's record batch stream through the
//! core's [`Batcher`], converted as they are pulled, so a result larger than memory never sits
//! in memory at once; and one rank's epoch of a training job over a plan whose partitions are
//! the units of the core's [`TrainingPlan`]: split, shuffled, resumable on another world size,
//! its partitions read ahead in parallel and handed on in the order the plan needs them.

use std::sync::Arc;

use arrow_array::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::stats::Precision;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use dlframe::batches::pass::Epoch;
use dlframe::batches::{BatchOptions, Batcher, Layout, Rank, Training, TrainingPlan};
use dlframe::table::TableTensors;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};

/// A dlframe error as DataFusion's external error, whose source is the structured
/// [`dlframe::Error`] (the SQL remedies of [`crate::external`] do not apply here: the null
/// policy is the caller's `options`).
fn external(e: dlframe::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The batches of `stream` (from `DataFrame::execute_stream`), each of exactly
/// `options.batch_size` rows (the last one fewer unless `drop_last`): zero-copy for a window
/// inside one input batch of a column without nulls, else one fused copy. The conversion runs
/// on the task that polls; move the stream to a blocking thread for large batches.
///
/// After an error (the query's, or a conversion's as [`DataFusionError::External`] over the
/// [`dlframe::Error`]), the stream ends.
pub fn tensor_batches(
    stream: SendableRecordBatchStream,
    options: BatchOptions,
) -> impl Stream<Item = Result<TableTensors>> + Send {
    let fields = stream.schema().fields().iter().cloned().collect();
    drive(stream, Batcher::new(fields, true, options).map_err(external))
}

/// One rank's epoch of batches over `plan`, whose partitions are the units: `training` says
/// the splits, `even` and the shuffle, `rank` the rank and the world ([`TrainingPlan`]), and
/// the pass starts at global step `start` (a resumed job's next step). Only the partitions
/// that hold this rank's rows are executed, up to `ahead` at once (each buffering two record
/// batches), and their rows are handed on in the order the plan needs them, whatever order the
/// threads finish in.
///
/// # Errors
/// A plan error when a partition's row count is not known exactly ahead (DataFusion knows it
/// for in-memory tables and for files with statistics and no filter); the plan's numbers
/// ([`TrainingPlan::new`]). The stream then yields the query's and the conversions' errors, and
/// a source shorter than its statistics said.
#[allow(clippy::too_many_arguments)]
pub fn epoch_batches(
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
    training: Training,
    rank: Rank,
    epoch: u64,
    start: u64,
    options: BatchOptions,
    ahead: usize,
) -> Result<impl Stream<Item = Result<TableTensors>> + Send> {
    let partitions = plan.output_partitioning().partition_count();
    let stats = StatisticsContext::new();
    let units = (0..partitions)
        .map(|i| {
            match stats.compute(plan.as_ref(), &StatisticsArgs::new().with_partition(Some(i)))?.num_rows {
                Precision::Exact(n) => Ok(n as u64),
                other => Err(DataFusionError::Plan(format!(
                    "partition {i} of the plan has {other:?} rows, not an exact count, so the ranks \
                 cannot be given their shares ahead; use tensor_batches, or a source with exact \
                 statistics (a MemTable, or Parquet files without a filter)"
                ))),
            }
        })
        .collect::<Result<Vec<u64>>>()?;
    let layout = Layout::Units(units);
    let pass = Epoch {
        plan: TrainingPlan::new(&layout, &options, &training, rank, epoch).map_err(external)?,
        start,
    };
    let read: Vec<usize> = pass.reads().iter().map(|r| r.unit).collect();
    let (setup, _) = pass.setup(options);
    let fields = plan.schema().fields().iter().cloned().collect();
    let batcher = Batcher::new(fields, true, setup.options)
        .and_then(|b| b.on_course(setup.course))
        .map(|b| b.from_source(setup.sources))
        .map(|b| match setup.router {
            Some(router) => b.routing(router),
            None => b,
        })
        .map_err(external);
    let input = futures::stream::iter(read)
        .map(move |unit| {
            let (plan, task) = (plan.clone(), task.clone());
            async move { read_ahead(plan.execute(unit, task)) }
        })
        .buffered(ahead.max(1))
        .flatten();
    Ok(drive(input, batcher))
}

/// A partition's record batches, read on a task of their own (two ahead) until the stream it
/// returns is dropped.
fn read_ahead(stream: Result<SendableRecordBatchStream>) -> impl Stream<Item = Result<RecordBatch>> + Send {
    let (mut tx, rx) = mpsc::channel(2);
    let job = SpawnedTask::spawn(async move {
        match stream {
            Ok(mut s) => {
                while let Some(b) = s.next().await {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
            }
        }
    });
    // The task is aborted when the stream (which holds it) is dropped.
    futures::stream::unfold((rx, job), |(mut rx, job)| async move { rx.next().await.map(|b| (b, (rx, job))) })
}

/// Feeds `input` to `batcher` and yields its batches; the first error ends the stream.
fn drive(
    input: impl Stream<Item = Result<RecordBatch>> + Send + 'static,
    batcher: std::result::Result<Batcher, DataFusionError>,
) -> impl Stream<Item = Result<TableTensors>> + Send {
    let input = Box::pin(input);
    futures::stream::unfold(Some((input, batcher)), |state| async move {
        let (mut input, batcher) = state?;
        let mut b = match batcher {
            Ok(b) => b,
            Err(e) => return Some((Err(e), None)),
        };
        loop {
            if let Some(ready) = b.next_ready() {
                let failed = ready.is_err();
                let item = ready.map_err(external);
                return Some((item, (!failed).then_some((input, Ok(b)))));
            }
            if b.ended() {
                return None;
            }
            let next = match input.next().await {
                None => None,
                Some(Ok(batch)) => Some(Ok(batch.columns().to_vec())),
                Some(Err(e)) => return Some((Err(e), None)),
            };
            if let Err(e) = b.feed(next) {
                return Some((Err(external(e)), None));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float32Array, Int64Array, RecordBatch};
    use datafusion::prelude::SessionContext;
    use dlframe::options::{ExportOptions, NullPolicy, Scalar};

    use super::*;

    #[tokio::test]
    async fn a_query_streams_as_exact_batches_equal_to_its_collected_result() {
        let ctx = SessionContext::new();
        // Input batches of 8192 rows from generate_series; batches of 5000 cut across them.
        let df = ctx
            .sql("SELECT value AS a, CAST(value AS FLOAT) * 0.5 AS b, CASE WHEN value % 7 = 0 THEN NULL ELSE value END AS c FROM generate_series(0, 20000)")
            .await
            .unwrap();
        let export = ExportOptions {
            nulls: NullPolicy::Fill(Scalar::Int(-1)),
            dtype: Some(dlframe::DType::Float64),
            ..Default::default()
        };
        let options = BatchOptions { export, ..BatchOptions::new(5000).unwrap() };
        let batches: Vec<_> = tensor_batches(df.execute_stream().await.unwrap(), options).collect().await;
        let sizes: Vec<i64> = batches
            .iter()
            .map(|b| match b.as_ref().unwrap() {
                TableTensors::One(c) => c.values.shape()[0],
                TableTensors::Dict(_) => unreachable!(),
            })
            .collect();
        assert_eq!(sizes, [5000, 5000, 5000, 5000, 1]);
        let mut row = 0i64;
        for b in batches {
            let TableTensors::One(c) = b.unwrap() else { unreachable!() };
            for r in c.values.as_slice::<f64>().unwrap().chunks(3) {
                let c_expected = if row % 7 == 0 { -1.0 } else { row as f64 };
                assert_eq!(r, [row as f64, row as f64 * 0.5, c_expected], "row {row}");
                row += 1;
            }
        }
        assert_eq!(row, 20001);
    }

    #[tokio::test]
    async fn a_query_error_and_a_conversion_error_end_the_stream() {
        let ctx = SessionContext::new();
        let a: Arc<dyn arrow_array::Array> = Arc::new(Int64Array::from(vec![Some(1), None, Some(3)]));
        let b: Arc<dyn arrow_array::Array> = Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0]));
        ctx.register_batch("t", RecordBatch::try_from_iter([("a", a), ("b", b)]).unwrap()).unwrap();
        let df = ctx.sql("SELECT a, b FROM t").await.unwrap();
        let got: Vec<_> =
            tensor_batches(df.execute_stream().await.unwrap(), BatchOptions::new(1).unwrap()).collect().await;
        assert_eq!(got.len(), 2, "row 0, then the nulls error of row 1, then nothing");
        let e = got[1].as_ref().unwrap_err();
        assert!(e.to_string().contains("column 'a' has 1 null(s); pass nulls='fill'"), "{e}");
        let DataFusionError::External(inner) = e else { panic!("{e:?}") };
        assert!(matches!(
            inner.downcast_ref::<dlframe::Error>(),
            Some(dlframe::Error::Nulls { null_count: 1, .. })
        ));
        let df = ctx.sql("SELECT 1 / (a - a) AS x FROM t WHERE a IS NOT NULL").await.unwrap();
        let got: Vec<_> =
            tensor_batches(df.execute_stream().await.unwrap(), BatchOptions::new(1).unwrap()).collect().await;
        assert_eq!(got.len(), 1);
        assert!(got[0].as_ref().unwrap_err().to_string().contains("Divide by zero"), "{:?}", got[0]);
    }

    /// A table of row ids in `parts` partitions of the given sizes.
    async fn partitioned(sizes: &[i64]) -> (Arc<dyn ExecutionPlan>, Arc<TaskContext>) {
        use datafusion::datasource::MemTable;
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "id",
            arrow_schema::DataType::Int64,
            false,
        )]));
        let mut next = 0;
        let parts = sizes
            .iter()
            .map(|&n| {
                let ids: Arc<dyn arrow_array::Array> = Arc::new(Int64Array::from_iter_values(next..next + n));
                next += n;
                vec![RecordBatch::try_new(schema.clone(), vec![ids]).unwrap()]
            })
            .collect();
        let ctx = SessionContext::new();
        ctx.register_table("t", Arc::new(MemTable::try_new(schema, parts).unwrap())).unwrap();
        let df = ctx.sql("SELECT id FROM t").await.unwrap();
        (df.create_physical_plan().await.unwrap(), ctx.task_ctx())
    }

    async fn ids(
        plan: &Arc<dyn ExecutionPlan>,
        task: &Arc<TaskContext>,
        (training, rank): (Training, Rank),
        start: u64,
    ) -> Vec<Vec<i64>> {
        let options = BatchOptions::new(64).unwrap();
        let stream = epoch_batches(plan.clone(), task.clone(), training, rank, 1, start, options, 3).unwrap();
        stream
            .map(|b| match b.unwrap() {
                TableTensors::One(c) => c.values.as_slice::<i64>().unwrap().to_vec(),
                TableTensors::Dict(_) => unreachable!(),
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn an_epoch_over_partitions_shards_shuffles_and_resumes() {
        use dlframe::batches::{Even, Shuffle};
        let (plan, task) = partitioned(&[300, 120, 500, 81]).await;
        let spec = |rank, seed: Option<u64>| {
            let shuffle = seed.map(|seed| Shuffle { seed, buffer: Some(128) });
            (Training { even: Even::Drop, shuffle, splits: Some(3) }, Rank::new(rank, 3).unwrap())
        };
        for seed in [None, Some(9)] {
            let mut all = Vec::new();
            let mut counts = Vec::new();
            for rank in 0..3 {
                let got = ids(&plan, &task, spec(rank, seed), 0).await;
                counts.push(got.len());
                // Resuming at any batch gives the rest of the same batches.
                for start in [1, 3] {
                    assert_eq!(ids(&plan, &task, spec(rank, seed), start).await, got[start as usize..]);
                }
                all.extend(got.into_iter().flatten());
            }
            assert!(counts.iter().all(|&c| c == counts[0]), "{counts:?}");
            // 1001 rows in steps of 192: the last step keeps 41 - 41 % 3 rows.
            assert_eq!(all.len(), 1001 - 41 % 3);
            let mut sorted = all.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), all.len(), "no row twice");
            assert_eq!(seed.is_some(), all != sorted, "shuffled only with a seed");
        }
    }

    #[tokio::test]
    async fn a_plan_without_exact_row_counts_is_refused() {
        let ctx = SessionContext::new();
        let df = ctx.sql("SELECT value FROM generate_series(1, 100) WHERE value % 3 = 0").await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let rank = Rank::new(0, 2).unwrap();
        let options = BatchOptions::new(8).unwrap();
        let e =
            epoch_batches(plan, ctx.task_ctx(), Training::in_order(), rank, 0, 0, options, 2).err().unwrap();
        assert!(e.to_string().contains("not an exact count"), "{e}");
    }
}

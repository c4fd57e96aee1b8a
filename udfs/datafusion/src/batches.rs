//! Exact-size tensor batches of a running query: DataFusion's record batch stream through the
//! core's [`Batcher`], converted as they are pulled, so a result larger than memory never sits
//! in memory at once.

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use dlframe::batches::{BatchOptions, Batcher};
use dlframe::table::TableTensors;
use futures::{Stream, StreamExt};

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
    let batcher = Batcher::new(fields, true, options).map_err(external);
    futures::stream::unfold(Some((stream, batcher)), |state| async move {
        let (mut stream, batcher) = state?;
        let mut b = match batcher {
            Ok(b) => b,
            Err(e) => return Some((Err(e), None)),
        };
        loop {
            if let Some(ready) = b.next_ready() {
                let failed = ready.is_err();
                let item = ready.map_err(external);
                return Some((item, (!failed).then_some((stream, Ok(b)))));
            }
            if b.ended() {
                return None;
            }
            let input = match stream.next().await {
                None => None,
                Some(Ok(batch)) => Some(Ok(batch.columns().to_vec())),
                Some(Err(e)) => return Some((Err(e), None)),
            };
            if let Err(e) = b.feed(input) {
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
}

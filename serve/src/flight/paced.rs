//! Every operator of a served query hands the thread back often and stops at the deadline.
//!
//! DataFusion's operators yield to the runtime only where their input does, and its
//! cooperative budget is spent at the leaves: a cross join that emits millions of rows per row
//! it reads, or a filter that keeps none of them, runs for minutes in one poll of the query's
//! task. Then the deadline never fires, a cancel is never heard, other clients cannot connect
//! and SIGTERM waits. [`pace`] puts a [`Paced`] node above every operator of the physical plan:
//! its stream returns `Pending` (waking itself at once) when its task has held the thread for
//! [`SLICE`], and an error once the query's deadline has passed. So the query's own task and the
//! tasks DataFusion spawns for it (repartitions, joins' build sides) reach an await point at
//! every operator boundary, where the deadline, a cancel or a client that went away ends them.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::Stream;

/// The longest an operator's stream runs before it hands the thread back.
pub(crate) const SLICE: Duration = Duration::from_millis(20);

/// `plan` with a [`Paced`] node above each of its operators, every one ending at `deadline`
/// (no copy of any data: the nodes wrap the operators' streams).
pub(crate) fn pace(plan: Arc<dyn ExecutionPlan>, deadline: Instant) -> Result<Arc<dyn ExecutionPlan>> {
    let children =
        plan.children().into_iter().map(|c| pace(c.clone(), deadline)).collect::<Result<Vec<_>>>()?;
    let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep);
    let plan = if children.is_empty() { plan } else { plan.replace_children(children, keep)? };
    Ok(Arc::new(Paced { input: plan, deadline }))
}

/// One operator, paced: its streams yield every [`SLICE`] and end at the deadline.
#[derive(Debug)]
pub(crate) struct Paced {
    input: Arc<dyn ExecutionPlan>,
    deadline: Instant,
}

impl DisplayAs for Paced {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Paced")
    }
}

impl ExecutionPlan for Paced {
    fn name(&self) -> &str {
        "Paced"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(Paced { input, deadline: self.deadline })),
            _ => Err(DataFusionError::Internal("Paced has one child".into())),
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let inner = self.input.execute(partition, context)?;
        Ok(Box::pin(PacedStream { inner, deadline: self.deadline, since: Instant::now() }))
    }
}

/// An operator's stream that yields every [`SLICE`] and ends with an error at the deadline.
struct PacedStream {
    inner: SendableRecordBatchStream,
    deadline: Instant,
    /// When it last handed the thread back (or began).
    since: Instant,
}

impl Stream for PacedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let now = Instant::now();
        if now >= self.deadline {
            return Poll::Ready(Some(Err(DataFusionError::ResourcesExhausted(
                "the query ran past the server's timeout".into(),
            ))));
        }
        if now.duration_since(self.since) >= SLICE {
            self.since = now;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let polled = self.inner.as_mut().poll_next(cx);
        if polled.is_pending() {
            // It waits anyway: the thread is handed back.
            self.since = Instant::now();
        }
        polled
    }
}

impl RecordBatchStream for PacedStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;
    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn every_operator_is_paced_and_the_result_is_the_same() {
        let ctx = SessionContext::new();
        let sql = "SELECT v % 7 AS k, count(*) AS n FROM generate_series(1, 100000) AS t(v) GROUP BY v % 7 ORDER BY k";
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let operators = |p: &Arc<dyn ExecutionPlan>| {
            fn count(p: &Arc<dyn ExecutionPlan>, paced: &mut usize, all: &mut usize) {
                *all += 1;
                *paced += usize::from(p.name() == "Paced");
                p.children().into_iter().for_each(|c| count(c, paced, all));
            }
            let (mut paced, mut all) = (0, 0);
            count(p, &mut paced, &mut all);
            (paced, all)
        };
        let (before, n) = operators(&plan);
        assert_eq!(before, 0);
        let paced = pace(plan, Instant::now() + Duration::from_secs(60)).unwrap();
        assert_eq!(operators(&paced), (n, 2 * n), "one Paced above each operator");
        let got = datafusion::physical_plan::collect(paced, ctx.task_ctx()).await.unwrap();
        let want = df.collect().await.unwrap();
        assert_eq!(
            datafusion::arrow::util::pretty::pretty_format_batches(&got).unwrap().to_string(),
            datafusion::arrow::util::pretty::pretty_format_batches(&want).unwrap().to_string()
        );
    }

    #[tokio::test]
    async fn a_query_past_its_deadline_ends_with_an_error() {
        let ctx = SessionContext::new();
        let df = ctx.sql("SELECT count(*) FROM generate_series(1, 10) AS t(v)").await.unwrap();
        let plan = df.create_physical_plan().await.unwrap();
        let paced = pace(plan, Instant::now()).unwrap();
        let mut stream = datafusion::physical_plan::execute_stream(paced, ctx.task_ctx()).unwrap();
        let e = stream.next().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("timeout"), "{e}");
    }
}

//! Query results as one [`Tensor`], and tensors as tables.
//!
//! [`collect_in_order`] runs a query and keeps the rows in the order of its plan's partitions:
//! without ORDER BY, a scan of CSV or Parquet files gives them in file order (files by path,
//! then rows within a file), however many partitions read it in parallel. Both the CLI and
//! [`sql_to_tensor`] collect through it.
//!
//! A result column in one batch becomes a tensor over the batch's buffer (without copying);
//! in several batches, one pass copies them into one buffer. The way back wraps each tensor's
//! memory in Arrow buffers owned by the tensor (without copying; bool tensors are bit-packed and
//! strided ones gathered, which copies) and slices the rows into one batch per partition.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{FieldRef, Schema};
use datafusion::catalog::MemTable;
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::{DataFrame, SessionContext};
use dlframe::Tensor;
use dlframe::arrow::is_list_like;
use dlframe::options::{CopyPolicy, ExportOptions, Inexact};

use crate::to_df_err;

/// One column of collected batches as one tensor: an `arrow.fixed_shape_tensor` (or nested
/// FixedSizeList) column becomes `(rows, *cell_shape)`, a numeric column `(rows,)`.
///
/// Zero-copy for one batch without nulls; several batches are concatenated in one pass into
/// one buffer (copies). Use [`dlframe::arrow::to_tensor`] directly for other null policies.
///
/// # Errors
/// An unknown column, and the errors of [`dlframe::arrow::to_tensor`] (nulls, non-numeric
/// columns), as DataFusion errors.
pub fn collect_tensor(schema: &Schema, batches: &[RecordBatch], column: &str) -> Result<Tensor> {
    let index = schema.index_of(column)?;
    let field = Arc::new(schema.field(index).clone());
    let chunks: Vec<ArrayRef> = batches.iter().map(|b| b.column(index).clone()).collect();
    let converted =
        dlframe::arrow::to_tensor(&field, &chunks, &ExportOptions::default()).map_err(to_df_err)?;
    Ok(converted.values)
}

/// A whole query result as one tensor, by the rule of Python's `dlframe.to_dlpack(table)`: a
/// result of one list or tensor column is that column's tensor, `(rows, *cell_shape)` (see
/// [`collect_tensor`]); otherwise every column is stacked into a `(rows, columns)` matrix of
/// their common dtype, so one plain column gives `(rows, 1)`.
///
/// The matrix is written in one fused pass (copies); the single tensor column is zero-copy for
/// one batch without nulls.
///
/// `inexact` says what the cast to the common dtype does with an integer the float cannot hold
/// exactly (int64 and uint64 columns together become float64).
///
/// # Errors
/// No columns, a list or tensor column among several (collect it by name), and the errors of
/// [`dlframe::arrow::columns_to_tensor`] (nulls, non-numeric columns, inexact integers).
pub fn collect_result(schema: &Schema, batches: &[RecordBatch], inexact: Inexact) -> Result<Tensor> {
    let fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
    let is_list = |f: &FieldRef| is_list_like(f.data_type());
    match fields.as_slice() {
        [] => return Err(DataFusionError::Plan("the query returns no columns".into())),
        [only] if is_list(only) => return collect_tensor(schema, batches, only.name()),
        _ => {}
    }
    if let Some(list) = fields.iter().find(|f| is_list(f)) {
        return Err(DataFusionError::Plan(format!(
            "the result has {} columns and '{}' is a list or tensor column, which does not stack \
             with others; collect one column by name",
            fields.len(),
            list.name()
        )));
    }
    let columns: Vec<Vec<ArrayRef>> =
        (0..fields.len()).map(|i| batches.iter().map(|b| b.column(i).clone()).collect()).collect();
    let opts = ExportOptions { inexact, ..Default::default() };
    let converted = dlframe::arrow::columns_to_tensor(&fields, &columns, &opts).map_err(to_df_err)?;
    Ok(converted.values)
}

/// Runs `df` and returns its batches in file order when the query has no ORDER BY: the
/// partitions are collected in parallel and concatenated in partition order, not in the order
/// they finish (which `DataFrame::collect` uses).
///
/// A file scan's partitions are planned as contiguous ranges in file order (files sorted by
/// path, large files split by byte range), so their concatenation is the files' row order. The
/// query runs with three session settings turned off, because each breaks that: round-robin
/// repartitioning (which deals batches out to partitions in turn), file-stream work stealing
/// (an idle partition takes another's next file at run time), and grouping files by statistics
/// (which reorders them). The caller's session is not changed. An ORDER BY result is one sorted partition; with joins, aggregates or LIMIT without
/// ORDER BY, the order is whatever the plan gives.
///
/// Holds the whole result in memory, as `collect` does; the batches are not copied.
///
/// # Errors
/// Planning and execution errors.
pub async fn collect_in_order(df: DataFrame) -> Result<Vec<RecordBatch>> {
    let (mut state, plan) = df.into_parts();
    let options = state.config_mut().options_mut();
    options.optimizer.enable_round_robin_repartition = false;
    options.execution.split_file_groups_by_statistics = false;
    options.execution.enable_file_stream_work_stealing = false;
    let partitions = DataFrame::new(state, plan).collect_partitioned().await?;
    Ok(partitions.into_iter().flatten().collect())
}

/// Runs `sql` and collects `column` (or the only column) of its result as one tensor; see
/// [`collect_tensor`].
///
/// Needs the `sql` feature (on by default).
///
/// # Errors
/// Planning and execution errors, a result with several columns and no `column` named, and
/// the errors of [`collect_tensor`].
#[cfg(feature = "sql")]
pub async fn sql_to_tensor(ctx: &SessionContext, sql: &str, column: Option<&str>) -> Result<Tensor> {
    let df = ctx.sql(sql).await?;
    let schema: arrow_schema::SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let name = match column {
        Some(c) => c.to_string(),
        None if schema.fields().len() == 1 => schema.field(0).name().clone(),
        None => {
            return Err(DataFusionError::Plan(format!(
                "the query returns {} columns; name the one to collect",
                schema.fields().len()
            )));
        }
    };
    let batches = collect_in_order(df).await?;
    collect_tensor(&schema, &batches, &name)
}

/// Tensors as the columns of an in-memory table, their rows split into `partitions` batches
/// (without copying, except bool tensors, which Arrow bit-packs, and strided tensors, which are
/// gathered). 1-D tensors become plain columns, N-d ones `arrow.fixed_shape_tensor` columns.
///
/// # Errors
/// No columns, columns of different lengths, and the errors of
/// [`dlframe::arrow::tensor_to_column_with`] (device memory).
pub fn tensors_to_table(columns: &[(&str, &Tensor)], partitions: usize) -> Result<MemTable> {
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays = Vec::with_capacity(columns.len());
    for (name, tensor) in columns {
        if tensor.ndim() == 0 {
            return Err(DataFusionError::Plan(format!(
                "column '{name}' is a 0-d tensor; a table needs rows"
            )));
        }
        let (field, array) =
            dlframe::arrow::tensor_to_column_with(tensor, name, CopyPolicy::IfNeeded).map_err(to_df_err)?;
        fields.push(field.as_ref().clone().with_name(*name));
        arrays.push(array);
    }
    if fields.is_empty() {
        return Err(DataFusionError::Plan("a table needs at least one tensor".into()));
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), arrays)?;
    let rows = batch.num_rows();
    let parts = partitions.clamp(1, rows.max(1));
    let step = rows.div_ceil(parts).max(1);
    let batches: Vec<Vec<RecordBatch>> = (0..rows.max(1))
        .step_by(step)
        .map(|start| vec![batch.slice(start.min(rows), step.min(rows - start.min(rows)))])
        .collect();
    MemTable::try_new(schema, batches)
}

/// Registers tensors as table `name` in `ctx`, one batch per target partition (without
/// copying; see [`tensors_to_table`]).
///
/// # Errors
/// As [`tensors_to_table`], and a name already taken.
pub fn register_tensors(ctx: &SessionContext, name: &str, columns: &[(&str, &Tensor)]) -> Result<()> {
    let partitions = ctx.copied_config().target_partitions();
    ctx.register_table(name, Arc::new(tensors_to_table(columns, partitions)?))?;
    Ok(())
}

//! Query results as one [`Tensor`], and tensors as tables.
//!
//! A result column in one batch becomes a tensor over the batch's buffer (without copying);
//! in several batches, one pass copies them into one buffer. The way back wraps each tensor's
//! memory in Arrow buffers owned by the tensor (without copying; bool tensors are bit-packed and
//! strided ones gathered, which copies) and slices the rows into one batch per partition.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use datafusion::catalog::MemTable;
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use dlframe::Tensor;
use dlframe::arrow::{CopyPolicy, ExportOptions};

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

/// Runs `sql` and collects `column` (or the only column) of its result as one tensor; see
/// [`collect_tensor`].
///
/// # Errors
/// Planning and execution errors, a result with several columns and no `column` named, and
/// the errors of [`collect_tensor`].
pub async fn sql_to_tensor(ctx: &SessionContext, sql: &str, column: Option<&str>) -> Result<Tensor> {
    let df = ctx.sql(sql).await?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
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
    let batches = df.collect().await?;
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

//! dlframe for DataFusion 55: `SELECT to_tensor(a, b, c) FROM t`, query results as one
//! [`Tensor`], and tensors as tables.
//!
//! | SQL function | result | data movement |
//! |---|---|---|
//! | `to_tensor(x1, ..., xk)` | `arrow.fixed_shape_tensor` `[k]` of the common type | one fused pass (cast, interleave) |
//! | `to_tensor_fill(fill, x1, ..., xk)` | the same, nulls replaced by `fill` | one fused pass |
//! | `to_tensor_as('float32', x1, ..., xk)` | the same, of the named dtype (checked casts) | one fused pass |
//! | `to_tensor(fsl_col)` | a tensor of the list's shape (nested lists give N-d cells) | zero-copy without nulls |
//! | `to_tensor(list_col, d1, ...)` | equal-length List/LargeList as tensors of shape `[d1, ...]` | zero-copy without nulls; ragged rows are an error naming the row |
//! | `to_tensor_padded(list_col, max_len, pad)` | ragged List/LargeList rows as `[max_len]` tensors, truncated or padded with `pad` (also for null rows and elements) | one pass |
//! | `tensor_shape(t)`, `tensor_ndim(t)`, `tensor_dtype(t)` | the cell shape, rank and dtype | metadata only |
//! | `tensor_reshape(t, d1, ...)` | the same values under another cell shape (`-1` infers one dimension) | zero-copy |
//! | `tensor_element(t, i1, ...)` | one element of each cell (negative indices count from the end) | one gather |
//!
//! `to_tensor_fill` and `to_tensor_as` take the same list arguments as `to_tensor`. Nulls are an
//! error by default that names the column and suggests `to_tensor_fill`. An integer that the
//! float dtype holds only rounded (int64 2^53 + 1 into float64) is an error naming its row and
//! column, unless the session says `SET dlframe.inexact = 'round'` ([`DlframeOptions`], added
//! by [`register`]).
//!
//! [`register`] adds every function to a [`SessionContext`]; the UDFs are plain
//! [`ScalarUDF`]s, so anything that registers built-ins (a Ballista executor, a
//! datafusion-ffi host) registers these the same way. [`collect_tensor`] turns a query's tensor
//! column into one [`Tensor`] (zero-copy for one batch, one pass into one buffer otherwise), and
//! [`register_tensors`] serves tensors as a table without copying them.
//!
//! [`tensor_batches`] streams a query's result as tensors of an exact number of rows, for
//! results larger than memory; [`epoch_batches`] gives one rank of a training job its share of
//! a plan's partitions, shuffled and resumable, reading several partitions at once.
//!
//! Errors from dlframe become DataFusion errors in one place, [`to_df_err`].
//!
//! Feature `sql` (default): [`sql_to_tensor`], which plans SQL text with DataFusion's parser.
//! Feature `files`: the [`files`] module, CSV, `.csv.gz` and Parquet files registered as tables
//! (DataFusion's Parquet reader), which the `dlframe` command (`dlframe-cli`, `cli/`) and its
//! servers (`dlframe-serve`, `serve/`) share.

/// One UDF struct: its `Signature`, `Default` -> `new()`, the SQL name, and the rest of its
/// `ScalarUDFImpl` items.
macro_rules! scalar_udf {
    ($(#[$doc:meta])* $name:ident, $sql:literal, $signature:expr; $($items:item)*) => {
        $(#[$doc])*
        #[derive(Debug, PartialEq, Eq, Hash)]
        pub struct $name {
            signature: datafusion::logical_expr::Signature,
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl $name {
            /// The function, ready to wrap in a `ScalarUDF`.
            pub fn new() -> Self {
                Self { signature: $signature }
            }
        }

        impl datafusion::logical_expr::ScalarUDFImpl for $name {
            fn name(&self) -> &str {
                $sql
            }

            fn signature(&self) -> &datafusion::logical_expr::Signature {
                &self.signature
            }

            $($items)*
        }
    };
}
pub(crate) use scalar_udf;

mod args;
mod batches;
mod config;
#[cfg(feature = "files")]
pub mod files;
mod inspect;
mod padded;
mod table;
mod tensor_type;
mod to_tensor;

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;

pub use batches::{epoch_batches, tensor_batches};
pub use config::DlframeOptions;
pub use inspect::{TensorDtypeFunc, TensorElementFunc, TensorNdimFunc, TensorReshapeFunc, TensorShapeFunc};
pub use padded::ToTensorPaddedFunc;
#[cfg(feature = "sql")]
pub use table::sql_to_tensor;
pub use table::{collect_in_order, collect_result, collect_tensor, register_tensors, tensors_to_table};
pub use tensor_type::tensor_type;
pub use to_tensor::{ToTensorAsFunc, ToTensorFillFunc, ToTensorFunc};

pub use dlframe::Tensor;

/// Every function of this package, as ready-to-register UDFs.
pub fn functions() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::from(ToTensorFunc::new())),
        Arc::new(ScalarUDF::from(ToTensorFillFunc::new())),
        Arc::new(ScalarUDF::from(ToTensorAsFunc::new())),
        Arc::new(ScalarUDF::from(ToTensorPaddedFunc::new())),
        Arc::new(ScalarUDF::from(TensorShapeFunc::new())),
        Arc::new(ScalarUDF::from(TensorNdimFunc::new())),
        Arc::new(ScalarUDF::from(TensorDtypeFunc::new())),
        Arc::new(ScalarUDF::from(TensorReshapeFunc::new())),
        Arc::new(ScalarUDF::from(TensorElementFunc::new())),
    ]
}

/// Registers every function in `registry` (a `SessionState`, a `SessionContext`, or an
/// executor's registry).
///
/// # Errors
/// The registry's own errors.
pub fn register_all(registry: &mut dyn FunctionRegistry) -> datafusion::common::Result<()> {
    for udf in functions() {
        registry.register_udf(udf)?;
    }
    Ok(())
}

/// Registers every function in a [`SessionContext`]: the one call an analytics service makes.
pub fn register(ctx: &SessionContext) {
    config::add_options(ctx);
    for udf in functions() {
        ctx.register_udf(udf.as_ref().clone());
    }
}

/// The one mapping of dlframe errors to DataFusion errors: bad input found while running is an
/// execution error, whose message carries dlframe's reason and remedy.
pub fn to_df_err(e: dlframe::Error) -> DataFusionError {
    match e {
        dlframe::Error::Arrow(a) => DataFusionError::ArrowError(Box::new(a), None),
        dlframe::Error::Nulls { column, null_count } => DataFusionError::Execution(format!(
            "column {column} has {null_count} null(s); fill them in the same pass with \
             to_tensor_fill(0, ...), or drop those rows with WHERE ... IS NOT NULL"
        )),
        // SET works only where the session has dlframe's options and takes SET (not a served
        // one); a cast in the query rounds on every route.
        dlframe::Error::InexactCast { value, place, target } => DataFusionError::Execution(format!(
            "{value} {place} has no exact {target}; round it in the query as numpy does, \
             CAST(x AS DOUBLE), or SET dlframe.inexact = 'round' in a session with dlframe's \
             options (dlframe --inexact round; in datafusion-python, a context made with \
             SessionConfig().with_extension(dlframe.datafusion.options()))"
        )),
        e => DataFusionError::Execution(e.to_string()),
    }
}

/// A conversion error of a SQL function over a batch of `rows` rows: its rows count from the
/// batch's start, since where DataFusion's batch lies in the result is not known.
pub(crate) fn batch_err(e: dlframe::Error, rows: usize) -> DataFusionError {
    to_df_err(e.at_rows(|row| (row, dlframe::Rows::Batch { len: rows as u64 })))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn names_and_aliases_are_unique() {
        let mut seen = HashSet::new();
        for f in functions() {
            for name in std::iter::once(f.name()).chain(f.aliases().iter().map(String::as_str)) {
                assert!(seen.insert(name.to_string()), "{name} registered twice");
            }
        }
        assert_eq!(seen.len(), 9);
    }
}

//! `to_tensor`, `to_tensor_fill` and `to_tensor_as`: numeric columns stacked into one
//! `arrow.fixed_shape_tensor` column, or list columns read as tensors.
//!
//! Scalar columns are cast to the common (or named) dtype, interleaved row by row, and their
//! nulls filled, in one pass of dlframe's fused kernel (copies). A FixedSizeList column, or an
//! equal-length List column, keeps its values buffer when it has no nulls and already has the
//! dtype (without copying).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeListArray};
use arrow_schema::{DataType, Field, FieldRef};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, Signature, Volatility,
};
use dlframe::arrow::{TensorMetadata, is_list_like};
use dlframe::dtype::field_dtype;
use dlframe::kernels::common_dtype;
use dlframe::options::{CopyPolicy, ExportOptions, NullPolicy, Order};
use dlframe::{DType, Tensor};

use crate::args;
use crate::tensor_type::{item_field, tensor_field, tensor_type};
use crate::{batch_err, to_df_err};
use dlframe::arrow::CellLayout;

/// Which options precede the data arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Options {
    /// `to_tensor(x, ...)`
    None,
    /// `to_tensor_fill(fill, x, ...)`
    Fill,
    /// `to_tensor_as(dtype, x, ...)`
    As,
}

impl Options {
    fn count(self) -> usize {
        match self {
            Options::None => 0,
            Options::Fill | Options::As => 1,
        }
    }
}

/// The output field, worked out from the argument types and the literal options.
fn plan(func: &str, options: Options, args: &ReturnFieldArgs) -> Result<FieldRef> {
    let skip = options.count();
    let fields = args.arg_fields;
    if fields.len() <= skip {
        return plan_err!("{func}: give at least one column");
    }
    let requested = match options {
        Options::As => Some(args::dtype(func, args::planned(func, "dtype", args.scalar_arguments, 0)?)?),
        Options::Fill => {
            args::planned_fill(func, args.scalar_arguments, fields, 0)?;
            None
        }
        Options::None => None,
    };
    let data = &fields[skip..];
    let (meta, leaf) = if is_list_like(data[0].data_type()) {
        let given = data[1..]
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let v = args::planned(func, "a dimension", args.scalar_arguments, skip + 1 + i)?;
                args::int(func, "a dimension", v)
            })
            .collect::<Result<Vec<_>>>()?;
        list_plan(func, &data[0], &given, requested)?
    } else {
        let mut dtypes = Vec::with_capacity(data.len());
        for f in data {
            if f.data_type() == &DataType::Null && f.name().ends_with('*') {
                // DataFusion 55 passes `*` to a scalar function unexpanded, as a Null argument.
                return plan_err!(
                    "{func}: DataFusion does not expand {0} inside a function call; name the \
                     columns, {func}(a, b, c), or select them without a function (SELECT {0}): \
                     the dlframe CLI and dlframe.to_dlpack stack a result's columns into one \
                     (rows, columns) matrix",
                    f.name()
                );
            }
            if is_list_like(f.data_type()) {
                return plan_err!(
                    "{func}: column '{}' is a list; stack scalar columns, or convert one list column \
                     on its own",
                    f.name()
                );
            }
            match field_dtype(f) {
                Ok(d) => dtypes.push(d),
                Err(e) => return plan_err!("{func}: column '{}': {e}", f.name()),
            }
        }
        let dtype = requested.unwrap_or_else(|| common_dtype(&dtypes));
        let meta = TensorMetadata { shape: vec![data.len()], dim_names: None, permutation: None };
        (meta, item_field(dtype))
    };
    let field = tensor_field(func, leaf, &meta, false).map_err(|e| plan_error(func, e))?;
    Ok(Arc::new(field))
}

/// The cell shape and leaf field of `to_tensor(list_col, d1, ...)`.
fn list_plan(
    func: &str,
    field: &FieldRef,
    given: &[i64],
    requested: Option<DType>,
) -> Result<(TensorMetadata, FieldRef)> {
    let (meta, leaf) = match field.data_type() {
        DataType::List(child) | DataType::LargeList(child) => {
            if is_list_like(child.data_type()) {
                return plan_err!(
                    "{func}: column '{}' is a list of lists; only FixedSizeList nests",
                    field.name()
                );
            }
            if given.is_empty() {
                return plan_err!(
                    "{func}: column '{0}' is a variable-length list, so its row length is unknown \
                     while planning; give it: {func}({0}, d) or {func}({0}, d1, d2, ...)",
                    field.name()
                );
            }
            let shape = args::dims(func, given, None)?;
            (TensorMetadata { shape, dim_names: None, permutation: None }, child.clone())
        }
        _ => {
            let t = tensor_type(field).map_err(|e| plan_error(func, e))?;
            let meta = if given.is_empty() {
                t.physical()
            } else if t.metadata.as_ref().is_some_and(|m| m.permutation.is_some()) {
                return plan_err!(
                    "{func}: column '{}' is a permuted tensor; reshaping it needs a copy in logical \
                     order, which this function does not make",
                    field.name()
                );
            } else {
                let shape = args::dims(func, given, Some(t.cell))?;
                TensorMetadata { shape, dim_names: None, permutation: None }
            };
            (meta, t.leaf.clone())
        }
    };
    let leaf_dtype = field_dtype(&leaf).map_err(|e| plan_error(func, e))?;
    let dtype = requested.unwrap_or(leaf_dtype);
    Ok((meta, item_field(dtype)))
}

fn plan_error(func: &str, e: dlframe::Error) -> datafusion::common::DataFusionError {
    datafusion::common::DataFusionError::Plan(format!("{func}: {e}"))
}

/// Runs the conversion for one batch.
fn invoke(func: &str, options: Options, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
    let skip = options.count();
    let nulls = match options {
        Options::Fill => NullPolicy::Fill(args::fill(func, &args::invoked(func, &args.args[0])?)?),
        _ => NullPolicy::Error,
    };
    let out = tensor_type(&args.return_field).map_err(to_df_err)?;
    let opts = ExportOptions {
        nulls,
        copy: CopyPolicy::IfNeeded,
        dtype: Some(out.dtype),
        order: Order::C,
        inexact: crate::config::inexact(&args.config_options)?,
        ..Default::default()
    };
    let n = args.number_rows;
    let data_fields = &args.arg_fields[skip..];
    let first = args.args[skip].clone().into_array(n)?;
    let tensor = if is_list_like(data_fields[0].data_type()) {
        // The storage is read as plain (nested) lists; the cell shape comes from the plan.
        let plain: FieldRef = Arc::new(Field::new(
            data_fields[0].name(),
            data_fields[0].data_type().clone(),
            data_fields[0].is_nullable(),
        ));
        check_row_lengths(func, &plain, first.as_ref(), &out)?;
        let converted = dlframe::arrow::to_tensor(&plain, &[first], &opts).map_err(|e| batch_err(e, n))?;
        converted.values
    } else {
        let mut columns = vec![vec![first]];
        for a in &args.args[skip + 1..] {
            columns.push(vec![a.clone().into_array(n)?]);
        }
        dlframe::arrow::columns_to_tensor(data_fields, &columns, &opts).map_err(|e| batch_err(e, n))?.values
    };
    let array = fixed_list(&tensor, &out, n)?;
    Ok(ColumnarValue::Array(array))
}

/// Names the first non-null row of a List/LargeList whose length is not the planned cell size.
fn check_row_lengths(func: &str, field: &Field, array: &dyn Array, out: &CellLayout) -> Result<()> {
    let lengths: Box<dyn Iterator<Item = usize>> = match array.data_type() {
        DataType::List(_) => Box::new(array.as_list::<i32>().offsets().lengths()),
        DataType::LargeList(_) => Box::new(array.as_list::<i64>().offsets().lengths()),
        _ => return Ok(()),
    };
    for (row, len) in lengths.enumerate() {
        if len != out.cell && array.is_valid(row) {
            return datafusion::common::exec_err!(
                "{func}: row {row} of list column '{}' (in a batch of {} rows, counted from its start) has \
                 {len} elements, but the shape {:?} needs {}; for rows of different lengths use \
                 to_tensor_padded({0}, max_len, pad)",
                field.name(),
                array.len(),
                out.physical().shape,
                out.cell
            );
        }
    }
    Ok(())
}

/// Wraps a C-contiguous `(n, ...)` tensor as the flat FixedSizeList storage of `out` (without
/// copying, except that bool values are bit-packed).
pub(crate) fn fixed_list(tensor: &Tensor, out: &CellLayout, n: usize) -> Result<ArrayRef> {
    let flat = tensor.reshape(vec![(n * out.cell) as i64]).map_err(to_df_err)?;
    let (_, values) =
        dlframe::arrow::tensor_to_column_with(&flat, "", CopyPolicy::IfNeeded).map_err(to_df_err)?;
    let values = if values.data_type() == out.leaf.data_type() {
        values
    } else {
        // A temporal leaf asked for by name keeps its Arrow type over the same buffer.
        values
            .to_data()
            .into_builder()
            .data_type(out.leaf.data_type().clone())
            .build()
            .map(arrow_array::make_array)?
    };
    let list = FixedSizeListArray::try_new_with_length(out.leaf.clone(), out.cell as i32, values, None, n)?;
    Ok(Arc::new(list))
}

macro_rules! to_tensor_udf {
    ($(#[$doc:meta])* $name:ident, $sql:literal, $options:expr) => {
        crate::scalar_udf! {
            $(#[$doc])*
            $name, $sql, Signature::variadic_any(Volatility::Immutable);

            fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
                datafusion::common::internal_err!("{} uses return_field_from_args", $sql)
            }

            fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
                plan($sql, $options, &args)
            }

            fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
                invoke($sql, $options, args)
            }

            fn simplify(&self, args: Vec<Expr>, _info: &SimplifyContext) -> Result<ExprSimplifyResult> {
                if $options == Options::Fill {
                    args::require_literal($sql, "fill value", &args, 0)?;
                }
                Ok(ExprSimplifyResult::Original(args))
            }
        }
    };
}

to_tensor_udf!(
    /// `to_tensor(x1, ..., xk)` stacks numeric columns into a `[k]` tensor per row (one fused
    /// pass, copies), and `to_tensor(list_col[, d1, ...])` reads list rows as tensors (without
    /// copying when there are no nulls). Nulls are an error that names the column.
    ToTensorFunc,
    "to_tensor",
    Options::None
);
to_tensor_udf!(
    /// `to_tensor_fill(fill, x1, ...)`: `to_tensor` with nulls replaced by `fill` in the same
    /// pass (copies).
    ToTensorFillFunc,
    "to_tensor_fill",
    Options::Fill
);
to_tensor_udf!(
    /// `to_tensor_as('float32', x1, ...)`: `to_tensor` cast to the named dtype in the same pass,
    /// with checked narrowing (copies unless the dtype already matches a list column's).
    ToTensorAsFunc,
    "to_tensor_as",
    Options::As
);

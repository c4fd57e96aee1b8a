//! `to_tensor_padded(list_col, max_len, pad)`: a List or LargeList column whose rows have
//! different lengths as a `[max_len]` tensor per row, each row truncated or padded with `pad`.
//!
//! The rows are padded by dlframe's ragged conversion (`ragged="pad"` in Python), one pass
//! after the values are read (copies). `pad` stands for every missing value: the slots past a
//! row's end, a null row (all `pad`) and a null element. The lengths are `array_length(list_col)`
//! (or `cardinality`) in SQL, clipped to `max_len`.

use std::sync::Arc;

use arrow_schema::{DataType, Field, FieldRef};
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, Signature, Volatility,
};
use dlframe::arrow::{TensorMetadata, is_list_like};
use dlframe::dtype::field_dtype;
use dlframe::options::{ExportOptions, NullPolicy, Ragged};

use crate::args;
use crate::tensor_type::{item_field, tensor_field, tensor_type};
use crate::to_df_err;
use crate::to_tensor::fixed_list;

const FUNC: &str = "to_tensor_padded";

/// The planned width: a literal integer >= 0.
fn width(v: &datafusion::common::ScalarValue) -> Result<usize> {
    let w = args::int(FUNC, "max_len", v)?;
    usize::try_from(w).or_else(|_| plan_err!("{FUNC}: max_len must be >= 0, found {w}"))
}

fn plan(a: &ReturnFieldArgs) -> Result<FieldRef> {
    let [list, _, _] = a.arg_fields else {
        return plan_err!("{FUNC}: takes (list_col, max_len, pad)");
    };
    let (DataType::List(child) | DataType::LargeList(child)) = list.data_type() else {
        return plan_err!(
            "{FUNC}: column '{}' is a {}, not a List or LargeList",
            list.name(),
            list.data_type()
        );
    };
    if is_list_like(child.data_type()) {
        return plan_err!("{FUNC}: column '{}' is a list of lists; pad a list of numbers", list.name());
    }
    let max_len = width(args::planned(FUNC, "max_len", a.scalar_arguments, 1)?)?;
    args::planned_fill(FUNC, a.scalar_arguments, a.arg_fields, 2)?;
    let dtype = field_dtype(child).or_else(|e| plan_err!("{FUNC}: column '{}': {e}", list.name()))?;
    let meta = TensorMetadata { shape: vec![max_len], dim_names: None, permutation: None };
    let field = tensor_field(FUNC, item_field(dtype), &meta, false).or_else(|e| plan_err!("{FUNC}: {e}"))?;
    Ok(Arc::new(field))
}

fn invoke(a: ScalarFunctionArgs) -> Result<ColumnarValue> {
    let n = a.number_rows;
    let max_len = width(&args::invoked(FUNC, &a.args[1])?)?;
    let pad = args::fill(FUNC, &args::invoked(FUNC, &a.args[2])?)?;
    let out = tensor_type(&a.return_field).map_err(to_df_err)?;
    let opts = ExportOptions {
        nulls: NullPolicy::Fill(pad),
        dtype: Some(out.dtype),
        ragged: Ragged::Pad { pad, max_len: Some(max_len) },
        ..Default::default()
    };
    let f = &a.arg_fields[0];
    let plain: FieldRef = Arc::new(Field::new(f.name(), f.data_type().clone(), true));
    let array = a.args[0].clone().into_array(n)?;
    let padded = dlframe::arrow::to_tensor(&plain, &[array], &opts).map_err(to_df_err)?;
    Ok(ColumnarValue::Array(fixed_list(&padded.values, &out, n)?))
}

crate::scalar_udf! {
    /// `to_tensor_padded(list_col, max_len, pad)`: ragged list rows as `[max_len]` tensors,
    /// truncated or padded with `pad` (which also replaces null rows and null elements); one
    /// pass (copies).
    ToTensorPaddedFunc, "to_tensor_padded", Signature::any(3, Volatility::Immutable);

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        datafusion::common::internal_err!("{FUNC} uses return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        plan(&args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        invoke(args)
    }

    fn simplify(&self, args: Vec<Expr>, _info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        args::require_literal(FUNC, "max_len", &args, 1)?;
        args::require_literal(FUNC, "pad", &args, 2)?;
        Ok(ExprSimplifyResult::Original(args))
    }
}

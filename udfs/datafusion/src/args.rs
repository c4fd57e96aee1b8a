//! Literal arguments (dtype names, fill values, dimensions), read the same way at planning
//! time (from `scalar_arguments`) and at run time (a scalar, or over datafusion-ffi a
//! one-value-per-row array).
//!
//! A fill value may also be a constant expression such as `CAST('NaN' AS DOUBLE)`: the SQL
//! planner asks for the output type before the optimizer folds it into a literal, so
//! [`planned_fill`] lets a number-typed expression through, [`require_literal`] refuses it
//! after folding if it is still not a literal, and [`invoked`] refuses a value that differs
//! between rows.

use arrow_schema::{DataType, FieldRef};
use datafusion::arrow::compute::kernels::cmp::not_distinct;
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, Expr};
use dlframe::DType;
use dlframe::options::Scalar;

/// The literal at position `i` while planning, or a plan error that says a literal is needed.
pub fn planned<'a>(
    func: &str,
    what: &str,
    scalars: &'a [Option<&'a ScalarValue>],
    i: usize,
) -> Result<&'a ScalarValue> {
    match scalars.get(i).copied().flatten() {
        Some(v) => Ok(v),
        None => plan_err!("{func}: argument {} ({what}) must be a literal", i + 1),
    }
}

/// The fill value at position `i` while planning: the literal's value, or `None` for an
/// expression of a number or boolean type not yet folded into a literal (such as
/// `CAST('NaN' AS DOUBLE)`); anything else is a plan error.
pub fn planned_fill(
    func: &str,
    scalars: &[Option<&ScalarValue>],
    fields: &[FieldRef],
    i: usize,
) -> Result<Option<Scalar>> {
    let foldable = |f: &FieldRef| f.data_type().is_numeric() || f.data_type() == &DataType::Boolean;
    match scalars.get(i).copied().flatten() {
        Some(v) => fill(func, v).map(Some),
        None if fields.get(i).is_some_and(foldable) => Ok(None),
        None => planned(func, "fill value", scalars, i).map(|_| None),
    }
}

/// Refuses argument `i` when it is not a literal once the optimizer has folded constants (the
/// `simplify` step of a UDF, which sees the folded arguments).
pub fn require_literal(func: &str, what: &str, args: &[Expr], i: usize) -> Result<()> {
    match args.get(i) {
        Some(Expr::Literal(..)) | None => Ok(()),
        Some(_) => plan_err!("{func}: argument {} ({what}) must be a literal", i + 1),
    }
}

/// The value of a literal argument while running: a scalar, or an array holding that one value
/// in every row (a literal over datafusion-ffi). An array whose rows differ is a column, and an
/// error.
pub fn invoked(func: &str, arg: &ColumnarValue) -> Result<ScalarValue> {
    match arg {
        ColumnarValue::Scalar(v) => Ok(v.clone()),
        ColumnarValue::Array(a) if !a.is_empty() => {
            let n = a.len();
            let same = not_distinct(&a.slice(0, n - 1), &a.slice(1, n - 1))?;
            if same.true_count() != n - 1 {
                return exec_err!("{func}: a literal argument varies between rows; it must be a literal");
            }
            ScalarValue::try_from_array(a, 0)
        }
        ColumnarValue::Array(_) => exec_err!("{func}: a literal argument arrived as an empty array"),
    }
}

/// A dtype name such as `'float32'`.
pub fn dtype(func: &str, v: &ScalarValue) -> Result<DType> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => {
            DType::from_name(s).or_else(|e| plan_err!("{func}: {e}"))
        }
        other => plan_err!("{func}: the dtype must be a string such as 'float32', found {other:?}"),
    }
}

/// A fill value: an integer, float or boolean literal.
pub fn fill(func: &str, v: &ScalarValue) -> Result<Scalar> {
    let s = match v {
        ScalarValue::Boolean(Some(b)) => Scalar::Bool(*b),
        ScalarValue::Float16(Some(f)) => Scalar::Float(f64::from(*f)),
        ScalarValue::Float32(Some(f)) => Scalar::Float(f64::from(*f)),
        ScalarValue::Float64(Some(f)) => Scalar::Float(*f),
        ScalarValue::UInt64(Some(u)) => match i64::try_from(*u) {
            Ok(i) => Scalar::Int(i),
            Err(_) => Scalar::Float(*u as f64),
        },
        v if v.data_type().is_integer() && !v.is_null() => Scalar::Int(int(func, "fill value", v)?),
        other => return plan_err!("{func}: the fill value must be a number or a boolean, found {other:?}"),
    };
    Ok(s)
}

/// An integer literal.
pub fn int(func: &str, what: &str, v: &ScalarValue) -> Result<i64> {
    match v.cast_to(&arrow_schema::DataType::Int64) {
        Ok(ScalarValue::Int64(Some(i))) if v.data_type().is_integer() => Ok(i),
        _ => plan_err!("{func}: {what} must be an integer, found {v:?}"),
    }
}

/// Dimensions `d1, ...` with at most one `-1`, resolved against `total` elements when known.
pub fn dims(func: &str, given: &[i64], total: Option<usize>) -> Result<Vec<usize>> {
    if given.is_empty() {
        return plan_err!("{func}: give at least one dimension");
    }
    let unknown = given.iter().filter(|&&d| d == -1).count();
    if unknown > 1 || given.iter().any(|&d| d < -1) {
        return plan_err!("{func}: dimensions must be >= 0, with at most one -1; found {given:?}");
    }
    let known: usize = given.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product();
    let out: Vec<usize> = match (unknown, total) {
        (0, _) => given.iter().map(|&d| d as usize).collect(),
        (_, Some(t)) if known > 0 && t % known == 0 => {
            given.iter().map(|&d| if d == -1 { t / known } else { d as usize }).collect()
        }
        (_, Some(t)) => return plan_err!("{func}: cannot infer -1 in {given:?} from {t} elements per cell"),
        (_, None) => {
            return plan_err!(
                "{func}: -1 needs the row length, which a variable-length list does not have; \
                 give every dimension"
            );
        }
    };
    let cell = out.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match (cell, total) {
        (None, _) => plan_err!("{func}: shape {out:?} overflows"),
        (Some(c), Some(t)) if c != t => {
            plan_err!("{func}: shape {out:?} holds {c} elements but each cell has {t}")
        }
        _ => Ok(out),
    }
}

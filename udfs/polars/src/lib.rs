//! Polars expression plugins on dlframe's fused kernels (pyo3-polars 0.28).
//!
//! `to_tensor(*exprs)` stacks k columns into one `Array(T, k)` column, with the cast to one
//! dtype and the null fill done in one pass over the inputs; `to_tensor(list_expr, width=d)`
//! turns equal-length lists into an `Array(T, d)` column; `to_tensor_padded(list_expr, max_len)`
//! pads or truncates lists of any lengths into an `Array(T, max_len)` column. The result shares the kernel's output
//! buffer (no further copy), so it leaves Polars through DLPack zero-copy as an `(n, k)` tensor.
//!
//! The expressions are elementwise: Polars may call them on any slice of rows, in lazy and
//! streaming queries and inside `group_by`. The plugin symbols are linked into the Python
//! extension (`dlframe._native`), which Polars loads as the plugin library.
//!
//! Errors become Polars errors in [`polars_error`], the one place this boundary maps them.

use dlframe::arrow::CellLayout;
use dlframe::options::{CopyPolicy, ExportOptions, Inexact, NullPolicy, Order, Ragged, Scalar};
use dlframe::polars::{
    cell_layout, polars_dtype, polars_dtype_of, series_to_matrix, series_to_tensor, tensor_to_series,
};
use dlframe::{DType, Error, Rows, kernels};
use polars_core::prelude::*;
use serde::Deserialize;

/// The keyword arguments of `to_tensor`, as the Python wrapper pickles them.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ToTensorKwargs {
    /// Target dtype name (`"float32"`, ...); `None` keeps the common dtype of the inputs.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Null policy: `"error"` (default), `"fill"` or `"nan"`.
    #[serde(default)]
    pub nulls: Option<String>,
    /// The fill value (a bool, int or float); implies `"fill"`.
    #[serde(default)]
    pub fill_value: Option<Fill>,
    /// The length of every list, for a list input (Polars needs an Array's width up front).
    #[serde(default)]
    pub width: Option<usize>,
    /// What an integer that the float dtype cannot hold exactly does: `"error"` (default) or
    /// `"round"`.
    #[serde(default)]
    pub inexact: Option<String>,
}

/// A fill value as Python gives it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Fill {
    /// `True` / `False`.
    Bool(bool),
    /// An int.
    Int(i64),
    /// A float.
    Float(f64),
}

impl ToTensorKwargs {
    fn target(&self) -> PolarsResult<Option<DType>> {
        target(self.dtype.as_deref())
    }

    fn options(&self) -> PolarsResult<ExportOptions> {
        let fill = self.fill_value.map(Fill::scalar);
        let name = self.nulls.as_deref().unwrap_or("error");
        let nulls = match NullPolicy::parse(name, fill) {
            Ok(NullPolicy::Mask) => polars_bail!(
                InvalidOperation: "nulls='mask' gives two tensors, which one expression cannot \
                return; use 'fill' or 'nan', or dlframe.to_dlpack(..., nulls='mask')"
            ),
            Ok(p) => p,
            Err(_) if !NullPolicy::NAMES.contains(&name) => polars_bail!(
                InvalidOperation: "nulls={name:?}: expected 'error', 'fill' or 'nan'"
            ),
            Err(e) => return Err(polars_error(e)),
        };
        Ok(ExportOptions {
            nulls,
            copy: CopyPolicy::IfNeeded,
            dtype: self.target()?,
            order: Order::C,
            inexact: Inexact::parse(self.inexact.as_deref().unwrap_or("error")).map_err(polars_error)?,
            ..Default::default()
        })
    }
}

/// A dlframe error as the Polars error a Python user expects for it.
pub fn polars_error(e: Error) -> PolarsError {
    let msg = e.to_string();
    match e {
        Error::LengthMismatch { .. } => PolarsError::ShapeMismatch(msg.into()),
        // A value that does not fit the dtype: what Polars' own strict cast raises.
        Error::UnsupportedArrowType { .. }
        | Error::UnsupportedDType { .. }
        | Error::InvalidArgument(_)
        | Error::ValueOutOfRange { .. }
        | Error::InexactCast { .. } => PolarsError::InvalidOperation(msg.into()),
        // The expression returns one column, so it offers no nulls='mask'.
        Error::Nulls { column, null_count } => PolarsError::ComputeError(
            format!(
                "column {column} has {null_count} null(s); pass nulls='fill' (with fill_value=...) or \
                 nulls='nan', or call fill_null first"
            )
            .into(),
        ),
        Error::Polars(inner) => inner,
        _ => PolarsError::ComputeError(msg.into()),
    }
}

/// The tensor layout of a row of one input: the core's rule for the Arrow field the column
/// exports as. A List column is read as the `Array` of `width` it must be (Polars needs an
/// Array's width before the query runs).
fn layout_of(dtype: &DataType, width: Option<usize>) -> PolarsResult<CellLayout> {
    let dtype = match (dtype, width) {
        (DataType::List(inner), Some(w)) => &DataType::Array(inner.clone(), w),
        (DataType::List(_), None) => polars_bail!(
            InvalidOperation: "to_tensor of a list column needs width=..., the length of every \
            list: Polars must know an Array's width before the query runs"
        ),
        (other, _) => other,
    };
    cell_layout("", dtype).map_err(|e| match e {
        Error::UnsupportedArrowType { .. } => polars_err!(
            InvalidOperation: "to_tensor takes numeric, boolean or temporal columns, or Arrays and \
            tensor columns of them, not {dtype}; cast or encode the column first"
        ),
        e => polars_error(e),
    })
}

/// The Polars type of a tensor dtype's values, or of the leaf the layout keeps.
fn polars_type(d: DType) -> PolarsResult<DataType> {
    polars_dtype_of(d).map_err(polars_error)
}

/// The output dtype for these input dtypes: `Array(T, k)` for k scalar columns, the cell shape
/// for one list, Array or tensor column.
pub fn output_dtype(inputs: &[&DataType], kwargs: &ToTensorKwargs) -> PolarsResult<DataType> {
    output(inputs, kwargs).map(|(dtype, _)| dtype)
}

/// [`output_dtype`], and whether the one input is converted cell by cell (a list, Array or
/// tensor column) rather than stacked: the layouts are read once for both.
fn output(inputs: &[&DataType], kwargs: &ToTensorKwargs) -> PolarsResult<(DataType, bool)> {
    polars_ensure!(!inputs.is_empty(), InvalidOperation: "to_tensor needs at least one column");
    let target = kwargs.target()?;
    let layouts = inputs.iter().map(|d| layout_of(d, kwargs.width)).collect::<PolarsResult<Vec<_>>>()?;
    if let [only] = &layouts[..]
        && !only.is_scalar()
    {
        let leaf = match target {
            Some(d) => polars_type(d)?,
            None => polars_dtype(&only.leaf).map_err(polars_error)?,
        };
        let cells = only.shape.iter().rev().fold(leaf, |acc, &d| DataType::Array(Box::new(acc), d as usize));
        return Ok((cells, true));
    }
    let dtypes: Vec<DType> = layouts.iter().map(|l| l.dtype).collect();
    let leaf = target.unwrap_or_else(|| kernels::common_dtype(&dtypes));
    Ok((DataType::Array(Box::new(polars_type(leaf)?), inputs.len()), false))
}

fn to_tensor_field(inputs: &[Field], kwargs: ToTensorKwargs) -> PolarsResult<Field> {
    let dtypes: Vec<&DataType> = inputs.iter().map(|f| f.dtype()).collect();
    let dtype = output_dtype(&dtypes, &kwargs)?;
    let name = inputs.first().map(|f| f.name().clone()).unwrap_or_default();
    Ok(Field::new(name, dtype))
}

/// The work of the `to_tensor` expression, callable without the plugin machinery.
///
/// Copies once: k columns are interleaved (cast and null fill fused); one Array column is cast
/// or filled only when needed, and otherwise shared.
///
/// # Errors
/// Polars errors for empty input, unsupported types, nulls under `'error'`, ragged lists or
/// lists whose length is not `width`, and columns of different lengths.
pub fn to_tensor_impl(inputs: &[Series], kwargs: &ToTensorKwargs) -> PolarsResult<Series> {
    let dtypes: Vec<&DataType> = inputs.iter().map(|s| s.dtype()).collect();
    let (out_dtype, one_cell) = output(&dtypes, kwargs)?;
    let name = inputs[0].name().clone();
    // A literal (`pl.lit(1.0)`) arrives as one row and is broadcast, as Polars broadcasts it.
    let len = inputs.iter().map(|s| s.len()).max().unwrap_or(0);
    let broadcast: Vec<Series>;
    let inputs = if inputs.iter().any(|s| s.len() == 1 && len > 1) {
        broadcast =
            inputs.iter().map(|s| if s.len() == 1 { s.new_from_index(0, len) } else { s.clone() }).collect();
        &broadcast[..]
    } else {
        inputs
    };
    if let Some(s) = inputs.iter().find(|s| s.len() != len) {
        polars_bail!(
            ShapeMismatch: "to_tensor: column '{}' has length {}, another column has {len}",
            s.name(), s.len()
        );
    }
    if len == 0 {
        return Ok(Series::new_empty(name, &out_dtype));
    }
    let opts = kwargs.options()?;
    // Polars hands over a batch (a morsel on the streaming engine), whose place in the frame
    // it does not say: a row counts from the batch's start.
    let converted =
        if one_cell { series_to_tensor(&inputs[0], &opts) } else { series_to_matrix(inputs, &opts) }
            .map_err(|e| polars_error(e.at_rows(|row| (row, Rows::Batch { len: len as u64 }))))?;
    if let (Some(width), Some(&found)) = (kwargs.width, converted.values.shape().get(1))
        && one_cell
        && found != width as i64
    {
        polars_bail!(ShapeMismatch: "to_tensor: the lists have length {found}, but width={width} was given");
    }
    let out =
        tensor_to_series(&converted.values, name.as_str(), CopyPolicy::IfNeeded).map_err(polars_error)?;
    polars_ensure!(
        out.dtype() == &out_dtype,
        ComputeError: "to_tensor made a column of type {} where {out_dtype} was declared",
        out.dtype()
    );
    Ok(out)
}

/// The keyword arguments of `to_tensor_padded`, as the Python wrapper pickles them.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PaddedKwargs {
    /// The width of every row: longer rows are truncated, shorter ones padded.
    pub max_len: usize,
    /// The value of every missing slot (past a row's end, a null row, a null element); 0 when
    /// not given.
    #[serde(default)]
    pub pad: Option<Fill>,
    /// Target dtype name; `None` keeps the list's.
    #[serde(default)]
    pub dtype: Option<String>,
}

/// The dtype a `dtype=` name (normalised by the Python wrapper) selects; `None` keeps the input's.
fn target(name: Option<&str>) -> PolarsResult<Option<DType>> {
    name.map(DType::from_name).transpose().map_err(polars_error)
}

impl PaddedKwargs {
    fn pad(&self) -> Scalar {
        self.pad.map_or(Scalar::Int(0), Fill::scalar)
    }
}

impl Fill {
    fn scalar(self) -> Scalar {
        match self {
            Fill::Bool(b) => Scalar::Bool(b),
            Fill::Int(i) => Scalar::Int(i),
            Fill::Float(x) => Scalar::Float(x),
        }
    }
}

fn padded_dtype(input: &DataType, kwargs: &PaddedKwargs) -> PolarsResult<DataType> {
    let DataType::List(inner) = input else {
        polars_bail!(InvalidOperation: "to_tensor_padded takes a List column, not {input}");
    };
    let layout = layout_of(inner, None)?;
    polars_ensure!(
        layout.is_scalar(),
        InvalidOperation: "to_tensor_padded pads lists of numbers, not lists of {inner}"
    );
    let leaf = match target(kwargs.dtype.as_deref())? {
        Some(d) => polars_type(d)?,
        None => inner.as_ref().clone(),
    };
    Ok(DataType::Array(Box::new(leaf), kwargs.max_len))
}

fn to_tensor_padded_field(inputs: &[Field], kwargs: PaddedKwargs) -> PolarsResult<Field> {
    polars_ensure!(inputs.len() == 1, InvalidOperation: "to_tensor_padded takes one List column");
    Ok(Field::new(inputs[0].name().clone(), padded_dtype(inputs[0].dtype(), &kwargs)?))
}

/// The work of the `to_tensor_padded` expression: a List column whose rows have different
/// lengths as `Array(T, max_len)`, each row truncated or padded with `pad`, which also stands
/// for null rows and null elements (the core's `ragged="pad"`; copies once after reading).
///
/// # Errors
/// Polars errors for a column that is not a List of numbers, and a pad value that does not fit.
pub fn to_tensor_padded_impl(input: &Series, kwargs: &PaddedKwargs) -> PolarsResult<Series> {
    let out_dtype = padded_dtype(input.dtype(), kwargs)?;
    if input.is_empty() {
        return Ok(Series::new_empty(input.name().clone(), &out_dtype));
    }
    let pad = kwargs.pad();
    let opts = ExportOptions {
        nulls: NullPolicy::Fill(pad),
        dtype: target(kwargs.dtype.as_deref())?,
        ragged: Ragged::Pad { pad, max_len: Some(kwargs.max_len) },
        ..Default::default()
    };
    let converted = series_to_tensor(input, &opts)
        .map_err(|e| polars_error(e.at_rows(|row| (row, Rows::Batch { len: input.len() as u64 }))))?;
    let out = tensor_to_series(&converted.values, input.name().as_str(), CopyPolicy::IfNeeded)
        .map_err(polars_error)?;
    polars_ensure!(
        out.dtype() == &out_dtype,
        ComputeError: "to_tensor_padded made a column of type {} where {out_dtype} was declared",
        out.dtype()
    );
    Ok(out)
}

/// The plugin entry points Polars looks up by name (`_polars_plugin_to_tensor` and
/// `_polars_plugin_field_to_tensor`); the macro's generated items carry no docs of their own.
#[allow(missing_docs)]
mod plugin {
    use pyo3_polars::derive::polars_expr;

    use super::*;

    #[polars_expr(output_type_func_with_kwargs = to_tensor_field)]
    fn to_tensor(inputs: &[Series], kwargs: ToTensorKwargs) -> PolarsResult<Series> {
        to_tensor_impl(inputs, &kwargs)
    }

    #[polars_expr(output_type_func_with_kwargs = to_tensor_padded_field)]
    fn to_tensor_padded(inputs: &[Series], kwargs: PaddedKwargs) -> PolarsResult<Series> {
        to_tensor_padded_impl(&inputs[0], &kwargs)
    }
}

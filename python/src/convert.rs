//! `to_dlpack`: any Arrow producer -> Tensor (the import side, `from_dlpack` and `tensor`, is
//! `importer.rs`).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3_arrow::PyDataType;

use dlframe::arrow::Converted;
use dlframe::dlpack::request::consumer_stream_on;
use dlframe::options::ExportOptions;
use dlframe::parquet::ParquetFile;
use dlframe::table::{Columns, TableTensors, input_on, tensor_of};
use dlframe::{DType, Device, Tensor, transfer};

use crate::args::{ConsumerStream, DTypeArg, FillValue, TargetDevice, export_options};
use crate::capsule;
use crate::error::{Binding, Result};
use crate::gil;
use crate::input::Input;
use crate::per_type::PerType;
use crate::tensor::PyTensor;

/// The Python result of a finished conversion (`dlframe::transfer::handed_over`): the values,
/// or `(values, mask)` under `nulls="mask"`; a ragged column adds its lengths or offsets last:
/// `(values, index)` or `(values, mask, index)`. With a consumer `stream` (device results
/// only), that stream is made to wait for the work that made them.
pub(crate) fn wrap(py: Python<'_>, c: Converted, stream: Option<usize>) -> Result<Py<PyAny>> {
    // Nothing to wait for without a stream: the GIL stays held.
    let mut parts = gil::run(py, stream.is_none(), 0, || transfer::handed_over(c, stream))?;
    if parts.len() == 1 {
        return Ok(Py::new(py, PyTensor::new(parts.remove(0)))?.into_any());
    }
    let parts = parts.into_iter().map(|t| Ok(Py::new(py, PyTensor::new(t))?.into_any()));
    Ok(PyTuple::new(py, parts.collect::<PyResult<Vec<_>>>()?)?.into_any().unbind())
}

/// A table's tensors for Python: [`wrap`] of the one tensor, or a dict of them by name.
pub(crate) fn wrap_table(py: Python<'_>, t: TableTensors, stream: Option<usize>) -> Result<Py<PyAny>> {
    match t {
        TableTensors::One(c) => wrap(py, c, stream),
        TableTensors::Dict(cols) => {
            let out = PyDict::new(py);
            for (name, c) in cols {
                out.set_item(name, wrap(py, c, stream)?)?;
            }
            Ok(out.into_any().unbind())
        }
    }
}

/// Any Arrow producer (pyarrow, polars, datafusion, duckdb, arro3, nanoarrow: anything with
/// `__arrow_c_array__` or `__arrow_c_stream__`), a Polars LazyFrame (collected on the
/// streaming engine), or the path of a Parquet file (`dlframe::parquet`: the pages of flat
/// fixed-width columns written straight into the matrix), as a tensor.
///
/// A column (chunked or not) becomes one tensor: zero-copy for one chunk of numeric data
/// without nulls, otherwise one fused copy. A table or record batch becomes an `(n, k)` matrix
/// (`columns="stack"`, one fused interleave + cast pass) or a dict of column tensors
/// (`columns="dict"`); a table whose only column is a list or tensor column (such as a
/// `SELECT to_tensor(...)` result) becomes that column's `(n, *cell_shape)` tensor.
///
/// - `nulls`: `"error"` (default: BufferError naming the column), `"fill"` with `fill_value`,
///   `"nan"` (float dtypes), or `"mask"`, which returns `(values, mask)` pairs.
/// - `copy`: None copies only when needed; False raises BufferError when a copy would be
///   needed; True always copies.
/// - `dtype`: the target dtype, checked (a value that does not fit raises ValueError): a name
///   (`"float32"`), a numpy dtype or code (`np.float32`, `"f4"`), a pyarrow, Polars or torch
///   dtype.
/// - `inexact`: what a cast does with an integer that the float dtype cannot hold exactly
///   (int64 2**53 + 1 into float64): `"error"` (default: ValueError naming the row and
///   column, as pyarrow's safe cast) or `"round"` (to nearest, as numpy's `astype`). Float
///   narrowing rounds either way, underflow to zero included.
/// - `order`: `"C"` or `"F"`, the memory order of a matrix.
/// - `ragged`: what a List column whose rows have different lengths becomes: `"error"`
///   (default), `"pad"` (`(values, lengths)`: `(n, width)` padded with `pad_value`, width
///   `max_len` or the longest row, always a copy) or `"jagged"` (`(values, offsets)` as
///   `torch.nested.nested_tensor_from_jagged` takes them, zero-copy where Arrow's buffers
///   allow). Null rows become empty rows unless `nulls="error"`; under `nulls="mask"` the
///   mask comes second.
/// - `device`: `"cpu"` (default), `"cuda"` or `"cuda:N"`; `stream` (DLPack numbering, or a
///   torch/cupy stream) is then made to wait for the conversion.
#[pyfunction]
#[pyo3(signature = (obj, *, nulls="error", fill_value=None, copy=None, dtype=None, order="C", device=None, columns="stack", stream=None, ragged="error", pad_value=None, max_len=None, inexact="error"))]
#[allow(clippy::too_many_arguments)]
pub fn to_dlpack<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    nulls: &str,
    fill_value: Option<FillValue>,
    copy: Option<bool>,
    dtype: Option<DTypeArg>,
    order: &str,
    device: Option<TargetDevice>,
    columns: &str,
    stream: Option<ConsumerStream>,
    ragged: &str,
    pad_value: Option<FillValue>,
    max_len: Option<usize>,
    inexact: &str,
) -> Result<Py<PyAny>> {
    let target = device.map_or(Device::Cpu, |d| d.0);
    let stream = consumer_stream_on(stream.map(|s| s.0), target)?;
    let opts = export_options(nulls, fill_value, copy, dtype, order, ragged, pad_value, max_len, inexact)?;
    let columns = Columns::parse(columns)?;
    let defaults = opts == ExportOptions::default()
        && target == Device::Cpu
        && columns == Columns::Stack
        && stream.is_none();
    // A pyarrow array of numbers (which the input's order takes as Arrow data), before the
    // input is told apart: the common small call, at pyarrow's own DLPack export.
    if defaults && let Some(t) = pyarrow_numeric(obj) {
        return Ok(Py::new(py, PyTensor::new(t))?.into_any());
    }
    let obj = obj.extract::<Input>()?;
    if let Input::File(_, path) = &obj {
        // A Parquet file: the reader writes its pages into the matrix (`dlframe::parquet`).
        let file = py.detach(|| ParquetFile::open(path))?;
        let units: Vec<usize> = (0..file.units().len()).collect();
        let t = py.detach(|| file.read_table(&units, columns, &opts, target))?;
        return wrap_table(py, t, stream);
    }
    let (chunks, field) = obj.chunks()?;
    let bytes = chunks.iter().map(|c| c.get_buffer_memory_size()).sum();
    let cpu = target == Device::Cpu;
    let t = gil::run(py, cpu, bytes, || input_on(&field, &chunks, columns, &opts, target))?;
    wrap_table(py, t, stream)
}

/// `call` (`dlframe.tensor` or `from_dlpack`) of an object with no tensor protocol:
/// `dlframe::table::tensor_of` of its Arrow data when it offers the Arrow PyCapsule interface
/// (the C Device data interface's methods included) or is a LazyFrame, AttributeError otherwise.
pub(crate) fn arrow_tensor(input: &Input<'_>, call: &str) -> Result<PyTensor> {
    if !input.is_arrow() {
        return Err(Binding::NoProtocol(format!(
            "{call} needs __dlpack__, a DLPack capsule, __array_interface__, __array_struct__, the buffer \
             protocol or Arrow data (__arrow_c_array__/__arrow_c_stream__/__arrow_c_device_array__/\
             __arrow_c_device_stream__); {} has none of them",
            input.object().get_type().name()?
        ))
        .into());
    }
    let (chunks, field) = input.chunks()?;
    let bytes = chunks.iter().map(|c| c.get_buffer_memory_size()).sum();
    let py = input.object().py();
    Ok(PyTensor::new(gil::run(py, true, bytes, || tensor_of(&field, &chunks, Device::Cpu))?))
}

/// Whether a pyarrow array type holds numbers (a dtype of the table but bool), learnt once per
/// type from its first instance: each of pyarrow's array classes but the extension arrays holds
/// one Arrow type (or several that are no dtype's, as timestamps), and for those pyarrow's own
/// `__dlpack__` exports what dlframe's Arrow path makes of them (the values buffer, shared).
static IS_PYARROW_NUMERIC: PerType<bool> = PerType::new();

/// A pyarrow array of numbers without nulls as a read-only tensor over its values (no copy),
/// through pyarrow's own DLPack export: the tensor the Arrow path makes of it, without the Arrow
/// C data interface's schema and array export and import (most of a small call). None for
/// anything else (pyarrow refuses nulls, which the Arrow path then reports, as it would also
/// for a pyarrow that has no `__dlpack__`); nothing is raised here.
fn pyarrow_numeric(obj: &Bound<'_, PyAny>) -> Option<Tensor> {
    let numeric = IS_PYARROW_NUMERIC
        .get(&obj.get_type(), |ty| -> PyResult<bool> {
            let pa = ty.py().import(intern!(ty.py(), "pyarrow"))?;
            let array = |class: &str| pa.getattr(class).and_then(|c| ty.is_subclass(&c));
            if ty.module()?.to_cow()? != "pyarrow.lib" || !array("Array")? || array("ExtensionArray")? {
                return Ok(false);
            }
            let dt = obj.getattr(intern!(obj.py(), "type"))?.extract::<PyDataType>()?.into_inner();
            Ok(DType::from_arrow_type(&dt).is_some_and(|d| d != DType::Bool))
        })
        .ok()?;
    if !numeric {
        return None;
    }
    let t = capsule::versioned_from_known(obj)?;
    // Arrow memory is immutable, whatever the producer's flags say.
    t.device().is_host_accessible().then(|| t.with_readonly(true))
}

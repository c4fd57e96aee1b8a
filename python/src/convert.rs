//! `to_dlpack`: any Arrow producer -> Tensor (the import side, `from_dlpack` and `tensor`, is
//! `importer.rs`).

use std::ffi::CStr;

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use arrow_schema::ffi::FFI_ArrowSchema;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyCapsule, PyDict, PyTuple};
use pyo3_arrow::ffi::ArrayIterator;
use pyo3_arrow::input::AnyArray;
use pyo3_arrow::{PyArray, PyArrayReader, PyDataType};

use dlframe::arrow::Converted;
use dlframe::arrow::device::{import_array_on_host, import_on_host};
use dlframe::arrow::device_stream::DeviceStream;
use dlframe::dlpack::request::consumer_stream_on;
use dlframe::dtype::spelling::polars_refusal;
use dlframe::ffi::arrow_device::ARROW_ARRAY_STREAM;
use dlframe::ffi::arrow_device::{ARROW_ARRAY, ARROW_DEVICE_ARRAY, ARROW_DEVICE_ARRAY_STREAM, ARROW_SCHEMA};
use dlframe::options::{ExportOptions, NullPolicy};
use dlframe::table::{TableTensors, input_on, tensor_of};
use dlframe::{DType, Device, Tensor, transfer};

use crate::args::{ColumnsArg, ConsumerStream, DTypeArg, FillValue, OrderArg, TargetDevice, export_options};
use crate::capsule;
use crate::error::{Binding, Error, Result};
use crate::gil;
use crate::per_type::PerType;
use crate::tensor::PyTensor;

/// The Python result of a conversion (`dlframe::transfer::handed_over`): the values, or
/// `(values, mask)` under `nulls="mask"`; a ragged column adds its lengths or offsets last:
/// `(values, index)` or `(values, mask, index)`. With a consumer `stream` (device results
/// only), that stream is made to wait for the work that made them.
pub(crate) fn wrap(
    py: Python<'_>,
    c: Converted,
    nulls: NullPolicy,
    stream: Option<usize>,
) -> Result<Py<PyAny>> {
    // Nothing to allocate or wait for without a mask or a stream: the GIL stays held.
    let plain = nulls != NullPolicy::Mask && stream.is_none();
    let mut parts = gil::run(py, plain, 0, || transfer::handed_over(c, nulls, stream))?;
    if parts.len() == 1 {
        return Ok(Py::new(py, PyTensor::new(parts.remove(0)))?.into_any());
    }
    let parts = parts.into_iter().map(|t| Ok(Py::new(py, PyTensor::new(t))?.into_any()));
    Ok(PyTuple::new(py, parts.collect::<PyResult<Vec<_>>>()?)?.into_any().unbind())
}

/// A table's tensors for Python: [`wrap`] of the one tensor, or a dict of them by name.
pub(crate) fn wrap_table(
    py: Python<'_>,
    t: TableTensors,
    nulls: NullPolicy,
    stream: Option<usize>,
) -> Result<Py<PyAny>> {
    match t {
        TableTensors::One(c) => wrap(py, c, nulls, stream),
        TableTensors::Dict(cols) => {
            let out = PyDict::new(py);
            for (name, c) in cols {
                out.set_item(name, wrap(py, c, nulls, stream)?)?;
            }
            Ok(out.into_any().unbind())
        }
    }
}

/// Any Arrow producer (pyarrow, polars, datafusion, duckdb, arro3, nanoarrow: anything with
/// `__arrow_c_array__` or `__arrow_c_stream__`), or a Polars LazyFrame (collected on the
/// streaming engine), as a tensor.
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
#[pyo3(signature = (obj, *, nulls="error", fill_value=None, copy=None, dtype=None, order=OrderArg(dlframe::options::Order::C), device=None, columns=ColumnsArg(dlframe::table::Columns::Stack), stream=None, ragged="error", pad_value=None, max_len=None, inexact="error"))]
// The defaults of `order` and `columns` are typed values; say them as the strings they parse.
#[pyo3(
    text_signature = "(obj, *, nulls='error', fill_value=None, copy=None, dtype=None, order='C', device=None, columns='stack', stream=None, ragged='error', pad_value=None, max_len=None, inexact='error')"
)]
#[allow(clippy::too_many_arguments)]
pub fn to_dlpack<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    nulls: &str,
    fill_value: Option<FillValue>,
    copy: Option<bool>,
    dtype: Option<DTypeArg>,
    order: OrderArg,
    device: Option<TargetDevice>,
    columns: ColumnsArg,
    stream: Option<ConsumerStream>,
    ragged: &str,
    pad_value: Option<FillValue>,
    max_len: Option<usize>,
    inexact: &str,
) -> Result<Py<PyAny>> {
    let target = device.map_or(Device::Cpu, |d| d.0);
    let stream = consumer_stream_on(stream.map(|s| s.0), target)?;
    let opts = export_options(nulls, fill_value, copy, dtype, order, ragged, pad_value, max_len, inexact)?;
    let defaults = opts == ExportOptions::default()
        && target == Device::Cpu
        && columns.0 == dlframe::table::Columns::Stack
        && stream.is_none();
    if defaults && let Some(t) = pyarrow_numeric(obj) {
        return Ok(Py::new(py, PyTensor::new(t))?.into_any());
    }
    let nulls = opts.nulls;
    // A LazyFrame has no Arrow interface: it is looked for only when the object has none.
    let collected;
    let (obj, input) = match arrow_input(obj) {
        Err(e) => match collected_lazy(obj)? {
            Some(lf) => {
                collected = lf;
                (&collected, arrow_input(&collected))
            }
            None => (obj, Err(e)),
        },
        input => (obj, input),
    };
    let (chunks, field) = chunks_of(obj, input)?;
    let bytes = chunks.iter().map(|c| c.get_buffer_memory_size()).sum();
    let cpu = target == Device::Cpu;
    let t = gil::run(py, cpu, bytes, || input_on(&field, &chunks, columns.0, &opts, target))?;
    wrap_table(py, t, nulls, stream)
}

/// The chunks and field of what [`arrow_input`] read of `obj` (one array: no reader to make
/// and drain); [`input_error`] for what it could not read.
fn chunks_of(obj: &Bound<'_, PyAny>, input: PyResult<AnyArray>) -> Result<(Vec<ArrayRef>, FieldRef)> {
    match input {
        Ok(AnyArray::Array(a)) => Ok(a.into_inner()).map(|(array, field)| (vec![array], field)),
        Ok(input) => input.into_chunked_array().map(|c| c.into_inner()).map_err(Error::from),
        Err(e) => Err(e.into()),
    }
    .map_err(|e| input_error(obj, e))
}

/// `dlframe.tensor` of an object with no tensor protocol: `dlframe::table::tensor_of` of its
/// data when it offers the Arrow PyCapsule interface (the C Device data interface's methods
/// included), AttributeError otherwise.
pub(crate) fn arrow_tensor(obj: &Bound<'_, PyAny>) -> Result<PyTensor> {
    if !speaks(obj, &ARROW_METHODS) {
        let expected = "__dlpack__, a capsule, __array_interface__, __array_struct__, a buffer or";
        let expected = format!("expected {expected} {}", ARROW_METHODS.join("/"));
        return Err(Binding::NoProtocol(expected).into());
    }
    let (chunks, field) = chunks_of(obj, arrow_input(obj))?;
    let bytes = chunks.iter().map(|c| c.get_buffer_memory_size()).sum();
    Ok(PyTensor::new(gil::run(obj.py(), true, bytes, || tensor_of(&field, &chunks, Device::Cpu))?))
}

/// The Arrow PyCapsule interface's producers' methods.
pub(crate) const ARROW_METHODS: [&str; 4] =
    ["__arrow_c_array__", "__arrow_c_stream__", "__arrow_c_device_array__", "__arrow_c_device_stream__"];

/// Whether `obj`'s type has one of `methods`.
pub(crate) fn speaks(obj: &Bound<'_, PyAny>, methods: &[&str]) -> bool {
    methods.iter().any(|m| obj.get_type().hasattr(m).unwrap_or(false))
}

/// An Arrow producer's data, through the PyCapsule interface (also the C Device data interface,
/// for an object that offers only that: its CPU memory is read in place, no copy). The protocol
/// methods are looked up
/// on the type: an instance lookup of a missing method falls back to `__getattr__`, which costs a
/// polars Series about 7 us (it searches its expression namespace) before we try the stream.
pub(crate) fn arrow_input(obj: &Bound<'_, PyAny>) -> PyResult<AnyArray> {
    let ty = obj.get_type();
    if ty.hasattr(intern!(obj.py(), "__arrow_c_array__"))? {
        Ok(imported(obj, "__arrow_c_array__", ARROW_ARRAY, import_array_on_host)?)
    } else if ty.hasattr(intern!(obj.py(), "__arrow_c_stream__"))? {
        Ok(stream(obj, "__arrow_c_stream__", ARROW_ARRAY_STREAM, DeviceStream::take_cpu)?)
    } else if ty.hasattr(intern!(obj.py(), "__arrow_c_device_array__"))? {
        Ok(imported(obj, "__arrow_c_device_array__", ARROW_DEVICE_ARRAY, import_on_host)?)
    } else if ty.hasattr(intern!(obj.py(), "__arrow_c_device_stream__"))? {
        Ok(stream(obj, "__arrow_c_device_stream__", ARROW_DEVICE_ARRAY_STREAM, DeviceStream::take)?)
    } else {
        // Buffers and other objects pyo3-arrow accepts without the protocol methods.
        obj.extract()
    }
}

/// The array of the `(arrow_schema, <name>)` pair of PyCapsules that `obj.<method>()` returns,
/// imported by the core (`import`: the producer's struct checked, moved from once and read in
/// place); ValueError naming what it returned when it is no such pair.
fn imported<T>(obj: &Bound<'_, PyAny>, method: &str, name: &CStr, import: Import<T>) -> Result<AnyArray> {
    let pair = obj.call_method0(method)?;
    let (schema, array) = match pair.extract::<(Bound<'_, PyCapsule>, Bound<'_, PyCapsule>)>() {
        Ok((s, a)) if s.is_valid_checked(Some(ARROW_SCHEMA)) && a.is_valid_checked(Some(name)) => (s, a),
        _ => {
            let (ty, got) = (obj.get_type().name()?, pair.get_type().name()?);
            let pair = format!("(schema, array) pair of PyCapsules named \"arrow_schema\" and {name:?}");
            return Err(Binding::Malformed(format!("{ty}.{method}() returned a {got}, not a {pair}")).into());
        }
    };
    let (schema, array) = (schema.pointer_checked(Some(ARROW_SCHEMA))?, array.pointer_checked(Some(name))?);
    // SAFETY: the capsules hold the producer's structs of these names, alive while they are; the
    // array is moved out once (its capsule then releases nothing).
    let (field, array) = unsafe { import(array.as_ptr().cast(), schema.as_ptr().cast()) }?;
    Ok(AnyArray::Array(PyArray::try_new(array, field).map_err(Error::from)?))
}

/// The stream in the capsule `obj.<method>()` returns, taken by the core (`take`: moved from
/// once; each array checked as it comes, and read in place).
fn stream<T>(obj: &Bound<'_, PyAny>, method: &str, name: &CStr, take: Take<T>) -> Result<AnyArray> {
    let capsule = obj.call_method0(method)?;
    let ptr = capsule.cast::<PyCapsule>().map_err(PyErr::from)?.pointer_checked(Some(name))?;
    // SAFETY: the capsule holds the producer's stream of this name, alive while it is; it is
    // moved out once (its capsule then releases nothing).
    let stream = unsafe { take(ptr.as_ptr().cast()) }?;
    let field = stream.field();
    Ok(AnyArray::Stream(PyArrayReader::new(Box::new(ArrayIterator::new(stream, field)))))
}

/// The core's take of a producer's stream struct, and its import of an array struct and schema.
type Take<T> = unsafe fn(*mut T) -> dlframe::Result<DeviceStream>;
type Import<T> = unsafe fn(*mut T, *const FFI_ArrowSchema) -> dlframe::Result<(FieldRef, ArrayRef)>;

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

/// A Polars LazyFrame (which has no Arrow interface of its own) collected on the streaming
/// engine (copies, as Polars runs the query); None for any other object.
fn collected_lazy<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let ty = obj.get_type();
    if ty.name()? != "LazyFrame" || !ty.module()?.to_cow()?.starts_with("polars") {
        return Ok(None);
    }
    let kwargs = [("engine", "streaming")].into_py_dict(obj.py())?;
    obj.call_method("collect", (), Some(&kwargs)).map(Some)
}

/// Why an object's Arrow data could not be read: the wrong kind of object, or (for a producer
/// that has the interface) what the producer or the import refused.
pub(crate) fn input_error(obj: &Bound<'_, PyAny>, e: Error) -> Error {
    let py = obj.py();
    let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    if !speaks(obj, &ARROW_METHODS) {
        return Binding::WrongType(format!(
            "to_dlpack takes an object with __arrow_c_array__, __arrow_c_stream__ or their \
             __arrow_c_device_*__ forms (pyarrow, polars, datafusion, duckdb, arro3, nanoarrow) or \
             a Polars LazyFrame, not {name}"
        ))
        .into();
    }
    if let Some(found) = unsupported_polars_column(obj) {
        return found;
    }
    e.in_context(py, &format!("reading the Arrow data of a {name} failed"))
}

/// For a Polars frame or Series with a column that Polars cannot export through Arrow, the error
/// naming it (`dlframe::dtype::spelling::polars_refusal`).
fn unsupported_polars_column(obj: &Bound<'_, PyAny>) -> Option<Error> {
    let ty = obj.get_type();
    if !ty.module().ok()?.to_cow().ok()?.starts_with("polars") {
        return None;
    }
    let schema: Vec<(String, Bound<'_, PyAny>)> = match obj.getattr("schema") {
        Ok(s) => {
            s.call_method0("items").ok()?.try_iter().ok()?.filter_map(|kv| kv.ok()?.extract().ok()).collect()
        }
        Err(_) => vec![(obj.getattr("name").ok()?.extract().ok()?, obj.getattr("dtype").ok()?)],
    };
    let refusal =
        |(col, dtype): (String, Bound<'_, PyAny>)| polars_refusal(&col, &dtype.str().ok()?.to_cow().ok()?);
    schema.into_iter().find_map(refusal).map(Into::into)
}

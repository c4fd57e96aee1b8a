//! `to_dlpack` (any Arrow producer -> Tensor) and `from_dlpack` (any tensor producer -> Arrow).

use arrow_schema::DataType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use pyo3_arrow::PyArray;
use pyo3_arrow::input::AnyArray;

use dlframe::arrow::{Converted, tensor_to_column_with, to_tensor};
use dlframe::dlpack::request::consumer_stream;
use dlframe::dlpack::{DlpackCall, Failure, ImportRequest, Keep, Offer, Rung, Then};
use dlframe::ffi::dlpack::DLDevice;
use dlframe::options::{CopyPolicy, ExportOptions, NullPolicy};
use dlframe::table::{TableTensors, split_struct, table_on};
use dlframe::{DType, Device, Tensor, transfer};

use crate::args::{
    ColumnsArg, ConsumerStream, DTypeArg, FillValue, HostDevice, OrderArg, TargetDevice, export_options,
};
use crate::capsule;
use crate::error::{Binding, Error, Result};
use crate::exchange;
use crate::gil;
use crate::interface;
use crate::ndarray;
use crate::per_type::PerType;
use crate::tensor::PyTensor;
use crate::to_python::{array_method, to_pyarrow};

/// The Python result of a conversion: the values, or `(values, mask)` under `nulls="mask"`
/// (an all-true mask, on the values' device, when there were no nulls); a ragged column adds
/// its lengths or offsets last: `(values, index)` or `(values, mask, index)`. With a consumer
/// `stream` (device results only), that stream is made to wait for the work that made them.
pub(crate) fn wrap(
    py: Python<'_>,
    c: Converted,
    nulls: NullPolicy,
    stream: Option<usize>,
) -> Result<Py<PyAny>> {
    let Converted { values, mask, index } = c;
    let mask = match (nulls, mask) {
        (NullPolicy::Mask, None) => Some(py.detach(|| all_valid(&values))?),
        (_, m) => m,
    };
    if let Some(h) = stream {
        for t in std::iter::once(&values).chain(&mask).chain(&index) {
            if let Some(sync) = t.sync() {
                py.detach(|| sync.wait_on(h))?;
            }
        }
    }
    let mask = mask.filter(|_| nulls == NullPolicy::Mask);
    if mask.is_none() && index.is_none() {
        return Ok(Py::new(py, PyTensor::new(values))?.into_any());
    }
    let parts = std::iter::once(values)
        .chain(mask)
        .chain(index)
        .map(|t| Ok(Py::new(py, PyTensor::new(t))?.into_any()))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PyTuple::new(py, parts)?.into_any().unbind())
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

/// A mask of `true`s shaped like `values` and, when they are dense (C or F order, a permuted
/// tensor column), laid out like them (C order otherwise), on its device (copies, to a device).
fn all_valid(values: &Tensor) -> dlframe::Result<Tensor> {
    let c = Tensor::from_vec(vec![true; values.numel()], values.shape().to_vec())?;
    let strides = values.dense_strides().unwrap_or_else(|| c.strides().to_vec());
    // SAFETY: the same allocation of numel bools, kept by its owner; a dense layout of the same
    // shape (any order of its dimensions) reaches exactly those numel elements, all true.
    let host = unsafe {
        Tensor::from_raw_parts(
            c.data_ptr() as *mut u8,
            values.shape().to_vec(),
            Some(strides),
            DType::Bool,
            Device::Cpu,
            false,
            c.owner().clone(),
        )
    }?;
    transfer::move_to(&host.with_copied(true), values.device())
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
    let stream = match (stream, target) {
        (None, _) => None,
        (Some(s), Device::Cuda(_)) => consumer_stream(s.0)?,
        (Some(_), _) => {
            return Err(dlframe::Error::InvalidArgument(
                "stream= orders a device result on a consumer's stream; pass device='cuda:N' too".into(),
            )
            .into());
        }
    };
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
        Err(_) if is_lazy_frame(obj)? => {
            collected = collect_lazy(obj)?;
            (&collected, arrow_input(&collected))
        }
        input => (obj, input),
    };
    let (chunks, field) = match input {
        // One array: no reader to make and drain.
        Ok(AnyArray::Array(a)) => {
            let (array, field) = a.into_inner();
            Ok((vec![array], field))
        }
        Ok(input) => input.into_chunked_array().map(|c| c.into_inner()).map_err(Error::from),
        Err(e) => Err(e.into()),
    }
    .map_err(|e| input_error(obj, e))?;
    let cpu = target == Device::Cpu;
    let bytes = chunks.iter().map(|c| c.get_buffer_memory_size()).sum();
    if let Some((fields, cols)) = split_struct(&field, &chunks)? {
        let t = gil::run(py, cpu, bytes, || table_on(&fields, &cols, columns.0, &opts, target))?;
        return wrap_table(py, t, nulls, stream);
    }
    let c = gil::run(py, cpu, bytes, || transfer::column_on(&field, &chunks, &opts, target))?;
    wrap(py, c, nulls, stream)
}

/// An Arrow producer's data, through the PyCapsule interface. The protocol methods are looked up
/// on the type: an instance lookup of a missing method falls back to `__getattr__`, which costs a
/// polars Series about 7 us (it searches its expression namespace) before we try the stream.
pub(crate) fn arrow_input(obj: &Bound<'_, PyAny>) -> PyResult<AnyArray> {
    let py = obj.py();
    let ty = obj.get_type();
    if ty.hasattr(intern!(py, "__arrow_c_array__"))? {
        // Called here, once: pyo3-arrow's extraction looks the method up twice more first.
        let pair = obj.call_method0(intern!(py, "__arrow_c_array__"))?;
        let Some(pair) = pair.cast::<PyTuple>().ok().filter(|t| t.len() == 2) else {
            let returned = pair.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            let ty = ty.name().map(|n| n.to_string()).unwrap_or_default();
            return Err(Error::from(Binding::Malformed(format!(
                "{ty}.__arrow_c_array__() returned a {returned}, not a (schema, array) pair of PyCapsules"
            )))
            .into());
        };
        let (schema, array) = (pair.get_item(0)?, pair.get_item(1)?);
        Ok(AnyArray::Array(PyArray::from_arrow_pycapsule(schema.cast()?, array.cast()?)?))
    } else if ty.hasattr(intern!(py, "__arrow_c_stream__"))? {
        Ok(AnyArray::Stream(obj.extract()?))
    } else {
        // Buffers and other objects pyo3-arrow accepts without the protocol methods.
        obj.extract()
    }
}

/// pyarrow's arrays of numbers: the types whose own `__dlpack__` exports what dlframe's Arrow
/// path makes of them (the values buffer, shared).
const PYARROW_NUMERIC: [&str; 11] = [
    "Int8Array",
    "Int16Array",
    "Int32Array",
    "Int64Array",
    "UInt8Array",
    "UInt16Array",
    "UInt32Array",
    "UInt64Array",
    "HalfFloatArray",
    "FloatArray",
    "DoubleArray",
];

/// Whether a type is one of [`PYARROW_NUMERIC`], learnt once per type.
static IS_PYARROW_NUMERIC: PerType<bool> = PerType::new();

/// A pyarrow array of numbers without nulls as a read-only tensor over its values (no copy),
/// through pyarrow's own DLPack export: the tensor the Arrow path makes of it, without the Arrow
/// C data interface's schema and array export and import (most of a small call). None for
/// anything else (pyarrow refuses nulls, which the Arrow path then reports, as it would also
/// for a pyarrow that has no `__dlpack__`); nothing is raised here.
fn pyarrow_numeric(obj: &Bound<'_, PyAny>) -> Option<Tensor> {
    let numeric = IS_PYARROW_NUMERIC
        .get(&obj.get_type(), |ty| -> PyResult<bool> {
            Ok(ty.module()?.to_cow()? == "pyarrow.lib" && PYARROW_NUMERIC.contains(&&*ty.name()?.to_cow()?))
        })
        .ok()?;
    if !numeric {
        return None;
    }
    let t = capsule::versioned_from_known(obj)?;
    // Arrow memory is immutable, whatever the producer's flags say.
    t.device().is_host_accessible().then(|| t.with_readonly(true))
}

/// True for a Polars LazyFrame, which has no Arrow interface of its own until it is collected.
fn is_lazy_frame(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let ty = obj.get_type();
    Ok(ty.name()? == "LazyFrame" && ty.module()?.to_cow()?.starts_with("polars"))
}

/// Collects a LazyFrame (copies, as Polars runs the query), on the streaming engine.
fn collect_lazy<'py>(lf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = lf.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("engine", "streaming")?;
    lf.call_method("collect", (), Some(&kwargs))
}

/// Why an object's Arrow data could not be read: the wrong kind of object, or (for a producer
/// that has the interface) what the producer or the import refused.
pub(crate) fn input_error(obj: &Bound<'_, PyAny>, e: Error) -> Error {
    let py = obj.py();
    let ty = obj.get_type();
    let name = ty.name().map(|n| n.to_string()).unwrap_or_default();
    let speaks_arrow = ty.hasattr(intern!(py, "__arrow_c_array__")).unwrap_or(false)
        || ty.hasattr(intern!(py, "__arrow_c_stream__")).unwrap_or(false);
    if !speaks_arrow {
        return Binding::WrongType(format!(
            "to_dlpack takes an object with __arrow_c_array__ or __arrow_c_stream__ (pyarrow, polars, \
             datafusion, duckdb, arro3, nanoarrow) or a Polars LazyFrame, not {name}"
        ))
        .into();
    }
    if let Some(found) = unsupported_polars_column(obj) {
        return found;
    }
    e.in_context(py, &format!("reading the Arrow data of a {name} failed"))
}

/// For a Polars frame or Series with a column that Polars cannot export through Arrow, the error
/// naming it: Int128 and the like need a cast; a column of Polars' Null type gets the error that
/// the same column from pyarrow gets (arrow-rs cannot import Polars' export of it).
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
    schema.into_iter().find_map(|(col, dtype)| {
        let printed = dtype.str().ok()?.to_string();
        if printed == "Null" {
            let field = std::sync::Arc::new(arrow_schema::Field::new(col, DataType::Null, true));
            let nulls = arrow_array::new_null_array(&DataType::Null, 0);
            return to_tensor(&field, &[nulls], &ExportOptions::default()).err().map(Into::into);
        }
        ["Int128", "UInt128", "Object"].iter().any(|t| printed.starts_with(t)).then(|| {
            Binding::Refused(format!(
                "column '{col}' is {printed}, which has no tensor dtype (and Polars cannot export it \
                 through Arrow); cast it first, e.g. pl.col('{col}').cast(pl.Int64) or pl.Float64"
            ))
            .into()
        })
    })
}

/// Imports `x` (which has `__dlpack__`) along the core's import ladder
/// (`dlframe::dlpack::ImportRequest`, docs/conformance.md item 16): its type's exchange table,
/// numpy's struct, `__dlpack__`, and, where `__dlpack__` refuses with BufferError (numpy has no
/// DLPack form of `datetime64`), the array interface. The core decides the order, what a
/// failure leads to and the `__dlpack__` call; this only reads the object and makes the calls.
/// Where the interface refuses too, the DLPack error is raised, except for a datetime, whose
/// refusal names its unit.
fn import_ladder(x: &Bound<'_, PyAny>, copy: Option<bool>, keep: Keep) -> Result<Tensor> {
    let py = x.py();
    let request = ImportRequest { copy, keep };
    let table = exchange::table_of(x)?;
    let array = ndarray::as_ndarray(x)?;
    let offer = Offer {
        table: match table {
            Some(t) if copy != Some(true) => t.answers_for(x)?,
            _ => false,
        },
        ndarray: array.is_some(),
        dlpack: true,
    };
    let mut refused = None;
    for rung in request.rungs(offer) {
        let tried = match rung {
            Rung::Table => table.map(|t| exchange::import(x, t)).transpose(),
            Rung::NdArray => Ok(array.and_then(ndarray::NdArray::import)),
            Rung::Dlpack => dlpack_rung(x, &request, array.is_some()).map(Some),
            Rung::Interface => Ok(None),
        };
        match tried {
            Ok(Some(t)) => {
                request.accept(t.device())?;
                return Ok(t);
            }
            Ok(None) => {}
            Err(e) => match request.then(rung, failure_of(py, &e)) {
                Then::Next => refused = Some((rung, e)),
                Then::Raise => return Err(e),
            },
        }
    }
    match refused {
        Some((Rung::Dlpack, e)) => match interface::import(x, CopyPolicy::from(copy)) {
            Ok(Some(imported)) => Ok(imported.tensor),
            Err(refusal) if interface::is_datetime(x) => Err(refusal),
            _ => Err(e),
        },
        Some((_, e)) => Err(e),
        None => Err(Binding::NoProtocol("the object has no __dlpack__".into()).into()),
    }
}

/// How a rung failed, for the ladder: BufferError is a refusal, TypeError the wrong object.
fn failure_of(py: Python<'_>, e: &Error) -> Failure {
    if e.is_type_error(py) {
        Failure::WrongObject
    } else if e.is_buffer_error(py) {
        Failure::Refused
    } else {
        Failure::Other
    }
}

/// The `__dlpack__` rung: the call the core makes of the producer's device (numpy's ndarray is
/// always on the CPU: asking its `__dlpack_device__` was a fifth of a small import).
fn dlpack_rung(x: &Bound<'_, PyAny>, request: &ImportRequest, ndarray: bool) -> Result<Tensor> {
    let py = x.py();
    let (device_type, device_id): (i32, i32) = if ndarray {
        (1, 0)
    } else {
        match x.getattr(intern!(py, "__dlpack_device__")) {
            Ok(f) => f.call0()?.extract()?,
            Err(_) => (1, 0),
        }
    };
    match request.dlpack_call(DLDevice { device_type, device_id })? {
        DlpackCall::OnDevice(device) => import_on_device(x, device),
        DlpackCall::Host { dl_device, copy, bare_last } => {
            // A copy of the shared keywords: an unknown producer may keep or change the dict.
            let kw = capsule::versioned_request(py)?.copy()?;
            if let Some(d) = dl_device {
                kw.set_item(intern!(py, "dl_device"), (d.device_type, d.device_id))?;
            }
            if let Some(c) = copy {
                kw.set_item(intern!(py, "copy"), c)?;
            }
            let t = call_dlpack(x, &kw, bare_last)?;
            if !t.device().is_host_accessible() {
                return Err(Binding::Refused(format!(
                    "the producer returned a {} tensor; Arrow needs host memory",
                    t.device()
                ))
                .into());
            }
            Ok(t)
        }
    }
}

/// Calls `x.__dlpack__(**kw)` and consumes the capsule. A producer that refuses a keyword with
/// TypeError is asked again without `max_version`, then (when `bare_last`) with no keywords.
fn call_dlpack(x: &Bound<'_, PyAny>, kw: &Bound<'_, PyDict>, bare_last: bool) -> Result<Tensor> {
    let py = x.py();
    let method = x.getattr(intern!(py, "__dlpack__"))?;
    let cap = match method.call((), Some(kw)).map_err(Error::from) {
        Ok(c) => c,
        Err(e) if e.is_type_error(py) => {
            kw.del_item(intern!(py, "max_version"))?;
            match method.call((), Some(kw)).map_err(Error::from) {
                Ok(c) => c,
                Err(e) if e.is_type_error(py) && bare_last => method.call0()?,
                Err(e) => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let cap = cap
        .cast::<PyCapsule>()
        .map_err(|_| Binding::WrongType("__dlpack__ did not return a capsule".into()))?;
    Ok(capsule::consume(cap)?.into_tensor())
}

/// A CUDA tensor kept on its device (without copying): the producer is asked for it with
/// `stream=` our stream on that device, so its pending work is ordered before ours, and the
/// result re-exports zero-copy with our stream semantics (torch -> dlframe -> cupy).
fn import_on_device(x: &Bound<'_, PyAny>, device: Device) -> Result<Tensor> {
    let py = x.py();
    // Refused here, before the producer is asked, when the device is out of reach.
    let stream = py.detach(|| transfer::stream_handle(device))?;
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "stream"), stream)?;
    kw.set_item(intern!(py, "max_version"), capsule::MAX_VERSION)?;
    // No bare call: without `stream` the producer would not order its work before ours.
    let t = call_dlpack(x, &kw, false)?;
    if t.device() != device {
        return Err(Binding::Refused(format!(
            "__dlpack_device__ said {device} but the producer returned a tensor on {}",
            t.device()
        ))
        .into());
    }
    Ok(py.detach(|| transfer::adopt(t))?)
}

/// A tensor from a raw capsule: a CUDA one is adopted on its device, ordered after the legacy
/// default stream (where DLPack puts data handed over without a stream).
fn from_capsule(cap: &Bound<'_, PyCapsule>) -> Result<Tensor> {
    let t = capsule::consume(cap)?.into_tensor();
    if t.device().is_host_accessible() {
        // Nothing to order, so the GIL stays held, as in the exchange API's import: releasing it
        // would let another Python thread take it, and this small import wait for its turn.
        return Ok(t);
    }
    Ok(cap.py().detach(|| transfer::adopt_legacy(t))?)
}

/// Any tensor as a pyarrow array, zero-copy where the memory allows.
///
/// Accepts objects with `__dlpack__`, raw DLPack capsules, `__array_interface__`,
/// `__array_struct__` and the buffer protocol; when a producer's `__dlpack__` refuses with
/// BufferError (numpy's datetime64), its array interface is read instead. N-d tensors become
/// `fixed_shape_tensor` arrays. The producer's memory stays alive as long as the Arrow buffers.
/// Device tensors become host arrays only with `copy=True`; otherwise BufferError. `copy=False`
/// raises BufferError when the memory cannot be shared.
#[pyfunction]
#[pyo3(signature = (x, *, copy=None, device=None))]
pub fn from_dlpack<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    copy: Option<bool>,
    device: Option<HostDevice>,
) -> Result<Bound<'py, PyAny>> {
    // `HostDevice` has refused every device but the CPU.
    let _ = device;
    // A plain numpy array goes to pyarrow's own DLPack import as it is: what dlframe's import
    // of it would hand pyarrow, without making and exporting a tensor in between.
    if copy != Some(true)
        && ndarray::as_ndarray(x)?.is_some_and(ndarray::NdArray::is_plain_1d)
        && let Some(shared) = pyarrow_from_dlpack(py, x)
    {
        return Ok(shared);
    }
    let (tensor, copy) = if let Ok(t) = x.cast::<PyTensor>() {
        let t = &t.get().inner;
        let (host, fresh) = gil::run_over(py, t, || transfer::on_host(t, copy))?;
        // A transfer to the host is already a fresh copy: no second one.
        (host, if fresh { None } else { copy })
    } else if let Ok(cap) = x.cast::<PyCapsule>() {
        (capsule::consume(cap)?.into_tensor(), copy)
    } else if x.hasattr(intern!(x.py(), "__dlpack__"))? {
        (import_ladder(x, copy, Keep::Host)?, copy)
    } else if let Some(imported) = interface::import(x, CopyPolicy::from(copy))? {
        (imported.tensor, copy)
    } else {
        return Err(Binding::NoProtocol(format!(
            "from_dlpack needs __dlpack__, a DLPack capsule, __array_interface__, __array_struct__ or the \
             buffer protocol; {} has none of them",
            x.get_type().name()?
        ))
        .into());
    };
    if !tensor.device().is_host_accessible() {
        return Err(Binding::Refused(format!(
            "the tensor is on {}; Arrow needs host memory",
            tensor.device()
        ))
        .into());
    }
    if copy != Some(true)
        && let Some(shared) = plain_to_pyarrow(py, &tensor)
    {
        return Ok(shared);
    }
    let policy = CopyPolicy::from(copy);
    let (field, array) = gil::run_over(py, &tensor, || tensor_to_column_with(&tensor, "", policy))?;
    to_pyarrow(py, field, array)
}

/// Wraps a tensor-like object (DLPack, array interface, buffer) as a dlframe Tensor, without
/// copying and without converting to Arrow.
///
/// A CUDA tensor (torch, cupy, jax) stays on its device and re-exports zero-copy with dlframe's
/// stream semantics. Other devices raise BufferError; without CUDA support, RuntimeError.
#[pyfunction]
pub fn tensor(x: &Bound<'_, PyAny>) -> Result<PyTensor> {
    if let Ok(cap) = x.cast::<PyCapsule>() {
        return Ok(PyTensor::new(from_capsule(cap)?));
    }
    if x.hasattr(intern!(x.py(), "__dlpack__"))? {
        return Ok(PyTensor::new(import_ladder(x, None, Keep::Device)?));
    }
    match interface::import(x, CopyPolicy::IfNeeded)? {
        Some(imported) => Ok(PyTensor::with_sycl(imported.tensor, imported.syclobj)),
        None => Err(Binding::NoProtocol(
            "expected __dlpack__, a capsule, __array_interface__, __array_struct__ or a buffer".into(),
        )
        .into()),
    }
}

/// `pyarrow.Array.from_dlpack`, looked up once; None for a pyarrow without it.
static FROM_DLPACK: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// A pyarrow array over a plain 1-D tensor's memory (no copy), made by pyarrow's own DLPack
/// importer from dlframe's export of the tensor: for a small array, the Arrow C schema and
/// array that [`to_pyarrow`] builds, and pyarrow's import of them, cost twice the whole DLPack
/// hand-over. Only for what that importer makes exactly as the Arrow path would: a non-empty,
/// aligned, contiguous 1-D host tensor of integers or IEEE floats with no Arrow type of its
/// own, and writable (a pyarrow that asks for a legacy capsule would get a copy of read-only
/// memory). None otherwise, or when pyarrow refuses; the caller then takes the Arrow path.
pub fn plain_to_pyarrow<'py>(py: Python<'py>, t: &Tensor) -> Option<Bound<'py, PyAny>> {
    let plain = t.ndim() == 1
        && t.numel() > 0
        && !t.readonly()
        && t.logical().is_none()
        && !matches!(t.dtype(), DType::Bool | DType::BFloat16)
        && t.check_host_contiguous().is_ok();
    if !plain {
        return None;
    }
    let tensor = Bound::new(py, PyTensor::new(t.clone())).ok()?;
    pyarrow_from_dlpack(py, &tensor)
}

/// `pyarrow.Array.from_dlpack(x)` (no copy); None for a pyarrow without it or that refuses
/// `x`. For producers of what [`plain_to_pyarrow`] hands on.
pub fn pyarrow_from_dlpack<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    array_method(py, &FROM_DLPACK, "from_dlpack").ok()??.call1((x,)).ok()
}

//! `to_dlpack` (any Arrow producer -> Tensor) and `from_dlpack` (any tensor producer -> Arrow).

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, FieldRef};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use pyo3_arrow::PyArray;
use pyo3_arrow::input::AnyArray;

use dlframe::arrow::{
    Converted, ExportOptions, NullPolicy, Scalar, columns_to_tensor, is_list_like, tensor_to_column_with,
    to_tensor,
};
use dlframe::ffi::dlpack::DLDevice;
use dlframe::kernels::Order;
use dlframe::{Device, Tensor};

use crate::args::DTypeArg;
use crate::capsule;
use crate::error::Result;
use crate::interface;
use crate::tensor::{PyTensor, consumer_stream, copy_policy, stream_number};

/// A pyarrow array for an Arrow column (zero-copy through the C data interface).
pub fn to_pyarrow<'py>(py: Python<'py>, field: FieldRef, array: ArrayRef) -> Result<Bound<'py, PyAny>> {
    let array = PyArray::try_new(array, field)?;
    let out = array.to_pyarrow(py)?.unbind();
    Ok(out.into_bound(py))
}

fn null_policy(nulls: &str, fill_value: Option<&Bound<'_, PyAny>>) -> Result<NullPolicy> {
    let fill = fill_value.filter(|v| !v.is_none()).map(scalar).transpose()?;
    Ok(NullPolicy::parse(nulls, fill)?)
}

fn scalar(v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
        return Ok(Scalar::Bool(b.is_true()));
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(Scalar::Int(i));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(Scalar::Float(f));
    }
    Err(PyTypeError::new_err(format!(
        "fill_value must be a bool, int or float, not {}",
        v.get_type().name()?
    )))
}

/// The Python result of a conversion: the values, or `(values, mask)` under `nulls="mask"`
/// (an all-true mask, on the values' device, when there were no nulls). With a consumer
/// `stream` (device results only), that stream is made to wait for the work that made them.
fn wrap(py: Python<'_>, c: Converted, nulls: NullPolicy, stream: Option<usize>) -> Result<Py<PyAny>> {
    let Converted { values, mask } = c;
    let mask = match (nulls, mask) {
        (NullPolicy::Mask, None) => Some(py.detach(|| all_valid(&values))?),
        (_, m) => m,
    };
    if let Some(h) = stream {
        for t in std::iter::once(&values).chain(&mask) {
            if let Some(sync) = t.sync() {
                py.detach(|| sync.wait_on(h))?;
            }
        }
    }
    let values = Py::new(py, PyTensor::new(values))?;
    let Some(mask) = mask.filter(|_| nulls == NullPolicy::Mask) else {
        return Ok(values.into_any());
    };
    let mask = Py::new(py, PyTensor::new(mask))?;
    Ok(PyTuple::new(py, [values.into_any(), mask.into_any()])?.into_any().unbind())
}

/// A mask of `true`s shaped like `values`, on its device.
fn all_valid(values: &Tensor) -> dlframe::Result<Tensor> {
    let host = Tensor::from_vec(vec![true; values.numel()], values.shape().to_vec())?.with_copied(true);
    match values.device() {
        #[cfg(feature = "cuda")]
        Device::Cuda(i) => dlframe::cuda::upload(&host, i as usize),
        _ => Ok(host),
    }
}

/// Splits a struct column (a record batch or table) into its fields and per-field chunks.
/// A table's fields and, per field, its chunks.
type Columns = (Vec<FieldRef>, Vec<Vec<ArrayRef>>);

fn table_columns(field: &FieldRef, chunks: &[ArrayRef]) -> Result<Option<Columns>> {
    let DataType::Struct(fields) = field.data_type() else { return Ok(None) };
    let mut columns = vec![Vec::with_capacity(chunks.len()); fields.len()];
    for chunk in chunks {
        let s = chunk.as_struct();
        if s.null_count() > 0 {
            return Err(PyBufferError::new_err(format!(
                "struct column {:?} has {} null rows; fill or drop them first",
                field.name(),
                s.null_count()
            ))
            .into());
        }
        for (col, child) in columns.iter_mut().zip(s.columns()) {
            col.push(child.clone());
        }
    }
    Ok(Some((fields.iter().cloned().collect(), columns)))
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
/// - `order`: `"C"` or `"F"`, the memory order of a matrix.
/// - `device`: `"cpu"` (default), `"cuda"` or `"cuda:N"`; `stream` (DLPack numbering, or a
///   torch/cupy stream) is then made to wait for the conversion.
#[pyfunction]
#[pyo3(signature = (obj, *, nulls="error", fill_value=None, copy=None, dtype=None, order="C", device=None, columns="stack", stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn to_dlpack<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    nulls: &str,
    fill_value: Option<Bound<'py, PyAny>>,
    copy: Option<bool>,
    dtype: Option<DTypeArg>,
    order: &str,
    device: Option<Bound<'py, PyAny>>,
    columns: &str,
    stream: Option<Bound<'py, PyAny>>,
) -> Result<Py<PyAny>> {
    let target = match device.as_ref().filter(|d| !d.is_none()) {
        None => None,
        Some(d) => parse_target_device(&d.str()?.extract::<String>()?)?,
    };
    let stream = match (stream.as_ref().filter(|s| !s.is_none()), target) {
        (None, _) => None,
        (Some(s), Some(_)) => consumer_stream(stream_number(s)?)?,
        (Some(_), None) => {
            return Err(PyValueError::new_err(
                "stream= orders a device result on a consumer's stream; pass device='cuda:N' too",
            )
            .into());
        }
    };
    let order = match order {
        "C" | "c" => Order::C,
        "F" | "f" => Order::F,
        other => return Err(PyValueError::new_err(format!("order={other:?}: expected 'C' or 'F'")).into()),
    };
    let nulls = null_policy(nulls, fill_value.as_ref())?;
    let opts = ExportOptions { nulls, copy: copy_policy(copy), dtype: dtype.map(|d| d.0), order };
    let collected;
    let obj = if is_lazy_frame(obj)? {
        collected = collect_lazy(obj)?;
        &collected
    } else {
        obj
    };
    let chunked = match arrow_input(obj) {
        Ok(input) => input.into_chunked_array().map_err(crate::error::Error::from),
        Err(e) => Err(e.into()),
    }
    .map_err(|e| input_error(obj, e))?;
    let (chunks, field) = chunked.into_inner();
    if let Some((fields, cols)) = table_columns(&field, &chunks)? {
        return match columns {
            // One list or tensor column (a `SELECT to_tensor(...)` result) is that column's
            // tensor, `(n, *cell_shape)`: there is nothing to stack.
            "stack" if fields.len() == 1 && is_list_like(fields[0].data_type()) => {
                let c = py.detach(|| column(&fields[0], &cols[0], &opts, target))?;
                wrap(py, c, nulls, stream)
            }
            "stack" => {
                let c = py.detach(|| matrix(&fields, &cols, &opts, target))?;
                wrap(py, c, nulls, stream)
            }
            "dict" => {
                if let Some(name) = first_duplicate(fields.iter().map(|f| f.name().as_str())) {
                    return Err(dlframe::Error::InvalidArgument(format!(
                        "column '{name}' appears twice, so columns=\"dict\" would keep only one of them; \
                         rename one, or use columns=\"stack\""
                    ))
                    .into());
                }
                let out = PyDict::new(py);
                for (f, chunks) in fields.iter().zip(&cols) {
                    let c = py.detach(|| column(f, chunks, &opts, target))?;
                    out.set_item(f.name(), wrap(py, c, nulls, stream)?)?;
                }
                Ok(out.into_any().unbind())
            }
            other => {
                Err(PyValueError::new_err(format!("columns={other:?}: expected 'stack' or 'dict'")).into())
            }
        };
    }
    let c = py.detach(|| column(&field, &chunks, &opts, target))?;
    wrap(py, c, nulls, stream)
}

/// An Arrow producer's data, through the PyCapsule interface. The protocol methods are looked up
/// on the type: an instance lookup of a missing method falls back to `__getattr__`, which costs a
/// polars Series about 7 us (it searches its expression namespace) before we try the stream.
fn arrow_input(obj: &Bound<'_, PyAny>) -> PyResult<AnyArray> {
    let py = obj.py();
    let ty = obj.get_type();
    if ty.hasattr(intern!(py, "__arrow_c_array__"))? {
        Ok(AnyArray::Array(obj.extract()?))
    } else if ty.hasattr(intern!(py, "__arrow_c_stream__"))? {
        Ok(AnyArray::Stream(obj.extract()?))
    } else {
        // Buffers and other objects pyo3-arrow accepts without the protocol methods.
        obj.extract()
    }
}

/// The first name that appears twice.
fn first_duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = std::collections::HashSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
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
fn input_error(obj: &Bound<'_, PyAny>, e: crate::error::Error) -> crate::error::Error {
    let py = obj.py();
    let ty = obj.get_type();
    let name = ty.name().map(|n| n.to_string()).unwrap_or_default();
    let speaks_arrow = ty.hasattr(intern!(py, "__arrow_c_array__")).unwrap_or(false)
        || ty.hasattr(intern!(py, "__arrow_c_stream__")).unwrap_or(false);
    if !speaks_arrow {
        return PyTypeError::new_err(format!(
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
fn unsupported_polars_column(obj: &Bound<'_, PyAny>) -> Option<crate::error::Error> {
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
            PyBufferError::new_err(format!(
                "column '{col}' is {printed}, which has no tensor dtype (and Polars cannot export it \
                 through Arrow); cast it first, e.g. pl.col('{col}').cast(pl.Int64) or pl.Float64"
            ))
            .into()
        })
    })
}

/// `None` for the CPU, `Some(ordinal)` for `"cuda"` / `"cuda:N"`.
fn parse_target_device(name: &str) -> PyResult<Option<usize>> {
    match name {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        _ => match name.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(i) => Ok(Some(i)),
            None => {
                Err(PyValueError::new_err(format!("device={name:?}: expected 'cpu', 'cuda' or 'cuda:N'")))
            }
        },
    }
}

/// One column on the CPU or, with the `cuda` feature, on a CUDA device.
fn column(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
    target: Option<usize>,
) -> dlframe::Result<Converted> {
    match target {
        None => to_tensor(field, chunks, opts),
        #[cfg(feature = "cuda")]
        Some(i) => dlframe::cuda::to_device(field, chunks, opts, i),
        #[cfg(not(feature = "cuda"))]
        Some(_) => Err(no_cuda()),
    }
}

/// Several columns as one matrix on the CPU or, with the `cuda` feature, on a CUDA device.
fn matrix(
    fields: &[FieldRef],
    cols: &[Vec<ArrayRef>],
    opts: &ExportOptions,
    target: Option<usize>,
) -> dlframe::Result<Converted> {
    match target {
        None => columns_to_tensor(fields, cols, opts),
        #[cfg(feature = "cuda")]
        Some(i) => dlframe::cuda::columns_to_device(fields, cols, opts, i),
        #[cfg(not(feature = "cuda"))]
        Some(_) => Err(no_cuda()),
    }
}

/// Why a build without the `cuda` feature cannot do what was asked.
#[cfg(not(feature = "cuda"))]
pub const NO_CUDA: &str = "this build has no CUDA support (feature `cuda`)";

#[cfg(not(feature = "cuda"))]
pub(crate) fn no_cuda() -> dlframe::Error {
    dlframe::Error::CopyRequired { reason: NO_CUDA.into() }
}

/// Where an imported device tensor goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// To the host, for Arrow: device data only by an explicit `copy=True`, made by the producer.
    Host,
    /// Where it is: CUDA tensors stay on their device (`dlframe.tensor(x)`), without a copy.
    Device,
}

/// Imports through `__dlpack__`, following the consumer ladder of docs/conformance.md item 16.
fn via_dlpack(x: &Bound<'_, PyAny>, copy: Option<bool>, keep: Keep) -> Result<Tensor> {
    let py = x.py();
    // Interned names: this runs once per imported tensor, and building and hashing the strings
    // anew was most of its cost next to the producer's own __dlpack__.
    let (ty, id): (i32, i32) = match x.getattr(intern!(py, "__dlpack_device__")) {
        Ok(f) => f.call0()?.extract()?,
        Err(_) => (1, 0),
    };
    let host =
        Device::from_dlpack(DLDevice { device_type: ty, device_id: 0 }).is_ok_and(|d| d.is_host_accessible());
    if !host && keep == Keep::Device {
        return import_on_device(x, ty, id);
    }
    if !host && copy != Some(true) {
        return Err(PyBufferError::new_err(format!(
            "the tensor is on DLPack device ({ty}, {id}); Arrow needs host memory, and dlframe copies device \
             data to the host only when asked: pass copy=True{}",
            if copy == Some(false) { " (copy=False was given)" } else { "" }
        ))
        .into());
    }
    // Device data is asked for on the CPU, copied by the producer.
    let (dl_device, copy_arg) = if host { (None, copy) } else { (Some((1i32, 0i32)), Some(true)) };
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "max_version"), (1, 3))?;
    if let Some(d) = dl_device {
        kw.set_item(intern!(py, "dl_device"), d)?;
    }
    if let Some(c) = copy_arg {
        kw.set_item(intern!(py, "copy"), c)?;
    }
    let t = call_dlpack(x, &kw, host)?;
    if !t.device().is_host_accessible() {
        return Err(PyBufferError::new_err(format!(
            "the producer returned a {} tensor; Arrow needs host memory",
            t.device()
        ))
        .into());
    }
    Ok(t)
}

/// Imports a host tensor through `__dlpack__`; when the producer refuses with BufferError (numpy
/// has no DLPack form of `datetime64`), through its array interface, which also carries a
/// datetime's unit.
fn dlpack_or_interface(x: &Bound<'_, PyAny>, copy: Option<bool>) -> Result<Tensor> {
    match via_dlpack(x, copy, Keep::Host) {
        // Only when the interface works: otherwise the DLPack error says more.
        Err(e) if e.is_instance_of::<PyBufferError>(x.py()) => match interface::import(x) {
            Ok(Some(imported)) => Ok(imported.tensor),
            _ => Err(e),
        },
        other => other,
    }
}

/// Calls `x.__dlpack__(**kw)` and consumes the capsule. A producer that refuses a keyword with
/// TypeError is asked again without `max_version`, then (when `bare_last`) with no keywords.
fn call_dlpack(x: &Bound<'_, PyAny>, kw: &Bound<'_, PyDict>, bare_last: bool) -> Result<Tensor> {
    let py = x.py();
    let method = x.getattr(intern!(py, "__dlpack__"))?;
    let cap = match method.call((), Some(kw)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            kw.del_item(intern!(py, "max_version"))?;
            match method.call((), Some(kw)) {
                Ok(c) => c,
                Err(e) if e.is_instance_of::<PyTypeError>(py) && bare_last => method.call0()?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    let cap =
        cap.cast::<PyCapsule>().map_err(|_| PyTypeError::new_err("__dlpack__ did not return a capsule"))?;
    Ok(capsule::consume(cap)?.into_tensor())
}

/// A CUDA tensor kept on its device (without copying): the producer is asked for it with
/// `stream=` our stream on that device, so its pending work is ordered before ours, and the
/// result re-exports zero-copy with our stream semantics (torch -> dlframe -> cupy).
#[cfg(feature = "cuda")]
fn import_on_device(x: &Bound<'_, PyAny>, ty: i32, id: i32) -> Result<Tensor> {
    let py = x.py();
    let ordinal = match (ty, usize::try_from(id)) {
        (2, Ok(i)) => i,
        _ => return Err(device_refused(ty, id)),
    };
    // Our stream handle is never 0 (ambiguous in DLPack); the legacy default stream is 1.
    let stream = py.detach(|| dlframe::cuda::stream_handle(ordinal))?.max(1);
    let kw = PyDict::new(py);
    kw.set_item(intern!(py, "stream"), stream)?;
    kw.set_item(intern!(py, "max_version"), (1, 3))?;
    // No bare call: without `stream` the producer would not order its work before ours.
    let t = call_dlpack(x, &kw, false)?;
    if t.device() != Device::Cuda(id) {
        return Err(PyBufferError::new_err(format!(
            "__dlpack_device__ said cuda:{id} but the producer returned a tensor on {}",
            t.device()
        ))
        .into());
    }
    Ok(py.detach(|| dlframe::cuda::adopt(t))?)
}

#[cfg(not(feature = "cuda"))]
fn import_on_device(_x: &Bound<'_, PyAny>, ty: i32, id: i32) -> Result<Tensor> {
    Err(if ty == 2 { dlframe::Error::Cuda(NO_CUDA.into()).into() } else { device_refused(ty, id) })
}

/// A tensor from a raw capsule: a CUDA one is adopted on its device, ordered after the legacy
/// default stream (where DLPack puts data handed over without a stream).
fn from_capsule(cap: &Bound<'_, PyCapsule>) -> Result<Tensor> {
    let t = capsule::consume(cap)?.into_tensor();
    match t.device() {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Ok(cap.py().detach(|| dlframe::cuda::adopt_legacy(t))?),
        _ => Ok(t),
    }
}

fn device_refused(ty: i32, id: i32) -> crate::error::Error {
    PyBufferError::new_err(format!(
        "the tensor is on DLPack device ({ty}, {id}); dlframe keeps only CUDA (2) device tensors on their \
         device. Use dlframe.from_dlpack(x, copy=True) for a host copy"
    ))
    .into()
}

/// A tensor in host memory for Arrow: device tensors of ours only through `copy=True`, as one
/// device-to-host transfer (then no second copy is needed).
pub fn on_host(t: Tensor, copy: Option<bool>) -> Result<(Tensor, Option<bool>)> {
    if t.device().is_host_accessible() {
        return Ok((t, copy));
    }
    if copy != Some(true) {
        return Err(PyBufferError::new_err(format!(
            "the tensor is on {}; Arrow needs host memory, and dlframe copies device data to the host \
             only when asked: pass copy=True",
            t.device()
        ))
        .into());
    }
    #[cfg(feature = "cuda")]
    if matches!(t.device(), Device::Cuda(_)) && t.sync().is_some() {
        return Ok((dlframe::cuda::download(&t)?, None));
    }
    Err(PyBufferError::new_err(format!("dlframe cannot copy a tensor on {} to the host", t.device())).into())
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
    device: Option<Bound<'py, PyAny>>,
) -> Result<Bound<'py, PyAny>> {
    if let Some(d) = device.as_ref().filter(|d| !d.is_none()) {
        let name: String = d.str()?.extract()?;
        if name != "cpu" {
            return Err(PyValueError::new_err(format!(
                "device={name:?}: Arrow arrays live on the CPU; pass device='cpu' or None"
            ))
            .into());
        }
    }
    let (tensor, copy) = if let Ok(t) = x.cast::<PyTensor>() {
        let t = t.get().inner.clone();
        py.detach(|| on_host(t, copy))?
    } else if let Ok(cap) = x.cast::<PyCapsule>() {
        (capsule::consume(cap)?.into_tensor(), copy)
    } else if x.hasattr(intern!(x.py(), "__dlpack__"))? {
        (dlpack_or_interface(x, copy)?, copy)
    } else if let Some(imported) = interface::import(x)? {
        (imported.tensor, copy)
    } else {
        return Err(PyAttributeError::new_err(format!(
            "from_dlpack needs __dlpack__, a DLPack capsule, __array_interface__, __array_struct__ or the \
             buffer protocol; {} has none of them",
            x.get_type().name()?
        ))
        .into());
    };
    if tensor.device() != Device::Cpu && !tensor.device().is_host_accessible() {
        return Err(PyBufferError::new_err(format!(
            "the tensor is on {}; Arrow needs host memory",
            tensor.device()
        ))
        .into());
    }
    let policy = copy_policy(copy);
    let (field, array) = py.detach(move || tensor_to_column_with(&tensor, "", policy))?;
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
        return Ok(PyTensor::new(via_dlpack(x, None, Keep::Device)?));
    }
    match interface::import(x)? {
        Some(imported) => Ok(PyTensor::with_sycl(imported.tensor, imported.syclobj)),
        None => Err(PyAttributeError::new_err(
            "expected __dlpack__, a capsule, __array_interface__, __array_struct__ or a buffer",
        )
        .into()),
    }
}

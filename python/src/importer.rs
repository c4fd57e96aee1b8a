//! `from_dlpack` (any tensor producer -> pyarrow array) and `tensor` (any tensor producer ->
//! `Tensor`): the core's import ladder (`dlframe::dlpack::ImportRequest`) carried out on Python
//! objects.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyCapsule, PyDict};

use dlframe::dlpack::{DlpackCall, ImportRequest, Keep, Offer, Rung, Then};
use dlframe::ffi::dlpack::DLDevice;
use dlframe::options::CopyPolicy;
use dlframe::{DType, Tensor, transfer};

use crate::args::HostDevice;
use crate::capsule;
use crate::error::{Binding, Result};
use crate::exchange;
use crate::gil;
use crate::input::Input;
use crate::interface;
use crate::ndarray;
use crate::tensor::{PyTensor, host_to_pyarrow, pyarrow_from_dlpack};

/// Imports `x` (which has `__dlpack__`) along the core's import ladder
/// (`dlframe::dlpack::ImportRequest`, docs/conformance.md item 16): its type's exchange table,
/// numpy's struct, `__dlpack__`, and, where `__dlpack__` refuses with BufferError (numpy has no
/// DLPack form of `datetime64` or of ml_dtypes' types), an ml_dtypes array's bits and the array
/// interface. The core decides the order, what a failure leads to and the `__dlpack__` call;
/// this only reads the object and makes the calls.
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
    // The last refusal that handed over to the next rung: `__dlpack__`'s, when the rungs after
    // it decline.
    let mut refused = None;
    for rung in request.rungs(offer) {
        let tried = match rung {
            Rung::Table => table.map(|t| exchange::import(x, t)).transpose(),
            Rung::NdArray => Ok(array.and_then(ndarray::NdArray::import)),
            Rung::Dlpack => dlpack_rung(x, &request, array.is_some()).map(Some),
            Rung::NamedBits => named_bits(x, copy),
            Rung::Interface => match interface::import(x, CopyPolicy::from(copy)) {
                Ok(imported) => Ok(imported.map(|i| i.tensor)),
                // A datetime's refusal names its unit; any other leaves `__dlpack__`'s.
                Err(refusal) if interface::is_datetime(x) => Err(refusal),
                Err(_) => Ok(None),
            },
        };
        match tried {
            Ok(Some(t)) => {
                request.accept(t.device())?;
                return Ok(t);
            }
            Ok(None) => {}
            Err(e) => match request.then(rung, e.failure(py)) {
                Then::Next => refused = Some(e),
                Then::Raise => return Err(e),
            },
        }
    }
    Err(refused.unwrap_or_else(|| Binding::NoProtocol("the object has no __dlpack__".into()).into()))
}

/// A numpy array of a dtype numpy itself lacks (ml_dtypes' bfloat16 and float8, which numpy's
/// `__dlpack__` refuses and whose typestr, `<V1` or `<f1`, names no type), read by its dtype's
/// name: its bits viewed as unsigned integers (numpy's public `view`, no copy; with
/// `copy=True`, a copy first), imported, and relabelled. None for any other array.
fn named_bits(x: &Bound<'_, PyAny>, copy: Option<bool>) -> Result<Option<Tensor>> {
    let py = x.py();
    let name = x.getattr(intern!(py, "dtype"))?.getattr(intern!(py, "name"))?.extract::<String>()?;
    let Some((dtype, bits)) = DType::from_name(&name).ok().and_then(|d| Some((d, d.bits_dtype()?))) else {
        return Ok(None);
    };
    let source = if copy == Some(true) { x.call_method0(intern!(py, "copy"))? } else { x.clone() };
    let view = source.call_method1(intern!(py, "view"), (bits.name(),))?;
    let Some(t) = ndarray::as_ndarray(&view)?.and_then(ndarray::NdArray::import) else {
        return Ok(None);
    };
    Ok(Some(t.view_as(dtype)?))
}

/// The `__dlpack__` rung: the call the core makes of the producer's device (numpy's ndarray is
/// always on the CPU: asking its `__dlpack_device__` was a fifth of a small import).
fn dlpack_rung(x: &Bound<'_, PyAny>, request: &ImportRequest, ndarray: bool) -> Result<Tensor> {
    let py = x.py();
    let (device_type, device_id): (i32, i32) =
        match (!ndarray).then(|| x.getattr(intern!(py, "__dlpack_device__"))) {
            Some(Ok(f)) => f.call0()?.extract()?,
            _ => (1, 0),
        };
    let call = request.dlpack_call(DLDevice { device_type, device_id })?;
    // A dict of its own: a producer may keep or change the dict it gets.
    let kw = [(intern!(py, "max_version"), capsule::MAX_VERSION)].into_py_dict(py)?;
    let t = match call {
        DlpackCall::OnDevice(device) => {
            // The producer is asked with `stream=` our stream on that device (refused here, before
            // it is asked, when the device is out of reach), so its pending work is ordered before
            // ours; no bare call, which would not order it.
            kw.set_item(intern!(py, "stream"), py.detach(|| transfer::stream_handle(device))?)?;
            call_dlpack(x, &kw, false)?
        }
        DlpackCall::Host { dl_device, copy, bare_last } => {
            if let Some(d) = dl_device {
                kw.set_item(intern!(py, "dl_device"), (d.device_type, d.device_id))?;
            }
            if let Some(c) = copy {
                kw.set_item(intern!(py, "copy"), c)?;
            }
            call_dlpack(x, &kw, bare_last)?
        }
    };
    request.returned(&call, t.device())?;
    match call {
        // Re-exported zero-copy with dlframe's stream semantics (torch -> dlframe -> cupy).
        DlpackCall::OnDevice(_) => Ok(py.detach(|| transfer::adopt(t))?),
        DlpackCall::Host { .. } => Ok(t),
    }
}

/// Calls `x.__dlpack__(**kw)` and consumes the capsule. A producer that refuses a keyword with
/// TypeError is asked again without `max_version`, then (when `bare_last`) with no keywords; a
/// subclass of TypeError (pyarrow's ArrowTypeError for data it cannot export) is the
/// producer's answer, not a keyword refusal, and is not asked again.
fn call_dlpack(x: &Bound<'_, PyAny>, kw: &Bound<'_, PyDict>, bare_last: bool) -> Result<Tensor> {
    let py = x.py();
    let method = x.getattr(intern!(py, "__dlpack__"))?;
    // A TypeError itself, not a subclass: how a producer refuses a keyword.
    let refused =
        |r: &PyResult<_>| r.as_ref().is_err_and(|e| e.get_type(py).is(py.get_type::<PyTypeError>()));
    let mut cap = method.call((), Some(kw));
    if refused(&cap) {
        kw.del_item(intern!(py, "max_version"))?;
        cap = method.call((), Some(kw));
        if bare_last && refused(&cap) {
            cap = method.call0();
        }
    }
    let cap = cap?
        .cast_into::<PyCapsule>()
        .map_err(|_| Binding::WrongType("__dlpack__ did not return a capsule".into()))?;
    Ok(capsule::consume(&cap)?.into_tensor())
}

/// A tensor from a raw capsule: a CUDA one is adopted on its device, ordered after the legacy
/// default stream (where DLPack puts data handed over without a stream).
fn from_capsule(cap: &Bound<'_, PyCapsule>) -> Result<Tensor> {
    let t = capsule::consume(cap)?.into_tensor();
    // A host tensor has nothing to order, so the GIL stays held, as in the exchange API's import:
    // releasing it would let another Python thread take it, and this small import wait its turn.
    Ok(gil::run(cap.py(), t.device().is_host_accessible(), 0, || transfer::adopt_legacy(t))?)
}

/// Any tensor as a pyarrow array, zero-copy where the memory allows.
///
/// Accepts objects with `__dlpack__`, raw DLPack capsules, `__array_interface__`,
/// `__array_struct__`, the buffer protocol and Arrow data (told apart by [`Input`]); when a
/// producer's `__dlpack__` refuses with BufferError (numpy's datetime64), its array interface
/// is read instead. N-d tensors become `fixed_shape_tensor` arrays. The producer's memory stays
/// alive as long as the Arrow buffers. Device tensors become host arrays only with `copy=True`;
/// otherwise BufferError. `copy=False` raises BufferError when the memory cannot be shared.
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
    // A plain numpy array (which the input's order takes as a `__dlpack__` producer) goes to
    // pyarrow's own DLPack import as it is: what dlframe's import of it would hand pyarrow,
    // without making and exporting a tensor in between, nor telling the input apart first.
    if copy != Some(true)
        && ndarray::as_ndarray(x)?.is_some_and(ndarray::NdArray::is_plain_1d)
        && let Some(shared) = pyarrow_from_dlpack(py, x)
    {
        return Ok(shared);
    }
    let x = x.extract::<Input>()?;
    let (tensor, copy) = match &x {
        Input::Ours(t) => return t.get().to_arrow(py, copy),
        Input::Capsule(cap) => (capsule::consume(cap)?.into_tensor(), copy),
        Input::Dlpack(x) => (import_ladder(x, copy, Keep::Host)?, copy),
        Input::Interface(o, offer) => {
            (interface::import_offered(o, offer, CopyPolicy::from(copy))?.tensor, copy)
        }
        // Arrow data, or none of them (AttributeError).
        arrow => (crate::convert::arrow_tensor(arrow, "from_dlpack")?.inner, copy),
    };
    host_to_pyarrow(py, &tensor, copy)
}

/// Wraps a tensor-like object (DLPack, array interface, buffer) as a dlframe Tensor, without
/// copying where its memory allows (numpy's datetime units Arrow lacks, `datetime64[D]`, `[h]`
/// and `[m]`, are converted, a copy: `Tensor.copied` says so). Arrow data on the host
/// (`__arrow_c_array__`, `__arrow_c_stream__`; a pyarrow array too, though it also has
/// `__dlpack__`), or an object with only the device forms, becomes what `to_dlpack` makes of it
/// by default (shared, or one copy for booleans, chunks or a table), errors included.
///
/// A CUDA tensor (torch, cupy, jax) stays on its device and re-exports zero-copy with dlframe's
/// stream semantics. Other devices raise BufferError; without CUDA support, RuntimeError.
#[pyfunction]
pub fn tensor(x: Input<'_>) -> Result<PyTensor> {
    match &x {
        Input::Ours(t) => Ok(PyTensor::new(t.get().inner.clone())),
        Input::Capsule(cap) => Ok(PyTensor::new(from_capsule(cap)?)),
        Input::Dlpack(x) => Ok(PyTensor::new(import_ladder(x, None, Keep::Device)?)),
        Input::Interface(o, offer) => {
            let imported = interface::import_offered(o, offer, CopyPolicy::IfNeeded)?;
            Ok(PyTensor { inner: imported.tensor, syclobj: imported.syclobj })
        }
        // Arrow data on the host answers as `to_dlpack` does (a pyarrow array also has
        // `__dlpack__`, which refuses nulls and booleans with pyarrow's own TypeError); an
        // object with none of them is AttributeError.
        arrow => crate::convert::arrow_tensor(arrow, "tensor"),
    }
}

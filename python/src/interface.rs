//! Imports through `__array_interface__`, `__array_struct__` and the buffer protocol
//! (without copying). The tensor's owner keeps the exporting Python object alive.

use std::sync::Arc;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use pyo3::{ffi, intern};

use dlframe::interface::array_struct::{self, Extents, PyArrayInterface, element_strides};
use dlframe::interface::{ArrayInterface, SyclInterface, TypeStr};
use dlframe::options::CopyPolicy;
use dlframe::{Device, Tensor};

use crate::error::{Binding, Error, Result};

/// Keeps a Python object alive from Rust; dropped without the GIL, pyo3 defers the decref.
pub(crate) struct PyOwner(Option<Py<PyAny>>);

impl PyOwner {
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> Self {
        PyOwner(Some(obj.clone().unbind()))
    }
}

// A keep-alive only: never read, so no broken state can be observed after a panic.
impl std::panic::RefUnwindSafe for PyOwner {}

impl Drop for PyOwner {
    /// A Py dropped without an attached thread only queues its decref until pyo3's next GIL
    /// acquisition, so the exporter would outlive its last Arrow array: attaching (a no-op when
    /// this thread is attached) releases it now. While the interpreter finalizes, or after, the
    /// reference stays queued.
    fn drop(&mut self) {
        let obj = self.0.take();
        let _ = Python::try_attach(move |_| drop(obj));
    }
}

/// A tensor imported from a Python object, and the SYCL queue or context its memory belongs
/// to when it came through `__sycl_usm_array_interface__`.
pub struct Imported {
    pub tensor: Tensor,
    pub syclobj: Option<Py<PyAny>>,
}

/// Which of the array interfaces an object offers (the first, in the order they are tried),
/// with the attribute's value: read once, by [`offered`].
pub enum Offered<'py> {
    Sycl(Bound<'py, PyAny>),
    Dict(Bound<'py, PyAny>),
    Struct(Bound<'py, PyAny>),
    Buffer,
}

/// `__sycl_usm_array_interface__`, the array interface, `__array_struct__`, or the buffer
/// protocol: the first that `x` offers; None when it offers none of them.
pub fn offered<'py>(x: &Bound<'py, PyAny>) -> Option<Offered<'py>> {
    let py = x.py();
    if let Ok(suai) = x.getattr(intern!(py, "__sycl_usm_array_interface__")) {
        return Some(Offered::Sycl(suai));
    }
    if let Ok(ai) = x.getattr(intern!(py, "__array_interface__")) {
        return Some(Offered::Dict(ai));
    }
    if let Ok(cap) = x.getattr(intern!(py, "__array_struct__")) {
        return Some(Offered::Struct(cap));
    }
    // SAFETY: CheckBuffer only inspects the type slots.
    (unsafe { ffi::PyObject_CheckBuffer(x.as_ptr()) } == 1).then_some(Offered::Buffer)
}

/// Imports what [`offered`] found (without copying, but for a datetime's unit that Arrow
/// lacks: days, hours and minutes become their Arrow type through a copy, which `copy` may
/// refuse; `dlframe::interface::datetime`).
pub fn import_offered(x: &Bound<'_, PyAny>, offer: &Offered<'_>, copy: CopyPolicy) -> Result<Imported> {
    let plain = |tensor| Ok(Imported { tensor, syclobj: None });
    match offer {
        Offered::Sycl(suai) => from_sycl(x, suai),
        Offered::Dict(ai) => plain(from_interface_dict(x, ai, copy)?),
        Offered::Struct(cap) => plain(from_array_struct(x, cap)?),
        Offered::Buffer => plain(from_buffer(x)?),
    }
}

/// [`import_offered`] of what [`offered`] finds; `Ok(None)` when the object offers none.
pub fn import(x: &Bound<'_, PyAny>, copy: CopyPolicy) -> Result<Option<Imported>> {
    offered(x).map(|o| import_offered(x, &o, copy)).transpose()
}

/// Whether `x`'s `__array_interface__` describes numpy datetimes or timedeltas (typestr kind
/// `M` or `m`). Reads the interface; for error paths.
pub fn is_datetime(x: &Bound<'_, PyAny>) -> bool {
    let typestr = x
        .getattr(intern!(x.py(), "__array_interface__"))
        .and_then(|ai| ai.get_item("typestr"))
        .and_then(|t| t.extract::<String>());
    typestr.is_ok_and(|t| matches!(t.as_bytes().get(1), Some(b'M' | b'm')))
}

/// `__sycl_usm_array_interface__` v1 (dpctl): strides and offset count elements. Only USM the
/// host can read is imported without copying: shared and host allocations, and device
/// allocations of a CPU device. dpctl tells which.
fn from_sycl(x: &Bound<'_, PyAny>, suai: &Bound<'_, PyAny>) -> Result<Imported> {
    let bad = |m: &str| {
        Error::from(dlframe::Error::InvalidArgument(format!("invalid __sycl_usm_array_interface__: {m}")))
    };
    let d = suai.cast::<PyDict>().map_err(|_| bad("must be a dict"))?;
    let get = |k: &str| d.get_item(k).ok().flatten().filter(|v| !v.is_none());
    let desc = SyclInterface {
        version: get("version").ok_or_else(|| bad("missing version"))?.extract()?,
        shape: get("shape").ok_or_else(|| bad("missing shape"))?.extract()?,
        typestr: get("typestr").ok_or_else(|| bad("missing typestr"))?.extract::<String>()?.parse()?,
        data: get("data")
            .ok_or_else(|| bad("missing data"))?
            .extract()
            .map_err(|_| bad("data must be (pointer, read_only)"))?,
        strides: get("strides").map(|s| s.extract()).transpose()?,
        offset: get("offset").map(|o| o.extract()).transpose()?.unwrap_or(0),
    };
    desc.start()?;
    let syclobj = get("syclobj").ok_or_else(|| bad("missing syclobj"))?;
    usm_readable(x)?;
    let owner = Arc::new((PyOwner::new(x), PyOwner::new(&syclobj)));
    // SAFETY: host-readable USM (checked through dpctl) that stays valid while the exporter and
    // its queue or context live; the owner keeps both.
    let tensor = unsafe { desc.import(owner) }?;
    Ok(Imported { tensor, syclobj: Some(syclobj.unbind()) })
}

/// Whether the host can read `x`'s USM memory, as dpctl tells its kind and device.
fn usm_readable(x: &Bound<'_, PyAny>) -> Result<()> {
    let memory = x.py().import("dpctl.memory").map_err(|_| {
        dlframe::Error::Refused(
            "importing SYCL USM memory needs dpctl to tell its kind; pip install dpctl".into(),
        )
    })?;
    let mem = memory.call_method1("as_usm_memory", (x,))?;
    let kind: String = mem.call_method0("get_usm_type")?.extract()?;
    let on_cpu: bool = mem.getattr("sycl_device")?.getattr("is_cpu")?.extract()?;
    Ok(SyclInterface::host_readable(&kind, on_cpu)?)
}

fn from_interface_dict(x: &Bound<'_, PyAny>, ai: &Bound<'_, PyAny>, copy: CopyPolicy) -> Result<Tensor> {
    let bad =
        |m: &str| Error::from(dlframe::Error::InvalidArgument(format!("invalid __array_interface__: {m}")));
    let d = ai.cast::<PyDict>().map_err(|_| bad("must be a dict"))?;
    let get = |k: &str| d.get_item(k).ok().flatten().filter(|v| !v.is_none());
    let mut desc = ArrayInterface {
        shape: get("shape").ok_or_else(|| bad("missing shape"))?.extract()?,
        typestr: get("typestr").ok_or_else(|| bad("missing typestr"))?.extract::<String>()?.parse()?,
        data: (0, true),
        strides: get("strides").map(|s| s.extract()).transpose()?,
        descr: Vec::new(),
        version: 3,
        stream: None,
    };
    let Some(data) = get("data") else {
        // No data: the memory is the object's own buffer, from `offset`, described by the
        // dict's shape, typestr and strides (numpy's reading).
        let offset: usize = get("offset").map(|o| o.extract()).transpose()?.unwrap_or(0);
        return interface_over_buffer(x, desc, offset, copy);
    };
    desc.data = data.extract().map_err(|_| bad("data must be a (pointer, read_only) tuple"))?;
    // SAFETY: the exporter promises `data` stays valid while it lives (numpy's contract:
    // consumers keep the exporting object as base), and the owner keeps it alive.
    Ok(unsafe { desc.import(Arc::new(PyOwner::new(x)), copy) }?)
}

/// An `__array_interface__` without `data` over the object's own buffer. Here the size of the
/// memory is known, so a layout that reaches outside it is refused before anything is read.
fn interface_over_buffer(
    x: &Bound<'_, PyAny>,
    mut desc: ArrayInterface,
    offset: usize,
    copy: CopyPolicy,
) -> Result<Tensor> {
    let owner = get_buffer(x)?;
    if !owner.is_c_contiguous() {
        return Err(Binding::WrongType("an array interface without data over a strided buffer".into()).into());
    }
    let (buf, len, readonly) = (owner.buf_ptr() as usize, owner.len_bytes(), owner.readonly());
    desc.within(buf, len, offset, readonly)?;
    // SAFETY: the layout lies inside the buffer (checked by `within`), which stays valid until
    // the view is released by the owner.
    Ok(unsafe { desc.import(Arc::new(owner), copy) }?)
}

/// A buffer view of `x` through pyo3 (released, with the GIL, when the last tensor over it
/// drops). An indirect buffer (suboffsets) has no tensor layout and is refused.
fn get_buffer(x: &Bound<'_, PyAny>) -> Result<PyUntypedBuffer> {
    let view = PyUntypedBuffer::get(x)?;
    if view.suboffsets().is_some() {
        return Err(
            Binding::WrongType("an indirect buffer (with suboffsets) has no tensor layout".into()).into()
        );
    }
    Ok(view)
}

/// An array-interface description as the Python dict numpy and CUDA consumers read; `stream`
/// is written only when the description has one. Never a `mask` key.
pub(crate) fn interface_dict<'py>(py: Python<'py>, ai: &ArrayInterface) -> PyResult<Bound<'py, PyDict>> {
    let d = common_dict(py, &ai.shape, ai.typestr.to_string(), ai.data, ai.strides.as_deref(), ai.version)?;
    d.set_item("descr", vec![(String::new(), ai.typestr.to_string())])?;
    if let Some(stream) = ai.stream {
        d.set_item("stream", stream)?;
    }
    Ok(d)
}

/// A SYCL USM description as `__sycl_usm_array_interface__` v1 gives it, with its queue or
/// context.
pub(crate) fn sycl_dict<'py>(
    py: Python<'py>,
    s: &SyclInterface,
    syclobj: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = common_dict(py, &s.shape, s.typestr.to_string(), s.data, s.strides.as_deref(), s.version)?;
    d.set_item("offset", s.offset)?;
    d.set_item("syclobj", syclobj)?;
    Ok(d)
}

/// The keys the array interfaces share: `strides` is None for C order.
fn common_dict<'py>(
    py: Python<'py>,
    shape: &[i64],
    typestr: String,
    data: (usize, bool),
    strides: Option<&[i64]>,
    version: impl IntoPyObject<'py>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", pyo3::types::PyTuple::new(py, shape)?)?;
    d.set_item("typestr", typestr)?;
    d.set_item("data", data)?;
    d.set_item("strides", strides.map(|s| pyo3::types::PyTuple::new(py, s)).transpose()?)?;
    d.set_item("version", version)?;
    Ok(d)
}

fn from_array_struct(x: &Bound<'_, PyAny>, cap: &Bound<'_, PyAny>) -> Result<Tensor> {
    let bad =
        |m: &str| Error::from(dlframe::Error::InvalidArgument(format!("invalid __array_struct__: {m}")));
    let cap = cap.cast::<PyCapsule>().map_err(|_| bad("not a capsule"))?;
    // numpy's protocol uses unnamed capsules.
    let ptr = cap.pointer_checked(None).map_err(|_| bad("a named or empty capsule"))?.as_ptr()
        as *const PyArrayInterface;
    let owner = Arc::new((PyOwner::new(x), PyOwner::new(cap.as_any())));
    // SAFETY: the capsule (kept by the owner with the exporter) holds a PyArrayInterface whose
    // memory stays valid while both live.
    Ok(unsafe { array_struct::read(ptr, owner) }?)
}

fn from_buffer(x: &Bound<'_, PyAny>) -> Result<Tensor> {
    let view = get_buffer(x)?;
    let format = view.format().to_string_lossy();
    let dtype = TypeStr::from_buffer_format(&format, view.item_size())
        .ok_or_else(|| Binding::WrongType(format!("buffer format {format:?} has no tensor dtype")))?
        .to_dtype()?;
    let shape: Extents = view.shape().iter().map(|&d| d as i64).collect();
    let strides = element_strides(view.strides(), view.item_size() as isize).ok_or_else(|| {
        dlframe::Error::InvalidArgument("a buffer stride that is not a whole element".into())
    })?;
    let (data, readonly) = (view.buf_ptr() as *mut u8, view.readonly());
    // SAFETY: the buffer stays valid until the view is released, which the owner does last.
    Ok(unsafe {
        Tensor::from_raw_slices(data, &shape, Some(&strides), dtype, Device::Cpu, readonly, Arc::new(view))
    }?)
}

//! The DLPack C exchange API (docs/conformance.md, "The exchange API"): `dlframe.Tensor`'s
//! table of C functions, and the tables other types publish.
//!
//! Producer: `Tensor.__dlpack_c_exchange_api__` (a capsule named `"dlpack_exchange_api"`, DLPack
//! 1.3) and `Tensor.__c_dlpack_exchange_api__` (its address as an int, DLPack 1.2) point to one
//! static table. Its functions run with the GIL held (the allocator may run without it), never
//! call into Python, and return 0, or -1 with a Python exception set.
//!
//! Consumer: [`table_of`] finds a type's table once (cached per type) and checks it;
//! [`import`] takes a tensor through it, without `__dlpack__`.

use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyType};

use dlframe::dlpack::export_versioned;
use dlframe::ffi::dlpack::{
    DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};
use dlframe::ffi::exchange::{
    DLPACK_EXCHANGE_API, DLPackCurrentWorkStream, DLPackExchangeAPI, DLPackExchangeAPIHeader,
    DLPackManagedTensorFromPyObjectNoSync, DLPackSetError, report_error, supported_table,
};
use dlframe::{Device, ForeignTensor, Tensor, transfer};

use crate::error::{Binding, Error, Result, exception_name, panic_exception};
use crate::per_type::PerType;
use crate::tensor::PyTensor;

/// dlframe's table: one for the whole process.
static API: DLPackExchangeAPI = DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader {
        version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
        prev_api: std::ptr::null_mut(),
    },
    managed_tensor_allocator: Some(allocate),
    managed_tensor_from_py_object_no_sync: Some(from_py_object),
    managed_tensor_to_py_object_no_sync: Some(to_py_object),
    dltensor_from_py_object_no_sync: Some(view_of_py_object),
    current_work_stream: Some(current_work_stream),
};

/// Publishes dlframe's table on `Tensor`: `__dlpack_c_exchange_api__` (DLPack 1.3, a capsule
/// named `"dlpack_exchange_api"`) and `__c_dlpack_exchange_api__` (DLPack 1.2, its address as
/// an int), class attributes that are the same for the whole process. Done here, at the
/// module's import, so that the type need not know this module (which uses it).
pub fn install(tensor_type: &Bound<'_, PyType>) -> PyResult<()> {
    let table = std::ptr::NonNull::from(&API).cast::<c_void>();
    // SAFETY: the table is static and never written, so the capsule needs no destructor.
    let capsule = unsafe { PyCapsule::new_with_pointer(tensor_type.py(), table, DLPACK_EXCHANGE_API) }?;
    tensor_type.setattr("__dlpack_c_exchange_api__", capsule)?;
    tensor_type.setattr("__c_dlpack_exchange_api__", table.as_ptr() as usize)
}

/// Runs one table function with the GIL: 0 on success, -1 with the error (or a panic) raised
/// as a Python exception.
fn guarded(f: impl FnOnce(Python<'_>) -> Result<()>) -> c_int {
    Python::attach(|py| {
        let e = match catch_unwind(AssertUnwindSafe(|| f(py))) {
            Ok(Ok(())) => return 0,
            Ok(Err(e)) => e,
            Err(_) => Error::panicked("a DLPack exchange function"),
        };
        PyErr::from(e).restore(py);
        -1
    })
}

/// The error for a NULL `what` handed to a table function.
fn null_arg(what: &str) -> Error {
    dlframe::Error::InvalidArgument(format!("the DLPack exchange API was handed a NULL {what}")).into()
}

/// Writes what `value` makes to a consumer's output, which is refused (before `value` runs)
/// when it is NULL.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn put<T>(out: *mut T, value: impl FnOnce() -> Result<T>) -> Result<()> {
    if out.is_null() {
        return Err(null_arg("output"));
    }
    // SAFETY: writable, as the caller promises, and not NULL.
    unsafe { *out = value()? };
    Ok(())
}

/// Writes what `make` makes of the dlframe Tensor behind a `PyObject*` a consumer passed in to
/// the consumer's output: 0, or -1 with the error raised (a NULL object or output, another type).
///
/// # Safety
/// `obj` is NULL or a live object, and `out` NULL or writable.
unsafe fn of_tensor<T>(obj: *mut c_void, out: *mut T, make: impl FnOnce(&Tensor) -> T) -> c_int {
    guarded(|py| {
        if obj.is_null() {
            return Err(null_arg("object"));
        }
        // SAFETY: the caller passes a live object and `guarded` holds the GIL.
        let any = unsafe { Bound::from_borrowed_ptr(py, obj.cast()) };
        let t = any.cast_into::<PyTensor>().map_err(|e| {
            let name = e.into_inner().get_type().name().map(|n| n.to_string()).unwrap_or_default();
            Binding::WrongType(format!("dlframe's exchange API exports dlframe.Tensor objects, not {name}"))
        })?;
        // SAFETY: `out` is NULL or writable, as the caller promises.
        unsafe { put(out, || Ok(make(&t.get().inner))) }
    })
}

/// `managed_tensor_from_py_object_no_sync`: the tensor as an owned `DLManagedTensorVersioned`
/// (without copying; `READ_ONLY` for Arrow memory, as `__dlpack__` sets it). No stream is
/// synchronised: a consumer orders itself after [`current_work_stream`].
///
/// # Safety
/// Called through the exchange table: `obj` is NULL or a live object, and `out` NULL or writable;
/// the GIL need not be held.
unsafe extern "C" fn from_py_object(obj: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int {
    // SAFETY: the caller's promise; the consumer then owns the tensor and calls its deleter once.
    unsafe { of_tensor(obj, out, |t| export_versioned(t.clone()).into_raw()) }
}

/// `dltensor_from_py_object_no_sync`: a non-owning view, valid while the object lives (the
/// shape and strides point into the Tensor, which never changes). A view has no flags: it
/// cannot say read-only.
///
/// # Safety
/// Called through the exchange table: `obj` is NULL or a live object, and `out` NULL or a writable
/// `DLTensor`; the GIL need not be held.
unsafe extern "C" fn view_of_py_object(obj: *mut c_void, out: *mut DLTensor) -> c_int {
    // SAFETY: the caller's promise; the view borrows the frozen Tensor, which lives as long as
    // the object the consumer holds.
    unsafe { of_tensor(obj, out, dlframe::dlpack::borrowed_view) }
}

/// `managed_tensor_to_py_object_no_sync`: a new `dlframe.Tensor` that owns the managed tensor
/// (without copying). The tensor is taken in every case: on an error it has been released.
///
/// # Safety
/// Called through the exchange table: `tensor` is NULL or a live managed tensor whose ownership the
/// caller hands over, and `out` NULL or writable; the GIL need not be held.
unsafe extern "C" fn to_py_object(tensor: *mut DLManagedTensorVersioned, out: *mut *mut c_void) -> c_int {
    guarded(|py| {
        // SAFETY: the consumer hands over a live managed tensor (NULL is refused inside) and
        // gives up its ownership.
        let t = unsafe { ForeignTensor::from_versioned(tensor) }?.into_tensor();
        // SAFETY: `out` is NULL or writable; the caller receives a new reference.
        unsafe { put(out, || Ok(Py::new(py, PyTensor::new(t))?.into_ptr().cast())) }
    })
}

/// `managed_tensor_allocator`: a new zeroed, C-contiguous tensor shaped like `prototype` (its
/// shape, dtype and device) on the CPU or a CUDA device (allocates). Errors go to `set_error`
/// by exception name; no Python is called.
///
/// # Safety
/// Called through the exchange table: `prototype` is NULL or a readable `DLTensor`, `out` NULL or
/// writable, and `set_error` NULL or a function that takes `error_ctx`; the GIL need not be held.
unsafe extern "C" fn allocate(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<DLPackSetError>,
) -> c_int {
    // SAFETY: the caller passes a readable prototype and a writable output (NULL is refused
    // inside).
    let made = catch_unwind(AssertUnwindSafe(|| unsafe { dlframe::dlpack::allocate_into(prototype, out) }));
    let (kind, message) = match made {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => (exception_name(&e), e.to_string()),
        Err(_) => panic_exception("its DLPack allocator"),
    };
    // SAFETY: the caller's `set_error` takes its `error_ctx`.
    unsafe { report_error(set_error, error_ctx, kind, &message) };
    -1
}

/// `current_work_stream`: the stream dlframe works on for a CUDA device (its own stream, which
/// every device result is ordered on); NULL for host memory.
///
/// # Safety
/// Called through the exchange table: `out` is NULL or writable; the GIL need not be held.
unsafe extern "C" fn current_work_stream(device_type: c_int, device_id: i32, out: *mut *mut c_void) -> c_int {
    guarded(|py| {
        let device = Device::from_dlpack(dlframe::ffi::dlpack::DLDevice { device_type, device_id })?;
        let stream = || match device.is_host_accessible() {
            true => Ok(std::ptr::null_mut()),
            false => Ok(py.detach(|| transfer::stream_handle(device))? as *mut c_void),
        };
        // SAFETY: `out` is NULL or writable.
        unsafe { put(out, stream) }
    })
}

/// What dlframe uses of another type's table, checked once.
#[derive(Clone, Copy)]
pub struct Table {
    from_py: DLPackManagedTensorFromPyObjectNoSync,
    stream: Option<DLPackCurrentWorkStream>,
    /// Whether the type has `requires_grad` (torch's tensors): its table exports a tensor that
    /// requires grad, which its `__dlpack__` refuses.
    grad: bool,
}

impl Table {
    /// Whether the table may answer for `x`: not for a tensor that requires grad, which the
    /// type's own `__dlpack__` refuses (and so numpy does), so that both routes answer alike.
    pub fn answers_for(&self, x: &Bound<'_, PyAny>) -> Result<bool> {
        Ok(!self.grad || !x.getattr(intern!(x.py(), "requires_grad"))?.is_truthy()?)
    }
}

/// Types seen, with their table or none.
static TABLES: PerType<Option<Table>> = PerType::new();

/// The exchange table of `x`'s type, if it publishes one that dlframe reads (looked up once per
/// type): `__dlpack_c_exchange_api__` first, then DLPack 1.2's `__c_dlpack_exchange_api__`.
/// A table of another major version, with no 1.x table behind it, is not used.
///
/// # Errors
/// `ValueError` for a malformed table: not a capsule or int, a wrong capsule name, a NULL
/// pointer, or a NULL export function.
pub fn table_of(x: &Bound<'_, PyAny>) -> Result<Option<Table>> {
    TABLES.get(&x.get_type(), lookup)
}

fn lookup(ty: &Bound<'_, PyType>) -> Result<Option<Table>> {
    let py = ty.py();
    let name = || ty.name().map(|n| n.to_string()).unwrap_or_default();
    let malformed = |what: &str| -> Error {
        dlframe::Error::InvalidArgument(format!("{}'s DLPack exchange table is refused: {what}", name()))
            .into()
    };
    let ptr = if let Some(attr) = ty.getattr_opt(intern!(py, "__dlpack_c_exchange_api__"))? {
        let cap =
            attr.cast::<PyCapsule>().map_err(|_| malformed("__dlpack_c_exchange_api__ is not a capsule"))?;
        if !cap.is_valid_checked(Some(DLPACK_EXCHANGE_API)) {
            let found = match cap.name() {
                // SAFETY: a capsule's name is a NUL-terminated string that lives with the capsule,
                // which `cap` holds while the message is made.
                Ok(Some(name)) => format!("{:?}", unsafe { name.as_cstr() }),
                _ => "no name".to_string(),
            };
            return Err(malformed(&format!("the capsule is named {found}, not \"dlpack_exchange_api\"")));
        }
        cap.pointer_checked(Some(DLPACK_EXCHANGE_API))?.as_ptr() as usize
    } else if let Some(attr) = ty.getattr_opt(intern!(py, "__c_dlpack_exchange_api__"))? {
        attr.extract::<usize>().map_err(|_| malformed("__c_dlpack_exchange_api__ is not an address"))?
    } else {
        return Ok(None);
    };
    if ptr == 0 {
        return Err(malformed("the table pointer is NULL"));
    }
    // SAFETY: the type publishes a table (or a chain of tables, newer ones linking to the
    // older ones they still serve) that lives for the process, as the exchange API requires.
    let Some(api) = (unsafe { supported_table(ptr as *const DLPackExchangeAPIHeader) }) else {
        return Ok(None);
    };
    let from_py = api
        .managed_tensor_from_py_object_no_sync
        .ok_or_else(|| malformed("managed_tensor_from_py_object_no_sync is NULL"))?;
    let grad = ty.getattr_opt(intern!(py, "requires_grad"))?.is_some();
    Ok(Some(Table { from_py, stream: api.current_work_stream, grad }))
}

/// A tensor from `x` through its type's table, with no Python call (without copying). A CUDA
/// tensor stays on its device, and dlframe's stream waits for the producer's current work
/// stream, since the exchange does not synchronise.
///
/// # Errors
/// The producer's exception; the importer's errors for a tensor dlframe does not read.
pub fn import(x: &Bound<'_, PyAny>, table: Table) -> Result<Tensor> {
    let py = x.py();
    let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: the producer's function takes a live object of its type with the GIL held and,
    // on success, writes a managed tensor that it hands to us.
    if unsafe { (table.from_py)(x.as_ptr().cast(), &mut out) } != 0 {
        return Err(Error::fetch(py));
    }
    // SAFETY: on success the tensor is ours; the importer releases it on any error.
    let t = unsafe { ForeignTensor::from_versioned(out) }?.into_tensor();
    if t.device().is_host_accessible() {
        return Ok(t);
    }
    let d = t.device().to_dlpack();
    let Some(stream_of) = table.stream else {
        // No stream to follow: order after the legacy default stream, as for a bare capsule.
        return Ok(py.detach(|| transfer::adopt_legacy(t))?);
    };
    let mut stream: *mut c_void = std::ptr::null_mut();
    // SAFETY: the producer's function, with the GIL held and a writable output.
    if unsafe { stream_of(d.device_type, d.device_id, &mut stream) } != 0 {
        return Err(Error::fetch(py));
    }
    let stream = stream as usize;
    Ok(py.detach(|| transfer::adopt_after(t, stream))?)
}

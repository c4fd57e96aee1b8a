//! DLPack capsules: `"dltensor"` / `"dltensor_versioned"` out, and both in.
//!
//! Export: the capsule holds the managed tensor; its destructor calls the deleter only while
//! the capsule still has its unconsumed name (a consumer renames it to `used_*` and becomes
//! the owner), and keeps any in-flight exception. Import: we check the name, rename the capsule
//! to `used_*`, and hand the pointer to [`ForeignTensor`], which calls the deleter exactly once.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyCapsule;

use dlframe::dlpack::{Export, Exported, ManagedTensor};
use dlframe::ffi::dlpack::{
    DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLTENSOR, DLTENSOR_VERSIONED, USED_DLTENSOR,
    USED_DLTENSOR_VERSIONED,
};
use dlframe::{ForeignTensor, Tensor};

use crate::error::{Error, Result};

/// The destructor of dlframe's DLPack capsules: calls the deleter of the tensor of a capsule
/// still named [`ManagedTensor::CAPSULE`] (a consumer renames it to `used_*` and becomes the
/// owner), keeping any in-flight exception, as the DLPack spec asks.
///
/// # Safety
/// Called by CPython, with the GIL, on a dying capsule that [`from_export`] made for an `M`.
unsafe extern "C" fn destructor<M: ManagedTensor>(capsule: *mut ffi::PyObject) {
    // SAFETY: the capsule is alive during its destructor; IsValid only checks the name.
    if unsafe { ffi::PyCapsule_IsValid(capsule, M::CAPSULE.as_ptr()) } != 1 {
        return; // consumed (renamed): the consumer owns the tensor now
    }
    let (mut ty, mut value, mut tb) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: fetches the in-flight exception (if any), restored below.
    unsafe { ffi::PyErr_Fetch(&mut ty, &mut value, &mut tb) };
    // SAFETY: the name was just checked, so the pointer is the managed tensor we stored.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(capsule, M::CAPSULE.as_ptr()) } as *mut M;
    if let Some(ptr) = NonNull::new(ptr) {
        // SAFETY: the unconsumed capsule owns the tensor; this is its only release.
        unsafe { M::delete(ptr) };
    }
    // SAFETY: restores exactly what was fetched.
    unsafe { ffi::PyErr_Restore(ty, value, tb) };
}

/// A capsule that owns `e` (`"dltensor"` or `"dltensor_versioned"`); when none is made, `e`
/// is released as it drops.
fn new_capsule<M: ManagedTensor>(py: Python<'_>, e: Exported<M>) -> Result<Bound<'_, PyAny>> {
    // SAFETY: a live managed tensor, under its capsule's static name, which `destructor::<M>`
    // releases unless a consumer takes it.
    let cap = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            e.as_non_null().cast(),
            M::CAPSULE,
            Some(destructor::<M>),
        )
    }?;
    e.into_raw(); // the capsule owns it now
    Ok(cap.into_any())
}

/// A capsule of the kind the export was resolved for.
pub fn from_export(py: Python<'_>, export: Export) -> Result<Bound<'_, PyAny>> {
    match export {
        Export::Versioned(e) => new_capsule(py, e),
        Export::Legacy(e) => new_capsule(py, e),
    }
}

/// The `max_version` dlframe asks producers for: the DLPack version it reads.
pub const MAX_VERSION: (u32, u32) = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);

/// A known producer's (numpy's, pyarrow's) versioned DLPack export of `x` as a tensor (no
/// copy), asked for as [`call_versioned`] asks. None when the producer refuses or returns
/// something dlframe does not import; nothing is raised.
pub fn versioned_from_known(x: &Bound<'_, PyAny>) -> Option<Tensor> {
    Some(consume(call_versioned(x).ok()?.cast::<PyCapsule>().ok()?).ok()?.into_tensor())
}

/// `x.__dlpack__(max_version=MAX_VERSION)` of a known producer (numpy, pyarrow), through a
/// Python function compiled once, `lambda x: x.__dlpack__(max_version=(1, 3))`: the interpreter
/// passes the keyword by name, where a call from here through the limited API of 3.11 must build
/// a bound method and a keyword dict (a quarter more instructions for a small export).
fn call_versioned<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let f = VERSIONED_CALL.get_or_try_init(py, || -> PyResult<_> {
        let (major, minor) = MAX_VERSION;
        let code = CString::new(format!("lambda x: x.__dlpack__(max_version=({major}, {minor}))"))?;
        Ok(py.eval(&code, None, None)?.unbind())
    })?;
    f.bind(py).call1((x,))
}

/// The function [`call_versioned`] calls, compiled once.
static VERSIONED_CALL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Consumes a DLPack capsule of either version: renames it to `used_*` and takes ownership.
///
/// # Errors
/// `ValueError` for a capsule that was already consumed or is not a DLPack capsule; the
/// importer's errors for a tensor we refuse (released before the error returns).
pub fn consume(capsule: &Bound<'_, PyCapsule>) -> Result<ForeignTensor> {
    let is = |name: &CStr| capsule.is_valid_checked(Some(name));
    let versioned = is(DLTENSOR_VERSIONED);
    if versioned || is(DLTENSOR) {
        let (name, used) =
            if versioned { (DLTENSOR_VERSIONED, USED_DLTENSOR_VERSIONED) } else { (DLTENSOR, USED_DLTENSOR) };
        let ptr = capsule.pointer_checked(Some(name))?.as_ptr();
        // SAFETY: a live capsule and a static name; renaming marks the capsule consumed, so its
        // destructor will not release the tensor.
        if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), used.as_ptr()) } != 0 {
            return Err(Error::fetch(capsule.py()));
        }
        // SAFETY: we took ownership above; the producer promises a valid managed tensor of the
        // struct its capsule's name says.
        let t = unsafe {
            if versioned {
                ForeignTensor::from_versioned(ptr.cast())
            } else {
                ForeignTensor::from_legacy(ptr.cast())
            }
        };
        return Ok(t?);
    }
    let why = if is(USED_DLTENSOR) || is(USED_DLTENSOR_VERSIONED) {
        "this DLPack capsule was already consumed; a capsule can be consumed once"
    } else {
        "not a DLPack capsule (expected the name 'dltensor' or 'dltensor_versioned')"
    };
    Err(dlframe::Error::InvalidArgument(why.into()).into())
}

//! Method calls into Python made the way CPython makes its own: the receiver and arguments in
//! an array, keywords by name, without the bound method object and argument tuple (or dict)
//! that pyo3's `call_method*` build for an abi3 extension (3.11's limited API has no vectorcall).

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

/// `obj.name()` (no copy of anything): one vectorcall on Unix; elsewhere pyo3's call.
pub(crate) fn method0<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    #[cfg(unix)]
    {
        let args = [obj.as_ptr()];
        // SAFETY: `args` holds the receiver, live for the call, and no keywords.
        unsafe { method(obj.py(), name, &args, None) }
    }
    #[cfg(not(unix))]
    obj.call_method0(name)
}

/// `obj.name(**dict(zip(names, values)))` with `args == [obj, *values]`: one vectorcall, the
/// keywords by name. Unix only (see [`vectorcall_method`]).
///
/// # Safety
/// `args` holds the receiver and then one value for each of `names` (all of them when `names`
/// is None: positional), every pointer live for the call; CPython's vectorcall borrows them.
#[cfg(unix)]
pub(crate) unsafe fn method<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
    args: &[*mut ffi::PyObject],
    names: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the caller's promise, passed on; `name` is a live str.
    unsafe { with(py, vectorcall_method, name.as_ptr(), args, names) }
}

/// `callable(*args[..positional], **dict(zip(names, rest)))`: one vectorcall, the keywords by
/// name. Unix only (see [`vectorcall`]).
///
/// # Safety
/// `args` holds the positional values and then one value for each of `names`, every pointer
/// live for the call; CPython's vectorcall borrows them.
#[cfg(unix)]
pub(crate) unsafe fn function<'py>(
    callable: &Bound<'py, PyAny>,
    args: &[*mut ffi::PyObject],
    names: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the caller's promise, passed on; `callable` is live.
    unsafe { with(callable.py(), vectorcall, callable.as_ptr(), args, names) }
}

/// One of the interpreter's vectorcall functions (`PyObject_VectorcallMethod` with a method
/// name, `PyObject_Vectorcall` with a callable) on `args`, the last of which are the values of
/// `names`.
///
/// # Safety
/// `target` is live, and `args` is as [`method`] or [`function`] says for `f`.
#[cfg(unix)]
unsafe fn with<'py>(
    py: Python<'py>,
    f: unsafe extern "C" fn(
        *mut ffi::PyObject,
        *const *mut ffi::PyObject,
        usize,
        *mut ffi::PyObject,
    ) -> *mut ffi::PyObject,
    target: *mut ffi::PyObject,
    args: &[*mut ffi::PyObject],
    names: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyAny>> {
    let kwnames = names.map_or(std::ptr::null_mut(), |n| n.as_ptr());
    let positional = args.len() - names.map_or(0, |n| n.len());
    // SAFETY: the caller's promise on `target`, `args` and `names`; `f` is the interpreter's.
    let ret = unsafe { f(target, args.as_ptr(), positional, kwnames) };
    // SAFETY: a new reference, or NULL with the exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, ret) }
}

#[cfg(unix)]
unsafe extern "C" {
    /// `PyObject_VectorcallMethod(name, args, nargsf, kwnames)`: CPython has exported it with
    /// this signature since 3.9 and has it in the limited API from 3.12. pyo3 hides it from an
    /// abi3 build for 3.11, which on Unix resolves it from the interpreter when it loads (as it
    /// does every other function it calls); Windows links abi3 builds against python3.dll,
    /// which lacks it before 3.12, so there the calls go through pyo3.
    #[link_name = "PyObject_VectorcallMethod"]
    fn vectorcall_method(
        name: *mut ffi::PyObject,
        args: *const *mut ffi::PyObject,
        nargsf: usize,
        kwnames: *mut ffi::PyObject,
    ) -> *mut ffi::PyObject;

    /// `PyObject_Vectorcall(callable, args, nargsf, kwnames)`: exported by CPython since 3.9,
    /// in the limited API from 3.12, resolved as [`vectorcall_method`] is.
    #[link_name = "PyObject_Vectorcall"]
    fn vectorcall(
        callable: *mut ffi::PyObject,
        args: *const *mut ffi::PyObject,
        nargsf: usize,
        kwnames: *mut ffi::PyObject,
    ) -> *mut ffi::PyObject;
}

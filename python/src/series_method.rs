//! `series.to_dlpack` as a method of Polars' Series type, made as Polars' own methods are: a
//! method descriptor that CPython calls with the Series and the arguments in an array. Without
//! arguments it is the Series' shared view ([`series_view`]), with no Python frame and no
//! keyword dict before it (those were a sixth of the call). A Series without such a view goes
//! to `dlframe._native.to_dlpack`, and a call with options to `dlframe.polars.to_dlpack`, as
//! the Python method did. Unix only: the call on to Python uses
//! `PyObject_Vectorcall`, which Windows' abi3 import library lacks before 3.12; there the
//! Python method stays.

use std::ffi::CString;
use std::panic::AssertUnwindSafe;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::call;
use crate::series::series_view;

/// Where the calls the shared view does not answer go: `with_options` (`dlframe.polars.to_dlpack`)
/// for a call with arguments, `plain` (`dlframe._native.to_dlpack`) for one without, which would
/// only ask for the view again on its way to the Arrow path.
struct Fallbacks {
    with_options: Py<PyAny>,
    plain: Py<PyAny>,
}

static FALLBACKS: PyOnceLock<Fallbacks> = PyOnceLock::new();

/// The method descriptor `to_dlpack` of `series_type`, documented by `doc` (which starts with
/// its text signature, as CPython reads it); calls it cannot answer go to
/// `with_options(series, *args, **kwargs)` or, without arguments, to `plain(series)`. Made once
/// per import of `dlframe.polars`; its definition lives for the process, as CPython requires of
/// a method's.
#[pyfunction]
#[pyo3(name = "_series_method", signature = (series_type, with_options, plain, doc, /))]
pub fn series_method<'py>(
    series_type: &Bound<'py, PyType>,
    with_options: Bound<'py, PyAny>,
    plain: Bound<'py, PyAny>,
    doc: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let py = series_type.py();
    FALLBACKS.get_or_init(py, || Fallbacks { with_options: with_options.unbind(), plain: plain.unbind() });
    let doc = CString::new(doc).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let def = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: c"to_dlpack".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: to_dlpack },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: doc.into_raw(),
    }));
    // SAFETY: a live type and a method definition that is never freed.
    let descr = unsafe { ffi::PyDescr_NewMethod(series_type.as_type_ptr(), def) };
    // SAFETY: a new reference, or NULL with the exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, descr) }
}

/// The method's C function.
///
/// # Safety
/// Called by CPython, attached to the interpreter, with `slf` a Series (the descriptor checks
/// its type), `args` holding the positional arguments and then one value per name in
/// `kwnames` (a tuple of str, or NULL).
unsafe extern "C" fn to_dlpack(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls methods attached to the interpreter.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: the caller's promise, passed on.
    let result =
        std::panic::catch_unwind(AssertUnwindSafe(|| unsafe { call(py, slf, args, nargsf, kwnames) }));
    match result {
        Ok(Ok(obj)) => obj.into_ptr(),
        Ok(Err(e)) => {
            e.restore(py);
            std::ptr::null_mut()
        }
        Err(_) => {
            PyRuntimeError::new_err("dlframe panicked in series.to_dlpack").restore(py);
            std::ptr::null_mut()
        }
    }
}

/// The shared view for a call without arguments, else a fallback: `plain(slf)` without
/// arguments, `with_options(slf, *args, **kwargs)` with them.
///
/// # Safety
/// As [`to_dlpack`].
unsafe fn call<'py>(
    py: Python<'py>,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> PyResult<Bound<'py, PyAny>> {
    // The high bit of nargsf is PY_VECTORCALL_ARGUMENTS_OFFSET, not a count.
    let nargs = (nargsf as usize) & !(1usize << (usize::BITS - 1));
    // SAFETY: kwnames is a tuple of str or NULL, alive for the call.
    let names = (!kwnames.is_null())
        .then(|| unsafe { Bound::from_borrowed_ptr(py, kwnames).cast_into_unchecked::<PyTuple>() });
    let nkw = names.as_ref().map_or(0, |n| n.len());
    // SAFETY: a live object, borrowed for the call.
    let series = unsafe { Bound::from_borrowed_ptr(py, slf) };
    let fallbacks = FALLBACKS
        .get(py)
        .ok_or_else(|| PyRuntimeError::new_err("series.to_dlpack was made without its fallbacks"))?;
    if nargs == 0 && nkw == 0 {
        return match series_view(&series) {
            Some(t) => Ok(Py::new(py, t)?.into_bound(py).into_any()),
            None => fallbacks.plain.bind(py).call1((series,)),
        };
    }
    let mut all = Vec::with_capacity(1 + nargs + nkw);
    all.push(slf);
    // SAFETY: CPython hands nargs positional values and then one per keyword name.
    all.extend_from_slice(unsafe { std::slice::from_raw_parts(args, nargs + nkw) });
    // SAFETY: `all` is the Series, the positional values and one value per name in `names`,
    // live for the call.
    unsafe { call::function(fallbacks.with_options.bind(py), &all, names.as_ref()) }
}

//! Methods made by hand, as CPython makes its own: a method descriptor over a C function that
//! takes the receiver and the arguments in an array (`METH_FASTCALL | METH_KEYWORDS`), for the
//! few calls where pyo3's generated wrapper was a large part of the cost. [`descriptor`] makes
//! one; [`enter`] is the body of its C function.

use std::ffi::{CStr, CString};
use std::panic::AssertUnwindSafe;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

/// The C function of a hand-made method.
pub type FastMethod = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *const *mut ffi::PyObject,
    ffi::Py_ssize_t,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;

/// A method descriptor `name` of `ty` calling `f`, documented by `doc` (which starts with its
/// text signature, as CPython reads it). Its definition lives for the process, as CPython
/// requires of a method's; make one per type and name, once.
pub fn descriptor<'py>(
    ty: &Bound<'py, PyType>,
    name: &'static CStr,
    f: FastMethod,
    doc: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let doc = CString::new(doc).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let def = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: name.as_ptr(),
        ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: f },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: doc.into_raw(),
    }));
    // SAFETY: a live type and a method definition that is never freed.
    let descr = unsafe { ffi::PyDescr_NewMethod(ty.as_type_ptr(), def) };
    // SAFETY: a new reference, or NULL with the exception set.
    unsafe { Bound::from_owned_ptr_or_err(ty.py(), descr) }
}

/// A hand-made method's arguments as CPython hands them: the receiver, the positional values,
/// and one value per keyword name.
pub struct Args<'a, 'py> {
    /// The receiver (the descriptor has checked its type).
    pub slf: Borrowed<'a, 'py, PyAny>,
    /// The positional values (not the receiver).
    pub positional: &'a [*mut ffi::PyObject],
    /// One value per name in `names`.
    pub keywords: &'a [*mut ffi::PyObject],
    /// The keyword names (a tuple of str), or None.
    pub names: Option<Borrowed<'a, 'py, PyTuple>>,
}

/// The body of a hand-made method's C function: runs `call` on the arguments, and hands
/// CPython its result, or NULL with its error (or a RuntimeError naming `place` for a panic)
/// set.
///
/// CPython calls methods attached to the interpreter; `attach` (rather than assuming it) also
/// tells pyo3 so, so that a Python reference dropped inside (an error read and replaced by a
/// clearer one) is released at once instead of waiting in pyo3's pool for its next call.
///
/// # Safety
/// The arguments of a `METH_FASTCALL | METH_KEYWORDS` method's C function, as CPython passes
/// them: `slf` live, `args` holding the positional values and then one value per name in
/// `kwnames` (a tuple of str, or NULL), all live for the call.
pub unsafe fn enter(
    place: &str,
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
    call: impl for<'a, 'py> FnOnce(Python<'py>, Args<'a, 'py>) -> PyResult<Bound<'py, PyAny>>,
) -> *mut ffi::PyObject {
    Python::attach(|py| {
        // The high bit of nargsf is PY_VECTORCALL_ARGUMENTS_OFFSET, not a count.
        let nargs = (nargsf as usize) & !(1usize << (usize::BITS - 1));
        // SAFETY: kwnames is a tuple of str or NULL, alive for the call (the caller's promise).
        let names = (!kwnames.is_null())
            .then(|| unsafe { Borrowed::from_ptr(py, kwnames).cast_unchecked::<PyTuple>() });
        let nkw = names.as_ref().map_or(0, |n| n.len());
        let all: &[*mut ffi::PyObject] = if nargs + nkw == 0 {
            &[]
        } else {
            // SAFETY: CPython hands nargs positional values and then one per keyword name.
            unsafe { std::slice::from_raw_parts(args, nargs + nkw) }
        };
        let (positional, keywords) = all.split_at(nargs);
        // SAFETY: a live object, borrowed for the call.
        let slf = unsafe { Borrowed::from_ptr(py, slf) };
        let args = Args { slf, positional, keywords, names };
        match std::panic::catch_unwind(AssertUnwindSafe(|| call(py, args))) {
            Ok(Ok(obj)) => obj.into_ptr(),
            Ok(Err(e)) => {
                e.restore(py);
                std::ptr::null_mut()
            }
            Err(_) => {
                PyRuntimeError::new_err(format!("dlframe panicked in {place}")).restore(py);
                std::ptr::null_mut()
            }
        }
    })
}

//! Methods made by hand, as CPython makes its own: a method descriptor over a C function that
//! takes the receiver and the arguments in an array (`METH_FASTCALL | METH_KEYWORDS`), for the
//! few calls where pyo3's generated argument reading was a large part of the cost.
//!
//! [`fast_method!`] makes the C function: the trampoline pyo3 generates for its own methods of
//! this kind (`pyo3::impl_::trampoline`, which pyo3's macros expand to in every crate; hidden
//! from its documentation, so a pyo3 upgrade may need this file changed), around a function
//! that takes [`Args`]. It tells pyo3 that the thread is attached, as pyo3's methods do, so a
//! Python reference dropped inside is released at once, and it turns a panic into pyo3's
//! `PanicException`. [`descriptor`] makes the method descriptor.

use std::ffi::{CStr, CString};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use crate::error::{Binding, Error};

/// The C function of a hand-made method, as [`fast_method!`] makes it.
pub type FastMethod = unsafe extern "C" fn(
    *mut ffi::PyObject,
    *const *mut ffi::PyObject,
    ffi::Py_ssize_t,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;

/// The C function of a method that calls `$body(py, args: Args) -> PyResult<Bound<PyAny>>`
/// with the thread attached (see the module's documentation).
macro_rules! fast_method {
    ($body:path) => {{
        /// Reads CPython's arguments and calls the body.
        ///
        /// # Safety
        /// Called by pyo3's trampoline with the arguments CPython passes to a
        /// `METH_FASTCALL | METH_KEYWORDS` method's C function.
        unsafe fn read_args<'py>(
            py: pyo3::Python<'py>,
            slf: *mut pyo3::ffi::PyObject,
            args: *const *mut pyo3::ffi::PyObject,
            nargs: pyo3::ffi::Py_ssize_t,
            kwnames: *mut pyo3::ffi::PyObject,
        ) -> pyo3::PyResult<*mut pyo3::ffi::PyObject> {
            // SAFETY: the caller's promise, passed on.
            let args = unsafe { $crate::method_def::Args::new(py, slf, args, nargs, kwnames) };
            $body(py, args).map(pyo3::Bound::into_ptr)
        }
        let f: $crate::method_def::FastMethod =
            pyo3::impl_::trampoline::get_trampoline_function!(fastcall_cfunction_with_keywords, read_args);
        f
    }};
}
pub(crate) use fast_method;

/// A method descriptor `name` of `ty` calling `f` (made by [`fast_method!`]), documented by
/// `doc` (which starts with its text signature, as CPython reads it). Its definition lives for
/// the process, as CPython requires of a method's; make one per type and name, once.
pub fn descriptor<'py>(
    ty: &Bound<'py, PyType>,
    name: &'static CStr,
    f: FastMethod,
    doc: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let doc = CString::new(doc)
        .map_err(|e| Error::from(Binding::Malformed(format!("a method's doc string: {e}"))))?;
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
/// and one value per keyword name, all borrowed for the call.
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

impl<'a, 'py> Args<'a, 'py> {
    /// The arguments of one call.
    ///
    /// # Safety
    /// What CPython passes a `METH_FASTCALL | METH_KEYWORDS` method's C function: `slf` live,
    /// `args` holding `nargs` positional values and then one value per name in `kwnames` (a
    /// tuple of str, or NULL), all live for `'a`, the call.
    pub unsafe fn new(
        py: Python<'py>,
        slf: *mut ffi::PyObject,
        args: *const *mut ffi::PyObject,
        nargs: ffi::Py_ssize_t,
        kwnames: *mut ffi::PyObject,
    ) -> Self {
        // SAFETY: kwnames is a tuple of str or NULL, alive for the call (the caller's promise).
        let names = (!kwnames.is_null())
            .then(|| unsafe { Borrowed::from_ptr(py, kwnames).cast_unchecked::<PyTuple>() });
        let nkw = names.as_ref().map_or(0, |n| n.len());
        let nargs = nargs as usize;
        let all: &'a [*mut ffi::PyObject] = if nargs + nkw == 0 {
            &[]
        } else {
            // SAFETY: CPython hands nargs positional values and then one per keyword name.
            unsafe { std::slice::from_raw_parts(args, nargs + nkw) }
        };
        let (positional, keywords) = all.split_at(nargs);
        // SAFETY: a live object, borrowed for the call.
        let slf = unsafe { Borrowed::from_ptr(py, slf) };
        Args { slf, positional, keywords, names }
    }

    /// The keywords, each name with its value.
    pub fn named(
        &self,
    ) -> impl Iterator<Item = (Borrowed<'a, 'py, PyAny>, Borrowed<'a, 'py, PyAny>)> + use<'a, 'py> {
        let py = self.slf.py();
        let names = self.names.map_or(std::ptr::null_mut(), |n| n.as_ptr());
        self.keywords.iter().enumerate().map(move |(i, &value)| {
            // SAFETY: one name per keyword value, so `names` is a tuple of at least i + 1 str,
            // and both it and the value are live for the call (`'a`). PyTuple_GetItem lends its
            // item.
            unsafe {
                (
                    Borrowed::from_ptr(py, ffi::PyTuple_GetItem(names, i as ffi::Py_ssize_t)),
                    Borrowed::from_ptr(py, value),
                )
            }
        })
    }
}

//! `series.to_dlpack` as a method of Polars' Series type, made as Polars' own methods are: a
//! method descriptor that CPython calls with the Series and the arguments in an array. Without
//! arguments it is the Series' shared view ([`series_view`]), with no Python frame and no
//! keyword dict before it (those were a sixth of the call). A Series without such a view goes
//! to `dlframe._native.to_dlpack`, and a call with options to `dlframe.polars.to_dlpack`, as
//! the Python method did. Unix only: the call on to Python uses
//! `PyObject_Vectorcall`, which Windows' abi3 import library lacks before 3.12; there the
//! Python method stays.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::call;
use crate::method_def::{self, Args};
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
    method_def::descriptor(series_type, c"to_dlpack", method_def::fast_method!(call), doc)
}

/// The shared view for a call without arguments, else a fallback: `plain(slf)` without
/// arguments, `with_options(slf, *args, **kwargs)` with them.
fn call<'py>(py: Python<'py>, a: Args<'_, 'py>) -> PyResult<Bound<'py, PyAny>> {
    let series = a.slf.to_owned();
    let fallbacks = FALLBACKS
        .get(py)
        .ok_or_else(|| PyRuntimeError::new_err("series.to_dlpack was made without its fallbacks"))?;
    if a.positional.is_empty() && a.keywords.is_empty() {
        return match series_view(&series) {
            Some(t) => Ok(Py::new(py, t)?.into_bound(py).into_any()),
            None => fallbacks.plain.bind(py).call1((series,)),
        };
    }
    let mut all = Vec::with_capacity(1 + a.positional.len() + a.keywords.len());
    all.push(series.as_ptr());
    all.extend_from_slice(a.positional);
    all.extend_from_slice(a.keywords);
    // SAFETY: `all` is the Series, the positional values and one value per name in `names`,
    // live for the call.
    unsafe { call::function(fallbacks.with_options.bind(py), &all, a.names.as_deref()) }
}

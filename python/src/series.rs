//! A Polars Series' own memory as a `dlframe.Tensor` (without copying), without the Arrow
//! stream: what `series.to_dlpack()` takes first.

use pyo3::prelude::*;
use pyo3::{ffi, intern};

use dlframe::DType;

use crate::call;
use crate::capsule;
use crate::ndarray;
use crate::tensor::PyTensor;

/// The Series' values as a read-only tensor over Polars' memory (no copy, constant time), or
/// None when it has no such view: nulls, several chunks, non-numeric or temporal data, or a
/// Polars without the private methods used here. None sends the caller to the Arrow path,
/// which handles every case; nothing is raised here.
///
/// Polars hands out the view that `Series.to_numpy()` returns without copying (a numpy array
/// that keeps the Series' memory alive, read-only), which becomes the tensor as numpy's DLPack
/// export would describe it (read from the array's struct, `ndarray.rs`). The
/// view is the raw values buffer, null slots included: only a Series without nulls qualifies.
/// Temporal views (`datetime64`) have no DLPack form and take the Arrow path, which knows their
/// units; so do booleans, which Polars stores as bits.
#[pyfunction]
#[pyo3(name = "_series_view", signature = (s, /))]
pub fn series_view(s: &Bound<'_, PyAny>) -> Option<PyTensor> {
    let py = s.py();
    // `_s` is an instance attribute: read without the Series' own `__getattr__` hook in the way.
    // SAFETY: a live object and a str name; a new reference or NULL with an exception set.
    let inner = unsafe { ffi::PyObject_GenericGetAttr(s.as_ptr(), intern!(py, "_s").as_ptr()) };
    // SAFETY: as above.
    let inner = unsafe { Bound::from_owned_ptr_or_err(py, inner) }.ok()?;
    let nulls: usize = call::method0(&inner, intern!(py, "null_count")).ok()?.extract().ok()?;
    if nulls != 0 {
        return None;
    }
    let view = call::method0(&inner, intern!(py, "to_numpy_view")).ok()?;
    if view.is_none() {
        return None;
    }
    // Polars' view is an exact ndarray: read from its struct, or, should that ever refuse it,
    // through numpy's DLPack export.
    let t = ndarray::as_ndarray(&view).ok()?.and_then(ndarray::NdArray::import);
    let t = t.or_else(|| capsule::versioned_from_known(&view))?;
    // Every dtype dlframe imports is a number but bool (complex is refused by the import).
    (t.dtype() != DType::Bool).then(|| PyTensor::new(t))
}

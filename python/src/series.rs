//! A Polars Series' own memory as a `dlframe.Tensor` (without copying), through Polars' public
//! `Series.to_numpy()`: what `series.to_dlpack()` takes first.

use pyo3::intern;
use pyo3::prelude::*;

use dlframe::DType;

use crate::ndarray;
use crate::tensor::PyTensor;

/// The Series' values as a read-only tensor over the memory `Series.to_numpy()` hands out (no
/// copy), or None when that is not Polars' own memory as a plain numeric vector: several chunks
/// (which `to_numpy` joins into a copy), nulls (which it turns into NaN), booleans (which Polars
/// stores as bits), temporal, decimal, string and nested data. None sends the caller to the
/// Arrow path, which handles every case; nothing is raised here.
///
/// Polars documents `to_numpy()` as zero-copy for one chunk of numeric data without nulls, and
/// then returns a read-only view that keeps the Series' memory alive: the tensor shares it.
#[pyfunction]
#[pyo3(name = "_series_view", signature = (s, /))]
pub fn series_view(s: &Bound<'_, PyAny>) -> Option<PyTensor> {
    let py = s.py();
    let count = |name| -> Option<usize> { s.call_method0(name).ok()?.extract().ok() };
    if count(intern!(py, "null_count"))? != 0 || count(intern!(py, "n_chunks"))? != 1 {
        return None;
    }
    let view = s.call_method0(intern!(py, "to_numpy")).ok()?;
    let t = ndarray::as_ndarray(&view).ok()??.import()?;
    // A vector of numbers: every dtype dlframe imports is a number but bool (complex is
    // refused by the import); an Array column comes back with more dimensions.
    (t.ndim() == 1 && t.dtype() != DType::Bool).then(|| PyTensor::new(t))
}

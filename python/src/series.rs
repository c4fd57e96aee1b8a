//! The tensor over a Polars Series' own memory, from the numpy view that Polars' public
//! `Series.to_numpy()` hands out: what `series.to_dlpack()` takes first (`dlframe.polars`
//! checks the Series, one chunk without nulls, and asks for the view).

use pyo3::prelude::*;

use dlframe::DType;

use crate::ndarray;
use crate::tensor::PyTensor;

/// `view` (what `Series.to_numpy()` returned for one chunk without nulls) as a tensor over the
/// same memory (no copy), or None when it is not a vector of numbers: booleans (which Polars
/// unpacks from bits into a new array), temporal, decimal, string and nested data, which the
/// Arrow path converts instead. Nothing is raised here.
///
/// Polars documents `to_numpy()` as zero-copy for one chunk of numeric data without nulls, and
/// then returns a read-only view that keeps the Series' memory alive: the tensor shares it.
#[pyfunction]
#[pyo3(name = "_numpy_view", signature = (view, /))]
pub fn numpy_view(view: &Bound<'_, PyAny>) -> Option<PyTensor> {
    let t = ndarray::as_ndarray(view).ok()??.import()?;
    // A vector of numbers: every dtype dlframe imports is a number but bool (complex is
    // refused by the import); an Array column comes back with more dimensions.
    (t.ndim() == 1 && t.dtype() != DType::Bool).then(|| PyTensor::new(t))
}

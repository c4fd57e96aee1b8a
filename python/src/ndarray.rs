//! numpy's ndarray, recognised once per type and read through the core's reader of the struct
//! layout numpy's C API publishes (`dlframe::interface::ndarray`), without calling Python: the
//! few facts the small-call paths need before they hand an array on, and the tensor over a
//! Polars Series' own memory, from the numpy view that Polars' public `Series.to_numpy()` hands
//! out (what `series.to_dlpack()` takes first: `dlframe.polars` checks the Series, one chunk
//! without nulls, and asks for the view).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyType;

use dlframe::interface::ndarray::{self as layout, KNOWN_NUMPY};
use dlframe::{DType, Tensor};

use crate::interface::PyOwner;
use crate::per_type::PerType;
use crate::tensor::PyTensor;

// The core reads the object head of CPython's default build: a reference count and a type.
const _: () = assert!(std::mem::size_of::<pyo3::ffi::PyObject>() == 2 * std::mem::size_of::<usize>());

/// Whether a type is exactly `numpy.ndarray` of a numpy whose struct layout the core knows,
/// learnt once per type.
static NDARRAY: PerType<bool> = PerType::new();

/// An object whose type is exactly `numpy.ndarray` ([`as_ndarray`]): the only kind whose
/// struct is read.
#[derive(Clone, Copy)]
pub struct NdArray<'a, 'py>(&'a Bound<'py, PyAny>);

/// `x` as an [`NdArray`] when its type is exactly `numpy.ndarray` (not a subclass, whose
/// layout may differ) of a numpy in [`KNOWN_NUMPY`] (an array of another major version goes
/// through numpy's DLPack export, as any producer's does); None for anything else.
pub fn as_ndarray<'a, 'py>(x: &'a Bound<'py, PyAny>) -> PyResult<Option<NdArray<'a, 'py>>> {
    let is = NDARRAY.get(&x.get_type(), |ty: &Bound<'_, PyType>| -> PyResult<bool> {
        if ty.name()?.to_cow()? != "ndarray" || ty.module()?.to_cow()? != "numpy" {
            return Ok(false);
        }
        let version: String = ty.py().import("numpy")?.getattr("__version__")?.extract()?;
        Ok(KNOWN_NUMPY.contains(&version.split('.').next().unwrap_or("")))
    })?;
    Ok(is.then_some(NdArray(x)))
}

impl NdArray<'_, '_> {
    /// A tensor over the array's memory (no copy, no Python call), owned by the array; None
    /// for what numpy's DLPack export would refuse (`dlframe::interface::ndarray::import`).
    pub fn import(self) -> Option<Tensor> {
        // SAFETY: the type is exactly numpy.ndarray of a known numpy (`as_ndarray`), the GIL is
        // held and the array referenced for the call; the owner keeps it alive.
        unsafe { layout::import(self.0.as_ptr().cast(), || Arc::new(PyOwner::new(self.0))) }
    }

    /// Whether `pyarrow.Array.from_dlpack` takes the array exactly as dlframe's own import
    /// would hand it on (`dlframe::interface::ndarray::is_plain_1d`).
    pub fn is_plain_1d(self) -> bool {
        // SAFETY: as in `import`.
        unsafe { layout::is_plain_1d(self.0.as_ptr().cast()) }
    }
}

/// Whether `x` is an exact `numpy.ndarray` that [`NdArray::is_plain_1d`] accepts: exposed so
/// that the tests hold the struct read to numpy's own answers (`ndim`, `flags`, `dtype`), not
/// an API.
#[pyfunction]
#[pyo3(name = "_plain_ndarray", signature = (x, /))]
pub fn plain_ndarray(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(as_ndarray(x)?.is_some_and(NdArray::is_plain_1d))
}

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
    let t = as_ndarray(view).ok()??.import()?;
    // A vector of numbers: every dtype dlframe imports is a number but bool (complex is
    // refused by the import); an Array column comes back with more dimensions.
    (t.ndim() == 1 && t.dtype() != DType::Bool).then(|| PyTensor::new(t))
}

//! Rust results as Python objects: Arrow columns as pyarrow arrays.

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3_arrow::PyArray;
use pyo3_arrow::ffi::to_array_pycapsules;

use dlframe::{DType, Tensor};

use crate::error::Result;
use crate::tensor::PyTensor;

/// pyarrow's importer of a pair of Arrow PyCapsules (`pyarrow.Array._import_from_c_capsule`,
/// what `pyarrow.array` calls for an `__arrow_c_array__` producer), looked up once; None for a
/// pyarrow without it.
static IMPORT: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// A pyarrow array for an Arrow column (zero-copy through the C data interface): the column's
/// capsules handed straight to pyarrow's importer, without `pyarrow.array`'s search for what
/// kind of input it was given (a third of the call for a small array).
pub fn to_pyarrow<'py>(py: Python<'py>, field: FieldRef, array: ArrayRef) -> Result<Bound<'py, PyAny>> {
    match array_method(py, &IMPORT, "_import_from_c_capsule")? {
        Some(import) => {
            let capsules: Bound<'py, PyTuple> = to_array_pycapsules(py, field, array.as_ref(), None)?;
            Ok(import.call1(capsules)?)
        }
        None => Ok(PyArray::try_new(array, field)?.to_pyarrow(py)?.unbind().into_bound(py)),
    }
}

/// `pyarrow.Array.from_dlpack`, looked up once; None for a pyarrow without it.
static FROM_DLPACK: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// A pyarrow array over a plain 1-D tensor's memory (no copy), made by pyarrow's own DLPack
/// importer from dlframe's export of the tensor: for a small array, the Arrow C schema and
/// array that [`to_pyarrow`] builds, and pyarrow's import of them, cost twice the whole DLPack
/// hand-over. Only for what that importer makes exactly as the Arrow path would: a non-empty,
/// aligned, contiguous 1-D host tensor of integers or IEEE floats with no Arrow type of its
/// own, and writable (a pyarrow that asks for a legacy capsule would get a copy of read-only
/// memory). None otherwise, or when pyarrow refuses; the caller then takes the Arrow path.
pub fn plain_to_pyarrow<'py>(py: Python<'py>, t: &Tensor) -> Option<Bound<'py, PyAny>> {
    let plain = t.ndim() == 1
        && t.numel() > 0
        && !t.readonly()
        && t.logical().is_none()
        && !matches!(t.dtype(), DType::Bool | DType::BFloat16)
        && t.check_host_contiguous().is_ok();
    if !plain {
        return None;
    }
    let tensor = Bound::new(py, PyTensor::new(t.clone())).ok()?;
    pyarrow_from_dlpack(py, &tensor)
}

/// `pyarrow.Array.from_dlpack(x)` (no copy); None for a pyarrow without it or that refuses
/// `x`. For producers of what [`plain_to_pyarrow`] hands on.
pub fn pyarrow_from_dlpack<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    array_method(py, &FROM_DLPACK, "from_dlpack").ok()??.call1((x,)).ok()
}

/// `pyarrow.Array.<name>`, looked up once into `cell`; None for a pyarrow without it.
fn array_method<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Option<Py<PyAny>>>,
    name: &str,
) -> PyResult<Option<&'py Bound<'py, PyAny>>> {
    let method = cell.get_or_try_init(py, || -> PyResult<_> {
        let array_type = py.import("pyarrow")?.getattr("Array")?;
        Ok(array_type.getattr(name).ok().map(Bound::unbind))
    })?;
    Ok(method.as_ref().map(|m| m.bind(py)))
}

//! Rust results as Python objects: Arrow columns as pyarrow arrays, and pyarrow's own
//! importers, looked up once.

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3_arrow::PyArray;
use pyo3_arrow::ffi::to_array_pycapsules;

use crate::error::Result;

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

/// `pyarrow.Array.<name>`, looked up once into `cell`; None for a pyarrow without it.
pub(crate) fn array_method<'py>(
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

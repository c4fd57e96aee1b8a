//! Rust results as Python objects: Arrow columns as pyarrow arrays, and pyarrow's public
//! methods, looked up once.

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3_arrow::PyArray;

use crate::error::Result;

/// A pyarrow array for an Arrow column (zero-copy through the C data interface): `pyarrow.array`
/// of a producer of `__arrow_c_array__`, pyarrow's public import of the PyCapsule interface.
pub fn to_pyarrow<'py>(py: Python<'py>, field: FieldRef, array: ArrayRef) -> Result<Bound<'py, PyAny>> {
    Ok(PyArray::try_new(array, field)?.to_pyarrow(py)?.unbind().into_bound(py))
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

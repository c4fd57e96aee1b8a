//! Rust results as Python objects: Arrow columns as pyarrow arrays.

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3_arrow::PyArray;

use crate::error::Result;

/// A pyarrow array for an Arrow column (zero-copy through the C data interface).
pub fn to_pyarrow<'py>(py: Python<'py>, field: FieldRef, array: ArrayRef) -> Result<Bound<'py, PyAny>> {
    let array = PyArray::try_new(array, field)?;
    let out = array.to_pyarrow(py)?.unbind();
    Ok(out.into_bound(py))
}

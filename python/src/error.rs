//! The one place where dlframe errors become Python exceptions.
//!
//! `BufferError` for data that cannot be exchanged (the array API's choice), `ValueError` for
//! bad values, `TypeError` for unsupported types, `RuntimeError` for failures below us.

use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};

use dlframe::ErrorKind;

/// A dlframe or Python error on its way to Python.
pub struct Error(PyErr);

/// The result type of the extension's functions.
pub type Result<T> = std::result::Result<T, Error>;

impl From<dlframe::Error> for Error {
    fn from(e: dlframe::Error) -> Self {
        let msg = e.to_string();
        Error(match e.kind() {
            ErrorKind::Buffer => PyBufferError::new_err(msg),
            ErrorKind::Value => PyValueError::new_err(msg),
            ErrorKind::Type => PyTypeError::new_err(msg),
            _ => PyRuntimeError::new_err(msg),
        })
    }
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error(e)
    }
}

impl From<pyo3_arrow::error::PyArrowError> for Error {
    fn from(e: pyo3_arrow::error::PyArrowError) -> Self {
        Error(e.into())
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        dlframe::Error::from(e).into()
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        e.0
    }
}

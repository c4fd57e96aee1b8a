//! The one place where dlframe errors become Python exceptions.
//!
//! `BufferError` for data that cannot be exchanged (the array API's choice), `ValueError` for
//! bad values, `TypeError` for unsupported types, `RuntimeError` for failures below us.

use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use dlframe::ErrorKind;

/// A dlframe or Python error on its way to Python.
pub struct Error(PyErr);

/// The result type of the extension's functions.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// True when the exception is an instance of `T` (a BufferError from a producer, ...).
    pub fn is_instance_of<T: pyo3::PyTypeInfo>(&self, py: Python<'_>) -> bool {
        self.0.is_instance_of::<T>(py)
    }

    /// The error of reading a producer's Arrow data, said as `context: ...` with the same type
    /// (the original stays the `__cause__`). Failures of the producer's own stream (a DataFusion
    /// query that fails while it runs) arrive from arrow-rs as RuntimeError (see the
    /// `PyArrowError` conversion), never as a bare `Exception`.
    pub fn in_context(self, py: Python<'_>, context: &str) -> Error {
        let e = self.0;
        let msg = e.value(py).to_string();
        let msg = msg.strip_prefix("C Data interface error: ").unwrap_or(&msg);
        let new = if e.is_instance_of::<PyRuntimeError>(py) {
            PyRuntimeError::new_err(format!("{context}: {msg}"))
        } else if e.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(format!("{context}: {msg}"))
        } else {
            return Error(e);
        };
        new.set_cause(py, Some(e));
        Error(new)
    }
}

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
    /// An arrow-rs error (pyo3-arrow would raise it as a bare `Exception`) is mapped as dlframe
    /// maps its own Arrow errors: RuntimeError.
    fn from(e: pyo3_arrow::error::PyArrowError) -> Self {
        match e {
            pyo3_arrow::error::PyArrowError::ArrowError(a) => dlframe::Error::from(a).into(),
            other => Error(other.into()),
        }
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

//! The one place where errors become Python exceptions.
//!
//! The rest of the binding returns the core's [`dlframe::Error`], one of the binding's own
//! [`Binding`] errors (what only Python objects can get wrong), or an exception that Python code
//! raised (a producer's own). Each kind maps to exactly one exception type:
//!
//! | error | exception |
//! |---|---|
//! | [`ErrorKind::Buffer`] (data that cannot be exchanged as asked, a device out of reach) | `BufferError` |
//! | [`ErrorKind::Value`] (a bad value) | `ValueError` |
//! | [`ErrorKind::Type`] | `TypeError` |
//! | [`ErrorKind::Runtime`] (a failure below dlframe) | `RuntimeError` |
//! | [`ErrorKind::Attribute`] (a protocol the tensor does not offer) | `AttributeError` |
//! | [`Binding::WrongType`] | `TypeError` |
//! | [`Binding::NoProtocol`] | `AttributeError` |
//! | [`Binding::NotImplemented`] | `NotImplementedError` |

use pyo3::exceptions::{
    PyAttributeError, PyBufferError, PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;

use dlframe::ErrorKind;
use dlframe::dlpack::Failure;

/// What only the binding can get wrong: Python arguments and protocol objects.
#[derive(Debug)]
pub enum Binding {
    /// An argument or object of a Python type the function does not take.
    WrongType(String),
    /// The object does not offer this protocol, so `hasattr` says False for it.
    NoProtocol(String),
    /// A keyword a protocol reserves for later versions (the Arrow PyCapsule interface's).
    NotImplemented(String),
}

/// A dlframe, binding or Python error on its way to Python.
pub struct Error(PyErr);

/// The result type of the extension's functions.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The exception Python raised last (after a C API call that failed).
    pub fn fetch(py: Python<'_>) -> Error {
        Error(PyErr::fetch(py))
    }

    /// A panic caught at a C boundary, where it must not unwind: `RuntimeError`.
    pub fn panicked(place: &str) -> Error {
        Error(PyRuntimeError::new_err(panic_exception(place).1))
    }

    /// How a rung of the import ladder failed: a `TypeError` is the wrong object, a
    /// `BufferError` a refusal (a producer's, or one of ours).
    pub fn failure(&self, py: Python<'_>) -> Failure {
        if self.0.is_instance_of::<PyTypeError>(py) {
            Failure::WrongObject
        } else if self.0.is_instance_of::<PyBufferError>(py) {
            Failure::Refused
        } else {
            Failure::Other
        }
    }

    /// The error of reading a producer's Arrow data, said as `context: ...` with the same type
    /// (the original stays the `__cause__`). Failures of the producer's own stream (a DataFusion
    /// query that fails while it runs) arrive from arrow-rs as RuntimeError (see the
    /// `PyArrowError` conversion), never as a bare `Exception`.
    pub fn in_context(self, py: Python<'_>, context: &str) -> Error {
        let e = self.0;
        let msg = e.value(py).to_string();
        let msg = msg.strip_prefix("C Data interface error: ").unwrap_or(&msg);
        let same = match () {
            _ if e.is_instance_of::<PyRuntimeError>(py) => PyRuntimeError::new_err::<String>,
            _ if e.is_instance_of::<PyTypeError>(py) => PyTypeError::new_err::<String>,
            _ => return Error(e),
        };
        let new = same(format!("{context}: {msg}"));
        new.set_cause(py, Some(e));
        Error(new)
    }
}

/// The exception a core error maps to: its name, and how to make it.
fn exception_of(e: &dlframe::Error) -> (&'static str, fn(String) -> PyErr) {
    match e.kind() {
        ErrorKind::Buffer => ("BufferError", PyBufferError::new_err::<String>),
        ErrorKind::Value => ("ValueError", PyValueError::new_err::<String>),
        ErrorKind::Type => ("TypeError", PyTypeError::new_err::<String>),
        ErrorKind::Attribute => ("AttributeError", PyAttributeError::new_err::<String>),
        _ => ("RuntimeError", PyRuntimeError::new_err::<String>),
    }
}

/// The name of the exception a core error maps to, for C callers that take errors by name
/// (the DLPack exchange API's allocator, which may run without the GIL).
pub fn exception_name(e: &dlframe::Error) -> &'static str {
    exception_of(e).0
}

/// What [`Error::panicked`] raises, by name and message, for C callers that take errors by name.
pub fn panic_exception(place: &str) -> (&'static str, String) {
    ("RuntimeError", format!("dlframe panicked inside {place}"))
}

impl From<dlframe::Error> for Error {
    fn from(e: dlframe::Error) -> Self {
        let (_, new) = exception_of(&e);
        Error(new(e.to_string()))
    }
}

impl From<Binding> for Error {
    fn from(e: Binding) -> Self {
        Error(match e {
            Binding::WrongType(m) => PyTypeError::new_err(m),
            Binding::NoProtocol(m) => PyAttributeError::new_err(m),
            Binding::NotImplemented(m) => PyNotImplementedError::new_err(m),
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

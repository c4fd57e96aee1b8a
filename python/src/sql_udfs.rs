//! DataFusion UDFs for datafusion-python, handed over as datafusion-ffi capsules.
//!
//! Each UDF is exported as an `FFI_ScalarUDF` inside a capsule named `datafusion_scalar_udf`,
//! which `datafusion.udf(obj)` imports. datafusion-ffi has no stable ABI across major versions,
//! so the Python wrapper checks the host's major version against [`datafusion_version`] before
//! asking for a capsule (a mismatch would crash the process).

use std::sync::Arc;

use datafusion::logical_expr::ScalarUDF;
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::udf::FFI_ScalarUDF;
use dlframe_datafusion::DlframeOptions;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::error::Result;

/// One dlframe UDF, ready for `datafusion.udf(...)`.
#[pyclass(name = "ScalarUDF", module = "dlframe._native", frozen)]
pub struct PyScalarUDF {
    inner: Arc<ScalarUDF>,
}

#[pymethods]
impl PyScalarUDF {
    /// The SQL name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The UDF as a datafusion-ffi capsule (the owner of the `FFI_ScalarUDF` is the capsule).
    fn __datafusion_scalar_udf__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let udf = FFI_ScalarUDF::from(Arc::clone(&self.inner));
        PyCapsule::new_with_value(py, udf, c"datafusion_scalar_udf")
    }

    fn __repr__(&self) -> String {
        format!("<dlframe ScalarUDF {}>", self.inner.name())
    }
}

/// dlframe's session options (`dlframe.inexact`), for `SessionConfig().with_extension(...)`:
/// a session made with them takes `SET dlframe.inexact = 'round'`.
#[pyclass(name = "DatafusionOptions", module = "dlframe._native", frozen)]
pub struct PyOptions;

#[pymethods]
impl PyOptions {
    #[new]
    fn new() -> Self {
        PyOptions
    }

    /// The options, at their defaults, as a datafusion-ffi capsule (the capsule owns them).
    fn __datafusion_extension_options__<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyCapsule>> {
        let mut options = FFI_ExtensionOptions::default();
        options
            .add_config(&DlframeOptions::default())
            .map_err(|e| dlframe::Error::InvalidArgument(e.to_string()))?;
        Ok(PyCapsule::new_with_value(py, options, c"datafusion_extension_options")?)
    }

    fn __repr__(&self) -> &'static str {
        "<dlframe DataFusion options: dlframe.inexact>"
    }
}

/// Every dlframe UDF (the same list `dlframe_datafusion::register` installs in Rust).
#[pyfunction]
pub fn datafusion_udfs() -> Vec<PyScalarUDF> {
    dlframe_datafusion::functions().into_iter().map(|inner| PyScalarUDF { inner }).collect()
}

/// The DataFusion version these UDFs are built against.
#[pyfunction]
pub fn datafusion_version() -> &'static str {
    datafusion::DATAFUSION_VERSION
}

//! `dlframe._native`: the pyo3 extension behind the `dlframe` Python package.
//!
//! Layering: this crate only adapts Python objects to the core crate's API; errors become
//! exceptions in `error.rs`, and nothing here converts data on its own.

mod capsule;
mod convert;
mod error;
mod interface;
mod tensor;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tensor::PyTensor>()?;
    m.add_function(wrap_pyfunction!(convert::to_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(convert::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(convert::tensor, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

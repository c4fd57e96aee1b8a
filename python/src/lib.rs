//! `dlframe._native`: the pyo3 extension behind the `dlframe` Python package.
//!
//! Layering: this crate only adapts Python objects to the core crate's API; errors become
//! exceptions in `error.rs`, and nothing here converts data on its own.

mod args;
mod batches;
mod capsule;
mod convert;
mod error;
mod exchange;
mod gil;
mod importer;
mod input;
mod interface;
mod ndarray;
mod per_type;
mod sql_udfs;
mod tensor;

// Links the Polars expression plugins (`_polars_plugin_*`) into this library, which Polars loads.
use dlframe_polars as _;
use pyo3::prelude::*;

/// `[(case, bytes moved, best ms)]` of the `convert` kernel and of a device-to-device copy
/// (`dlframe::transfer::kernel_timing`), for `benches/gpu.py`: feature `bench-internals`, no API.
#[cfg(feature = "bench-internals")]
#[pyfunction]
#[pyo3(signature = (n, reps=20, device=0))]
fn _cuda_kernel_timing(
    py: Python<'_>,
    n: usize,
    reps: usize,
    device: usize,
) -> crate::error::Result<Vec<(String, f64, f64)>> {
    Ok(py.detach(|| dlframe::transfer::kernel_timing(device, n, reps))?)
}

/// Number of CUDA devices dlframe can use: 0 without a driver, a device, or the `cuda` feature.
#[pyfunction]
fn cuda_device_count() -> usize {
    dlframe::transfer::cuda_device_count()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<tensor::PyTensor>()?;
    exchange::install(&m.py().get_type::<tensor::PyTensor>())?;
    m.add_class::<batches::PyBatchStream>()?;
    m.add_class::<batches::PySchedule>()?;
    m.add_class::<batches::PyPlan>()?;
    m.add_class::<batches::PyParquetFiles>()?;
    m.add_function(wrap_pyfunction!(convert::to_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(importer::from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(importer::tensor, m)?)?;
    m.add_function(wrap_pyfunction!(ndarray::numpy_view, m)?)?;
    m.add_function(wrap_pyfunction!(ndarray::plain_ndarray, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(args::dtype_name, m)?)?;
    #[cfg(feature = "bench-internals")]
    m.add_function(wrap_pyfunction!(_cuda_kernel_timing, m)?)?;
    m.add_class::<sql_udfs::PyScalarUDF>()?;
    m.add_class::<sql_udfs::PyOptions>()?;
    m.add_function(wrap_pyfunction!(sql_udfs::datafusion_udfs, m)?)?;
    m.add_function(wrap_pyfunction!(sql_udfs::datafusion_version, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

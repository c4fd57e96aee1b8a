//! When a call releases the GIL: for work that takes long enough to let other Python threads
//! run meanwhile (copies of large data, device work), not for a small host export, where
//! releasing and taking back the GIL would cost more than the work, and would let another
//! thread take the GIL while this call waits for its turn.

use dlframe::{Device, Tensor};
use pyo3::Python;

/// CPU work over fewer bytes than this keeps the GIL.
pub const RELEASE_BYTES: usize = 64 << 10;

/// Runs `f` with the GIL held when it is CPU work (`cpu`: plain host memory, no stream to wait
/// on) over fewer than [`RELEASE_BYTES`] bytes, else without the GIL.
pub fn run<T: Send>(py: Python<'_>, cpu: bool, bytes: usize, f: impl FnOnce() -> T + Send) -> T {
    if cpu && bytes < RELEASE_BYTES { f() } else { py.detach(f) }
}

/// [`run`] for work over the tensor `t`: CPU work when `t` is in plain CPU memory, over its
/// bytes.
pub fn run_over<T: Send>(py: Python<'_>, t: &Tensor, f: impl FnOnce() -> T + Send) -> T {
    run(py, t.device() == Device::Cpu, t.nbytes(), f)
}

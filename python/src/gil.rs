//! When a call releases the GIL: for work that takes long enough to let other Python threads
//! run meanwhile (copies of large data, device work), not for a small host export, where
//! releasing and taking back the GIL would cost more than the work, and would let another
//! thread take the GIL while this call waits for its turn.

use pyo3::Python;

/// CPU work over fewer bytes than this keeps the GIL.
pub const RELEASE_BYTES: usize = 64 << 10;

/// Runs `f` with the GIL held when it is CPU work (`cpu`: plain host memory, no stream to wait
/// on) over fewer than [`RELEASE_BYTES`] bytes, else without the GIL.
pub fn run<T: Send>(py: Python<'_>, cpu: bool, bytes: usize, f: impl FnOnce() -> T + Send) -> T {
    if cpu && bytes < RELEASE_BYTES { f() } else { py.detach(f) }
}

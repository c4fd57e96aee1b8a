//! The threads that read `dlframe.batches`' sources: the core's reader threads
//! (`dlframe::batches::readers`), each attached to Python once, when it starts, and from then on
//! waiting and working detached (without the GIL). A source that takes the GIL for every batch
//! (DataFusion's stream does) then only takes and gives back the GIL, where a thread without a
//! Python thread state would get a new one from CPython each time and delete it after (most of
//! the time of a pass over such a source).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use dlframe::batches::readers::{Done, Readers, Serve};

/// The process's readers.
pub static READERS: Readers = Readers::new(attach);

/// Runs a new reader's loop attached once: `detach` releases the GIL and, as the loop never
/// returns, never takes it back. Without an interpreter to attach to, the loop is left to run
/// unattached.
fn attach(serve: &mut Option<Serve>) {
    let _ = Python::try_attach(|py| py.detach(|| serve.take().expect("served once")()));
}

/// Looks up `sys.is_finalizing` while imports still work (for a later [`wait`]); call it before
/// starting work.
pub fn prepare(py: Python<'_>) {
    let _ = finalizing(py);
}

/// Waits, without the GIL, until the work has ended. While the interpreter finalizes it does not
/// wait: work that takes the GIL then is stopped by CPython for good (or blocked in what unwinds
/// it), and waiting for it would hang the process's exit.
pub fn wait(py: Python<'_>, done: Done) {
    if !finalizing(py) {
        py.detach(move || done.wait());
    }
}

/// `sys.is_finalizing`, looked up while imports still work.
static IS_FINALIZING: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether the interpreter is finalizing (also when that cannot be asked any more).
fn finalizing(py: Python<'_>) -> bool {
    IS_FINALIZING
        .get_or_try_init(py, || py.import("sys")?.getattr("is_finalizing").map(Bound::unbind))
        .and_then(|f| f.bind(py).call0()?.is_truthy())
        .unwrap_or(true)
}

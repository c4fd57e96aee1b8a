//! The threads that read `dlframe.batches`' sources: kept for the life of the process, each
//! with a Python thread state of its own.
//!
//! Some sources take the GIL for every batch they hand out (DataFusion's stream does). A thread
//! that has no Python thread state gets a new one from CPython each time and deletes it after,
//! and over a DataFusion source that was most of the time of a pass. A reader here attaches to
//! Python once, when it starts, and from then on waits and works detached (without the GIL), so
//! such a source only takes and gives back the GIL.
//!
//! A reader never ends. A thread with a thread state of its own must take the GIL back to delete
//! it when it ends, and while the interpreter finalizes, CPython before 3.14 answers that with
//! `pthread_exit`, whose unwind through Rust frames aborts the process. A reader instead waits
//! in Rust, outside Python, until the process exits. [`start`] waits for a new reader to have
//! attached and detached, so a reader only ever takes the GIL when the work it runs does, as any
//! other thread would.
//!
//! At most [`KEPT`] readers are kept. Beyond that, or when Python cannot be attached to, work
//! runs on a thread of its own with no thread state (slower for a source that takes the GIL,
//! and otherwise the same). A process made by `fork` has none of its parent's threads, so it
//! starts readers of its own, as the kernels' pool does.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// How many readers a process keeps.
pub const KEPT: usize = 8;

/// The name of a reader thread (a thread of its own, beyond [`KEPT`], is named the same).
pub const NAME: &str = "dlframe-batches";

/// Work for a reader, and the sender whose drop tells [`Done`] that it has ended.
struct Job {
    work: Box<dyn FnOnce() + Send>,
    ended: SyncSender<()>,
}

impl Job {
    /// Runs the work on a thread of its own, without a thread state kept.
    fn alone(self) -> std::io::Result<()> {
        std::thread::Builder::new().name(NAME.into()).spawn(move || {
            let Job { work, ended } = self;
            work();
            drop(ended);
        })?;
        Ok(())
    }
}

/// The idle readers of the process that started them, and how many it started.
struct Readers {
    pid: u32,
    idle: Vec<SyncSender<Job>>,
    started: usize,
}

static READERS: Mutex<Option<Readers>> = Mutex::new(None);

/// Waits for work started by [`start`] to end (in a Mutex only to be Sync, as pyclasses are).
pub struct Done(Mutex<Receiver<()>>);

impl Done {
    /// Waits, without the GIL, until the work has ended (returned or panicked) and its reader,
    /// if it ran on one, is idle again.
    ///
    /// While the interpreter finalizes it does not wait: work that takes the GIL then is stopped
    /// by CPython for good (or blocked in what unwinds it), and waiting for it would hang the
    /// process's exit.
    pub fn wait(self, py: Python<'_>) {
        if finalizing(py) {
            return;
        }
        let ended = self.0.into_inner().unwrap_or_else(|e| e.into_inner());
        // Only that end drops the only sender.
        let _ = py.detach(move || ended.recv());
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

/// Runs `work` on an idle reader, on a new reader, or past [`KEPT`] on a thread of its own;
/// the GIL is released while a new reader attaches.
pub fn start(py: Python<'_>, work: impl FnOnce() + Send + 'static) -> std::io::Result<Done> {
    // Looks `sys.is_finalizing` up now, for a wait at the interpreter's exit.
    let _ = finalizing(py);
    let (ended, done) = sync_channel::<()>(0);
    let done = Done(Mutex::new(done));
    let mut job = Job { work: Box::new(work), ended };
    {
        let mut slot = READERS.lock().unwrap_or_else(|e| e.into_inner());
        let readers = current(&mut slot);
        while let Some(reader) = readers.idle.pop() {
            match reader.send(job) {
                Ok(()) => return Ok(done),
                // Cannot happen while the reader lives; try the next one.
                Err(back) => job = back.0,
            }
        }
        if readers.started == KEPT {
            drop(slot);
            job.alone()?;
            return Ok(done);
        }
        readers.started += 1;
    }
    let (to_reader, inbox) = sync_channel::<Job>(1);
    let (attached, ready) = sync_channel::<()>(1);
    let me = to_reader.clone();
    let spawned = std::thread::Builder::new().name(NAME.into()).spawn(move || read(inbox, me, attached));
    if let Err(e) = spawned {
        with_readers(|r| r.started -= 1);
        return Err(e);
    }
    // The reader attaches now, with the GIL this thread lets go of.
    let _ = py.detach(move || ready.recv());
    if let Err(back) = to_reader.send(job) {
        // Only if the reader died starting.
        back.0.alone()?;
    }
    Ok(done)
}

/// The readers of this process: none yet, or the parent's (whose threads a forked child does
/// not have) are replaced by an empty set.
fn current(slot: &mut Option<Readers>) -> &mut Readers {
    let pid = std::process::id();
    if slot.as_ref().is_some_and(|r| r.pid != pid) {
        *slot = None;
    }
    slot.get_or_insert_with(|| Readers { pid, idle: Vec::new(), started: 0 })
}

/// Runs `f` on this process's readers, under their lock.
fn with_readers<R>(f: impl FnOnce(&mut Readers) -> R) -> R {
    let mut slot = READERS.lock().unwrap_or_else(|e| e.into_inner());
    f(current(&mut slot))
}

/// A reader's life: attach, tell the starter, then run work detached, forever.
fn read(inbox: Receiver<Job>, me: SyncSender<Job>, attached: SyncSender<()>) {
    let serve = move || {
        let _ = attached.send(());
        loop {
            match inbox.recv() {
                Ok(Job { work, ended }) => {
                    // The work reports its own panics; the reader goes on.
                    let _ = catch_unwind(AssertUnwindSafe(work));
                    // Idle again: on the list of its process (the only one it runs in).
                    with_readers(|r| r.idle.push(me.clone()));
                    drop(ended);
                }
                // `me` is still held here, so the inbox stays open: never reached.
                Err(_) => loop {
                    std::thread::park();
                },
            }
        }
    };
    // Attached once; `detach` releases the GIL and, as `serve` never returns, never takes it
    // back. Without an interpreter to attach to, the reader serves unattached.
    let mut serve = Some(serve);
    let _ = Python::try_attach(|py| py.detach(serve.take().expect("served once")));
    if let Some(serve) = serve {
        serve();
    }
}

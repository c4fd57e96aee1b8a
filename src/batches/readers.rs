//! The threads that read batch streams' sources: kept for the life of the process, each set up
//! once by its embedder.
//!
//! Some sources need a per-thread context for every batch they hand out (a Python source takes
//! the GIL, and a thread without a Python thread state gets a new one from CPython each time,
//! most of a pass over a DataFusion source). A reader is set up once, when it starts, by
//! [`Readers`]' `serve` hook (the Python binding attaches a thread state there, then runs the
//! reader detached), and then serves work forever.
//!
//! A reader never ends: a thread with a Python thread state of its own must take the GIL back to
//! delete it when it ends, and while the interpreter finalizes, CPython before 3.14 answers that
//! with `pthread_exit`, whose unwind through Rust frames aborts the process. A reader instead
//! waits in Rust until the process exits. [`Readers::start`] waits for a new reader to be set up,
//! so a reader only ever needs its context when the work it runs does.
//!
//! At most [`KEPT`] readers are kept. Beyond that, or when the hook cannot set a reader up, work
//! runs on a thread of its own with no context kept (slower for a source that takes the GIL, and
//! otherwise the same). A process made by `fork` has none of its parent's threads, so it starts
//! readers of its own, as the kernels' pool does.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// How many readers a process keeps.
pub const KEPT: usize = 8;

/// The name of a reader thread (a thread of its own, beyond [`KEPT`], is named the same).
pub const NAME: &str = "dlframe-batches";

/// A reader's serving loop, which never returns.
pub type Serve = Box<dyn FnOnce() + Send>;

/// Work for a reader, and the sender whose drop tells [`Done`] that it has ended.
struct Job {
    work: Box<dyn FnOnce() + Send>,
    ended: SyncSender<()>,
}

impl Job {
    /// Runs the work on a thread of its own, without a context kept.
    fn alone(self) -> std::io::Result<()> {
        std::thread::Builder::new().name(NAME.into()).spawn(move || {
            let Job { work, ended } = self;
            // Reported by the work itself; `ended` drops either way.
            let _ = catch_unwind(AssertUnwindSafe(work));
            drop(ended);
        })?;
        Ok(())
    }
}

/// The idle readers of the process that started them, and how many it started.
struct Pool {
    pid: u32,
    idle: Vec<SyncSender<Job>>,
    started: usize,
}

/// A process's readers, with the hook that sets each one up.
pub struct Readers {
    pool: Mutex<Option<Pool>>,
    /// Runs a new reader's serving loop in the reader's context (takes it out of the option and
    /// never returns); leaves it there when it cannot, and the loop then runs without one.
    serve: fn(&mut Option<Serve>),
}

/// Waits for work started by [`Readers::start`] to end (in a Mutex only to be Sync).
pub struct Done(Mutex<Receiver<()>>);

impl Done {
    /// Blocks until the work has ended (returned or panicked) and its reader, if it ran on one,
    /// is idle again.
    pub fn wait(self) {
        let ended = self.0.into_inner().unwrap_or_else(|e| e.into_inner());
        // Only that end drops the only sender.
        let _ = ended.recv();
    }
}

impl Readers {
    /// No readers yet; `serve` sets each new one up (see the field).
    pub const fn new(serve: fn(&mut Option<Serve>)) -> Self {
        Readers { pool: Mutex::new(None), serve }
    }

    /// Runs `work` on an idle reader, on a new reader, or past [`KEPT`] on a thread of its own.
    /// Blocks while a new reader is set up: an embedder whose hook takes a lock this thread
    /// holds (the GIL) must release it around the call.
    pub fn start(&'static self, work: impl FnOnce() + Send + 'static) -> std::io::Result<Done> {
        let (ended, done) = sync_channel::<()>(0);
        let done = Done(Mutex::new(done));
        let mut job = Job { work: Box::new(work), ended };
        {
            let mut slot = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            let pool = current(&mut slot);
            while let Some(reader) = pool.idle.pop() {
                match reader.send(job) {
                    Ok(()) => return Ok(done),
                    // Cannot happen while the reader lives; try the next one.
                    Err(back) => job = back.0,
                }
            }
            if pool.started == KEPT {
                drop(slot);
                job.alone()?;
                return Ok(done);
            }
            pool.started += 1;
        }
        let (to_reader, inbox) = sync_channel::<Job>(1);
        let (set_up, ready) = sync_channel::<()>(1);
        let me = to_reader.clone();
        let spawned =
            std::thread::Builder::new().name(NAME.into()).spawn(move || self.read(inbox, me, set_up));
        if let Err(e) = spawned {
            self.with_pool(|p| p.started -= 1);
            return Err(e);
        }
        let _ = ready.recv();
        if let Err(back) = to_reader.send(job) {
            // Only if the reader died starting.
            back.0.alone()?;
        }
        Ok(done)
    }

    /// How many readers this process has started.
    pub fn started(&self) -> usize {
        self.with_pool(|p| p.started)
    }

    /// Runs `f` on this process's readers, under their lock.
    fn with_pool<R>(&self, f: impl FnOnce(&mut Pool) -> R) -> R {
        let mut slot = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        f(current(&mut slot))
    }

    /// A reader's life: set up, tell the starter, then run work, forever.
    fn read(&'static self, inbox: Receiver<Job>, me: SyncSender<Job>, set_up: SyncSender<()>) {
        let serve = move || {
            let _ = set_up.send(());
            loop {
                match inbox.recv() {
                    Ok(Job { work, ended }) => {
                        // The work reports its own panics; the reader goes on.
                        let _ = catch_unwind(AssertUnwindSafe(work));
                        // Idle again: on the list of its process (the only one it runs in).
                        self.with_pool(|p| p.idle.push(me.clone()));
                        drop(ended);
                    }
                    // `me` is still held here, so the inbox stays open: never reached.
                    Err(_) => loop {
                        std::thread::park();
                    },
                }
            }
        };
        let mut serve: Option<Serve> = Some(Box::new(serve));
        (self.serve)(&mut serve);
        if let Some(serve) = serve {
            serve();
        }
    }
}

/// The readers of this process: none yet, or the parent's (whose threads a forked child does not
/// have) are replaced by an empty set.
fn current(slot: &mut Option<Pool>) -> &mut Pool {
    let pid = std::process::id();
    if slot.as_ref().is_some_and(|r| r.pid != pid) {
        *slot = None;
    }
    slot.get_or_insert_with(|| Pool { pid, idle: Vec::new(), started: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::thread::ThreadId;

    static SET_UP: AtomicUsize = AtomicUsize::new(0);

    fn count_and_serve(serve: &mut Option<Serve>) {
        SET_UP.fetch_add(1, Ordering::SeqCst);
        (serve.take().expect("a loop to serve"))();
    }

    static READERS: Readers = Readers::new(count_and_serve);

    /// Runs `f` on `readers` and returns the thread it ran on, once it has ended.
    fn on(readers: &'static Readers, f: impl FnOnce() + Send + 'static) -> (ThreadId, Option<String>) {
        let (tx, rx) = channel();
        let done = readers
            .start(move || {
                let me = std::thread::current();
                tx.send((me.id(), me.name().map(String::from))).unwrap();
                f();
            })
            .unwrap();
        done.wait();
        rx.recv().unwrap()
    }

    #[test]
    fn readers_are_set_up_once_reused_and_kept_at_most_kept() {
        let (first, name) = on(&READERS, || {});
        assert_eq!(name.as_deref(), Some(NAME));
        assert_eq!((READERS.started(), SET_UP.load(Ordering::SeqCst)), (1, 1));
        // Idle again once done: the next work runs on the same reader, not set up again.
        assert_eq!(on(&READERS, || {}).0, first);
        assert_eq!(SET_UP.load(Ordering::SeqCst), 1);
        // A panic is the work's to report: the reader survives it and serves again.
        let (after_panic, _) = on(&READERS, || panic!("the work's own"));
        assert_eq!(after_panic, first);
        assert_eq!(on(&READERS, || {}).0, first);

        // Work held busy at once takes new readers, up to KEPT; past them, threads of their own.
        let (release, hold) = std::sync::mpsc::sync_channel::<()>(0);
        let hold = Arc::new(Mutex::new(hold));
        let busy: Vec<Done> = (0..KEPT + 2)
            .map(|_| {
                let hold = hold.clone();
                READERS
                    .start(move || {
                        let _ = hold.lock().unwrap().recv();
                    })
                    .unwrap()
            })
            .collect();
        assert_eq!(READERS.started(), KEPT);
        assert_eq!(SET_UP.load(Ordering::SeqCst), KEPT);
        for _ in 0..KEPT + 2 {
            release.send(()).unwrap();
        }
        busy.into_iter().for_each(Done::wait);
        assert_eq!(on(&READERS, || {}).1.as_deref(), Some(NAME));
        assert_eq!(READERS.started(), KEPT);
    }

    fn refuse(_: &mut Option<Serve>) {}

    static PLAIN: Readers = Readers::new(refuse);

    #[test]
    fn a_reader_the_hook_cannot_set_up_serves_without_its_context() {
        let (first, _) = on(&PLAIN, || {});
        assert_eq!(on(&PLAIN, || {}).0, first);
        assert_eq!(PLAIN.started(), 1);
    }
}

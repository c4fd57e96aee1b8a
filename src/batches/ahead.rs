//! [`Ahead`]: windows converted on dlframe's pool while the caller reads on, handed back in
//! order.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc::{Receiver, sync_channel};

use super::Window;
use crate::error::Result;
use crate::table::TableTensors;

/// A converted window, or the panic of its conversion.
type Done = std::thread::Result<Result<TableTensors>>;

/// Windows converted ahead, up to `depth` at once, on dlframe's pool: their conversions overlap
/// each other and whatever the caller does meanwhile (reading the next input). They come back
/// in the order they went in. Each holds its output until [`Ahead::pop`] hands it over, so at
/// most `depth` converted batches are held here. Drive it from a thread of your own, not from
/// inside dlframe's pool: `pop` blocks its thread until the pool has made the batch.
#[derive(Debug)]
pub struct Ahead {
    pending: VecDeque<Receiver<Done>>,
    depth: usize,
}

impl Ahead {
    /// Room for `depth` conversions at once (at least one).
    pub fn new(depth: usize) -> Self {
        Ahead { pending: VecDeque::new(), depth: depth.max(1) }
    }

    /// True when `depth` conversions are under way or done and not handed out.
    pub fn is_full(&self) -> bool {
        self.pending.len() >= self.depth
    }

    /// True when nothing is under way or waiting.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Starts converting `window` on the pool (on this thread when no pool can start).
    pub fn push(&mut self, window: Window) {
        let (tx, rx) = sync_channel(1);
        crate::kernels::spawn(move || {
            // A panic goes back to the caller of `pop`, not through the pool (which would abort).
            let done = catch_unwind(AssertUnwindSafe(|| window.convert()));
            // The receiver is gone only when the caller stopped: the batch is not wanted.
            let _ = tx.send(done);
        });
        self.pending.push_back(rx);
    }

    /// The oldest window's batch, waiting for its conversion; None when nothing was pushed.
    /// A panic in the conversion resumes here.
    ///
    /// # Errors
    /// The conversion's errors.
    pub fn pop(&mut self) -> Option<Result<TableTensors>> {
        let rx = self.pending.pop_front()?;
        match rx.recv() {
            Ok(Ok(done)) => Some(done),
            Ok(Err(panic)) => resume_unwind(panic),
            Err(_) => unreachable!("a spawned conversion always sends, or its panic is caught"),
        }
    }
}

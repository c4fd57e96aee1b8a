//! The threads that run queries: a tokio runtime for each running query, kept between queries.
//!
//! A query runs on a runtime of its own, whose workers (one per core) poll its stream and the
//! tasks DataFusion spawns for it. The system shares the cores among the queries and the
//! server's own threads, so a query that holds its threads starves no other client. A runtime
//! whose query ended with nothing of it left is kept for the next query: starting one costs
//! threads, their stacks and the pages those touch, for every query. A runtime still busy with
//! an ended query (a task inside a long poll) is shut down without waiting; the task stops at its
//! next await.

use std::sync::Mutex;
use std::time::Duration;

use tokio::runtime::Runtime;

/// How long an ended query's runtime may take to be left with no task, before it is shut down
/// rather than kept: an operator's task ends at the end of its slice of [`super::paced::SLICE`].
const SETTLE: Duration = super::paced::SLICE.saturating_mul(2);

/// One query's runtime. Dropped anywhere (also inside a runtime that is shutting down) without
/// blocking: a task still on it stops at its next await.
pub(crate) struct Threads(Option<Runtime>);

impl std::ops::Deref for Threads {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("held until dropped")
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The runtimes of the queries of one server.
pub(crate) struct QueryThreads {
    /// The stack of each worker, for the deepest plan the limits let through.
    stack: usize,
    /// How many idle runtimes are kept: as many as queries may run at once.
    kept: usize,
    idle: Mutex<Vec<Threads>>,
}

impl QueryThreads {
    pub(crate) fn new(stack: usize, kept: usize) -> QueryThreads {
        QueryThreads { stack, kept, idle: Mutex::new(Vec::new()) }
    }

    /// A runtime for one query: one kept idle, or a new one.
    pub(crate) fn take(&self) -> std::io::Result<Threads> {
        if let Some(rt) = self.idle.lock().expect("not poisoned").pop() {
            return Ok(rt);
        }
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name("dlframe-query")
            .thread_stack_size(self.stack)
            .enable_all()
            .build()?;
        Ok(Threads(Some(rt)))
    }

    /// Takes back the runtime of a query that has ended: kept when no task is left on it within
    /// [`SETTLE`] and fewer than `kept` wait, shut down (without waiting for its tasks)
    /// otherwise. A blocking call (a file read that object_store hands to the blocking pool) is
    /// not a task here: one left by the ended query finishes on the kept runtime's blocking
    /// threads, apart from its workers.
    pub(crate) async fn give_back(&self, rt: Threads) {
        // A finished task leaves the runtime's list just after its handle hears, and a task its
        // query aborted at its next poll.
        let until = tokio::time::Instant::now() + SETTLE;
        while rt.metrics().num_alive_tasks() > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut idle = self.idle.lock().expect("not poisoned");
        if rt.metrics().num_alive_tasks() == 0 && idle.len() < self.kept {
            idle.push(rt);
        }
    }

    /// The runtimes kept idle.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.idle.lock().expect("not poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_runtime_is_kept_only_when_its_query_left_nothing_on_it() {
        let threads = QueryThreads::new(8 << 20, 1);
        let rt = threads.take().unwrap();
        let done = rt.spawn(async { 1 });
        assert_eq!(done.await.unwrap(), 1);
        // The task leaves the runtime's list just after its handle hears: on a busy machine,
        // maybe later than `give_back` waits.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while rt.metrics().num_alive_tasks() > 0 && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let first = rt.handle().id();
        threads.give_back(rt).await;
        assert_eq!(threads.idle(), 1);
        let rt = threads.take().unwrap();
        assert_eq!(rt.handle().id(), first, "the kept runtime is taken again");
        assert_eq!(threads.idle(), 0);
        // A task that never ends: the runtime is shut down, not kept.
        let stuck = rt.spawn(std::future::pending::<()>());
        threads.give_back(rt).await;
        assert_eq!(threads.idle(), 0);
        assert!(stuck.await.unwrap_err().is_cancelled());
        // At most `kept` wait.
        let (a, b) = (threads.take().unwrap(), threads.take().unwrap());
        threads.give_back(a).await;
        threads.give_back(b).await;
        assert_eq!(threads.idle(), 1);
    }
}

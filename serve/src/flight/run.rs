//! How `dlframe serve` runs a query within bounds: at most `max_queries` at once (the rest wait
//! in a bounded queue), each with a memory pool of its own inside the server's, a deadline, a
//! way to cancel it by id, and one log line when it ends.
//!
//! A query runs on a task of its own that holds its slot and its memory; the task ends at the
//! deadline, on CancelFlightInfo, or when the client goes away, also while the client has
//! stopped reading, and dropping DataFusion's stream there stops its tasks, so CPU and memory
//! go back to idle.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::memory_pool::{MemoryLimit, MemoryPool, MemoryReservation};
use futures::{Stream, StreamExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::conn::Owner;
use super::error::ServeError;
use super::guard::SqlLimits;
use super::threads::QueryThreads;

/// The bounds on running queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunLimits {
    /// Queries running at once.
    pub max_queries: usize,
    /// Queries waiting for a slot; past this a query is refused as busy.
    pub max_queued: usize,
    /// How long a query may take, from the start of its wait to its last batch.
    pub timeout: Duration,
    /// The memory of all queries together, in bytes (DataFusion's accounted memory: sorts,
    /// joins, aggregations; they spill to disk where DataFusion can).
    pub memory: usize,
    /// The memory of one query, in bytes.
    pub query_memory: usize,
    /// The stack of each thread that runs a query ([`query_stack_for`] the block limit).
    pub query_stack: usize,
}

impl Default for RunLimits {
    /// Safe on a 2-core, 4 GB machine.
    fn default() -> Self {
        RunLimits {
            max_queries: 4,
            max_queued: 64,
            timeout: Duration::from_secs(300),
            memory: 1 << 30,
            query_memory: 512 << 20,
            query_stack: query_stack_for(SqlLimits::default().max_blocks),
        }
    }
}

/// Stack bytes per query block on the threads that run a query: a plan recurses once per
/// operator when it is executed and polled, and a flat chain of `EXCEPT`s or `INTERSECT`s (which
/// the text's nesting limit does not see) is a join per block. 255 of them overflowed 5 MiB and
/// held in 8 MiB in the debug build (about 32 KiB a block); this is four times that.
const QUERY_STACK_PER_BLOCK: usize = 128 << 10;

/// The stack of the threads that run queries of at most `max_blocks` blocks, at least 8 MiB:
/// 32 MiB at the default of 256 blocks, reserved as address space and used only as deep as a
/// plan goes.
pub(crate) fn query_stack_for(max_blocks: usize) -> usize {
    max_blocks.saturating_mul(QUERY_STACK_PER_BLOCK).max(8 << 20)
}

/// A query's id: the random bytes in its tickets, which CancelFlightInfo names.
pub(crate) type QueryId = [u8; 16];

/// A fresh random id.
pub(crate) fn new_id() -> QueryId {
    let mut id = [0u8; 16];
    // The system's random source; it fails only where none exists, which `serve` checks at start.
    getrandom::fill(&mut id).expect("the system's random source");
    id
}

/// Each running query's runs: a nonce and the signal that cancels it.
type Running = HashMap<QueryId, Vec<(u64, Owner, Arc<Notify>)>>;

/// The queries of one server: the slots, the memory, and the running ones by id.
pub(crate) struct Runner {
    limits: RunLimits,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    memory: Arc<dyn MemoryPool>,
    /// The running queries by id: a nonce for each run (a ticket may be run twice) and the
    /// signal that cancels it.
    running: Mutex<Running>,
    /// The next run's nonce.
    next_run: AtomicU64,
    /// The runtimes the queries run on.
    threads: QueryThreads,
}

impl Runner {
    pub(crate) fn new(limits: RunLimits) -> Runner {
        Runner {
            limits,
            slots: Arc::new(Semaphore::new(limits.max_queries)),
            waiting: AtomicUsize::new(0),
            memory: Arc::new(datafusion::execution::memory_pool::GreedyMemoryPool::new(limits.memory)),
            running: Mutex::new(HashMap::new()),
            next_run: AtomicU64::new(0),
            threads: QueryThreads::new(limits.query_stack, limits.max_queries),
        }
    }

    /// Waits for a slot, within the timeout; refuses at once when the queue is full.
    pub(crate) async fn slot(&self, started: Instant) -> Result<OwnedSemaphorePermit, ServeError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.waiting);
        let running = self.limits.max_queries;
        if waiting >= self.limits.max_queued {
            return Err(ServeError::Busy { running, waiting });
        }
        let left = self.limits.timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, self.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(_)) => Err(ServeError::Busy { running, waiting }),
            Err(_) => Err(ServeError::Timeout(self.limits.timeout.as_secs())),
        }
    }

    /// The bounds it runs queries within.
    pub(crate) fn limits(&self) -> &RunLimits {
        &self.limits
    }

    /// A memory pool for one query: its own limit, inside the server's.
    pub(crate) fn query_pool(&self) -> Arc<dyn MemoryPool> {
        Arc::new(QueryPool {
            server: self.memory.clone(),
            limit: self.limits.query_memory,
            used: AtomicUsize::new(0),
        })
    }

    /// Cancels the runs under `id` that `caller` asked for (another caller's are left alone);
    /// false when none of them runs.
    pub(crate) fn cancel(&self, id: &QueryId, caller: &Owner) -> bool {
        let mut running = self.running.lock().expect("not poisoned");
        let Some(runs) = running.get_mut(id) else { return false };
        let mut any = false;
        runs.retain(|(_, owner, signal)| {
            let theirs = owner == caller;
            if theirs {
                signal.notify_one();
                any = true;
            }
            !theirs
        });
        if runs.is_empty() {
            running.remove(id);
        }
        any
    }

    /// Runs a query's stream (which `start` makes) on threads of its own, apart from the ones
    /// that answer calls and from other queries' (the system shares the cores among them, so
    /// a query that holds its threads for long starves no other client), on a task that holds
    /// `slot` and hands the batches to the client through a channel of two. The deadline and a cancel end the query there,
    /// whether the client reads or has stopped reading (then only the channel waits); a client
    /// that goes away closes the channel, which ends it too. One log line is written when it
    /// ends. Returns the client's side: the batches, then the reason if the query was ended.
    pub(crate) fn run<S, F>(
        self: &Arc<Self>,
        id: QueryId,
        owner: Owner,
        start: F,
        slot: OwnedSemaphorePermit,
        log: QueryLog,
    ) -> impl Stream<Item = Result<RecordBatch, ServeError>> + Send + 'static
    where
        S: Stream<Item = DFResult<RecordBatch>> + Send + Unpin + 'static,
        F: FnOnce() -> DFResult<S> + Send + 'static,
    {
        let signal = Arc::new(Notify::new());
        let nonce = self.next_run.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::from_std(log.started + self.limits.timeout);
        let secs = self.limits.timeout.as_secs();
        let runner = self.clone();
        let keeper = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch, ServeError>>(2);
        let ended: Arc<Mutex<Option<ServeError>>> = Arc::new(Mutex::new(None));
        let verdict = ended.clone();
        let why = Arc::new(Mutex::new(None));
        let threads = match self.threads.take() {
            Ok(t) => t,
            Err(e) => {
                let e = ServeError::Query(DataFusionError::Execution(format!(
                    "cannot start the query's threads: {e}"
                )));
                let mut log = log;
                log.error = Some(e.to_string());
                log.write();
                *ended.lock().expect("not poisoned") = Some(e);
                drop(tx);
                return Self::answer(rx, ended);
            }
        };
        // Cancellable from here: a query whose threads did not start is not running.
        self.running.lock().expect("not poisoned").entry(id).or_default().push((
            nonce,
            owner,
            signal.clone(),
        ));
        // The stream is made and polled on the query's own threads, where the tasks it spawns
        // run too; this task, on the server's, keeps the deadline, a cancel and the client in
        // view even while an operator is inside a long poll there.
        let (fwd, mut forwarded) = tokio::sync::mpsc::channel(1);
        let held = why.clone();
        let pump = threads.spawn(async move {
            // An error of the start is the stream's one item.
            let inner = match start() {
                Ok(s) => futures::future::Either::Left(s),
                Err(e) => futures::future::Either::Right(futures::stream::iter([Err(e)])),
            };
            let mut watched = Watched { inner, why: held, runner, id, nonce, _slot: slot, log, done: false };
            while let Some(item) = watched.next().await {
                if fwd.send(item).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            let cancelled = signal.notified();
            tokio::pin!(cancelled);
            let gone = || "the client went away".to_string();
            let stop: Option<Result<ServeError, String>> = loop {
                let item = tokio::select! {
                    biased;
                    () = &mut cancelled => break Some(Ok(ServeError::Cancelled)),
                    () = tokio::time::sleep_until(deadline) => break Some(Ok(ServeError::Timeout(secs))),
                    // A client that went away is heard while the query has no row to send yet.
                    () = tx.closed() => break Some(Err(gone())),
                    item = forwarded.recv() => item,
                };
                let Some(item) = item else { break None };
                // The operators end with their own error at the deadline (see `paced`).
                if item.is_err() && tokio::time::Instant::now() >= deadline {
                    break Some(Ok(ServeError::Timeout(secs)));
                }
                tokio::select! {
                    biased;
                    () = &mut cancelled => break Some(Ok(ServeError::Cancelled)),
                    () = tokio::time::sleep_until(deadline) => break Some(Ok(ServeError::Timeout(secs))),
                    sent = tx.send(item) => if sent.is_err() { break Some(Err(gone())) },
                }
            };
            if let Some(stopped) = &stop {
                let reason = match stopped {
                    Ok(e) => e.to_string(),
                    Err(gone) => gone.clone(),
                };
                *why.lock().expect("not poisoned") = Some(reason);
                pump.abort();
            }
            drop(forwarded);
            // The query's stream, its memory and its slot go when its task next yields, before
            // the client hears, unless an operator is inside a poll that does not end sooner.
            let let_go = tokio::time::timeout(LET_GO, pump).await;
            if let Some(Ok(e)) = stop {
                *verdict.lock().expect("not poisoned") = Some(e);
            }
            drop(tx);
            match let_go {
                Ok(_) => keeper.threads.give_back(threads).await,
                Err(_) => drop(threads),
            }
        });
        Self::answer(rx, ended)
    }

    /// The client's side of a run: the batches, then the reason if the query was ended.
    fn answer(
        rx: tokio::sync::mpsc::Receiver<Result<RecordBatch, ServeError>>,
        ended: Arc<Mutex<Option<ServeError>>>,
    ) -> impl Stream<Item = Result<RecordBatch, ServeError>> + Send + 'static {
        futures::stream::unfold((rx, Some(ended)), |(mut rx, ended)| async move {
            match rx.recv().await {
                Some(item) => Some((item, (rx, ended))),
                None => {
                    let e = ended?.lock().expect("not poisoned").take()?;
                    Some((Err(e), (rx, None)))
                }
            }
        })
    }
}

/// How long a query's end waits for its stream to let go of its slot and memory before the
/// client hears (an operator may be inside a poll that does not return sooner).
const LET_GO: Duration = Duration::from_millis(250);

/// What the log line of a query says.
pub(crate) struct QueryLog {
    pub peer: Option<SocketAddr>,
    /// The statement's first characters.
    pub what: String,
    pub started: Instant,
    pub rows: usize,
    pub bytes: usize,
    pub error: Option<String>,
    /// (partition, of how many), for one endpoint of a partitioned result.
    pub partition: Option<(u32, u32)>,
}

impl QueryLog {
    pub(crate) fn new(peer: Option<SocketAddr>, what: &str, started: Instant) -> QueryLog {
        let mut short: String = what.chars().take(80).map(|c| if c.is_control() { ' ' } else { c }).collect();
        if short.len() < what.len() {
            short.push_str("...");
        }
        QueryLog { peer, what: short, started, rows: 0, bytes: 0, error: None, partition: None }
    }

    /// Writes the line: client, statement, rows, bytes, milliseconds, and the error if any.
    pub(crate) fn write(&self) {
        let peer = self.peer.map_or_else(|| "-".to_string(), |p| p.to_string());
        let outcome = match &self.error {
            None => "ok".to_string(),
            Some(e) => format!("error: {}", e.lines().next().unwrap_or_default()),
        };
        let partition = self.partition.map_or_else(String::new, |(i, n)| format!(" partition={i}/{n}"));
        crate::service::say(&format!(
            "dlframe serve: query from {peer} {:?}{partition} rows={} bytes={} ms={} {outcome}",
            self.what,
            self.rows,
            self.bytes,
            self.started.elapsed().as_millis()
        ));
    }
}

/// A running query's stream, with its slot, its entry among the running queries and its log
/// (see [`Runner::run`]).
struct Watched<S> {
    inner: S,
    /// Why the query was ended from outside (the deadline, a cancel, the client gone), for
    /// the log line written when it is dropped.
    why: Arc<Mutex<Option<String>>>,
    runner: Arc<Runner>,
    id: QueryId,
    nonce: u64,
    _slot: OwnedSemaphorePermit,
    log: QueryLog,
    done: bool,
}

impl<S> Watched<S> {
    /// Writes the log line once, with `error` unless one is already set.
    fn finish(&mut self, error: Option<String>) {
        if !self.done {
            self.done = true;
            if self.log.error.is_none() {
                self.log.error = error;
            }
            self.log.write();
        }
    }
}

impl<S> Stream for Watched<S>
where
    S: Stream<Item = DFResult<RecordBatch>> + Unpin,
{
    type Item = Result<RecordBatch, ServeError>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<RecordBatch, ServeError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(batch))) => {
                self.log.rows += batch.num_rows();
                self.log.bytes += batch.get_array_memory_size();
                Poll::Ready(Some(Ok(batch)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e = ServeError::Query(e);
                self.finish(Some(e.to_string()));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.finish(None);
                Poll::Ready(None)
            }
        }
    }
}

impl<S> Drop for Watched<S> {
    fn drop(&mut self) {
        let mut running = self.runner.running.lock().expect("not poisoned");
        if let Some(runs) = running.get_mut(&self.id) {
            runs.retain(|(nonce, _, _)| *nonce != self.nonce);
            if runs.is_empty() {
                running.remove(&self.id);
            }
        }
        drop(running);
        let why = self.why.lock().expect("not poisoned").take();
        self.finish(Some(why.unwrap_or_else(|| "the client went away".into())));
    }
}

/// One query's memory: refuses past `limit`, and takes what it grants from the server's pool.
#[derive(Debug)]
struct QueryPool {
    server: Arc<dyn MemoryPool>,
    limit: usize,
    used: AtomicUsize,
}

impl std::fmt::Display for QueryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a query's pool of {} bytes in {}", self.limit, self.server)
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "dlframe-serve-query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::SeqCst);
        self.server.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::SeqCst);
        self.server.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DFResult<()> {
        let before = self.used.fetch_add(additional, Ordering::SeqCst);
        if before + additional > self.limit {
            self.used.fetch_sub(additional, Ordering::SeqCst);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the query needs more than its memory limit of {} MB (--query-memory); it asked for \
                 {} more bytes with {} in use",
                self.limit >> 20,
                additional,
                before
            )));
        }
        if let Err(e) = self.server.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::SeqCst);
            let over = match e.find_root() {
                DataFusionError::ResourcesExhausted(_) => DataFusionError::ResourcesExhausted(format!(
                    "the server's memory for queries is in use (--memory {} MB); try again later",
                    match self.server.memory_limit() {
                        MemoryLimit::Finite(n) => n >> 20,
                        _ => 0,
                    }
                )),
                _ => e,
            };
            return Err(over);
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryConsumer;

    #[test]
    fn a_query_pool_refuses_past_its_limit_and_the_servers() {
        let runner = Runner::new(RunLimits { memory: 1000, query_memory: 600, ..RunLimits::default() });
        let a = runner.query_pool();
        let b = runner.query_pool();
        let ra = MemoryConsumer::new("a").register(&a);
        let rb = MemoryConsumer::new("b").register(&b);
        ra.try_grow(600).unwrap();
        let e = ra.try_grow(1).unwrap_err();
        assert!(e.to_string().contains("its memory limit"), "{e}");
        rb.try_grow(400).unwrap();
        let e = rb.try_grow(1).unwrap_err();
        assert!(e.to_string().contains("server's memory"), "{e}");
        assert!(matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)));
        ra.free();
        rb.try_grow(200).unwrap();
        assert_eq!((a.reserved(), b.reserved()), (0, 600));
    }

    #[tokio::test]
    async fn a_full_queue_is_refused_and_a_slot_waits_within_the_timeout() {
        let runner = Runner::new(RunLimits {
            max_queries: 1,
            max_queued: 1,
            timeout: Duration::from_millis(200),
            ..RunLimits::default()
        });
        let held = runner.slot(Instant::now()).await.unwrap();
        let waiter = runner.slot(Instant::now());
        let second = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            runner.slot(Instant::now()).await
        };
        let (first, second) = tokio::join!(waiter, second);
        assert!(matches!(second, Err(ServeError::Busy { .. })), "{second:?}");
        assert!(matches!(first, Err(ServeError::Timeout(_))), "{first:?}");
        drop(held);
        let _again = runner.slot(Instant::now()).await.unwrap();
    }
}

//! The threads of the parallel kernels: one rayon pool per process.
//!
//! A process made by `fork` (torch's DataLoader workers, multiprocessing on Linux) inherits the
//! parent's memory but none of its threads, so rayon's global pool, once started in the parent,
//! would take the child's jobs and never run them. Each process therefore gets its own pool on
//! first use, and a child starts a new one; the parent's pool is left untouched in the child,
//! since its threads are not there to stop.

use std::sync::Mutex;

use rayon::ThreadPool;

/// The pool of the process that made it.
static POOL: Mutex<Option<(u32, &'static ThreadPool)>> = Mutex::new(None);

/// Runs `f` in this process's pool, so that the parallel iterators inside it use that pool's
/// threads. A caller already inside a rayon pool (its own, or a one-thread pool that forces one
/// thread) keeps it; `f` runs on the calling thread when no pool can be started.
pub(crate) fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    match current() {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Runs `work` as many times as this process's pool has threads, as jobs there, and once more
/// on the calling thread outside it, and returns when all are done. Unlike [`install`], which
/// hands all of it to the pool and waits, the calling thread starts at once, while the pool's
/// threads wake. Inside a rayon pool (dlframe's or the caller's) it runs as many times as that
/// pool has threads, over them, the calling one among them.
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) fn on_every_thread(work: &(impl Fn() + Sync)) {
    use rayon::prelude::*;
    if rayon::current_thread_index().is_some() {
        (0..rayon::current_num_threads()).into_par_iter().for_each(|_| work());
        return;
    }
    match current() {
        Some(pool) => pool.in_place_scope(|s| {
            for _ in 0..pool.current_num_threads() {
                s.spawn(|_| work());
            }
            work();
        }),
        None => work(),
    }
}

thread_local! {
    /// Set on the threads of dlframe's own pools when they start.
    static OWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is one of dlframe's pool threads (of this process or, in a forked
/// child, none: its parent's threads are not there).
#[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
pub(crate) fn on_own_pool() -> bool {
    OWN.with(|own| own.get())
}

/// Runs `f` on this process's pool without waiting for it (on the calling thread, at once, when
/// no pool can be started). `f` must not panic: a panic there aborts the process, as rayon does.
pub(crate) fn spawn(f: impl FnOnce() + Send + 'static) {
    match current() {
        Some(pool) => pool.spawn(f),
        None => f(),
    }
}

/// The threads of this process's pool (one where none can be started): how much work to hand
/// it at once.
#[cfg(feature = "parquet")]
pub(crate) fn threads() -> usize {
    current().map_or(1, |p| p.current_num_threads())
}

fn current() -> Option<&'static ThreadPool> {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|e| e.into_inner());
    match *slot {
        Some((owner, pool)) if owner == pid => Some(pool),
        _ => {
            let pool = rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("dlframe-kernel-{i}"))
                .start_handler(|_| OWN.with(|own| own.set(true)))
                .build()
                .ok()?;
            // Lives for the process: the kernels hand it work until exit. A parent's pool,
            // inherited by a forked child, is leaked there, as its threads do not exist.
            let pool: &'static ThreadPool = Box::leak(Box::new(pool));
            *slot = Some((pid, pool));
            Some(pool)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Mutex;

    #[test]
    fn the_work_runs_once_per_pool_thread_and_once_on_the_caller() {
        let names = Mutex::new(Vec::new());
        let me = std::thread::current().id();
        let work = || {
            let on_pool = super::on_own_pool();
            names.lock().unwrap().push((std::thread::current().id(), on_pool));
        };
        super::on_every_thread(&work);
        let outside = std::mem::take(&mut *names.lock().unwrap());
        let threads = super::install(rayon::current_num_threads);
        // Each pool thread's job and the caller's own call; the caller's runs here, not in the pool.
        assert_eq!(outside.len(), threads + 1);
        assert!(outside.iter().any(|(id, on_pool)| *id == me && !on_pool), "the caller did not take part");
        assert_eq!(outside.iter().filter(|(_, on_pool)| *on_pool).count(), threads);
        // Inside a pool it runs over that pool's threads, as many calls as it has threads.
        let own = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        own.install(|| super::on_every_thread(&work));
        let inside = names.into_inner().unwrap();
        assert_eq!(inside.len(), 3);
        assert!(inside.iter().map(|(id, _)| id).collect::<HashSet<_>>().len() <= 3);
    }

    #[test]
    fn work_runs_on_the_process_pool_and_nests() {
        use rayon::prelude::*;
        let name = || std::thread::current().name().map(str::to_owned).unwrap_or_default();
        let outer = super::install(name);
        assert!(outer.starts_with("dlframe-kernel-"), "{outer}");
        let sums: Vec<u64> =
            super::install(|| (0..64u64).into_par_iter().map(|i| super::install(|| i * 2)).collect());
        assert_eq!(sums.iter().sum::<u64>(), 64 * 63);
        // Inside a caller's pool, the caller's pool runs it.
        let own =
            rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "caller".into()).build().unwrap();
        assert_eq!(own.install(|| super::install(name)), "caller");
        // Only dlframe's own threads count as its pool.
        assert!(
            super::install(super::on_own_pool) && !own.install(super::on_own_pool) && !super::on_own_pool()
        );
    }
}

//! Host-to-device copies through page-locked staging buffers (copies). A copy from pageable
//! memory (an Arrow buffer, a numpy array) would otherwise be staged by the driver, on one
//! thread and in small steps, at about a quarter of the bandwidth of a copy from page-locked
//! memory (measured on an H100: docs/notes/benchmark-passes.md). Here a set of two page-locked buffers
//! serves one conversion at a time. The kernel threads copy the sources of the conversion into
//! one, together (a batch of eight columns is eight small pieces), in 1 MiB pieces taken in
//! order, with non-temporal stores (the CPU does not read the buffer again, the copy engine
//! does); each stretch of copied pieces at the front is queued for upload while they copy the
//! rest, and then they fill the other buffer. A buffer is written again only after the upload
//! out of it is done (an event per buffer). Each device has up to three sets, made as
//! concurrent conversions need them (batches converted ahead). Sources CUDA already knows
//! (page-locked, registered, managed) are copied straight, with no staging. A conversion on a
//! thread of a rayon pool never waits for a set: when all are held, its pageable sources go to
//! the driver as they are, since rayon would run other queued conversions on that thread while
//! it waited (`claim`). Built on `driver.rs` and `relay.rs` (the copy that uploads as it
//! goes).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::driver::{CudaEvent, sys};

use super::driver::{Gpu, Pinned, cuda_err, is_page_locked, memcpy_htod};
use super::relay::{HostCopy, relay};
use crate::error::Result;

/// Bytes of one staging buffer. Large buffers amortise the fixed cost of each fill (waking the
/// kernel threads, one upload); on an H100 32 MiB did better than 8 or 16 (docs/notes/benchmark-passes.md).
const BUFFER: usize = 32 << 20;
/// Staging buffers per device: one filled by the host while the other uploads.
const BUFFERS: usize = 2;

/// One page-locked buffer and the event recorded after the last upload queued out of it.
struct Slot {
    memory: Pinned,
    uploaded: CudaEvent,
}

/// The staging buffers of one device, and the one being filled.
struct Buffers {
    slots: Vec<Slot>,
    current: usize,
}

/// Sets of staging buffers per device at most. A conversion holds one set while it stages;
/// the caller's own conversion and the batches converted ahead (two by default) each get
/// one, instead of all but one of them going to the driver's slower staging.
const SETS: usize = 3;

/// The staging sets of one device, made on demand.
type Sets<T> = Mutex<Vec<&'static Mutex<T>>>;

/// The staging sets of `g`'s device; each is kept, once made, for the process's life.
fn sets(g: &Gpu) -> &'static Sets<Buffers> {
    static STAGING: OnceLock<Mutex<HashMap<usize, &'static Sets<Buffers>>>> = OnceLock::new();
    let mut all = STAGING.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    all.entry(g.ordinal).or_insert_with(|| Box::leak(Box::default()))
}

/// A new set of staging buffers on `g`'s device.
fn new_buffers(g: &Gpu) -> Result<Buffers> {
    let slots = (0..BUFFERS)
        .map(|_| {
            Ok(Slot {
                memory: Pinned::new(&g.ctx, BUFFER)?,
                uploaded: g
                    .ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(cuda_err)?,
            })
        })
        .collect::<Result<Vec<Slot>>>()?;
    Ok(Buffers { slots, current: 0 })
}

/// A run of host-to-device copies on `g`'s producer stream. It holds one of the device's
/// staging sets until dropped. A run on a thread of a rayon pool never waits for one: when
/// all are held, it leaves pageable sources to the driver's own staging (see [`claim`]).
pub(super) struct Uploads<'a> {
    g: &'a Gpu,
    /// None: every set was busy, and pageable sources go to the driver as they are.
    buffers: Option<MutexGuard<'static, Buffers>>,
    /// Bytes of the current buffer queued for upload in this run (0: not written yet).
    used: usize,
    /// Whether a source was page-locked memory, copied straight.
    locked: bool,
}

/// A free set of `sets`, or a new one from `make` while there are fewer than [`SETS`];
/// when all are held (or a further set cannot be made), None at once on a thread of a rayon
/// pool, and elsewhere the first set once its holder lets it go. Only a first set that cannot
/// be made is an error.
///
/// A pool thread must not block on a set. Its holder may be waiting for the pool (its copy
/// runs there), and a pool thread that waits for work of its own lets rayon run other queued
/// jobs on it meanwhile (the next batch's conversion): one that blocked there on a set its own
/// thread holds further up would never wake. A set whose holder panicked is taken as it is:
/// dropping the holder's run recorded its event, so its buffers are consistent.
fn claim<T>(sets: &Sets<T>, make: impl FnOnce() -> Result<T>) -> Result<Option<MutexGuard<'static, T>>> {
    let mut all = sets.lock().unwrap_or_else(|e| e.into_inner());
    for set in all.iter() {
        match set.try_lock() {
            Ok(guard) => return Ok(Some(guard)),
            Err(std::sync::TryLockError::Poisoned(e)) => return Ok(Some(e.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
    if all.len() < SETS {
        match make() {
            Ok(buffers) => {
                // Kept until the process exits, as the device's context is.
                let set: &'static Mutex<T> = Box::leak(Box::new(Mutex::new(buffers)));
                all.push(set);
                // No one else has seen it yet.
                return Ok(Some(set.lock().unwrap_or_else(|e| e.into_inner())));
            }
            // Page-locked memory may be short (a memlock limit): the sets there are do.
            Err(e) if all.is_empty() => return Err(e),
            Err(_) => {}
        }
    }
    if rayon::current_thread_index().is_some() {
        return Ok(None);
    }
    let first = all[0];
    drop(all);
    Ok(Some(first.lock().unwrap_or_else(|e| e.into_inner())))
}

impl<'a> Uploads<'a> {
    /// Starts a run of copies to `g`'s device; the caller has bound its context.
    pub fn new(g: &'a Gpu) -> Result<Self> {
        Ok(Uploads { g, buffers: claim(sets(g), || new_buffers(g))?, used: 0, locked: false })
    }

    /// Whether a source was page-locked memory, copied straight: it must outlive the copy, so
    /// the caller waits for the stream before the source may go.
    pub fn copied_page_locked(&self) -> bool {
        self.locked
    }

    /// Queues the copy of each `(dst, src)` to its device address on the producer stream
    /// (copies). Pageable sources are packed one after another into the staging buffers; the
    /// pieces one buffer takes are copied there together, over the kernel threads, and their
    /// uploads are queued as the copying goes ([`relay`]). A pageable source may go when this
    /// returns: its bytes are in a staging buffer.
    ///
    /// # Safety
    /// Each `dst` holds its `src.len()` writable bytes on `g`'s device, alive until the
    /// producer stream has run the copy; the destinations do not overlap.
    pub unsafe fn copy_all(&mut self, items: &[HostCopy]) -> Result<()> {
        let stream = self.g.producer();
        // The pageable pieces packed into the current buffer from byte `start` on, in order.
        let mut batch: Vec<HostCopy> = Vec::new();
        let mut start = self.used;
        for &(dst, src) in items.iter().filter(|(_, src)| !src.is_empty()) {
            // Page-locked sources go straight, and all of them when the buffers were busy.
            let locked = is_page_locked(src);
            if locked || self.buffers.is_none() {
                self.locked |= locked;
                // SAFETY: per this function's contract; the driver stages a pageable source
                // before returning, and the caller waits for the stream before a page-locked
                // one may go (`copied_page_locked`).
                unsafe { memcpy_htod(dst, src, stream) }?;
                continue;
            }
            let mut done = 0;
            while done < src.len() {
                if self.used == BUFFER {
                    self.flush(start, &batch)?;
                    batch.clear();
                    self.next()?;
                    start = 0;
                }
                let n = (BUFFER - self.used).min(src.len() - done);
                batch.push((dst + done as u64, &src[done..done + n]));
                self.used += n;
                done += n;
            }
        }
        self.flush(start, &batch)
    }

    /// Copies `batch`, packed in order from byte `start` of the current buffer, into it (on the
    /// kernel threads), queueing the uploads of its first bytes while the rest are still being
    /// copied ([`relay`]).
    fn flush(&mut self, start: usize, batch: &[HostCopy]) -> Result<()> {
        let Some(b) = self.buffers.as_deref_mut().filter(|_| !batch.is_empty()) else { return Ok(()) };
        let slot = &mut b.slots[b.current];
        if start == 0 {
            // The upload of an earlier run out of this buffer is done before it is written.
            slot.uploaded.synchronize().map_err(cuda_err)?;
        }
        let len: usize = batch.iter().map(|(_, src)| src.len()).sum();
        let (g, stream) = (self.g, self.g.producer());
        relay(
            slot.memory.bytes_mut(start..start + len),
            batch,
            || g.bind(),
            |dst, staged| {
                // SAFETY: `relay` hands over bytes of the region, copied from the sources in
                // `batch`, with their place within those sources' destinations, which hold them
                // (`copy_all`'s contract); the region is page-locked and not written again before
                // the event that `next` or `drop` records after these uploads has completed.
                unsafe { memcpy_htod(dst, staged, stream) }
            },
        )
    }

    /// Records the current buffer's event after the uploads queued out of it, and moves on to
    /// the next buffer.
    fn next(&mut self) -> Result<()> {
        let Some(b) = self.buffers.as_deref_mut() else { return Ok(()) };
        b.slots[b.current].uploaded.record(&self.g.stream).map_err(cuda_err)?;
        b.current = (b.current + 1) % b.slots.len();
        self.used = 0;
        Ok(())
    }
}

impl Drop for Uploads<'_> {
    /// Records the event of the buffer in use, so that no later run writes it before its
    /// uploads are done; if that fails, waits for the stream instead.
    fn drop(&mut self) {
        if self.used > 0 && self.next().is_err() {
            self.g.ctx.record_err(self.g.stream.synchronize());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::*;
    use crate::error::Error;

    #[test]
    fn a_pool_thread_never_waits_for_a_staging_set() {
        static SETS_OF: Sets<u32> = Mutex::new(Vec::new());
        let made = std::sync::atomic::AtomicU32::new(0);
        let make = || Ok(made.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        // Sets are made as they are needed, up to SETS, each held by one run at a time.
        let held: Vec<_> = (0..SETS).map(|_| claim(&SETS_OF, make).unwrap().unwrap()).collect();
        assert_eq!(held.iter().map(|g| **g).collect::<Vec<_>>(), (0..SETS as u32).collect::<Vec<_>>());
        // With all of them held, a run on a pool thread goes on without one at once. (Were it
        // to wait, this test would hang: bounded by the timeout below.)
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(crate::kernels::install(|| {
                (rayon::current_thread_index().is_some(), claim(&SETS_OF, || Ok(99)).map(|g| g.is_none()))
            }));
        });
        let (on_pool, busy) =
            rx.recv_timeout(Duration::from_secs(30)).expect("a pool thread waited for a staging set");
        assert!(on_pool && matches!(busy, Ok(true)), "{busy:?}");
        // Off the pool, a run waits for the first set; once one is free, any run takes it and
        // no set is made beyond SETS.
        let first = std::thread::spawn(|| claim(&SETS_OF, || Ok(99)).map(|g| *g.unwrap()));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!first.is_finished(), "a run off the pool did not wait");
        drop(held);
        assert_eq!(first.join().unwrap().unwrap(), 0);
        let free = crate::kernels::install(|| claim(&SETS_OF, || Ok(99)).map(|g| g.map(|g| *g)));
        assert!(matches!(free, Ok(Some(n)) if n < SETS as u32), "{free:?}");
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), SETS as u32);
    }

    #[test]
    fn a_set_that_cannot_be_made_or_whose_holder_panicked_does_not_fail_the_run() {
        static SOME: Sets<u32> = Mutex::new(Vec::new());
        let refused = || Err(Error::Cuda("out of page-locked memory".into()));
        // Without any set, a set that cannot be made is the run's error.
        assert!(matches!(claim(&SOME, refused), Err(Error::Cuda(_))));
        let first = claim(&SOME, || Ok(7)).unwrap().unwrap();
        // With one held and no more to be had, a pool thread goes on without one ...
        let busy = crate::kernels::install(|| claim(&SOME, refused).map(|g| g.is_none()));
        assert!(matches!(busy, Ok(true)), "{busy:?}");
        // ... and a run elsewhere waits for the first.
        let waiter = std::thread::spawn(move || claim(&SOME, refused).map(|g| *g.unwrap()));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "a run off the pool did not wait");
        drop(first);
        assert_eq!(waiter.join().unwrap().unwrap(), 7);
        // A holder that panics poisons the set; the next run takes it as it is.
        let _ = std::thread::spawn(move || {
            let _held = claim(&SOME, refused).unwrap();
            panic!("a conversion panicked while it held a staging set");
        })
        .join();
        assert!(SOME.lock().unwrap()[0].is_poisoned());
        assert_eq!(claim(&SOME, refused).unwrap().map(|g| *g), Some(7));
    }
}

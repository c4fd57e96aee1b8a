//! Host-to-device copies through page-locked staging buffers (copies). A copy from pageable
//! memory (an Arrow buffer, a numpy array) would otherwise be staged by the driver, on one
//! thread and in small steps, at about a quarter of the bandwidth of a copy from page-locked
//! memory (measured on an H100: docs/benchmarks.md). Here a set of two page-locked buffers
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
//! it waited (`claim`). Built on `driver.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::driver::{CudaEvent, sys};

use super::driver::{Gpu, Pinned, cuda_err, is_page_locked, memcpy_htod};
use crate::error::{Error, Result};

/// Bytes of one staging buffer. Large buffers amortise the fixed cost of each fill (waking the
/// kernel threads, one upload); on an H100 32 MiB did better than 8 or 16 (docs/benchmarks.md).
const BUFFER: usize = 32 << 20;
/// Staging buffers per device: one filled by the host while the other uploads.
const BUFFERS: usize = 2;
/// Fills of a buffer up to this size stay on the calling thread (waking the kernel threads
/// would cost more than the copy).
const PART: usize = 256 << 10;

/// A host-to-device copy: the device address, and the bytes that go there.
pub(super) type HostCopy<'a> = (sys::CUdeviceptr, &'a [u8]);

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

/// Pieces of this size are copied by one thread each; once the first ones are in the staging
/// buffer their upload starts while the threads copy the next. On an H200, 1 MiB took a 40 MB
/// column from 1.8x a page-locked copy to 1.7x, where 512 KiB and 2 MiB did no better than
/// copying the whole buffer before its upload (docs/benchmarks.md).
const PIECE: usize = 1 << 20;

/// One piece of a [`relay`], by its place in the staging region: to be copied (its source and
/// device address), being copied, copied (its length and device address), or queued.
enum Piece<'s> {
    Pending { at: usize, from: &'s [u8], dst: sys::CUdeviceptr },
    Copying,
    Copied { at: usize, len: usize, dst: sys::CUdeviceptr },
    Queued,
}

/// The start of a relay's staging region, shared by the threads that fill it: each piece's
/// bytes are written by the one thread that took the piece, and read (by the uploads) only
/// once it is copied.
#[derive(Clone, Copy)]
struct Region(*mut u8);

// SAFETY: the address of page-locked host memory, which any thread may write or read; `relay`
// keeps the threads to disjoint pieces (above).
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

/// Copies the sources of `batch` one after another into `region` (as long as all of them), in
/// pieces of [`PIECE`] that threads take in order, and queues the upload of each run of copied
/// pieces from the front as soon as it is complete, so that the first bytes travel while the
/// last are copied (copies). It stays on this thread when the whole is at most [`PART`] or one
/// piece, or on a thread of another rayon pool than dlframe's (whose threads would otherwise
/// be given dlframe's CUDA context). Otherwise this thread copies too, from the start, while
/// dlframe's pool threads wake and join it ([`crate::kernels::on_every_thread`]). On a thread
/// of that pool (a batch converted ahead), while this thread waits for the others, rayon may
/// run another queued conversion on it, which stages through another set or the driver and
/// never waits for this one (`claim`), but which the conversion being staged then waits for.
///
/// `upload(dst, staged)` is called for each such run, one call at a time (by whichever thread
/// is queueing: the others go on copying, [`Front::pass`]), with bytes of `region` and their
/// device address; `bind` first on each thread that takes part (it binds
/// the device's context there). The first error of either is returned, and no upload is
/// queued after it.
fn relay(
    region: &mut [u8],
    batch: &[HostCopy],
    bind: impl Fn() -> Result<()> + Sync,
    upload: impl Fn(sys::CUdeviceptr, &[u8]) -> Result<()> + Sync,
) -> Result<()> {
    let total = region.len();
    let base = Region(region.as_mut_ptr());
    let pieces: Vec<Mutex<Piece>> = cut(batch, PIECE).map(Mutex::new).collect();
    let taken = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    // The first piece not yet queued, and the first error.
    let front = Front::default();
    let work = || {
        if let Err(e) = bind() {
            front.state.lock().unwrap_or_else(|e| e.into_inner()).1.get_or_insert(e);
            failed.store(true, Ordering::Relaxed);
            return;
        }
        while !failed.load(Ordering::Relaxed) {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            let Some(piece) = pieces.get(i) else { return };
            let mut p = piece.lock().unwrap_or_else(|e| e.into_inner());
            let Piece::Pending { at, from, dst } = std::mem::replace(&mut *p, Piece::Copying) else {
                continue;
            };
            drop(p);
            // SAFETY: bytes at..at + from.len() lie within `region` (`cut` places the sources
            // one after another, and they are as long as `region` together), and only this
            // thread, which took piece i, touches them until it marks them copied.
            let to = unsafe { std::slice::from_raw_parts_mut(base.0.add(at), from.len()) };
            crate::kernels::stream_copy(to, from);
            *piece.lock().unwrap_or_else(|e| e.into_inner()) = Piece::Copied { at, len: from.len(), dst };
            if !queue_front(base, &pieces, &front, &upload) {
                failed.store(true, Ordering::Relaxed);
            }
        }
    };
    let foreign_pool = rayon::current_thread_index().is_some() && !crate::kernels::on_own_pool();
    if total <= PART || pieces.len() <= 1 || foreign_pool {
        work();
    } else {
        crate::kernels::on_every_thread(&work);
    }
    // A thread queues from the front after each piece it copies, and the one that copies the
    // last piece missing from a stretch queues that stretch: once all are done, every piece is
    // queued, unless an error stopped them.
    let (queued, error) = front.state.into_inner().unwrap_or_else(|e| e.into_inner());
    debug_assert!(error.is_some() || queued == pieces.len(), "{queued} of {} queued", pieces.len());
    error.map_or(Ok(()), Err)
}

/// Where a [`relay`] stands: the first piece not yet queued and the first error, held by one
/// thread at a time, and how many threads asked for a pass over it since the last one began.
#[derive(Default)]
struct Front {
    state: Mutex<(usize, Option<Error>)>,
    asked: AtomicUsize,
}

impl Front {
    /// Runs `pass` with the state held. A thread that finds the state held by another does not
    /// wait: its request is counted and it returns at once (true), and the holder, once done,
    /// runs its own pass again for it. (Waiting, the copying threads stood idle through each
    /// upload call of another, and a thread put to sleep on a virtual machine takes long to
    /// wake.) False when the state holds an error.
    fn pass(&self, mut pass: impl FnMut(&mut (usize, Option<Error>))) -> bool {
        self.asked.fetch_add(1, Ordering::SeqCst);
        loop {
            // With the fence after the holder's unlock below, either this thread sees the state
            // free, or the holder sees this request: never neither.
            fence(Ordering::SeqCst);
            let mut state = match self.state.try_lock() {
                Ok(state) => state,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                // The holder sees the request once its pass is done.
                Err(std::sync::TryLockError::WouldBlock) => return true,
            };
            // Requests counted before this point are served by this pass.
            self.asked.store(0, Ordering::SeqCst);
            pass(&mut state);
            let ok = state.1.is_none();
            drop(state);
            fence(Ordering::SeqCst);
            // A request made during the pass may have found the state held: another pass.
            if !ok || self.asked.load(Ordering::SeqCst) == 0 {
                return ok;
            }
        }
    }
}

/// Queues the upload of the copied pieces at the front of `pieces`, in order, each run of
/// pieces that lie next to each other both in the staging region (from `base`) and on the
/// device as one copy; stops at the first piece not copied yet. A piece marked copied before
/// this call is queued by it or by the thread queueing at the time ([`Front::pass`]). False
/// after an error (kept in `front`), when nothing more is queued.
fn queue_front(
    base: Region,
    pieces: &[Mutex<Piece>],
    front: &Front,
    upload: &impl Fn(sys::CUdeviceptr, &[u8]) -> Result<()>,
) -> bool {
    front.pass(|state| queue_copied(base, pieces, state, upload))
}

/// One pass of [`queue_front`], with its state held.
fn queue_copied(
    base: Region,
    pieces: &[Mutex<Piece>],
    front: &mut (usize, Option<Error>),
    upload: &impl Fn(sys::CUdeviceptr, &[u8]) -> Result<()>,
) {
    while front.1.is_none() && front.0 < pieces.len() {
        // The run of copied pieces from the front that continue each other: (at, len, dst).
        let mut run: Option<(usize, usize, sys::CUdeviceptr)> = None;
        let mut end = front.0;
        while let Some(piece) = pieces.get(end) {
            let mut p = piece.lock().unwrap_or_else(|e| e.into_inner());
            let Piece::Copied { at, len, dst } = *p else { break };
            run = match run {
                None => Some((at, len, dst)),
                Some((start, n, to)) if start + n == at && to + n as u64 == dst => Some((start, n + len, to)),
                Some(_) => break,
            };
            *p = Piece::Queued;
            end += 1;
        }
        let Some((at, len, dst)) = run else { break };
        // SAFETY: bytes at..at + len of the region `relay` was given, all of them copied (their
        // pieces were marked so) and none written again during the relay.
        let staged = unsafe { std::slice::from_raw_parts(base.0.add(at), len) };
        if let Err(e) = upload(dst, staged) {
            front.1 = Some(e);
        }
        front.0 = end;
    }
}

/// The sources of `batch`, placed one after another from offset 0, each cut into pieces of at
/// most `part` bytes (at least 1), with their device addresses.
fn cut<'s>(batch: &'s [HostCopy<'s>], part: usize) -> impl Iterator<Item = Piece<'s>> {
    let part = part.max(1);
    let mut next = 0;
    batch.iter().flat_map(move |&(dst, src)| {
        let start = next;
        next += src.len();
        src.chunks(part).enumerate().map(move |(k, from)| Piece::Pending {
            at: start + k * part,
            from,
            dst: dst + (k * part) as u64,
        })
    })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::*;

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

    /// Sources of the given sizes, each placed on a pretend device (a byte vector) 64 bytes after
    /// the last, except that every third one follows its predecessor directly.
    fn sources(sizes: &[usize]) -> (Vec<Vec<u8>>, Vec<u64>, usize) {
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8).collect())
            .collect();
        let mut at = 0u64;
        let dsts = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let d = at + if k % 3 == 2 { 0 } else { 64 };
                at = d + n as u64;
                d
            })
            .collect();
        (data, dsts, at as usize)
    }

    /// `relay` on dlframe's pool, with a `bind` that always succeeds.
    fn relay_on_pool(
        region: &mut [u8],
        batch: &[HostCopy],
        upload: impl Fn(sys::CUdeviceptr, &[u8]) -> Result<()> + Sync,
    ) -> Result<()> {
        crate::kernels::install(|| relay(region, batch, || Ok(()), &upload))
    }

    #[test]
    fn relay_stages_everything_and_uploads_it_in_order_to_its_place() {
        // From a pool thread and from a thread outside the pool (which copies too), with uploads
        // quick and slow (while one thread queues, the others leave it their requests).
        let cases = [vec![10, 0, 3000], vec![3 << 20, 1, PIECE, PIECE + 1, 5 << 20, 77, 2 << 20]];
        for (sizes, on_pool, slow) in
            cases.iter().flat_map(|s| [(s, true, false), (s, false, false), (s, false, true)])
        {
            let sizes = sizes.clone();
            let (data, dsts, device_len) = sources(&sizes);
            let batch: Vec<HostCopy> = dsts.iter().zip(&data).map(|(&d, v)| (d, &v[..])).collect();
            let total: usize = sizes.iter().sum();
            let mut region = vec![0u8; total];
            let base = region.as_ptr() as usize;
            let calls = Mutex::new(Vec::new());
            let upload = |dst, staged: &[u8]| {
                if slow {
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
                calls.lock().unwrap().push((staged.as_ptr() as usize - base, dst, staged.to_vec()));
                Ok(())
            };
            if on_pool {
                relay_on_pool(&mut region, &batch, upload)
            } else {
                relay(&mut region, &batch, || Ok(()), upload)
            }
            .unwrap();
            assert_eq!(region, data.concat(), "{sizes:?}: the region holds the sources in order");
            let calls = calls.into_inner().unwrap();
            let mut device = vec![0u8; device_len];
            let mut next = 0;
            for (offset, dst, bytes) in &calls {
                assert_eq!(*offset, next, "{sizes:?}: uploads go in order, each byte once");
                device[*dst as usize..*dst as usize + bytes.len()].copy_from_slice(bytes);
                next += bytes.len();
            }
            assert_eq!(next, total, "{sizes:?}");
            for ((&d, v), n) in dsts.iter().zip(&data).zip(&sizes) {
                assert_eq!(&device[d as usize..d as usize + n], &v[..], "{sizes:?}: a source in its place");
            }
        }
    }

    #[test]
    fn relay_stops_uploading_at_the_first_error_and_returns_it() {
        let (data, dsts, _) = sources(&[4 << 20, 4 << 20]);
        let batch: Vec<HostCopy> = dsts.iter().zip(&data).map(|(&d, v)| (d, &v[..])).collect();
        let mut region = vec![0u8; 8 << 20];
        let calls = AtomicUsize::new(0);
        let r = relay_on_pool(&mut region, &batch, |_, _| {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Error::Cuda("refused".into()))
        });
        assert!(matches!(r, Err(Error::Cuda(m)) if m == "refused"));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "an upload was queued after an error");
        let r = relay(&mut region, &batch, || Err(Error::Cuda("no context".into())), |_, _| Ok(()));
        assert!(matches!(r, Err(Error::Cuda(m)) if m == "no context"));
    }

    #[test]
    fn a_request_that_finds_the_front_held_gets_a_pass_from_its_holder() {
        let front = Front::default();
        let passes = AtomicUsize::new(0);
        let (inside, entered) = channel();
        let (go, wait) = channel::<()>();
        std::thread::scope(|s| {
            let (f, p) = (&front, &passes);
            let holder = s.spawn(move || {
                f.pass(|_| {
                    if p.fetch_add(1, Ordering::SeqCst) == 0 {
                        inside.send(()).unwrap();
                        wait.recv().unwrap();
                    }
                })
            });
            entered.recv().unwrap();
            // The state is held, in the middle of a pass: this returns at once, passing nothing.
            assert!(front.pass(|_| panic!("a pass while another thread held the state")));
            go.send(()).unwrap();
            assert!(holder.join().unwrap());
        });
        assert_eq!(passes.load(Ordering::SeqCst), 2, "the holder did not pass again for the request");
        // Alone, one pass; an error is reported to whoever passes next.
        let alone = AtomicUsize::new(0);
        assert!(front.pass(|_| _ = alone.fetch_add(1, Ordering::SeqCst)));
        assert_eq!(alone.load(Ordering::SeqCst), 1);
        assert!(!front.pass(|state| state.1 = Some(Error::Cuda("refused".into()))));
        assert!(!front.pass(|_| {}));
    }

    #[test]
    fn copied_pieces_go_up_as_one_copy_per_stretch_that_is_contiguous_on_both_sides() {
        // Sources 1 and 2 follow each other on the device, 0 and 1 do not: two copies, however
        // many pieces each source is cut into, and none across the gap.
        let sizes = [3 * PIECE + 5, PIECE, 2 * PIECE];
        let (data, dsts, _) = sources(&sizes);
        let batch: Vec<HostCopy> = dsts.iter().zip(&data).map(|(&d, v)| (d, &v[..])).collect();
        let mut region = vec![0u8; sizes.iter().sum()];
        let pieces: Vec<Mutex<Piece>> = cut(&batch, PIECE)
            .map(|p| match p {
                Piece::Pending { at, from, dst } => {
                    region[at..at + from.len()].copy_from_slice(from);
                    Mutex::new(Piece::Copied { at, len: from.len(), dst })
                }
                _ => unreachable!("cut makes pending pieces"),
            })
            .collect();
        assert_eq!(pieces.len(), 4 + 1 + 2);
        let front = Front::default();
        let calls = Mutex::new(Vec::new());
        let all = queue_front(Region(region.as_mut_ptr()), &pieces, &front, &|dst, bytes: &[u8]| {
            calls.lock().unwrap().push((dst, bytes.to_vec()));
            Ok(())
        });
        assert!(all);
        let calls = calls.into_inner().unwrap();
        let want = [(dsts[0], data[0].clone()), (dsts[1], [&data[1][..], &data[2][..]].concat())];
        assert!(calls == want, "{:?}", calls.iter().map(|(d, b)| (d, b.len())).collect::<Vec<_>>());
        assert_eq!(front.state.into_inner().unwrap().0, pieces.len());
    }
}

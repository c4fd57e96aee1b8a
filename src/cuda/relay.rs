//! The copy into a staging region that uploads as it goes (copies): threads take the sources
//! in pieces, in order, and each stretch of copied pieces at the front is queued for upload
//! while they copy the rest. It knows nothing of CUDA: the upload and the binding of a thread
//! to the device are the caller's closures (`staging.rs`), so the tests run it on the CPU.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

use cudarc::driver::sys;

use crate::error::{Error, Result};

/// A host-to-device copy: the device address, and the bytes that go there.
pub(super) type HostCopy<'a> = (sys::CUdeviceptr, &'a [u8]);

/// Fills of a buffer up to this size stay on the calling thread (waking the kernel threads
/// would cost more than the copy).
const PART: usize = 256 << 10;

/// Pieces of this size are copied by one thread each; once the first ones are in the staging
/// buffer their upload starts while the threads copy the next. On an H200, 1 MiB took a 40 MB
/// column from 1.8x a page-locked copy to 1.7x, where 512 KiB and 2 MiB did no better than
/// copying the whole buffer before its upload (docs/notes/benchmark-passes.md).
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
/// device address; `bind` first on each thread that takes part (it binds the device's context
/// there). The first error of either is returned, and no upload is queued after it.
pub(super) fn relay(
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
    // A thread asks for a queueing pass after each piece it copies, and a pass asked for is
    // made (by it, or by the thread queueing at the time): once all are done, every piece is
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

    use super::*;

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

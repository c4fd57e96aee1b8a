//! Host-to-device copies through page-locked staging buffers (copies). A copy from pageable
//! memory (an Arrow buffer, a numpy array) would otherwise be staged by the driver, on one
//! thread and in small steps, at about a quarter of the bandwidth of a copy from page-locked
//! memory (measured on an H100: docs/benchmarks.md). Here each device has two page-locked
//! buffers: the kernel threads copy a source into one, all at once, and its upload is queued
//! while they fill the other. A buffer is written again only after the upload out of it is
//! done (an event per buffer). Sources CUDA already knows (page-locked, registered, managed)
//! are copied straight, with no staging. Built on `driver.rs`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::driver::{CudaEvent, sys};
use rayon::prelude::*;

use super::driver::{Gpu, Pinned, cuda_err, is_page_locked, memcpy_htod};
use crate::error::{Error, Result};

/// Bytes of one staging buffer. Large buffers amortise the fixed cost of each fill (waking the
/// kernel threads, one upload); on an H100 32 MiB did better than 8 or 16 (docs/benchmarks.md).
const BUFFER: usize = 32 << 20;
/// Staging buffers per device: one filled by the host while the other uploads.
const BUFFERS: usize = 2;
/// The least each kernel thread copies into a buffer.
const PART: usize = 1 << 20;

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

/// The staging buffers of `g`'s device, allocated on first use and kept for the process's life.
fn buffers(g: &Gpu) -> Result<&'static Mutex<Buffers>> {
    static STAGING: OnceLock<Mutex<HashMap<usize, &'static Mutex<Buffers>>>> = OnceLock::new();
    let mut all = STAGING
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| Error::Cuda("staging table poisoned".into()))?;
    if let Some(b) = all.get(&g.ordinal) {
        return Ok(b);
    }
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
    // Kept until the process exits, as the device's context is.
    let b: &'static Mutex<Buffers> = Box::leak(Box::new(Mutex::new(Buffers { slots, current: 0 })));
    all.insert(g.ordinal, b);
    Ok(b)
}

/// A run of host-to-device copies on `g`'s producer stream. It holds the device's staging
/// buffers until dropped, so runs on one device take turns (they share its one stream anyway).
pub(super) struct Uploads<'a> {
    g: &'a Gpu,
    buffers: MutexGuard<'static, Buffers>,
    /// Bytes of the current buffer queued for upload in this run (0: not written yet).
    used: usize,
    /// Whether a source was page-locked memory, copied straight.
    locked: bool,
}

impl<'a> Uploads<'a> {
    /// Starts a run of copies to `g`'s device; the caller has bound its context.
    pub fn new(g: &'a Gpu) -> Result<Self> {
        let buffers = buffers(g)?.lock().map_err(|_| Error::Cuda("staging buffers poisoned".into()))?;
        Ok(Uploads { g, buffers, used: 0, locked: false })
    }

    /// Whether a source was page-locked memory, copied straight: it must outlive the copy, so
    /// the caller waits for the stream before the source may go.
    pub fn copied_page_locked(&self) -> bool {
        self.locked
    }

    /// Queues the copy of `src` to the device address `dst` on the producer stream (copies).
    /// A pageable source may go when this returns: its bytes are in a staging buffer.
    ///
    /// # Safety
    /// `dst` holds `src.len()` writable bytes on `g`'s device, alive until the producer stream
    /// has run the copy.
    pub unsafe fn copy(&mut self, dst: sys::CUdeviceptr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let stream = self.g.producer();
        if is_page_locked(src) {
            self.locked = true;
            // SAFETY: per this function's contract; the caller waits for the stream before the
            // page-locked source may go (`copied_page_locked`).
            return unsafe { memcpy_htod(dst, src, stream) };
        }
        let mut done = 0;
        while done < src.len() {
            if self.used == BUFFER {
                self.next()?;
            }
            let b = &mut *self.buffers;
            let slot = &mut b.slots[b.current];
            if self.used == 0 {
                // The upload of an earlier run out of this buffer is done before it is written.
                slot.uploaded.synchronize().map_err(cuda_err)?;
            }
            let n = (BUFFER - self.used).min(src.len() - done);
            let staged = slot.memory.bytes_mut(self.used..self.used + n);
            stage(staged, &src[done..done + n]);
            // SAFETY: `dst + done` holds n bytes (this function's contract); `staged` is
            // page-locked, and not written again before the event recorded after this upload
            // (by `next`, here or in `drop`) has completed.
            unsafe { memcpy_htod(dst + done as u64, staged, stream) }?;
            self.used += n;
            done += n;
        }
        Ok(())
    }

    /// Records the current buffer's event after the uploads queued out of it, and moves on to
    /// the next buffer.
    fn next(&mut self) -> Result<()> {
        let b = &mut *self.buffers;
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

/// Copies `src` into `staged` (as long), split evenly over the kernel threads (copies).
fn stage(staged: &mut [u8], src: &[u8]) {
    if src.len() <= PART {
        staged.copy_from_slice(src);
        return;
    }
    crate::kernels::install(|| {
        let part = src.len().div_ceil(rayon::current_num_threads()).max(PART);
        staged.par_chunks_mut(part).zip(src.par_chunks(part)).for_each(|(to, from)| to.copy_from_slice(from));
    });
}

//! The lowest CUDA layer: the device registry (one context and one producer stream per device,
//! made on first use) and every raw `sys::`/`result::` driver call of the `cuda` module, each
//! behind a function that states its contract. Nothing here owns device memory or knows about
//! tensors beyond their device; the layers above (`memory.rs`, `transfer.rs`, `launch.rs`) call
//! only these functions and cudarc's safe API.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, result, sys};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A driver error as [`Error::Cuda`].
pub(super) fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{e:?}"))
}

/// Runs CUDA work, turning a panic inside cudarc (a library that cannot be loaded, a missing
/// symbol) into [`Error::Cuda`].
pub(super) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| Error::Cuda("a CUDA call panicked".into()))?
}

/// Number of CUDA devices; 0 without a driver or a device. Never panics.
pub(super) fn device_count() -> usize {
    catch_unwind(|| {
        // SAFETY: only checks whether the driver library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
    })
    .unwrap_or(0)
}

/// One device: its ordinal, its (primary) context and dlframe's producer stream on it.
pub(super) struct Gpu {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
}

impl Gpu {
    /// Binds the device's context to the calling thread, as every raw call below needs.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(cuda_err)
    }

    /// The raw handle of the producer stream.
    pub fn producer(&self) -> usize {
        self.stream.cu_stream() as usize
    }
}

/// The registry entry of `cuda:ordinal`, made (context and stream) on first use.
///
/// # Errors
/// [`Error::Cuda`] without that device or when the driver cannot be loaded.
pub(super) fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let mut gpus =
        GPUS.get_or_init(Default::default).lock().map_err(|_| Error::Cuda("device table poisoned".into()))?;
    if let Some(g) = gpus.get(&ordinal) {
        return Ok(g.clone());
    }
    let count = device_count();
    if ordinal >= count {
        return Err(Error::Cuda(format!(
            "cuda:{ordinal} does not exist: {count} CUDA device(s) are visible"
        )));
    }
    let g = catch_unwind(|| -> Result<Gpu> {
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let stream = ctx.new_stream().map_err(cuda_err)?;
        Ok(Gpu { ordinal, ctx, stream })
    })
    .map_err(|_| Error::Cuda("the CUDA driver library could not be loaded".into()))??;
    let g = Arc::new(g);
    gpus.insert(ordinal, g.clone());
    Ok(g)
}

/// The registry entry of the CUDA device a tensor that `what` takes lives on, or why it is not
/// a CUDA tensor (checked before any device is touched).
///
/// # Errors
/// [`Error::InvalidArgument`] for a tensor not on a CUDA device; [`Error::Cuda`] without that
/// device.
pub(super) fn gpu_of(t: &Tensor, what: &str) -> Result<Arc<Gpu>> {
    match t.device() {
        Device::Cuda(id) => {
            gpu(usize::try_from(id).map_err(|_| Error::Cuda(format!("device ordinal {id}")))?)
        }
        other => Err(Error::InvalidArgument(format!("{what} takes a CUDA tensor, not one on {other}"))),
    }
}

/// Makes the work queued on `stream` wait for `event` (the host does not block).
///
/// # Safety
/// `stream` is a live stream handle (or the legacy / per-thread default stream) and `event` a
/// live event, both of the context bound to this thread.
pub(super) unsafe fn wait_event(stream: usize, event: sys::CUevent) -> Result<()> {
    // SAFETY: per this function's contract.
    unsafe {
        result::stream::wait_event(
            stream as sys::CUstream,
            event,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(cuda_err)
}

/// Makes the work queued so far on `stream` a precondition: of the work queued next on
/// `waiter` when it is given (the host does not block), otherwise of the host's next step (it
/// blocks until that work is done). The event used is created and destroyed here.
///
/// # Safety
/// `stream` and `waiter` are live stream handles (or the legacy / per-thread default stream) of
/// the context bound to this thread.
pub(super) unsafe fn fence(
    stream: usize,
    waiter: Option<usize>,
) -> std::result::Result<(), result::DriverError> {
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    // SAFETY: the streams are live per this function's contract; the event is ours, used here
    // and destroyed once (CUDA defers the release until the recorded work is done).
    unsafe {
        result::event::record(event, stream as sys::CUstream)?;
        match waiter {
            Some(w) => result::stream::wait_event(
                w as sys::CUstream,
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )?,
            None => result::event::synchronize(event)?,
        }
        result::event::destroy(event)
    }
}

/// Whether CUDA knows this host memory (page-locked, registered or managed). A copy from it
/// runs asynchronously to the host, so the source must live until the copy is done: callers
/// then wait for the stream (a copy from pageable memory returns once the driver has staged
/// it, and the source may go at once). Needs a context bound to the thread.
pub(super) fn is_page_locked(bytes: &[u8]) -> bool {
    let mut kind = 0u32;
    // SAFETY: a query that writes one unsigned int into `kind`; any address may be asked about
    // (memory CUDA does not know gives an error, not undefined behaviour).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            bytes.as_ptr() as sys::CUdeviceptr,
        )
    };
    !bytes.is_empty() && r == sys::CUresult::CUDA_SUCCESS
}

/// Queues a copy of `host.len()` bytes at device address `src` into `host` on `stream`
/// (copies, device to host); the caller waits for the stream before reading `host`.
///
/// # Safety
/// `src` holds `host.len()` readable bytes on the device of the context bound to this thread,
/// and both `src`'s memory and `host` stay alive (and `host` untouched) until the copy is done;
/// `stream` is a live stream of that context.
pub(super) unsafe fn memcpy_dtoh(host: &mut [u8], src: usize, stream: usize) -> Result<()> {
    // SAFETY: per this function's contract.
    unsafe { result::memcpy_dtoh_async(host, src as sys::CUdeviceptr, stream as sys::CUstream) }
        .map_err(cuda_err)
}

/// Page-locked host memory from `cuMemHostAlloc` (no flags), freed on drop. The staging
/// buffers of host-to-device copies (`staging.rs`); nothing else holds it.
pub(super) struct Pinned {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory with no thread affinity; access goes through `&mut self`.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` bytes of page-locked host memory in `ctx` (bound to this thread first).
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned> {
        ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: allocates `len` bytes (unset; this type hands them out only as `&mut [u8]` to
        // be written, or after writing) in the context bound above.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(cuda_err)?;
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::Cuda("cuMemHostAlloc gave null".into()))?;
        Ok(Pinned { ptr, len, ctx: ctx.clone() })
    }

    /// The bytes `range`, to be written by the host. The caller makes sure no copy still reads
    /// them (this type does not know the streams).
    pub fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(range.start <= range.end && range.end <= self.len, "{range:?} of {}", self.len);
        // SAFETY: within the allocation (checked above), borrowed mutably through `self`. The
        // bytes may be unset: callers only write them (u8 has no invalid values either way).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(range.start), range.len()) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; the owner (staging.rs) waits
        // for every copy out of it before dropping it.
        self.ctx.record_err(unsafe { result::free_host(self.ptr.as_ptr().cast()) });
    }
}

/// Queues a copy of `src` to device address `dst` on `stream` (copies, host to device). From
/// page-locked memory it runs asynchronously to the host; from pageable memory the driver
/// stages it before returning.
///
/// # Safety
/// `dst` holds `src.len()` writable bytes on the device of the context bound to this thread,
/// alive until the copy is done; `stream` is a live stream of that context; page-locked `src`
/// stays alive and unchanged until the copy is done.
pub(super) unsafe fn memcpy_htod(dst: sys::CUdeviceptr, src: &[u8], stream: usize) -> Result<()> {
    // SAFETY: per this function's contract.
    unsafe { result::memcpy_htod_async(dst, src, stream as sys::CUstream) }.map_err(cuda_err)
}

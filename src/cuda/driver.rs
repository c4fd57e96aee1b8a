//! The lowest CUDA layer: the device registry (one context and one producer stream per device,
//! made on first use) and every raw `sys::`/`result::` driver call of the `cuda` module, each
//! behind a function that states its contract. Nothing here owns device memory or knows about
//! tensors beyond their device; the layers above (`memory.rs`, `transfer.rs`, `launch.rs`) call
//! only these functions and cudarc's safe API.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, result, sys};

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

/// One device: its ordinal, its (primary) context, dlframe's producer stream on it, and the
/// memory pool its stream-ordered allocations come from (None where the device has no pools).
pub(super) struct Gpu {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pool: Option<Pool>,
}

/// A CUDA memory pool of one device, kept for the process's life (as the device's context is).
struct Pool(sys::CUmemoryPool);

// SAFETY: a pool handle is a driver object that CUDA lets any thread use.
unsafe impl Send for Pool {}
// SAFETY: as above; this type only passes the handle to the driver.
unsafe impl Sync for Pool {}

/// The most freed memory dlframe's pool of a device keeps for reuse: 1 GiB, or a sixteenth of
/// the device's memory when that is less.
const POOL_KEEPS: u64 = 1 << 30;

/// `CUmemPoolProps` as CUDA's C header lays it out: two enums, a location (an enum and a device
/// id), a Windows-only pointer, a maximum size and a reserved tail, zero for the defaults. The
/// bindings' names for the location's id differ between CUDA versions; this layout does not,
/// and the tail here is longer than any version's.
#[repr(C)]
struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32_security_attributes: *mut std::ffi::c_void,
    max_size: usize,
    reserved: [u8; 64],
}

/// A memory pool of `ctx`'s device (bound to this thread) that keeps up to [`POOL_KEEPS`] of
/// freed memory instead of handing it back to the driver at each synchronisation: the
/// device's default pool keeps none, so every output and scratch buffer was mapped afresh,
/// which on an H200 made a 40 MB upload 1.4x slower (docs/notes/benchmark-passes.md). A pool of its own
/// leaves the default pool, which other libraries in the process may use, as it is.
fn new_pool(ctx: &CudaContext) -> std::result::Result<Pool, result::DriverError> {
    let props = PoolProps {
        alloc_type: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED as u32,
        handle_types: 0,
        location_type: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32,
        location_id: ctx.cu_device(),
        win32_security_attributes: std::ptr::null_mut(),
        max_size: 0,
        reserved: [0; 64],
    };
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `props` has CUmemPoolProps' layout (above) and outlives the call, which writes the
    // new pool's handle into `pool`; the context is bound to this thread.
    unsafe { sys::cuMemPoolCreate(&mut pool, (&props as *const PoolProps).cast()) }.result()?;
    let keep = || -> std::result::Result<(), result::DriverError> {
        // SAFETY: a device of this context.
        let total = unsafe { result::device::total_mem(ctx.cu_device()) }? as u64;
        let mut keep = POOL_KEEPS.min(total / 16);
        // SAFETY: a live pool; the release threshold attribute takes a u64, read during the call.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            )
        }
        .result()
    };
    if let Err(e) = keep() {
        // SAFETY: the pool made above, with no allocations yet, destroyed once.
        let _ = unsafe { sys::cuMemPoolDestroy(pool) };
        return Err(e);
    }
    Ok(Pool(pool))
}

/// The release threshold of the pool that device memory at `ptr` came from (a test's check of
/// [`new_pool`]); an error for memory not allocated from a pool.
#[cfg(test)]
pub(super) fn pool_keeps(ptr: sys::CUdeviceptr) -> Result<u64> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut keep = 0u64;
    // SAFETY: two queries that write a pool handle and a u64 into locals; a pointer the driver
    // does not know gives an error.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut pool as *mut sys::CUmemoryPool).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ptr,
        )
        .result()
        .map_err(cuda_err)?;
        sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
        .result()
        .map_err(cuda_err)?;
    }
    Ok(keep)
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

    /// `len` bytes (at least 1) of device memory, allocated in stream order on the producer
    /// stream from the device's pool, and freed there when the slice is dropped; where the
    /// device has no pools, as cudarc allocates.
    ///
    /// # Safety
    /// The memory is not initialised: the caller writes every byte it or a consumer reads.
    pub unsafe fn alloc(&self, len: usize) -> Result<CudaSlice<u8>> {
        let len = len.max(1);
        self.bind()?;
        let Some(pool) = &self.pool else {
            // SAFETY: per this function's contract.
            return unsafe { self.stream.alloc::<u8>(len) }.map_err(cuda_err);
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a pool of this device and a live stream of its context, bound to this thread;
        // the call writes the new allocation's address into `ptr`.
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, len, pool.0, self.stream.cu_stream()) }
            .result()
            .map_err(cuda_err)?;
        // SAFETY: `ptr` holds `len` bytes of this device, allocated in stream order on this
        // stream; the slice frees it with cuMemFreeAsync on the same stream (the context has
        // stream-ordered allocation, or the device would have no pool).
        Ok(unsafe { self.stream.upgrade_device_ptr::<u8>(ptr, len) })
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
        // Without a pool of its own (no pool support, or the driver refuses one), allocations
        // go where cudarc puts them: slower, not wrong.
        let pool = if ctx.has_async_alloc() { new_pool(&ctx).ok() } else { None };
        Ok(Gpu { ordinal, ctx, stream, pool })
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
        // bytes may be unset before the host first writes them; any byte is a valid u8.
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

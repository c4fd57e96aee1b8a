//! The owners of device memory: [`DeviceMemory`] holds one tensor's bytes (allocated here, or a
//! foreign tensor adopted through DLPack), its readiness event and the consumer streams that
//! must finish before the bytes go. It is the tensor's owner and its [`DeviceSync`]. Built on
//! `driver.rs` only; the transfers and launches above hand it the memory they filled.

use std::panic::RefUnwindSafe;
use std::sync::{Arc, Mutex};

use arrow_schema::FieldRef;
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr};

use super::driver::{Gpu, cuda_err, fence, wait_event};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::{DeviceSync, Tensor};

/// What keeps the bytes of a [`DeviceMemory`] alive.
#[allow(dead_code, reason = "the fields are held for their Drop")]
enum Storage {
    /// Allocated here; freed on the producer stream, ordered after the consumers' work.
    Ours(CudaSlice<u8>),
    /// Imported through DLPack: the foreign tensor, whose deleter hands the memory back to the
    /// producer's allocator. That allocator knows nothing of our consumers' streams, so the host
    /// waits for their queued work before the deleter runs.
    Foreign(Tensor),
}

/// Device memory of one tensor, its readiness event, and the consumer streams to fence before
/// freeing it. It is the tensor's owner and its [`DeviceSync`].
struct DeviceMemory {
    gpu: Arc<Gpu>,
    storage: Mutex<Option<Storage>>,
    ready: CudaEvent,
    consumers: Mutex<Vec<usize>>,
}

// The mutexes are never held across code that can panic halfway through an update.
impl RefUnwindSafe for DeviceMemory {}

impl DeviceMemory {
    /// Records the readiness event after the work queued so far on the producer stream, and
    /// owns `storage` from now on.
    fn new(gpu: Arc<Gpu>, storage: Storage) -> Result<Arc<Self>> {
        let ready = gpu.stream.record_event(None).map_err(cuda_err)?;
        Ok(Arc::new(DeviceMemory {
            gpu,
            storage: Mutex::new(Some(storage)),
            ready,
            consumers: Mutex::new(Vec::new()),
        }))
    }
}

impl DeviceSync for DeviceMemory {
    fn wait_on(&self, stream: usize) -> Result<()> {
        self.gpu.bind()?;
        // Our own stream (a copy or a download) needs no wait: the event was recorded on it. It
        // is still remembered, so that foreign memory outlives the work queued there.
        if stream != self.gpu.producer() {
            // SAFETY: `stream` is a live stream handle of this context given by the consumer
            // (or the legacy / per-thread default stream); the event belongs to the same context,
            // bound above.
            unsafe { wait_event(stream, self.ready.cu_event()) }?;
        }
        if let Ok(mut c) = self.consumers.lock()
            && !c.contains(&stream)
        {
            c.push(stream);
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.ready.synchronize().map_err(cuda_err)
    }

    fn producer_stream(&self) -> usize {
        self.gpu.producer()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        let ctx = &self.gpu.ctx;
        ctx.record_err(ctx.bind_to_thread());
        let storage = self.storage.lock().ok().and_then(|mut s| s.take());
        let foreign = matches!(storage, Some(Storage::Foreign(_)));
        // Our memory is freed on the producer stream: first make it wait for the work consumers
        // queued on their own streams. Foreign memory goes back to an allocator that cannot see
        // those streams: the host waits for that work before the producer's deleter runs.
        let waiter = if foreign { None } else { Some(self.gpu.producer()) };
        for &stream in self.consumers.lock().map(|c| c.clone()).unwrap_or_default().iter() {
            // SAFETY: the consumer's stream handle, recorded when it waited on this tensor, and
            // our producer stream, both of this context (bound above).
            ctx.record_err(unsafe { fence(stream, waiter) });
        }
        drop(storage);
    }
}

/// Wraps memory allocated here as a device tensor that owns it (no copy), marked as copied:
/// records the readiness event after the work queued so far on the producer stream.
///
/// `slice` must hold the elements of `shape`/`strides` (C order, or the permuted C order of a
/// tensor column), all written by work already queued on the producer stream.
pub(super) fn owned_tensor(
    g: Arc<Gpu>,
    slice: CudaSlice<u8>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    dtype: DType,
    logical: Option<FieldRef>,
) -> Result<Tensor> {
    let ordinal = g.ordinal;
    let (ptr, guard) = slice.device_ptr(&g.stream);
    let ptr = ptr as usize as *mut u8;
    drop(guard);
    let memory = DeviceMemory::new(g, Storage::Ours(slice))?;
    // SAFETY: per this function's contract the slice, owned by `memory`, holds every element
    // reachable through shape and strides on cuda:ordinal.
    let t = unsafe {
        Tensor::from_raw_parts(
            ptr,
            shape,
            Some(strides),
            dtype,
            Device::Cuda(ordinal as i32),
            false,
            memory.clone(),
        )
    }?;
    Ok(t.with_copied(true).with_logical(logical).with_sync(Some(memory)))
}

/// A device tensor over the memory of `foreign`, a CUDA tensor on `g`'s device imported through
/// DLPack (no copy), that keeps `foreign` alive. When `after` names a stream, the producer
/// stream first waits for that stream's work; the readiness event is recorded after that.
///
/// # Errors
/// [`Error::Cuda`](crate::Error::Cuda) from the driver.
pub(super) fn adopted_tensor(g: Arc<Gpu>, foreign: Tensor, after: Option<usize>) -> Result<Tensor> {
    g.bind()?;
    if let Some(stream) = after {
        // SAFETY: `stream` is the legacy default stream (always valid) or the stream the
        // tensor's producer named as its current work stream on this device (live while the
        // producer's tensor is); the waiter is our producer stream, in the context bound above.
        unsafe { fence(stream, Some(g.producer())) }.map_err(cuda_err)?;
    }
    let device = foreign.device();
    let (ptr, shape, strides) =
        (foreign.data_ptr() as *mut u8, foreign.shape().to_vec(), foreign.strides().to_vec());
    let (dtype, readonly, copied, logical) =
        (foreign.dtype(), foreign.readonly(), foreign.copied(), foreign.logical().cloned());
    let memory = DeviceMemory::new(g, Storage::Foreign(foreign))?;
    // SAFETY: the view is the one the foreign tensor validated; `memory` keeps that tensor (and
    // its producer's allocation) alive for as long as this tensor or a clone lives.
    let t = unsafe {
        Tensor::from_raw_parts(ptr, shape, Some(strides), dtype, device, readonly, memory.clone())
    }?;
    Ok(t.with_copied(copied).with_readonly(readonly).with_logical(logical).with_sync(Some(memory)))
}

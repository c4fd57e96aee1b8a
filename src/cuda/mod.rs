//! CUDA devices (feature `cuda`): Arrow columns onto a GPU in one transfer and one kernel,
//! handed over with DLPack stream semantics.
//!
//! Every conversion is one plan (`plan.rs`, checked on the host with the CPU path's rules) and,
//! on the device, one of:
//!
//! | case | device work |
//! |---|---|
//! | one dtype, no nulls, no bools (chunks, lists, tensor columns) | each chunk's values copied host-to-device straight into the tensor |
//! | anything else: nulls, masks, bools, casts, list-level nulls, several columns | each chunk's raw values and validity copied host-to-device once into one scratch buffer, then one `convert` kernel writes the tensor (and its mask) |
//!
//! The kernels (`kernels.cu`) are compiled with NVRTC when a device is first used; the unit tests
//! also build them for the CPU and check them against the CPU kernels (`emulate.rs`).
//!
//! cudarc is loaded dynamically: without a driver, [`is_available`] is false (never a panic)
//! and conversions return [`Error::Cuda`]. Each device has one producer stream; uploads and
//! kernels run there, an event is recorded after them, and a consumer's stream is made to wait
//! on it ([`DeviceSync::wait_on`]); the host does not block. Device memory is freed on the
//! producer stream after the streams consumers named have finished their queued work.
//!
//! CUDA tensors imported through DLPack are adopted without a copy ([`adopt`]) and re-export
//! with the same stream semantics; [`download`] copies a device tensor to the host when asked.
//!

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, RefUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::ArrayRef;
use arrow_schema::{DataType, FieldRef};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
    result, sys,
};

use crate::arrow::{Converted, ExportOptions, NullPolicy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, HostBuffer};

use crate::tensor::{DeviceSync, Tensor, c_strides};

#[cfg(test)]
mod emulate;
mod plan;

use plan::Plan;

fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{e:?}"))
}

/// Number of CUDA devices; 0 without a driver or a device. Never panics.
pub fn device_count() -> usize {
    catch_unwind(|| {
        // SAFETY: only checks whether the driver library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return 0;
        }
        CudaContext::device_count().map(|n| n.max(0) as usize).unwrap_or(0)
    })
    .unwrap_or(0)
}

/// True when a CUDA driver and at least one device are present. Never panics.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The kernels' source (`kernels.cu`), compiled with NVRTC when a device is first used.
const KERNELS: &str = include_str!("kernels.cu");

/// One device: its context, the producer stream, and the compiled kernels.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    convert: CudaFunction,
    gather: CudaFunction,
}

fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
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
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).map_err(cuda_err)?;
        let module = ctx.load_module(ptx).map_err(cuda_err)?;
        let f = |name: &str| module.load_function(name).map_err(cuda_err);
        Ok(Gpu { convert: f("convert")?, gather: f("gather")?, ctx, stream })
    })
    .map_err(|_| Error::Cuda("the CUDA driver or NVRTC library could not be loaded".into()))??;
    let g = Arc::new(g);
    gpus.insert(ordinal, g.clone());
    Ok(g)
}

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

impl DeviceSync for DeviceMemory {
    fn wait_on(&self, stream: usize) -> Result<()> {
        self.gpu.ctx.bind_to_thread().map_err(cuda_err)?;
        // Our own stream (a copy or a download) needs no wait: the event was recorded on it. It
        // is still remembered, so that foreign memory outlives the work queued there.
        if stream != self.gpu.stream.cu_stream() as usize {
            // SAFETY: `stream` is a live stream handle of this context given by the consumer
            // (or the legacy / per-thread default stream); the event belongs to the same context.
            unsafe {
                result::stream::wait_event(
                    stream as sys::CUstream,
                    self.ready.cu_event(),
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(cuda_err)?;
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
        self.gpu.stream.cu_stream() as usize
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
        let waiter = if foreign { None } else { Some(self.gpu.stream.cu_stream()) };
        for &stream in self.consumers.lock().map(|c| c.clone()).unwrap_or_default().iter() {
            // SAFETY: the consumer's stream handle, recorded when it waited on this tensor, and
            // our producer stream, both of this context (bound above).
            ctx.record_err(unsafe { fence(stream as sys::CUstream, waiter) });
        }
        drop(storage);
    }
}

/// A column (chunked or not) as a CUDA tensor on `cuda:ordinal` (copies, to the device): the
/// raw Arrow buffers of every chunk go over in one host-to-device transfer each, and one kernel
/// writes the tensor: nulls filled, bools unpacked, cast, chunks concatenated, list cells and
/// tensor columns laid out as on the CPU. A column that needs none of that (one dtype, no nulls)
/// is copied straight into the tensor, with no kernel. Under [`NullPolicy::Mask`] the kernel
/// writes the validity mask beside the values. Same results and errors as
/// [`crate::arrow::to_tensor`] with a copy; lossy casts are checked on the host first.
///
/// # Errors
/// [`Error::Cuda`] without a device; [`Error::Nulls`] under [`NullPolicy::Error`];
/// [`Error::ValueOutOfRange`] for a fill value or a cast value that does not fit.
pub fn to_device(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
    ordinal: usize,
) -> Result<Converted> {
    run(&plan::column(field, chunks, opts)?, ordinal)
}

/// Several columns as one `(n, k)` CUDA tensor in C or F order on `cuda:ordinal` (copies, to
/// the device): each chunk's raw buffers go over once, and one kernel interleaves, casts to the
/// common (or requested) dtype and fills nulls (and writes the mask under
/// [`NullPolicy::Mask`]). Same results and errors as [`crate::arrow::columns_to_tensor`].
///
/// # Errors
/// [`Error::Cuda`] without a device; the errors of [`crate::arrow::columns_to_tensor`].
pub fn columns_to_device(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
    ordinal: usize,
) -> Result<Converted> {
    run(&plan::matrix(fields, columns, opts)?, ordinal)
}

/// Carries out a plan on `cuda:ordinal`: the output (and mask) allocated on the producer
/// stream, the values that keep their dtype copied straight into it, then (when there is more
/// to do) the rest uploaded into one scratch buffer and one `convert` launch; the scratch
/// buffer is freed on the stream after the kernel.
fn run(plan: &Plan, ordinal: usize) -> Result<Converted> {
    let g = gpu(ordinal)?;
    let item = plan.storage.itemsize();
    let (out, mask) = catch_unwind(AssertUnwindSafe(|| -> Result<(CudaSlice<u8>, Option<CudaSlice<u8>>)> {
        g.ctx.bind_to_thread().map_err(cuda_err)?;
        let s = &g.stream;
        // SAFETY: every element is written below (by the copies or by the kernel, which writes
        // each slot of each segment, and the segments cover the output) before the readiness
        // event that consumers wait on.
        let mut out = unsafe { s.alloc::<u8>((plan.len * item).max(1)) }.map_err(cuda_err)?;
        // SAFETY: as above; the kernel writes one mask byte per element it writes.
        let mut mask =
            plan.mask.then(|| unsafe { s.alloc::<u8>(plan.len.max(1)) }).transpose().map_err(cuda_err)?;
        for (at, bytes) in plan.output_copies() {
            s.memcpy_htod(bytes, &mut out.slice_mut(at..at + bytes.len())).map_err(cuda_err)?;
        }
        if plan.needs_kernel() {
            let scratch = upload_scratch(&g, plan)?;
            launch_convert(&g, plan, &mut out, mask.as_mut(), &scratch)?;
        }
        if plan.output_copies().chain(plan.uploads()).any(|(_, b)| is_page_locked(b)) {
            s.synchronize().map_err(cuda_err)?;
        }
        Ok((out, mask))
    }))
    .map_err(|_| Error::Cuda("a CUDA call panicked".into()))??;
    let values = device_tensor(
        g.clone(),
        out,
        plan.shape.clone(),
        plan.strides.clone(),
        plan.dtype,
        ordinal,
        plan.logical.clone(),
    )?;
    let mask = mask
        .map(|m| device_tensor(g, m, plan.shape.clone(), plan.strides.clone(), DType::Bool, ordinal, None))
        .transpose()?;
    Ok(Converted { values, mask })
}

/// Records the readiness event after the work queued so far and wraps the memory as a copied
/// tensor on `cuda:ordinal` that owns it.
///
/// `slice` must hold the elements of `shape`/`strides` (C order, or the permuted C order of a
/// tensor column), all written by work already queued on the producer stream.
fn device_tensor(
    g: Arc<Gpu>,
    slice: CudaSlice<u8>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    dtype: DType,
    ordinal: usize,
    logical: Option<FieldRef>,
) -> Result<Tensor> {
    let ready = g.stream.record_event(None).map_err(cuda_err)?;
    let (ptr, guard) = slice.device_ptr(&g.stream);
    let ptr = ptr as usize as *mut u8;
    drop(guard);
    let memory = Arc::new(DeviceMemory {
        gpu: g,
        storage: Mutex::new(Some(Storage::Ours(slice))),
        ready,
        consumers: Mutex::new(Vec::new()),
    });
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

/// Whether CUDA knows this host memory (page-locked, registered or managed). A copy from it
/// runs asynchronously to the host, so the source must live until the copy is done: callers
/// then wait for the stream (a copy from pageable memory returns once the driver has staged
/// it, and the source may go at once). Needs the context bound to the thread.
fn is_page_locked(bytes: &[u8]) -> bool {
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

/// The plan's scratch buffer on the device: its pieces and segment table copied host to device
/// on the producer stream.
fn upload_scratch(g: &Gpu, plan: &Plan) -> Result<CudaSlice<u8>> {
    let s = &g.stream;
    // SAFETY: the kernel reads only the placed bytes, all written by the copies below first.
    let mut scratch = unsafe { s.alloc::<u8>(plan.scratch_len()) }.map_err(cuda_err)?;
    for (at, bytes) in plan.uploads().filter(|(_, b)| !b.is_empty()) {
        s.memcpy_htod(bytes, &mut scratch.slice_mut(at..at + bytes.len())).map_err(cuda_err)?;
    }
    Ok(scratch)
}

/// One launch of `convert` over the plan's segments (queued on the producer stream).
fn launch_convert(
    g: &Gpu,
    plan: &Plan,
    out: &mut CudaSlice<u8>,
    mask: Option<&mut CudaSlice<u8>>,
    scratch: &CudaSlice<u8>,
) -> Result<()> {
    let (segs, table_at) = plan.segments();
    let rows = segs.iter().map(|g| g.rows).max().unwrap_or(0);
    // Blocks along y take segments, along x slots; both loops stride over the grid, so about
    // 2^18 blocks in all are enough, however skewed the segments are.
    let gy = segs.len().clamp(1, 65535) as u64;
    let gx = rows.div_ceil(256).clamp(1, ((1 << 18) / gy).max(1));
    let cfg =
        LaunchConfig { grid_dim: (gx as u32, gy as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let table = scratch.slice(table_at..);
    let item = plan.storage.itemsize() as u64;
    let (nseg, out_dt, fill, no_mask) = (segs.len() as u64, plan::code(plan.storage), plan.fill, 0u64);
    let mut b = g.stream.launch_builder(&g.convert);
    b.arg(out);
    match mask {
        Some(m) => b.arg(m),
        None => b.arg(&no_mask),
    };
    b.arg(scratch).arg(&table).arg(&nseg).arg(&out_dt).arg(&item).arg(&fill);
    // SAFETY: the arguments match convert's signature in kernels.cu (four pointers, a null mask
    // as 0, then u64s). The plan's segments write elements out + i * stride below plan.len,
    // for which `out` (and `mask`) were allocated, and read only bytes placed in `scratch`.
    unsafe { b.launch(cfg) }.map_err(cuda_err)?;
    Ok(())
}

/// A C-contiguous host tensor copied to `cuda:ordinal` in one host-to-device transfer on the
/// producer stream (copies, to the device). From page-locked or managed memory the host waits
/// for the transfer, so the source may be freed on return. Used for results made on the CPU first, such as a
/// multi-column matrix.
///
/// # Errors
/// [`Error::Cuda`] without a device; [`Error::CopyRequired`] for strided or device input.
pub fn upload(t: &Tensor, ordinal: usize) -> Result<Tensor> {
    t.check_host_contiguous()?;
    let g = gpu(ordinal)?;
    let bytes: &[u8] = if t.numel() == 0 {
        &[]
    } else {
        // SAFETY: a host-readable, C-contiguous tensor (checked above) of nbytes bytes, alive
        // for this call through `t`.
        unsafe { std::slice::from_raw_parts(t.data_ptr(), t.nbytes()) }
    };
    let slice = catch_unwind(AssertUnwindSafe(|| -> Result<CudaSlice<u8>> {
        g.ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: every byte is written by the copy below before the readiness event.
        let mut out = unsafe { g.stream.alloc::<u8>(bytes.len().max(1)) }.map_err(cuda_err)?;
        if !bytes.is_empty() {
            let mut dst = out.slice_mut(..bytes.len());
            g.stream.memcpy_htod(bytes, &mut dst).map_err(cuda_err)?;
            if is_page_locked(bytes) {
                g.stream.synchronize().map_err(cuda_err)?;
            }
        }
        Ok(out)
    }))
    .map_err(|_| Error::Cuda("a CUDA call panicked".into()))??;
    device_tensor(
        g,
        slice,
        t.shape().to_vec(),
        c_strides(t.shape()),
        t.dtype(),
        ordinal,
        t.logical().cloned(),
    )
}

/// Makes the work queued so far on `stream` a precondition: of the work queued next on
/// `waiter` when it is given (the host does not block), otherwise of the host's next step (it
/// blocks until that work is done). The event used is created and destroyed here.
///
/// # Safety
/// `stream` and `waiter` are live stream handles (or the legacy / per-thread default stream) of
/// the context bound to this thread.
unsafe fn fence(
    stream: sys::CUstream,
    waiter: Option<sys::CUstream>,
) -> std::result::Result<(), result::DriverError> {
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
    // SAFETY: the streams are live per this function's contract; the event is ours, used here
    // and destroyed once (CUDA defers the release until the recorded work is done).
    unsafe {
        result::event::record(event, stream)?;
        match waiter {
            Some(w) => result::stream::wait_event(w, event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)?,
            None => result::event::synchronize(event)?,
        }
        result::event::destroy(event)
    }
}

/// The CUDA ordinal of a tensor that `what` takes, or why it is not a CUDA tensor.
fn cuda_id(t: &Tensor, what: &str) -> Result<i32> {
    match t.device() {
        Device::Cuda(id) => Ok(id),
        other => Err(Error::InvalidArgument(format!("{what} takes a CUDA tensor, not one on {other}"))),
    }
}

fn cuda_ordinal(id: i32) -> Result<usize> {
    usize::try_from(id).map_err(|_| Error::Cuda(format!("device ordinal {id}")))
}

/// The raw handle of dlframe's producer stream on `cuda:ordinal`. An importer passes it as
/// `__dlpack__(stream=...)`, so that the producer orders its pending work before ours.
///
/// # Errors
/// [`Error::Cuda`] without that device.
pub fn stream_handle(ordinal: usize) -> Result<usize> {
    Ok(gpu(ordinal)?.stream.cu_stream() as usize)
}

/// Adopts a CUDA tensor imported through DLPack (without copying): the result is a device
/// tensor that keeps `foreign` (and so the producer's memory) alive, and that re-exports with
/// our stream semantics, so torch -> dlframe -> cupy shares one allocation.
///
/// The producer must have been asked for the tensor with `stream=`[`stream_handle`]`(ordinal)`:
/// its pending work is then ordered before our stream, where the readiness event that
/// consumers wait on is recorded now. When the last reference drops, the host waits for the
/// work that our consumers queued on their streams, and then the producer's deleter runs.
///
/// # Errors
/// [`Error::InvalidArgument`] when `foreign` is not on a CUDA device; [`Error::Cuda`] without
/// that device.
pub fn adopt(foreign: Tensor) -> Result<Tensor> {
    adopt_after(foreign, None)
}

/// [`adopt`] for a tensor whose producer was not handed our stream, such as a raw capsule:
/// DLPack then promises the data on the legacy default stream, so our stream first waits for
/// that stream's work (without blocking the host).
///
/// # Errors
/// As [`adopt`].
pub fn adopt_legacy(foreign: Tensor) -> Result<Tensor> {
    adopt_after(foreign, Some(1))
}

fn adopt_after(foreign: Tensor, after: Option<usize>) -> Result<Tensor> {
    let id = cuda_id(&foreign, "adopt")?;
    let g = gpu(cuda_ordinal(id)?)?;
    g.ctx.bind_to_thread().map_err(cuda_err)?;
    if let Some(stream) = after {
        // SAFETY: `stream` is the legacy default stream (always valid) and the waiter our
        // producer stream, in the context bound above.
        unsafe { fence(stream as sys::CUstream, Some(g.stream.cu_stream())) }.map_err(cuda_err)?;
    }
    let ready = g.stream.record_event(None).map_err(cuda_err)?;
    let (ptr, shape, strides) =
        (foreign.data_ptr() as *mut u8, foreign.shape().to_vec(), foreign.strides().to_vec());
    let (dtype, readonly, copied, logical) =
        (foreign.dtype(), foreign.readonly(), foreign.copied(), foreign.logical().cloned());
    let memory = Arc::new(DeviceMemory {
        gpu: g,
        storage: Mutex::new(Some(Storage::Foreign(foreign))),
        ready,
        consumers: Mutex::new(Vec::new()),
    });
    // SAFETY: the view is the one the foreign tensor validated; `memory` keeps that tensor (and
    // its producer's allocation) alive for as long as this tensor or a clone lives.
    let t = unsafe {
        Tensor::from_raw_parts(ptr, shape, Some(strides), dtype, Device::Cuda(id), readonly, memory.clone())
    }?;
    Ok(t.with_copied(copied).with_readonly(readonly).with_logical(logical).with_sync(Some(memory)))
}

/// A host copy of a CUDA tensor (copies, device to host): our stream waits for the tensor's
/// readiness event, a strided tensor is first gathered into C order on the device
/// ([`device_copy`]), one device-to-host transfer runs, and the host waits for that transfer
/// (the copy is what was asked for). The result is a C-contiguous CPU tensor.
///
/// # Errors
/// [`Error::InvalidArgument`] for a tensor not on a CUDA device; [`Error::Cuda`] from the driver.
pub fn download(t: &Tensor) -> Result<Tensor> {
    let id = cuda_id(t, "download")?;
    if t.numel() > 0 && !t.is_c_contiguous() {
        return download(&device_copy(t)?);
    }
    let g = gpu(cuda_ordinal(id)?)?;
    // Every byte is written by the transfer below.
    let mut host = HostBuffer::for_overwrite(t.nbytes())?;
    if t.nbytes() > 0 {
        catch_unwind(AssertUnwindSafe(|| -> Result<()> {
            g.ctx.bind_to_thread().map_err(cuda_err)?;
            let stream = g.stream.cu_stream() as usize;
            if let Some(sync) = t.sync() {
                sync.wait_on(stream)?;
            }
            // SAFETY: the tensor holds nbytes contiguous bytes at data_ptr on this device (C order,
            // checked above), alive through `t` until the synchronize below; `host` has nbytes.
            unsafe {
                result::memcpy_dtoh_async(
                    host.as_mut_slice(),
                    t.data_ptr() as sys::CUdeviceptr,
                    stream as sys::CUstream,
                )
            }
            .map_err(cuda_err)?;
            g.stream.synchronize().map_err(cuda_err)
        }))
        .map_err(|_| Error::Cuda("a CUDA call panicked".into()))??;
    }
    Ok(Tensor::from_buffer(host.into_buffer(), 0, t.shape().to_vec(), None, t.dtype())?
        .with_copied(true)
        .with_logical(t.logical().cloned()))
}

/// A C-contiguous copy of a CUDA tensor on its device (copies, device to device): one `gather`
/// kernel on our stream, after the tensor's readiness event, reads any strides (negative and
/// zero included) into fresh memory. The host does not block (unless the tensor has no
/// readiness hook, when it waits for the kernel); the copy has its own readiness event, and the
/// source stays alive until the kernel has read it.
///
/// # Errors
/// [`Error::InvalidArgument`] for a tensor not on a CUDA device; [`Error::Misaligned`] for data
/// not aligned to its element size; [`Error::Cuda`] from the driver.
pub fn device_copy(t: &Tensor) -> Result<Tensor> {
    let id = cuda_id(t, "device_copy")?;
    let ordinal = cuda_ordinal(id)?;
    let g = gpu(ordinal)?;
    let item = t.dtype().itemsize();
    let out = catch_unwind(AssertUnwindSafe(|| -> Result<CudaSlice<u8>> {
        g.ctx.bind_to_thread().map_err(cuda_err)?;
        let s = &g.stream;
        if let Some(sync) = t.sync() {
            sync.wait_on(s.cu_stream() as usize)?;
        }
        // SAFETY: the gather below writes each of the numel elements.
        let mut out = unsafe { s.alloc::<u8>(t.nbytes().max(1)) }.map_err(cuda_err)?;
        if t.numel() == 0 {
            return Ok(out);
        }
        if t.data_ptr() as usize % item != 0 {
            return Err(Error::Misaligned { ptr: t.data_ptr() as usize, align: item });
        }
        let dims: Vec<i64> = t.shape().iter().chain(t.strides()).copied().collect();
        let dims = s.clone_htod(&dims).map_err(cuda_err)?;
        let (src, ndim, n, item) = (t.data_ptr() as u64, t.ndim() as u64, t.numel() as u64, item as u64);
        let mut b = s.launch_builder(&g.gather);
        b.arg(&mut out).arg(&src).arg(&dims).arg(&ndim).arg(&n).arg(&item);
        let blocks = n.div_ceil(256).min(1 << 20) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match gather's signature in kernels.cu; `src` is the tensor's
        // element 0 on this device and every element the view reaches lies in its allocation
        // (the Tensor's layout invariant) and is aligned (checked above); `out` holds n
        // elements. The tensor's owner waited on our stream above (or, without a hook, the host
        // waits below), so its memory outlives the kernel.
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
        if t.sync().is_none() {
            // Nothing tells the source's owner about our stream: wait before it can go.
            s.synchronize().map_err(cuda_err)?;
        }
        Ok(out)
    }))
    .map_err(|_| Error::Cuda("a CUDA call panicked".into()))??;
    device_tensor(g, out, t.shape().to_vec(), c_strides(t.shape()), t.dtype(), ordinal, t.logical().cloned())
}

/// Device times in milliseconds (best of `reps`, CUDA events on our stream, on `cuda:ordinal`)
/// of the `convert` kernel in its two modes over the same `4 n` bytes of f32, every tenth value
/// null and filled with 0, against a device-to-device copy of those bytes:
/// `(in_place, full, copy)`. `in_place` is what [`to_device`] runs after copying a column's
/// values into the tensor (reads the validity, writes the null slots); `full` reads every value
/// from the scratch buffer and writes every element, as for a cast or an interleave (here 8
/// columns of `n / 8` rows into a C-order matrix). What `benches/gpu.py` reports for the
/// kernel-bandwidth target; it allocates about `12 n` bytes of device memory.
///
/// # Errors
/// [`Error::Cuda`] without a device, or when `n` is below 8.
pub fn kernel_timing(ordinal: usize, n: usize, reps: usize) -> Result<(f64, f64, f64)> {
    if n < 8 {
        return Err(Error::Cuda("n must be at least 8".into()));
    }
    let n = n / 8 * 8;
    let column = |rows: usize, from: usize| -> ArrayRef {
        Arc::new(
            (from..from + rows)
                .map(|i| (i % 10 != 0).then_some(i as f32))
                .collect::<arrow_array::Float32Array>(),
        )
    };
    let field =
        |name: String| -> FieldRef { Arc::new(arrow_schema::Field::new(name, DataType::Float32, true)) };
    let opts = ExportOptions { nulls: NullPolicy::Fill(kernels::Scalar::Int(0)), ..Default::default() };
    let in_place = plan::column(&field("x".into()), &[column(n, 0)], &opts)?;
    let rows = n / 8;
    let fields: Vec<FieldRef> = (0..8).map(|j| field(format!("c{j}"))).collect();
    let columns: Vec<Vec<ArrayRef>> = (0..8).map(|j| vec![column(rows, j * rows)]).collect();
    let full = plan::matrix(&fields, &columns, &opts)?;
    let g = gpu(ordinal)?;
    catch_unwind(AssertUnwindSafe(|| -> Result<(f64, f64, f64)> {
        let s = &g.stream;
        let (scratch_in_place, scratch_full) = (upload_scratch(&g, &in_place)?, upload_scratch(&g, &full)?);
        let mut a = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let mut b = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut best = [f64::INFINITY; 3];
        for _ in 0..=reps {
            let e0 = s.record_event(timing).map_err(cuda_err)?;
            launch_convert(&g, &in_place, &mut a, None, &scratch_in_place)?;
            let e1 = s.record_event(timing).map_err(cuda_err)?;
            launch_convert(&g, &full, &mut a, None, &scratch_full)?;
            let e2 = s.record_event(timing).map_err(cuda_err)?;
            s.memcpy_dtod(&a, &mut b).map_err(cuda_err)?;
            let e3 = s.record_event(timing).map_err(cuda_err)?;
            for (i, (x, y)) in [(&e0, &e1), (&e1, &e2), (&e2, &e3)].into_iter().enumerate() {
                best[i] = best[i].min(f64::from(x.elapsed_ms(y).map_err(cuda_err)?));
            }
        }
        Ok((best[0], best[1], best[2]))
    }))
    .map_err(|_| Error::Cuda("a CUDA call panicked".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_compiles_the_kernels_without_a_device() {
        // Set to 1, lets this test skip without NVRTC; without it a missing NVRTC fails it, so
        // that a CI run that lost the library does not pass vacuously.
        const ALLOW_SKIP: &str = "DLFRAME_ALLOW_SKIP_NVRTC";
        // SAFETY: only checks whether the NVRTC library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            let why = "NVRTC (libnvrtc.so) is not on the library path; scripts/test.sh puts the one \
                       from PyPI's nvidia-cuda-nvrtc-cu12 there";
            assert!(
                std::env::var_os(ALLOW_SKIP).is_some_and(|v| v == "1"),
                "{why}; set {ALLOW_SKIP}=1 to skip this test"
            );
            eprintln!("skipped ({ALLOW_SKIP}=1): {why}");
            return;
        }
        // What `gpu` compiles when a device is first used; NVRTC needs no device or driver.
        let ptx =
            cudarc::nvrtc::compile_ptx(KERNELS).unwrap_or_else(|e| panic!("NVRTC rejects kernels.cu: {e:?}"));
        let src = ptx.to_src();
        for kernel in ["convert", "gather"] {
            assert!(src.contains(&format!(".entry {kernel}(")), "no entry point {kernel} in the PTX");
        }
        eprintln!("nvrtc: 1 case ran: kernels.cu compiled to {} bytes of PTX, 2 entry points", src.len());
    }

    #[test]
    fn probing_never_panics_and_says_why_when_there_is_no_device() {
        let n = device_count();
        if n == 0 {
            eprintln!(
                "skipped: no CUDA driver or device on this machine (dlframe::cuda::device_count() == 0)"
            );
            let col: ArrayRef = Arc::new(arrow_array::Float32Array::from(vec![1.0]));
            let f: FieldRef = Arc::new(arrow_schema::Field::new("x", DataType::Float32, false));
            let e = to_device(&f, &[col], &ExportOptions::default(), 0).unwrap_err();
            assert!(matches!(e, Error::Cuda(_)), "{e}");
            return;
        }
        assert!(is_available());
    }

    #[test]
    fn adopt_and_download_refuse_host_tensors_before_touching_a_device() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0], vec![2]).unwrap();
        for e in [adopt(t.clone()).unwrap_err(), download(&t).unwrap_err()] {
            assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("cpu"), "{e}");
        }
        if device_count() == 0 {
            eprintln!("skipped (device half): no CUDA driver or device on this machine");
            assert!(matches!(stream_handle(0).unwrap_err(), Error::Cuda(_)));
            assert!(matches!(kernel_timing(0, 1000, 1).unwrap_err(), Error::Cuda(_)));
            return;
        }
        let up = upload(&Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], vec![2, 3]).unwrap(), 0).unwrap();
        let back = download(&up).unwrap();
        assert_eq!(back.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
        assert!(back.copied() && back.device() == Device::Cpu && back.shape() == [2, 3]);
        // A foreign view of our own device memory, adopted: same pointer, and the download
        // still reads it after the original is gone.
        let adopted = adopt(up.clone()).unwrap();
        assert_eq!(adopted.data_ptr(), up.data_ptr());
        drop(up);
        assert_eq!(download(&adopted).unwrap().as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
        // SAFETY: a transposed view of the same 6 elements, kept alive by the same owner.
        let transposed = unsafe {
            Tensor::from_raw_parts(
                adopted.data_ptr() as *mut u8,
                vec![3, 2],
                Some(vec![1, 3]),
                DType::Int32,
                adopted.device(),
                false,
                adopted.owner().clone(),
            )
        }
        .unwrap();
        // Strided device tensors are gathered into C order on the device first.
        let transposed = transposed.with_sync(adopted.sync().cloned());
        let t = download(&transposed).unwrap();
        assert_eq!((t.shape(), t.as_slice::<i32>().unwrap()), (&[3i64, 2][..], &[1, 4, 2, 5, 3, 6][..]));
        let c = device_copy(&transposed).unwrap();
        assert!(c.is_c_contiguous() && c.device() == Device::Cuda(0) && c.data_ptr() != adopted.data_ptr());
    }
}

//! CUDA devices (feature `cuda`): Arrow columns onto a GPU in one transfer and one kernel,
//! handed over with DLPack stream semantics.
//!
//! | host analogue | here |
//! |---|---|
//! | `kernels::fill_nulls` into a fresh buffer | raw values copied host-to-device straight into the tensor, the validity once, then one kernel writes the fill value over the null slots |
//! | a plain copy (no nulls) | one host-to-device copy straight into the tensor |
//! | `kernels::unpack_bits_fill` | bits and validity copied once, one unpack kernel |
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
//! Not yet here: casts, masks and list-level nulls on the device (they are refused with the
//! remedy), several columns into one matrix (stacked on the CPU, then one transfer).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, RefUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, FieldRef};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
    result, sys,
};

use crate::arrow::policy::{
    cell_layout, fill_for, leaf_dtype, leaf_of, lists_as_fixed_chunks, nested_null_count,
};
use crate::arrow::{ExportOptions, NullPolicy};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, HostBuffer};
use crate::tensor::{DeviceSync, Tensor, c_strides};

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

const KERNELS: &str = r#"
#define FILL(NAME, T) \
extern "C" __global__ void NAME(T* out, const unsigned char* valid, \
        unsigned long long voff, unsigned long long n, T fill) { \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; \
         i += (unsigned long long)gridDim.x * blockDim.x) { \
        unsigned long long b = voff + i; \
        if (!((valid[b >> 3] >> (b & 7)) & 1)) out[i] = fill; \
    } \
}
FILL(fill_1, unsigned char)
FILL(fill_2, unsigned short)
FILL(fill_4, unsigned int)
FILL(fill_8, unsigned long long)

extern "C" __global__ void unpack_bits(unsigned char* out, const unsigned char* bits, unsigned long long boff,
        const unsigned char* valid, unsigned long long voff, int has_valid, unsigned long long n, unsigned char fill) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long b = boff + i, v = voff + i;
        bool ok = !has_valid || ((valid[v >> 3] >> (v & 7)) & 1);
        out[i] = ok ? ((bits[b >> 3] >> (b & 7)) & 1) : fill;
    }
}
"#;

/// One device: its context, the producer stream, and the compiled kernels.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    fill: [CudaFunction; 4],
    unpack: CudaFunction,
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
        Ok(Gpu {
            fill: [f("fill_1")?, f("fill_2")?, f("fill_4")?, f("fill_8")?],
            unpack: f("unpack_bits")?,
            ctx,
            stream,
        })
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
        if stream == self.gpu.stream.cu_stream() as usize {
            // Our own stream (a download): the event was recorded on it, so it is ordered.
            return Ok(());
        }
        self.gpu.ctx.bind_to_thread().map_err(cuda_err)?;
        // SAFETY: `stream` is a live stream handle of this context given by the consumer (or
        // the legacy / per-thread default stream); the event belongs to the same context.
        unsafe {
            result::stream::wait_event(
                stream as sys::CUstream,
                self.ready.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(cuda_err)?;
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

/// A column (chunked or not) as a CUDA tensor on `cuda:ordinal`: one host-to-device transfer
/// of the raw Arrow buffers per chunk, then one kernel for null fill or bool unpacking (copies,
/// to the device).
///
/// # Errors
/// [`Error::Cuda`] without a device; [`Error::Nulls`] under [`NullPolicy::Error`]; an
/// [`Error::InvalidArgument`] naming the remedy for what the device path does not do yet
/// (casts, masks, list-level nulls).
pub fn to_device(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
    ordinal: usize,
) -> Result<Tensor> {
    if matches!(field.data_type(), DataType::List(_) | DataType::LargeList(_)) {
        let (field, chunks) = lists_as_fixed_chunks(field, chunks)?;
        return to_device(&field, &chunks, opts, ordinal);
    }
    let null_count: usize = chunks.iter().map(|c| nested_null_count(c.as_ref())).sum();
    if null_count > 0 && opts.nulls == NullPolicy::Error {
        return Err(Error::Nulls { column: format!("'{}'", field.name()), null_count });
    }
    if null_count > 0 && opts.nulls == NullPolicy::Mask {
        return Err(Error::InvalidArgument(
            "nulls='mask' is not supported on a device yet; pass nulls='fill' or convert on the CPU".into(),
        ));
    }
    let dtype = leaf_dtype(field)?;
    if opts.dtype.is_some_and(|d| d != dtype) {
        return Err(Error::InvalidArgument(format!(
            "casts on the device are not supported yet; cast column '{}' in Arrow first",
            field.name()
        )));
    }
    if opts.nulls == NullPolicy::Nan && !dtype.is_float() {
        return Err(Error::InvalidArgument(format!(
            "nulls='nan' needs a float dtype but the column is {dtype}"
        )));
    }
    let (cell, cell_strides) = cell_layout(field)?;
    let cell_size: usize = cell.iter().map(|&d| d as usize).product();
    let n: usize = chunks.iter().map(|c| c.len()).sum();
    let mut shape = vec![n as i64];
    shape.extend(&cell);
    let strides = match cell_strides {
        Some(s) => std::iter::once(cell_size as i64).chain(s).collect(),
        None => c_strides(&shape),
    };
    let fill = fill_bytes(dtype, opts.nulls)?;
    let g = gpu(ordinal)?;
    let item = dtype.itemsize();
    let total = n * cell_size;
    let upload = catch_unwind(AssertUnwindSafe(|| -> Result<CudaSlice<u8>> {
        let s = &g.stream;
        // SAFETY: every byte is written below (by a copy or a kernel) before the event that
        // consumers wait on.
        let mut out = unsafe { s.alloc::<u8>((total * item).max(1)) }.map_err(cuda_err)?;
        let mut pos = 0usize;
        for chunk in chunks {
            let (leaf, list_nulls) = leaf_of(chunk.as_ref());
            if !list_nulls.is_empty() {
                return Err(Error::InvalidArgument(
                    "list-level nulls are not supported on a device yet; fill them on the CPU first".into(),
                ));
            }
            let slots = chunk.len() * cell_size;
            if slots == 0 {
                continue;
            }
            let data = leaf.to_data();
            let (off, len) = (data.offset(), data.len());
            let validity = data.nulls().filter(|v| v.null_count() > 0).map(|v| {
                let first = v.offset() / 8;
                let last = (v.offset() + v.len()).div_ceil(8);
                (&v.validity()[first..last], (v.offset() % 8) as u64)
            });
            let mut dst = out.slice_mut(pos * item..(pos + slots) * item);
            if dtype == DType::Bool {
                let bits = &data.buffers()[0].as_slice()[off / 8..(off + len).div_ceil(8)];
                let d_bits = s.clone_htod(bits).map_err(cuda_err)?;
                let (vb, voff) = validity.unwrap_or((&[0u8][..], 0));
                let d_valid = s.clone_htod(vb).map_err(cuda_err)?;
                let has = validity.is_some() as i32;
                let (boff, n64, f) = ((off % 8) as u64, slots as u64, fill[0]);
                let mut b = s.launch_builder(&g.unpack);
                b.arg(&mut dst).arg(&d_bits).arg(&boff).arg(&d_valid).arg(&voff).arg(&has).arg(&n64).arg(&f);
                // SAFETY: the argument list matches unpack_bits's signature, and every index the
                // kernel reads or writes is below n (bits and validity cover their offsets + n).
                unsafe { b.launch(LaunchConfig::for_num_elems(slots as u32)) }.map_err(cuda_err)?;
            } else {
                // The values go straight into the tensor; the kernel then writes the fill value
                // over the null slots only, in place.
                let bytes = &data.buffers()[0].as_slice()[off * item..(off + len) * item];
                s.memcpy_htod(bytes, &mut dst).map_err(cuda_err)?;
                if let Some((vb, voff)) = validity {
                    let d_valid = s.clone_htod(vb).map_err(cuda_err)?;
                    launch_fill(&g, item, &mut dst, &d_valid, voff, slots as u64, &fill)?;
                }
            }
            pos += slots;
        }
        Ok(out)
    }))
    .map_err(|_| Error::Cuda("a CUDA call panicked".into()))??;
    device_tensor(g, upload, shape, strides, dtype, ordinal, Some(field.clone()))
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

fn launch_fill(
    g: &Gpu,
    item: usize,
    dst: &mut cudarc::driver::CudaViewMut<'_, u8>,
    valid: &CudaSlice<u8>,
    voff: u64,
    n: u64,
    fill: &[u8; 8],
) -> Result<()> {
    let f = &g.fill[item.trailing_zeros() as usize];
    let mut b = g.stream.launch_builder(f);
    b.arg(dst).arg(valid).arg(&voff).arg(&n);
    let (f1, f2, f4, f8) = (
        fill[0],
        u16::from_le_bytes([fill[0], fill[1]]),
        u32::from_le_bytes(fill[..4].try_into().expect("4 bytes")),
        u64::from_le_bytes(*fill),
    );
    match item {
        1 => b.arg(&f1),
        2 => b.arg(&f2),
        4 => b.arg(&f4),
        _ => b.arg(&f8),
    };
    // SAFETY: the arguments match fill_<item>'s signature; n elements of `item` bytes are
    // writable in `dst`, and the validity covers bits voff..voff + n.
    unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }.map_err(cuda_err)?;
    Ok(())
}

/// The fill value's bytes in `dtype` (little-endian, zero-padded), range-checked.
fn fill_bytes(dtype: DType, nulls: NullPolicy) -> Result<[u8; 8]> {
    let mut out = [0u8; 8];
    let item = dtype.itemsize();
    if dtype == DType::Bool {
        out[0] = matches!(fill_for(nulls), Some(kernels::Scalar::Bool(true) | kernels::Scalar::Int(1))) as u8;
        return Ok(out);
    }
    let mut buf = HostBuffer::zeroed(item)?;
    kernels::fill_range(dtype, fill_for(nulls), &mut buf, 0..1)?;
    out[..item].copy_from_slice(buf.as_mut_slice());
    Ok(out)
}

/// A C-contiguous host tensor copied to `cuda:ordinal` in one host-to-device transfer on the
/// producer stream (copies, to the device). Used for results made on the CPU first, such as a
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
        // SAFETY: every byte is written by the copy below before the readiness event.
        let mut out = unsafe { g.stream.alloc::<u8>(bytes.len().max(1)) }.map_err(cuda_err)?;
        if !bytes.is_empty() {
            let mut dst = out.slice_mut(..bytes.len());
            g.stream.memcpy_htod(bytes, &mut dst).map_err(cuda_err)?;
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

/// A host copy of a C-contiguous CUDA tensor (copies, device to host): our stream waits for
/// the tensor's readiness event, one device-to-host transfer runs on it, and the host waits for
/// that transfer (the copy is what was asked for). The result is a read-only CPU tensor.
///
/// # Errors
/// [`Error::InvalidArgument`] for a tensor not on a CUDA device; [`Error::CopyRequired`] for a
/// strided one (make it contiguous on the device first); [`Error::Cuda`] from the driver.
pub fn download(t: &Tensor) -> Result<Tensor> {
    let id = cuda_id(t, "download")?;
    if t.numel() > 0 && !t.is_c_contiguous() {
        return Err(Error::CopyRequired {
            reason: format!(
                "a CUDA tensor with shape {:?} and strides {:?} is not C-contiguous; dlframe copies only \
                 contiguous device tensors to the host (make it contiguous on the device first)",
                t.shape(),
                t.strides()
            ),
        });
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

/// Device times of the null-fill kernel and of a device-to-device copy, in milliseconds (best
/// of `reps`, timed with CUDA events), on `cuda:ordinal`: the kernel over `n` f32 slots of which
/// every tenth is null, in place as [`to_device`] runs it, against a copy of the same `4 n`
/// bytes. What `benches/gpu.py` reports for the kernel-bandwidth target; it allocates
/// `8 n + n / 8` bytes of device memory and measures nothing on the host.
///
/// # Errors
/// [`Error::Cuda`] without a device, or when `n` exceeds `u32::MAX`.
pub fn fill_kernel_timing(ordinal: usize, n: usize, reps: usize) -> Result<(f64, f64)> {
    if n == 0 || u32::try_from(n).is_err() {
        return Err(Error::Cuda(format!("n = {n} is outside 1..=u32::MAX")));
    }
    let g = gpu(ordinal)?;
    let validity: Vec<u8> = (0..n.div_ceil(8))
        .map(|byte| (0..8).filter(|bit| (byte * 8 + bit) % 10 != 0).fold(0u8, |acc, bit| acc | (1 << bit)))
        .collect();
    catch_unwind(AssertUnwindSafe(|| -> Result<(f64, f64)> {
        let s = &g.stream;
        let valid = s.clone_htod(&validity).map_err(cuda_err)?;
        let mut a = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let mut b = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let fill = fill_bytes(DType::Float32, NullPolicy::Fill(kernels::Scalar::Int(0)))?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (mut kernel, mut copy) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..=reps {
            let start = s.record_event(timing).map_err(cuda_err)?;
            launch_fill(&g, 4, &mut a.slice_mut(..), &valid, 0, n as u64, &fill)?;
            let mid = s.record_event(timing).map_err(cuda_err)?;
            s.memcpy_dtod(&a, &mut b).map_err(cuda_err)?;
            let end = s.record_event(timing).map_err(cuda_err)?;
            kernel = kernel.min(f64::from(start.elapsed_ms(&mid).map_err(cuda_err)?));
            copy = copy.min(f64::from(mid.elapsed_ms(&end).map_err(cuda_err)?));
        }
        Ok((kernel, copy))
    }))
    .map_err(|_| Error::Cuda("a CUDA call panicked".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(matches!(fill_kernel_timing(0, 1000, 1).unwrap_err(), Error::Cuda(_)));
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
        assert!(matches!(download(&transposed).unwrap_err(), Error::CopyRequired { .. }));
    }

    #[test]
    fn fill_bytes_are_range_checked() {
        use crate::kernels::Scalar;
        assert_eq!(
            fill_bytes(DType::Int16, NullPolicy::Fill(Scalar::Int(-2))).unwrap()[..2],
            (-2i16).to_le_bytes()
        );
        assert_eq!(fill_bytes(DType::Float32, NullPolicy::Nan).unwrap()[..4], f32::NAN.to_le_bytes());
        assert!(fill_bytes(DType::UInt8, NullPolicy::Fill(Scalar::Int(256))).is_err());
    }
}

//! Copies between the host and a device, and on a device: a plan's bytes up (straight into the
//! output, or into one scratch buffer for the `convert` kernel), host tensors up, device
//! tensors down, and strided device tensors into C order. Every function here copies; the
//! memory it fills goes to an owner from `memory.rs`. Host-to-device copies go through
//! `staging.rs`: pageable sources through page-locked staging buffers, page-locked ones
//! straight, and then the host waits for them (their copies run asynchronously to the host).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, sys};

use super::driver::{Gpu, cuda_err, guarded, memcpy_dtoh};
use super::launch;
use super::memory::owned_tensor;
use super::plan::Plan;
use super::relay::HostCopy;
use super::staging::Uploads;
use crate::arrow::Converted;
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::HostBuffer;
use crate::tensor::{Tensor, c_strides};

/// The plan's scratch buffer, allocated on the producer stream (the caller binds the
/// context), and the copies that fill it: its pieces and segment table at their device
/// addresses, for [`Uploads::copy_all`]. The kernel reads only those bytes.
pub(super) fn scratch<'p>(g: &Gpu, plan: &'p Plan) -> Result<(CudaSlice<u8>, Vec<HostCopy<'p>>)> {
    // SAFETY: the kernel reads only the placed bytes, all written by the copies returned first.
    let scratch = unsafe { g.alloc(plan.scratch_len()) }?;
    let base = address(g, &scratch);
    let pieces = plan.uploads().map(|(at, bytes)| (base + at as u64, bytes)).collect();
    Ok((scratch, pieces))
}

/// The device address of `slice` (its work is all on the producer stream).
fn address(g: &Gpu, slice: &CudaSlice<u8>) -> sys::CUdeviceptr {
    slice.device_ptr(&g.stream).0
}

/// Carries out a plan on `g`'s device (copies, host to device): the output (and mask)
/// allocated on the producer stream, the values that keep their dtype and have no nulls copied
/// straight into it, then (when there is more to do) the rest uploaded into one scratch buffer
/// and one `convert` launch; the scratch buffer is freed on the stream after the kernel.
pub(super) fn run(g: Arc<Gpu>, plan: &Plan) -> Result<Converted> {
    let item = plan.made.storage.itemsize();
    let (out, mask) = guarded(|| -> Result<(CudaSlice<u8>, Option<CudaSlice<u8>>)> {
        g.bind()?;
        let s = &g.stream;
        // SAFETY: every element is written below (by the copies or by the kernel, which writes
        // each slot of each segment, and the segments cover the output) before the readiness
        // event that consumers wait on.
        let mut out = unsafe { g.alloc(plan.len * item) }?;
        // SAFETY: as above; the kernel writes one mask byte per element it writes.
        let mut mask = plan.made.mask.then(|| unsafe { g.alloc(plan.len) }).transpose()?;
        let base = address(&g, &out);
        let mut copies: Vec<_> = plan.output_copies().map(|(at, bytes)| (base + at as u64, bytes)).collect();
        let scratch = if plan.needs_kernel() {
            let (scratch, pieces) = scratch(&g, plan)?;
            copies.extend(pieces);
            Some(scratch)
        } else {
            None
        };
        let mut up = Uploads::new(&g)?;
        // SAFETY: the plan's output copies lie apart within the len * item bytes of `out`, and
        // its scratch pieces apart within the scratch buffer; both are freed on the producer
        // stream, after the copies.
        unsafe { up.copy_all(&copies) }?;
        if let Some(scratch) = &scratch {
            launch::convert(&g, plan, &mut out, mask.as_mut(), scratch)?;
        }
        if up.copied_page_locked() {
            s.synchronize().map_err(cuda_err)?;
        }
        Ok((out, mask))
    })?;
    let m = &plan.made;
    let values =
        owned_tensor(g.clone(), out, m.shape.clone(), m.strides.clone(), m.target, m.logical.clone())?;
    let mask = mask
        .map(|k| owned_tensor(g, k, m.shape.clone(), m.strides.clone(), DType::Bool, None))
        .transpose()?;
    Ok(Converted { values, mask, index: None })
}

/// A dense host tensor (C, F or another order of its dimensions) copied to `g`'s device on
/// the producer stream (copies), its layout kept, through the staging buffers when it is
/// pageable. From page-locked or managed memory the host waits for the transfer, so the source
/// may be freed on return.
///
/// # Errors
/// [`Error::CopyRequired`](crate::Error::CopyRequired) for a layout with gaps or device input;
/// [`Error::Cuda`](crate::Error::Cuda) from the driver.
pub(super) fn upload(g: Arc<Gpu>, t: &Tensor) -> Result<Tensor> {
    let strides = t.check_host_dense()?;
    let bytes: &[u8] = if t.numel() == 0 {
        &[]
    } else {
        // SAFETY: a host-readable dense tensor (checked above), so its elements are the nbytes
        // bytes from its data pointer, alive for this call through `t`.
        unsafe { std::slice::from_raw_parts(t.data_ptr(), t.nbytes()) }
    };
    let slice = guarded(|| -> Result<CudaSlice<u8>> {
        g.bind()?;
        // SAFETY: every byte is written by the copy below before the readiness event.
        let out = unsafe { g.alloc(bytes.len()) }?;
        let mut up = Uploads::new(&g)?;
        // SAFETY: `out` holds bytes.len() bytes and is freed on the producer stream, after the
        // copy.
        unsafe { up.copy_all(&[(address(&g, &out), bytes)]) }?;
        if up.copied_page_locked() {
            g.stream.synchronize().map_err(cuda_err)?;
        }
        Ok(out)
    })?;
    owned_tensor(g, slice, t.shape().to_vec(), strides, t.dtype(), t.logical().cloned())
}

/// A host copy of a C-contiguous CUDA tensor on `g`'s device (copies, device to host): our
/// stream waits for the tensor's readiness event, one device-to-host transfer runs, and the
/// host waits for that transfer. The result is a C-contiguous CPU tensor.
///
/// `t` must be C-contiguous (or empty).
pub(super) fn download_contiguous(g: &Gpu, t: &Tensor) -> Result<Tensor> {
    debug_assert!(t.numel() == 0 || t.is_c_contiguous());
    // Every byte is written by the transfer below.
    let mut host = HostBuffer::for_overwrite(t.nbytes())?;
    if t.nbytes() > 0 {
        guarded(|| -> Result<()> {
            g.bind()?;
            let stream = g.producer();
            if let Some(sync) = t.sync() {
                sync.wait_on(stream)?;
            }
            // SAFETY: the tensor holds nbytes contiguous bytes at data_ptr on this device (C
            // order, per this function's contract), alive through `t` until the synchronize
            // below; `host` has nbytes and is not touched before then.
            unsafe { memcpy_dtoh(host.as_mut_slice(), t.data_ptr() as usize, stream) }?;
            g.stream.synchronize().map_err(cuda_err)
        })?;
    }
    Ok(Tensor::from_buffer(host.into_buffer(), 0, t.shape().to_vec(), None, t.dtype())?
        .with_copied(true)
        .with_logical(t.logical().cloned()))
}

/// A C-contiguous copy of a CUDA tensor on `g`'s device (copies, device to device): one
/// `gather` kernel on our stream, after the tensor's readiness event. The host does not block
/// unless the tensor has no readiness hook (then it waits for the kernel, so that the source
/// may go); the copy has its own readiness event.
///
/// # Errors
/// [`Error::Misaligned`](crate::Error::Misaligned) for data not aligned to its element size;
/// [`Error::Cuda`](crate::Error::Cuda) from the driver or NVRTC.
pub(super) fn device_copy(g: Arc<Gpu>, t: &Tensor) -> Result<Tensor> {
    let out = guarded(|| -> Result<CudaSlice<u8>> {
        g.bind()?;
        let s = &g.stream;
        if let Some(sync) = t.sync() {
            sync.wait_on(g.producer())?;
        }
        // SAFETY: the gather below writes each of the numel elements.
        let mut out = unsafe { g.alloc(t.nbytes()) }?;
        if t.numel() == 0 {
            return Ok(out);
        }
        // The tensor's owner waited on our stream above (or, without a hook, the host waits
        // below), so its memory outlives the kernel.
        launch::gather(&g, t, &mut out)?;
        if t.sync().is_none() {
            // Nothing tells the source's owner about our stream: wait before it can go.
            s.synchronize().map_err(cuda_err)?;
        }
        Ok(out)
    })?;
    owned_tensor(g, out, t.shape().to_vec(), c_strides(t.shape()), t.dtype(), t.logical().cloned())
}

//! CUDA devices (feature `cuda`): Arrow columns onto a GPU in one transfer and one kernel,
//! handed over with DLPack stream semantics. This file holds the public entry points only.
//!
//! Every conversion is one plan (`plan.rs`, checked on the host with the CPU path's rules) and,
//! on the device, one of:
//!
//! | case | device work |
//! |---|---|
//! | one dtype, no nulls, no bools (chunks, lists, tensor columns) | each chunk's values copied host-to-device straight into the tensor |
//! | anything else: nulls, masks, bools, casts, list-level nulls, several columns | each chunk's raw values and validity copied host-to-device once into one scratch buffer, then one `convert` kernel writes the tensor (and its mask) |
//!
//! Pageable host memory goes up through two page-locked staging buffers of 32 MiB per device
//! (`staging.rs`), filled by the kernel threads: the host blocks only when it needs a buffer
//! whose last upload is still running. Page-locked memory is copied straight.
//!
//! The kernels (`kernels.cu`) are compiled with NVRTC when a kernel is first launched on a
//! device; the unit tests also build them for the CPU and check them against the CPU kernels
//! (`emulate.rs`).
//!
//! cudarc is loaded dynamically: without a driver, [`is_available`] is false (never a panic)
//! and conversions return [`Error::Cuda`]. Each device has one producer stream; uploads and
//! kernels run there, an event is recorded after them, and a consumer's stream is made to wait
//! on it ([`DeviceSync::wait_on`](crate::tensor::DeviceSync::wait_on)); the host does not wait
//! for the device (but for a staging buffer, above). Device memory is freed on the producer stream after the streams consumers named have
//! finished their queued work.
//!
//! CUDA tensors imported through DLPack are adopted without a copy ([`adopt`]) and re-export
//! with the same stream semantics; [`download`] copies a device tensor to the host when asked.
//!
//! # Layers
//!
//! As cudarc does (sys, result, safe), one level per file; each uses only the ones below it:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the public entry points |
//! | `transfer.rs` | host-to-device, device-to-host and device-to-device copies; a plan's uploads |
//! | `staging.rs` | host-to-device copies through page-locked staging buffers |
//! | `launch.rs` | the kernel source (dtype codes generated from `DType`), NVRTC, the launches |
//! | `memory.rs` | the owners of device memory: readiness events, consumer fences, `Drop` |
//! | `driver.rs` | the device registry and every raw `sys::`/`result::` driver call |
//! | `plan.rs` | what a conversion uploads and how the kernel writes it (host only, no CUDA) |
//!
//! `transfer.rs` queues launches (`launch.rs`) between its copies; `launch.rs` never copies
//! host memory. `bench.rs` (feature `bench-internals`) times the kernel for the benchmarks.

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;

use crate::arrow::Converted;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::options::ExportOptions;
#[cfg(doc)]
use crate::options::NullPolicy;
use crate::tensor::Tensor;

#[cfg(feature = "bench-internals")]
mod bench;
mod driver;
#[cfg(test)]
mod emulate;
mod launch;
mod memory;
mod plan;
mod relay;
mod staging;
mod transfer;

#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub use bench::kernel_timing;
use driver::{gpu, gpu_of};

/// Number of CUDA devices; 0 without a driver or a device. Never panics.
pub fn device_count() -> usize {
    driver::device_count()
}

/// True when a CUDA driver and at least one device are present. Never panics.
pub fn is_available() -> bool {
    device_count() > 0
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
pub(crate) fn to_device(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
    ordinal: usize,
) -> Result<Converted> {
    transfer::run(gpu(ordinal)?, &plan::column(field, chunks, opts)?)
}

/// Several columns as one `(n, k)` CUDA tensor in C or F order on `cuda:ordinal` (copies, to
/// the device): each chunk's raw buffers go over once, and one kernel interleaves, casts to the
/// common (or requested) dtype and fills nulls (and writes the mask under
/// [`NullPolicy::Mask`]). Same results and errors as [`crate::arrow::columns_to_tensor`].
///
/// # Errors
/// [`Error::Cuda`] without a device; the errors of [`crate::arrow::columns_to_tensor`].
pub(crate) fn columns_to_device(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
    ordinal: usize,
) -> Result<Converted> {
    transfer::run(gpu(ordinal)?, &plan::matrix(fields, columns, opts)?)
}

/// A dense host tensor (C, F or another order of its dimensions) copied to `cuda:ordinal` on
/// the producer stream (copies, to the device), its layout kept, through page-locked staging
/// buffers when it is pageable. From page-locked or managed memory the host waits for the
/// transfer, so the source may be freed on return. Used for results made on the CPU first,
/// such as a multi-column matrix.
///
/// # Errors
/// [`Error::Cuda`] without a device; [`Error::CopyRequired`] for a layout with gaps or device
/// input.
pub fn upload(t: &Tensor, ordinal: usize) -> Result<Tensor> {
    // Refused before any device is touched.
    t.check_host_dense()?;
    transfer::upload(gpu(ordinal)?, t)
}

/// The raw handle of dlframe's producer stream on `cuda:ordinal`. An importer passes it as
/// `__dlpack__(stream=...)`, so that the producer orders its pending work before ours.
///
/// # Errors
/// [`Error::Cuda`] without that device.
pub fn stream_handle(ordinal: usize) -> Result<usize> {
    Ok(gpu(ordinal)?.producer())
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
    memory::adopted_tensor(gpu_of(&foreign, "adopt")?, foreign, None)
}

/// [`adopt`] for a tensor whose producer was not handed our stream, such as a raw capsule:
/// DLPack then promises the data on the legacy default stream, so our stream first waits for
/// that stream's work (without blocking the host).
///
/// # Errors
/// As [`adopt`].
pub fn adopt_legacy(foreign: Tensor) -> Result<Tensor> {
    memory::adopted_tensor(gpu_of(&foreign, "adopt")?, foreign, Some(1))
}

/// [`adopt`] for a tensor whose producer did not synchronise (the DLPack exchange API): our
/// stream first waits for the work queued on `stream`, the producer's current work stream on
/// the tensor's device (0, the default stream, is taken as the legacy default stream).
///
/// # Errors
/// As [`adopt`].
pub fn adopt_after(foreign: Tensor, stream: usize) -> Result<Tensor> {
    memory::adopted_tensor(gpu_of(&foreign, "adopt")?, foreign, Some(stream.max(1)))
}

/// A host copy of a CUDA tensor (copies, device to host): our stream waits for the tensor's
/// readiness event, a strided tensor is first gathered into C order on the device
/// ([`device_copy`]), one device-to-host transfer runs, and the host waits for that transfer
/// (the copy is what was asked for). The result is a C-contiguous CPU tensor.
///
/// # Errors
/// [`Error::InvalidArgument`] for a tensor not on a CUDA device; [`Error::Cuda`] from the driver.
pub fn download(t: &Tensor) -> Result<Tensor> {
    let g = gpu_of(t, "download")?;
    if t.numel() > 0 && !t.is_c_contiguous() {
        return transfer::download_contiguous(&g, &device_copy(t)?);
    }
    transfer::download_contiguous(&g, t)
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
    transfer::device_copy(gpu_of(t, "device_copy")?, t)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::DataType;

    use super::*;
    use crate::device::Device;
    use crate::dtype::DType;
    use crate::error::Error;

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

    #[test]
    fn outputs_come_from_a_pool_that_keeps_freed_memory_for_reuse() {
        if device_count() == 0 {
            eprintln!("skipped: no CUDA driver or device on this machine");
            return;
        }
        let g = driver::gpu(0).unwrap();
        if !g.ctx.has_async_alloc() {
            eprintln!("skipped: cuda:0 has no stream-ordered memory pools (cudarc allocates there)");
            return;
        }
        // The device's default pool keeps nothing (its release threshold is 0), so each output
        // would be mapped afresh after every synchronisation.
        let col: ArrayRef = Arc::new(arrow_array::Float32Array::from(vec![Some(1.0), None, Some(3.0)]));
        let f: FieldRef = Arc::new(arrow_schema::Field::new("x", DataType::Float32, true));
        let opts = ExportOptions { nulls: crate::options::NullPolicy::Mask, ..Default::default() };
        let c = to_device(&f, &[col], &opts, 0).unwrap();
        let up = upload(&Tensor::from_vec(vec![1u8; 1000], vec![1000]).unwrap(), 0).unwrap();
        let mask = c.mask.as_ref().unwrap();
        for t in [&c.values, mask, &up] {
            let keeps = driver::pool_keeps(t.data_ptr() as u64).unwrap();
            assert!(keeps > 0 && keeps <= 1 << 30, "{keeps}");
        }
        g.stream.synchronize().unwrap();
    }
}

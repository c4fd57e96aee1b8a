//! Moving data between devices: one facade over the device back ends, dispatching on
//! [`Device`]. Callers (the DLPack negotiation in [`crate::dlpack::request`], the Python
//! binding, the SQL functions) never name a back end or a cargo feature.
//!
//! | function | data movement |
//! |---|---|
//! | [`move_to`] | none when the tensor is already there; otherwise one copy (host to CUDA, CUDA to host) |
//! | [`on_host`] | none for host memory; one device-to-host copy, only when asked |
//! | [`copy_on_device`] | one copy on the tensor's own device |
//! | [`column_on`] / [`matrix_on`] | Arrow columns to a tensor on the device (zero-copy only on the CPU, as [`crate::arrow::to_tensor`]) |
//! | [`adopt`] / [`adopt_legacy`] | none: a foreign CUDA tensor kept where it is, with dlframe's stream semantics |
//!
//! Layers: this module sits above `cuda`, `arrow` and `kernels`, and calls only their public
//! entry points. A build without the `cuda` feature, a machine without a driver or a GPU, and
//! an ordinal beyond the visible devices all give the one error [`Error::DeviceUnavailable`].

use std::sync::OnceLock;

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;

use crate::arrow::{Converted, columns_to_tensor, is_list_like, is_list_view, is_ragged, to_tensor};
use crate::decide::decide_on;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::options::{ExportOptions, NullPolicy, Order};
use crate::tensor::Tensor;

#[cfg(feature = "cuda")]
use crate::cuda;

/// The CUDA entry points of a build without the `cuda` feature: each one says so.
#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::{ArrayRef, Converted, ExportOptions, FieldRef, Result, Tensor, unavailable};

    pub fn device_count() -> usize {
        0
    }
    pub fn to_device(_: &FieldRef, _: &[ArrayRef], _: &ExportOptions, ordinal: usize) -> Result<Converted> {
        Err(unavailable(ordinal))
    }
    pub fn columns_to_device(
        _: &[FieldRef],
        _: &[Vec<ArrayRef>],
        _: &ExportOptions,
        ordinal: usize,
    ) -> Result<Converted> {
        Err(unavailable(ordinal))
    }
    pub fn upload(_: &Tensor, ordinal: usize) -> Result<Tensor> {
        Err(unavailable(ordinal))
    }
    pub fn download(t: &Tensor) -> Result<Tensor> {
        Err(unavailable(super::ordinal_of(t)))
    }
    pub fn device_copy(t: &Tensor) -> Result<Tensor> {
        Err(unavailable(super::ordinal_of(t)))
    }
    pub fn stream_handle(ordinal: usize) -> Result<usize> {
        Err(unavailable(ordinal))
    }
    pub fn adopt(t: Tensor) -> Result<Tensor> {
        Err(unavailable(super::ordinal_of(&t)))
    }
    pub fn adopt_legacy(t: Tensor) -> Result<Tensor> {
        Err(unavailable(super::ordinal_of(&t)))
    }
    pub fn adopt_after(t: Tensor, _: usize) -> Result<Tensor> {
        Err(unavailable(super::ordinal_of(&t)))
    }
}

/// True when this build has the `cuda` feature.
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");

/// Number of CUDA devices dlframe can use: 0 without the `cuda` feature, a driver or a device.
/// Asked once per process (CUDA fixes the visible devices when it starts).
pub fn cuda_device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(cuda::device_count)
}

/// The error for `cuda:ordinal` when this build or machine cannot reach it.
fn unavailable(ordinal: usize) -> Error {
    Error::DeviceUnavailable {
        device: format!("cuda:{ordinal}"),
        visible: cuda_device_count(),
        built_with_cuda: BUILT_WITH_CUDA,
    }
}

/// The CUDA ordinal of a CUDA tensor (`usize::MAX` for a negative one, which no device has).
fn ordinal_of(t: &Tensor) -> usize {
    match t.device() {
        Device::Cuda(i) => usize::try_from(i).unwrap_or(usize::MAX),
        _ => usize::MAX,
    }
}

/// Refuses `cuda:ordinal` before any work when this build or machine cannot reach it.
///
/// # Errors
/// [`Error::DeviceUnavailable`].
pub fn require_cuda(ordinal: usize) -> Result<()> {
    if ordinal < cuda_device_count() { Ok(()) } else { Err(unavailable(ordinal)) }
}

/// `[(case, bytes moved, best ms)]` of the `convert` kernel and of a device-to-device copy on
/// `cuda:ordinal` (`cuda::kernel_timing`, feature `bench-internals`): a measurement for the
/// GPU benchmark, not an API.
///
/// # Errors
/// [`Error::DeviceUnavailable`] without that device, or in a build without the feature.
#[doc(hidden)]
pub fn kernel_timing(ordinal: usize, n: usize, reps: usize) -> Result<Vec<(String, f64, f64)>> {
    require_cuda(ordinal)?;
    #[cfg(feature = "bench-internals")]
    return reached(ordinal, cuda::kernel_timing(ordinal, n, reps));
    #[cfg(not(feature = "bench-internals"))]
    {
        let _ = (n, reps);
        Err(unavailable(ordinal))
    }
}

/// A back end's result for `cuda:ordinal`, with its "no such device" said as
/// [`Error::DeviceUnavailable`]. Errors found before the device is touched (a column's nulls,
/// a value that does not fit) come first, as on the CPU.
fn reached<T>(ordinal: usize, r: Result<T>) -> Result<T> {
    match r {
        Err(Error::Cuda(_)) if ordinal >= cuda_device_count() => Err(unavailable(ordinal)),
        r => r,
    }
}

/// Why dlframe cannot move or copy memory on `device`.
fn unsupported(device: Device) -> Error {
    Error::UnsupportedDevice {
        what: device.to_string(),
        remedy: "dlframe moves and copies tensors only on the CPU and on CUDA devices",
    }
}

/// A mask of `true`s shaped like `values` and, when they are dense (C or F order, a permuted
/// tensor column), laid out like them (C order otherwise), on their device (allocates; copies
/// to a device): the mask of a result without nulls, under `nulls="mask"`.
///
/// # Errors
/// A device error.
pub fn all_valid_like(values: &Tensor) -> Result<Tensor> {
    let c = Tensor::from_vec(vec![true; values.numel()], values.shape().to_vec())?;
    let strides = values.dense_strides().unwrap_or_else(|| c.strides().to_vec());
    // SAFETY: the same allocation of numel bools, kept by its owner; a dense layout of the same
    // shape (any order of its dimensions) reaches exactly those numel elements, all true.
    let host = unsafe {
        Tensor::from_raw_parts(
            c.data_ptr() as *mut u8,
            values.shape().to_vec(),
            Some(strides),
            DType::Bool,
            Device::Cpu,
            false,
            c.owner().clone(),
        )
    }?;
    move_to(&host.with_copied(true), values.device())
}

/// A conversion as its caller gets it: under [`NullPolicy::Mask`] a mask always
/// ([`all_valid_like`] when there were no nulls, which allocates). The conversions finish
/// themselves so where they are made ([`column_on`], [`matrix_on`], a shuffled batch's gathered
/// matrix), once.
///
/// # Errors
/// A device error.
pub fn completed(c: Converted, nulls: NullPolicy) -> Result<Converted> {
    if nulls != NullPolicy::Mask || c.mask.is_some() {
        return Ok(c);
    }
    Ok(Converted { mask: Some(all_valid_like(&c.values)?), ..c })
}

/// The tensors a finished conversion ([`completed`]) hands its caller, in order: the values,
/// the mask, a ragged column's lengths or offsets. With a consumer's `stream` (a CUDA handle),
/// that stream is made to wait for the work that made them.
///
/// # Errors
/// A device error.
pub fn handed_over(c: Converted, stream: Option<usize>) -> Result<Vec<Tensor>> {
    let Converted { values, mask, index } = c;
    let parts: Vec<Tensor> = std::iter::once(values).chain(mask).chain(index).collect();
    if let Some(h) = stream {
        for sync in parts.iter().filter_map(Tensor::sync) {
            sync.wait_on(h)?;
        }
    }
    Ok(parts)
}

/// The tensor on `device`: the same tensor when it is already there (no copy; host-readable
/// memory counts as the CPU), otherwise one copy. A host tensor goes to a CUDA device in one
/// transfer, in its own dense layout (C, F or another order of its dimensions; a layout with
/// gaps is gathered into C order on the host first); a CUDA tensor comes to the CPU in
/// one transfer, after which the host has waited for it.
///
/// # Errors
/// [`Error::DeviceUnavailable`] for a CUDA device this build or machine cannot reach;
/// [`Error::UnsupportedDevice`] for other devices; the back end's errors.
pub fn move_to(t: &Tensor, device: Device) -> Result<Tensor> {
    let from = t.device();
    if from == device || (from.is_host_accessible() && device == Device::Cpu) {
        return Ok(t.clone());
    }
    match (from.is_host_accessible(), device) {
        (true, Device::Cuda(_)) => {
            let ordinal = cuda_ordinal(device)?;
            require_cuda(ordinal)?;
            // A dense layout goes up as it is (an F-ordered or permuted tensor column keeps its
            // layout); others are gathered into C order first.
            let gathered;
            let src = if t.dense_strides().is_some() {
                t
            } else {
                gathered = kernels::contiguous_copy(t)?;
                &gathered
            };
            reached(ordinal, cuda::upload(src, ordinal))
        }
        (false, Device::Cpu) if matches!(from, Device::Cuda(_)) => reached(ordinal_of(t), cuda::download(t)),
        (false, Device::Cpu) => Err(unsupported(from)),
        _ => Err(unsupported(device)),
    }
}

/// The tensor in host memory, for a consumer that reads it there (Arrow, numpy): host-readable
/// memory as it is (no copy); device memory only when asked with `copy=Some(true)`, as one
/// transfer. The flag says whether the result is a fresh copy, so that no second copy is made.
///
/// # Errors
/// [`Error::NotOnHost`] for device memory without `copy=True`; the errors of [`move_to`].
pub fn on_host(t: &Tensor, copy: Option<bool>) -> Result<(Tensor, bool)> {
    if t.device().is_host_accessible() {
        return Ok((t.clone(), false));
    }
    if copy != Some(true) {
        return Err(Error::NotOnHost { device: t.device().to_string(), copy_false: copy == Some(false) });
    }
    Ok((move_to(t, Device::Cpu)?, true))
}

/// A fresh C-contiguous copy of a device tensor on its own device (copies, device to device).
///
/// # Errors
/// [`Error::DeviceUnavailable`] for a CUDA tensor this build cannot reach;
/// [`Error::UnsupportedDevice`] for host memory and other devices.
pub fn copy_on_device(t: &Tensor) -> Result<Tensor> {
    match t.device() {
        Device::Cuda(_) => reached(ordinal_of(t), cuda::device_copy(t)),
        d => Err(unsupported(d)),
    }
}

/// One Arrow column as a tensor on `device`: [`crate::arrow::to_tensor`] on the CPU, one
/// transfer and one kernel on a CUDA device (which copies). A list view column, a ragged list
/// column ([`crate::arrow::is_ragged`]), and a list or tensor column in F order, is made on the
/// host and each of its tensors moved (copies).
///
/// # Errors
/// The conversion's errors first, then [`Error::DeviceUnavailable`] or
/// [`Error::UnsupportedDevice`].
pub fn column_on(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
    device: Device,
) -> Result<Converted> {
    decide_on(opts.copy, device, || format!("column '{}'", field.name()))?;
    let made = match device {
        Device::Cpu => to_tensor(field, chunks, opts),
        Device::Cuda(_) if made_on_host(field, opts) => {
            let host = to_tensor(field, chunks, opts)?;
            let on = |t: Option<Tensor>| t.map(|t| move_to(&t, device)).transpose();
            Ok(Converted {
                values: move_to(&host.values, device)?,
                mask: on(host.mask)?,
                index: on(host.index)?,
            })
        }
        Device::Cuda(_) => {
            let ordinal = cuda_ordinal(device)?;
            reached(ordinal, cuda::to_device(field, chunks, opts, ordinal))
        }
        d => Err(unsupported(d)),
    };
    completed(made?, opts.nulls)
}

/// Whether a column's tensors are made on the host and then moved to a device: a list view
/// column (whose rows the host lays end to end), a ragged list column, and a list or tensor
/// column under `order="F"`, none of which the device plan lays out.
fn made_on_host(field: &FieldRef, opts: &ExportOptions) -> bool {
    is_list_view(field.data_type())
        || is_ragged(field, opts)
        || (opts.order == Order::F && is_list_like(field.data_type()))
}

/// Several Arrow columns as one `(n, k)` tensor on `device`: [`crate::arrow::columns_to_tensor`]
/// on the CPU, one transfer and one kernel on a CUDA device (which copies).
///
/// # Errors
/// As [`column_on`].
pub fn matrix_on(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
    device: Device,
) -> Result<Converted> {
    decide_on(opts.copy, device, || format!("{} columns", fields.len()))?;
    let made = match device {
        Device::Cpu => columns_to_tensor(fields, columns, opts),
        Device::Cuda(_) => {
            let ordinal = cuda_ordinal(device)?;
            reached(ordinal, cuda::columns_to_device(fields, columns, opts, ordinal))
        }
        d => Err(unsupported(d)),
    };
    completed(made?, opts.nulls)
}

fn cuda_ordinal(device: Device) -> Result<usize> {
    match device {
        Device::Cuda(id) => usize::try_from(id).map_err(|_| unsupported(device)),
        d => Err(unsupported(d)),
    }
}

/// The raw handle of dlframe's producer stream on `device` (never 0), which an importer hands
/// a producer as `__dlpack__(stream=...)` so that the producer's pending work is ordered before
/// ours.
///
/// # Errors
/// [`Error::DeviceUnavailable`] without that device; [`Error::UnsupportedDevice`] for a device
/// other than CUDA.
pub fn stream_handle(device: Device) -> Result<usize> {
    let ordinal = cuda_ordinal(device)?;
    require_cuda(ordinal)?;
    Ok(reached(ordinal, cuda::stream_handle(ordinal))?.max(1))
}

/// A foreign CUDA tensor kept on its device (no copy), whose producer was handed
/// [`stream_handle`]; host tensors are returned as they are.
///
/// # Errors
/// [`Error::DeviceUnavailable`] without that device; [`Error::UnsupportedDevice`] for devices
/// other than the CPU and CUDA.
pub fn adopt(t: Tensor) -> Result<Tensor> {
    adopt_with(t, cuda::adopt)
}

/// [`adopt`] for a tensor handed over without a stream (a raw capsule): DLPack then promises
/// the data on the legacy default stream, which dlframe's stream waits for.
///
/// # Errors
/// As [`adopt`].
pub fn adopt_legacy(t: Tensor) -> Result<Tensor> {
    adopt_with(t, cuda::adopt_legacy)
}

/// [`adopt`] for a tensor handed over through the DLPack exchange API, which does not
/// synchronise: dlframe's stream first waits for the work queued on `stream`, the producer's
/// current work stream on that device (NULL, the default stream, counts as the legacy one).
///
/// # Errors
/// As [`adopt`].
pub fn adopt_after(t: Tensor, stream: usize) -> Result<Tensor> {
    adopt_with(t, |t| cuda::adopt_after(t, stream))
}

/// A CUDA tensor through the back end's `adopt` (its device checked first); host tensors as
/// they are.
fn adopt_with(t: Tensor, adopt: impl FnOnce(Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match t.device() {
        Device::Cuda(_) => {
            let ordinal = ordinal_of(&t);
            require_cuda(ordinal)?;
            reached(ordinal, adopt(t))
        }
        d if d.is_host_accessible() => Ok(t),
        d => Err(unsupported(d)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_hands_over_its_values_then_the_mask_asked_for_then_its_index() {
        let values = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], vec![3]).unwrap();
        let index = Tensor::from_vec(vec![0i64, 3], vec![2]).unwrap();
        let c =
            |mask: Option<Tensor>, index: Option<Tensor>| Converted { values: values.clone(), mask, index };
        let dtypes = |parts: Vec<Tensor>| parts.iter().map(|t| t.dtype()).collect::<Vec<_>>();
        let finished = |c, nulls| handed_over(completed(c, nulls).unwrap(), None).unwrap();
        assert_eq!(dtypes(finished(c(None, None), NullPolicy::Error)), [DType::Float32]);
        // Under nulls="mask" a column without nulls gets an all-true mask of its shape.
        let parts = finished(c(None, Some(index.clone())), NullPolicy::Mask);
        assert_eq!(dtypes(parts.clone()), [DType::Float32, DType::Bool, DType::Int64]);
        assert_eq!((parts[1].shape(), parts[1].as_slice::<bool>().unwrap()), (&[3][..], &[true; 3][..]));
        let filled = NullPolicy::Fill(crate::options::Scalar::Float(0.0));
        let c = completed(c(None, Some(index)), filled).unwrap();
        assert_eq!(dtypes(handed_over(c, Some(7)).unwrap()), [DType::Float32, DType::Int64]);
    }

    #[test]
    fn host_tensors_stay_where_they_are_and_unreachable_devices_say_so() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0], vec![2]).unwrap();
        assert_eq!(move_to(&t, Device::Cpu).unwrap().data_ptr(), t.data_ptr());
        let e = move_to(&t, Device::Cuda(1_000)).unwrap_err();
        assert!(matches!(e, Error::DeviceUnavailable { .. }), "{e}");
        assert!(e.to_string().contains("cuda:1000 is not available"), "{e}");
        let e = move_to(&t, Device::OpenCl(0)).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDevice { .. }), "{e}");
        assert!(matches!(copy_on_device(&t).unwrap_err(), Error::UnsupportedDevice { .. }));
        assert!(matches!(stream_handle(Device::Cuda(1_000)).unwrap_err(), Error::DeviceUnavailable { .. }));
        assert_eq!(adopt(t.clone()).unwrap().data_ptr(), t.data_ptr());
        let (same, fresh) = on_host(&t, Some(false)).unwrap();
        assert_eq!((same.data_ptr(), fresh), (t.data_ptr(), false));
    }

    #[test]
    fn every_shape_is_refused_in_the_same_words_on_the_cpu_and_on_a_device() {
        use std::sync::Arc;

        use arrow_array::{Int32Array, LargeListArray, ListViewArray};
        use arrow_buffer::{OffsetBuffer, ScalarBuffer};
        use arrow_schema::{DataType, Field};

        use crate::decide::{Cause, decide};
        use crate::options::{CopyPolicy, Ragged};
        let refusal = |cause: Cause| decide(CopyPolicy::Never, Some(cause)).unwrap_err().to_string();
        let never = ExportOptions { copy: CopyPolicy::Never, ..Default::default() };
        let item = Arc::new(Field::new("item", DataType::Int32, false));
        let values = Arc::new(Int32Array::from(vec![1, 2, 3]));
        let named =
            |name: &str, a: ArrayRef| (Arc::new(Field::new(name, a.data_type().clone(), true)), vec![a]);
        // A column with a null to fill, a ragged list padded, a list view and a matrix.
        let column = named("c", Arc::new(Int32Array::from(vec![Some(1), None])));
        let fill = ExportOptions { nulls: NullPolicy::Fill(crate::options::Scalar::Int(0)), ..never };
        let ragged = named(
            "r",
            Arc::new(LargeListArray::new(
                item.clone(),
                OffsetBuffer::from_lengths([1, 2]),
                values.clone(),
                None,
            )),
        );
        let pad = ExportOptions {
            ragged: Ragged::Pad { pad: crate::options::Scalar::Int(0), max_len: None },
            ..never
        };
        let offsets = ScalarBuffer::from(vec![0i32, 1]);
        let view = named(
            "v",
            Arc::new(ListViewArray::new(item, offsets, ScalarBuffer::from(vec![1i32, 2]), values, None)),
        );
        let cases: [(&str, _, _, Cause); 3] = [
            ("column 'c'", column.clone(), fill, Cause::NullFill { column: "c".into(), nulls: 1 }),
            ("column 'r'", ragged, pad, Cause::RaggedPad { column: "r".into() }),
            ("column 'v'", view, never, Cause::ListView { column: "v".into() }),
        ];
        let device = Device::Cuda(1_000);
        let moved = |what: &str| refusal(Cause::ToDevice { what: what.into(), device });
        for (what, (field, chunks), opts, cause) in cases {
            let cpu = column_on(&field, &chunks, &opts, Device::Cpu).map(drop).unwrap_err();
            assert_eq!(cpu.to_string(), refusal(cause), "{what}");
            let gpu = column_on(&field, &chunks, &opts, device).map(drop).unwrap_err();
            assert_eq!(gpu.to_string(), moved(what), "{what}");
        }
        let (fields, columns) = ([column.0.clone(), column.0], [column.1.clone(), column.1]);
        let cpu = matrix_on(&fields, &columns, &fill, Device::Cpu).map(drop).unwrap_err();
        assert_eq!(cpu.to_string(), refusal(Cause::Interleave { columns: 2 }));
        let gpu = matrix_on(&fields, &columns, &fill, device).map(drop).unwrap_err();
        assert_eq!(gpu.to_string(), moved("2 columns"));
    }

    #[test]
    fn copy_false_onto_a_device_is_refused_before_the_device_is_reached() {
        use std::sync::Arc;

        use arrow_array::Float32Array;
        use arrow_schema::{DataType, Field};
        let field: FieldRef = Arc::new(Field::new("x", DataType::Float32, false));
        let chunks: Vec<ArrayRef> = vec![Arc::new(Float32Array::from(vec![1.0, 2.0]))];
        let never = ExportOptions { copy: crate::options::CopyPolicy::Never, ..Default::default() };
        // Shared on the CPU; a copy onto any CUDA device, present or not.
        assert!(column_on(&field, &chunks, &never, Device::Cpu).is_ok());
        for device in [Device::Cuda(0), Device::Cuda(1_000)] {
            let e = column_on(&field, &chunks, &never, device).unwrap_err();
            assert!(matches!(&e, Error::CopyRequired { reason } if reason.contains("column 'x'")), "{e}");
            let e = matrix_on(std::slice::from_ref(&field), std::slice::from_ref(&chunks), &never, device)
                .unwrap_err();
            assert!(
                matches!(&e, Error::CopyRequired { reason } if reason.contains(&device.to_string())),
                "{e}"
            );
        }
    }
}

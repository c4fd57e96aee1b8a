//! The tensor a DLPack allocator hands out for a prototype: zeroed, C-contiguous, of the
//! prototype's shape, dtype and device (the exchange API's `managed_tensor_allocator`).

use super::export::export_versioned;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::dlpack::{DLManagedTensorVersioned, DLTensor};
use crate::tensor::Tensor;
use crate::transfer;

/// [`zeros_like`] handed over as the exchange API's `managed_tensor_allocator` hands it: a new
/// versioned managed tensor written to `out`, which the caller owns (allocates).
///
/// # Errors
/// [`Error::InvalidArgument`] for a NULL `out`; the errors of [`zeros_like`].
///
/// # Safety
/// `prototype` as [`zeros_like`] has it; `out` is NULL or writable.
pub unsafe fn allocate_into(
    prototype: *const DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::InvalidArgument("the DLPack allocator was handed a NULL output".into()));
    }
    // SAFETY: the caller's contract.
    let t = unsafe { zeros_like(prototype) }?;
    // SAFETY: `out` is writable (checked non-NULL); the caller owns the new tensor.
    unsafe { *out = export_versioned(t).into_raw() };
    Ok(())
}

/// A new zeroed, C-contiguous tensor shaped like `prototype` (its shape, dtype and device) on the
/// CPU or a CUDA device (allocates; reads only the prototype's description, never its data).
///
/// # Errors
/// [`Error::InvalidArgument`] for a NULL prototype or one whose `ndim` and `shape` disagree;
/// [`Error::UnsupportedDType`] and [`Error::UnsupportedDevice`] as the importer refuses them;
/// a device error.
///
/// # Safety
/// `prototype` is NULL or a readable `DLTensor` whose `shape` holds `ndim` extents.
pub unsafe fn zeros_like(prototype: *const DLTensor) -> Result<Tensor> {
    // SAFETY: the caller's contract.
    let Some(p) = (unsafe { prototype.as_ref() }) else {
        return Err(Error::InvalidArgument("the DLPack allocator was handed a NULL prototype".into()));
    };
    let shape = if p.ndim == 0 {
        Vec::new()
    } else if p.ndim < 0 || p.shape.is_null() {
        return Err(Error::InvalidArgument(format!(
            "the DLPack allocator's prototype has ndim {} and shape {:p}",
            p.ndim, p.shape
        )));
    } else {
        // SAFETY: the prototype's shape holds ndim extents (the caller's contract).
        unsafe { std::slice::from_raw_parts(p.shape, p.ndim as usize) }.to_vec()
    };
    let dtype = DType::from_dlpack(p.dtype)?;
    let device = Device::from_dlpack(p.device)?;
    let host = Tensor::zeros(dtype, shape)?;
    match device {
        Device::Cpu => Ok(host),
        d => transfer::move_to(&host, d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{ForeignTensor, borrowed_view};

    /// [`zeros_like`] of a view of this module's.
    fn zeros(view: &DLTensor) -> Result<Tensor> {
        // SAFETY: every view here is a `borrowed_view` of a tensor alive across the call (its
        // shape holds ndim extents), or one with its shape set to NULL, refused unread.
        unsafe { zeros_like(view) }
    }

    #[test]
    fn a_prototype_gives_zeros_of_its_shape_and_bad_ones_are_errors() {
        let p = Tensor::from_vec(vec![7.0f32; 6], vec![2, 3]).unwrap();
        let view = borrowed_view(&p);
        let z = zeros(&view).unwrap();
        assert_eq!((z.shape(), z.dtype(), z.device()), (&[2i64, 3][..], DType::Float32, Device::Cpu));
        assert_eq!(z.as_slice::<f32>().unwrap(), [0.0; 6]);
        // SAFETY: NULL is allowed.
        assert!(matches!(unsafe { zeros_like(std::ptr::null()) }, Err(Error::InvalidArgument(_))));
        let mut bad = borrowed_view(&p);
        bad.shape = std::ptr::null_mut();
        assert!(matches!(zeros(&bad), Err(Error::InvalidArgument(_))));
        let mut odd = borrowed_view(&p);
        odd.dtype.lanes = 4;
        assert!(matches!(zeros(&odd), Err(Error::UnsupportedDType { .. })));
    }

    #[test]
    fn the_allocator_hands_over_one_owned_tensor_or_refuses_a_null_output() {
        let p = Tensor::from_vec(vec![1i64; 3], vec![3]).unwrap();
        let view = borrowed_view(&p);
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: the view describes `p` and `out` is writable; the allocator's new tensor is
        // then owned here and taken once.
        let z = unsafe { allocate_into(&view, &mut out).and_then(|()| ForeignTensor::from_versioned(out)) };
        let z = z.unwrap().into_tensor();
        assert_eq!((z.shape(), z.as_slice::<i64>().unwrap()), (&[3i64][..], &[0i64; 3][..]));
        // SAFETY: a NULL output is refused before anything is written.
        let e = unsafe { allocate_into(&view, std::ptr::null_mut()) }.unwrap_err();
        assert!(e.to_string().contains("NULL output"), "{e}");
    }
}

//! The tensor a DLPack allocator hands out for a prototype: zeroed, C-contiguous, of the
//! prototype's shape, dtype and device (the exchange API's `managed_tensor_allocator`).

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::dlpack::DLTensor;
use crate::tensor::Tensor;
use crate::transfer;

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
    use crate::dlpack::borrowed_view;

    #[test]
    fn a_prototype_gives_zeros_of_its_shape_and_bad_ones_are_errors() {
        let p = Tensor::from_vec(vec![7.0f32; 6], vec![2, 3]).unwrap();
        let view = borrowed_view(&p);
        // SAFETY: the view describes `p`, alive across the call.
        let z = unsafe { zeros_like(&view) }.unwrap();
        assert_eq!((z.shape(), z.dtype(), z.device()), (&[2i64, 3][..], DType::Float32, Device::Cpu));
        assert_eq!(z.as_slice::<f32>().unwrap(), [0.0; 6]);
        // SAFETY: NULL is allowed.
        assert!(matches!(unsafe { zeros_like(std::ptr::null()) }, Err(Error::InvalidArgument(_))));
        let mut bad = borrowed_view(&p);
        bad.shape = std::ptr::null_mut();
        // SAFETY: a readable DLTensor whose NULL shape is refused before it is read.
        assert!(matches!(unsafe { zeros_like(&bad) }, Err(Error::InvalidArgument(_))));
        let mut odd = borrowed_view(&p);
        odd.dtype.lanes = 4;
        // SAFETY: as above; the dtype is refused.
        assert!(matches!(unsafe { zeros_like(&odd) }, Err(Error::UnsupportedDType { .. })));
    }
}

//! Strided (also negative and zero strides) tensors -> one contiguous C-order buffer.

use super::alloc::HostBuffer;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Copies the elements of a strided view into `out` in C order (copies).
///
/// # Safety
/// For every index `i` in the index space of `shape`, `base.offset(sum(i_k * strides_k))` is a
/// valid read of a `T` (the caller validated the extent), and `out.len()` is the product of
/// `shape`.
pub unsafe fn gather_strided<T: Copy>(base: *const T, shape: &[usize], strides: &[isize], out: &mut [T]) {
    debug_assert_eq!(out.len(), shape.iter().product::<usize>());
    if out.is_empty() {
        return;
    }
    match shape.len() {
        0 => {
            // SAFETY: a 0-d tensor has one element at base.
            out[0] = unsafe { *base };
        }
        1 if strides[0] == 1 => {
            // SAFETY: shape[0] contiguous elements from base are readable.
            out.copy_from_slice(unsafe { std::slice::from_raw_parts(base, shape[0]) });
        }
        1 => {
            for (i, o) in out.iter_mut().enumerate() {
                // SAFETY: i * stride is inside the validated extent.
                *o = unsafe { *base.offset(i as isize * strides[0]) };
            }
        }
        _ => {
            let inner: usize = shape[1..].iter().product();
            for (i, chunk) in out.chunks_exact_mut(inner).enumerate() {
                // SAFETY: row i of the outer dimension is inside the extent; the rest recurses
                // over the same promise.
                unsafe {
                    gather_strided(base.offset(i as isize * strides[0]), &shape[1..], &strides[1..], chunk)
                }
            }
        }
    }
}

/// A fresh, writable, C-contiguous, 64-byte aligned copy of a host tensor, marked copied;
/// the logical type carries over (copies).
///
/// # Errors
/// [`Error::CopyRequired`] for memory the CPU cannot read.
pub fn contiguous_copy(t: &Tensor) -> Result<Tensor> {
    if !t.device().is_host_accessible() {
        return Err(Error::CopyRequired {
            reason: format!("the tensor is on {}; copy it to the host first", t.device()),
        });
    }
    let item = t.dtype().itemsize();
    let mut buf = HostBuffer::zeroed(t.nbytes())?;
    let shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
    let strides: Vec<isize> = t.strides().iter().map(|&s| s as isize).collect();
    macro_rules! go {
        ($ty:ty) => {{
            let out: &mut [$ty] = buf.typed_mut();
            // SAFETY: the tensor's layout was validated at construction and its owner keeps
            // the memory alive; elements are plain bytes of this size.
            unsafe { gather_strided(t.data_ptr() as *const $ty, &shape, &strides, out) }
        }};
    }
    // Elements are copied as unsigned integers of their size: alignment of the source is not
    // assumed (misaligned foreign memory is copied byte-wise).
    if t.numel() > 0 {
        if (t.data_ptr() as usize) % item == 0 {
            match item {
                1 => go!(u8),
                2 => go!(u16),
                4 => go!(u32),
                _ => go!(u64),
            }
        } else {
            gather_bytes(t, &shape, &strides, buf.as_mut_slice());
        }
    }
    let copy = Tensor::from_buffer(buf.into_buffer(), 0, t.shape().to_vec(), None, t.dtype())?;
    Ok(copy.with_copied(true).with_logical(t.logical().cloned()))
}

/// The unaligned fallback: element by element through byte arrays (alignment 1).
fn gather_bytes(t: &Tensor, shape: &[usize], strides: &[isize], out: &mut [u8]) {
    macro_rules! go {
        ($n:literal) => {{
            let (head, elems, _) = {
                // SAFETY: [u8; N] has alignment 1, so any byte slice of whole elements casts.
                unsafe { out.align_to_mut::<[u8; $n]>() }
            };
            debug_assert!(head.is_empty());
            // SAFETY: as in contiguous_copy; [u8; N] reads have no alignment requirement.
            unsafe { gather_strided(t.data_ptr() as *const [u8; $n], shape, strides, elems) }
        }};
    }
    match t.dtype().itemsize() {
        1 => go!(1),
        2 => go!(2),
        4 => go!(4),
        _ => go!(8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::device::Device;

    fn view(t: &Tensor, offset: isize, shape: Vec<i64>, strides: Vec<i64>) -> Tensor {
        // SAFETY: the tests pick views inside the 24-element allocation.
        unsafe {
            Tensor::from_raw_parts(
                (t.data_ptr() as *mut i32).offset(offset) as *mut u8,
                shape,
                Some(strides),
                DType::Int32,
                Device::Cpu,
                true,
                t.owner().clone(),
            )
        }
        .unwrap()
    }

    #[test]
    fn gathers_transposes_reversals_and_broadcasts() {
        let base = Tensor::from_vec((0..24).collect::<Vec<i32>>(), vec![4, 6]).unwrap();
        let t = view(&base, 0, vec![6, 4], vec![1, 6]);
        let c = contiguous_copy(&t).unwrap();
        assert!(c.copied() && !c.readonly() && c.is_c_contiguous());
        assert_eq!(&c.as_slice::<i32>().unwrap()[..5], &[0, 6, 12, 18, 1]);
        let r = contiguous_copy(&view(&base, 23, vec![24], vec![-1])).unwrap();
        assert_eq!(r.as_slice::<i32>().unwrap()[0], 23);
        let b = contiguous_copy(&view(&base, 5, vec![3, 2], vec![0, 1])).unwrap();
        assert_eq!(b.as_slice::<i32>().unwrap(), &[5, 6, 5, 6, 5, 6]);
        let s = contiguous_copy(&view(&base, 7, vec![], vec![])).unwrap();
        assert_eq!(s.as_slice::<i32>().unwrap(), &[7]);
        let e = contiguous_copy(&view(&base, 0, vec![0, 3], vec![3, 1])).unwrap();
        assert_eq!(e.numel(), 0);
    }

    #[test]
    fn misaligned_memory_is_copied_bytewise() {
        let bytes = Tensor::from_vec((0u8..17).collect::<Vec<_>>(), vec![17]).unwrap();
        // SAFETY: 1 + 2 * 8 = 17 bytes are inside the allocation.
        let t = unsafe {
            Tensor::from_raw_parts(
                (bytes.data_ptr() as *mut u8).add(1),
                vec![2],
                None,
                DType::Float64,
                Device::Cpu,
                true,
                bytes.owner().clone(),
            )
        }
        .unwrap();
        let c = contiguous_copy(&t).unwrap();
        assert!(c.is_aligned());
        let raw: Vec<u8> = c.as_slice::<f64>().unwrap().iter().flat_map(|f| f.to_ne_bytes()).collect();
        assert_eq!(raw, (1u8..17).collect::<Vec<_>>());
    }
}

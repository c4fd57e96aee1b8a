//! Tensor -> Arrow with the copy fallback: zero-copy through `from_tensor.rs` when the memory
//! allows, else (unless `copy=False`) one gather/pack pass into a fresh buffer.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_buffer::MutableBuffer;
use arrow_schema::{DataType, FieldRef};

use super::extension::TensorMetadata;
use super::from_tensor::tensor_to_column;
use crate::decide::{Cause, decide};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::options::CopyPolicy;
use crate::tensor::Tensor;

/// A tensor as an Arrow column: zero-copy when the memory allows, else (unless
/// [`CopyPolicy::Never`]) one gather/pack pass into a fresh buffer. Bool tensors become Arrow
/// booleans (packed). Device memory is refused here: the CUDA layer copies it to the host.
///
/// # Errors
/// [`Error::CopyRequired`] under [`CopyPolicy::Never`] when a copy is needed, or for device
/// memory; the errors of [`tensor_to_column`].
pub fn tensor_to_column_with(tensor: &Tensor, name: &str, copy: CopyPolicy) -> Result<(FieldRef, ArrayRef)> {
    if !tensor.device().is_host_accessible() {
        return Err(Cause::OnDevice(tensor.device()).refused());
    }
    if tensor.dtype() == DType::Bool {
        decide(copy, Some(Cause::BoolTensor))?;
    } else if copy != CopyPolicy::Always {
        match tensor_to_column(tensor, name) {
            // The view's refusal is the decision's: copy=False keeps it, else the copy below.
            Err(Error::CopyRequired { .. } | Error::Misaligned { .. }) if copy != CopyPolicy::Never => {}
            done => return done,
        }
    }
    let fresh = kernels::contiguous_copy(tensor)?;
    if fresh.dtype() == DType::Bool {
        return bool_column(&fresh, name);
    }
    tensor_to_column(&fresh, name)
}

/// Whether `pyarrow.Array.from_dlpack` makes of `t` exactly what [`tensor_to_column_with`]
/// makes without `copy=True`: a non-empty, aligned, contiguous 1-D host tensor of integers or IEEE
/// floats with no Arrow type of its own, and writable (a pyarrow that asks for a legacy capsule
/// would get a copy of read-only memory). `interface::ndarray::is_plain_1d` is the same rule over
/// numpy's struct.
pub fn is_plain_1d(t: &Tensor) -> bool {
    t.ndim() == 1
        && t.numel() > 0
        && !t.readonly()
        && t.logical().is_none()
        && t.dtype() != DType::Bool
        && t.dtype().arrow_extension().is_none()
        && t.check_host_contiguous().is_ok()
}

/// Packs a contiguous bool tensor into an Arrow boolean column (1-D) or tensor column.
fn bool_column(t: &Tensor, name: &str) -> Result<(FieldRef, ArrayRef)> {
    let bytes = t.as_slice::<u8>().or_else(|_| {
        // SAFETY: a contiguous host bool tensor is numel bytes of 0/1 kept alive by `t`.
        Ok::<_, Error>(unsafe { std::slice::from_raw_parts(t.data_ptr(), t.numel()) })
    })?;
    let mut packed = MutableBuffer::from_len_zeroed(bytes.len().div_ceil(8));
    kernels::pack_bits(bytes, packed.as_slice_mut());
    let values =
        arrow_array::BooleanArray::new(arrow_buffer::BooleanBuffer::new(packed.into(), 0, bytes.len()), None);
    let values: ArrayRef = Arc::new(values);
    let shape: Vec<i64> = if t.ndim() == 0 { vec![1] } else { t.shape().to_vec() };
    if shape.len() == 1 {
        return Ok((Arc::new(arrow_schema::Field::new(name, DataType::Boolean, false)), values));
    }
    let meta = TensorMetadata {
        shape: shape[1..].iter().map(|&d| d as usize).collect(),
        dim_names: None,
        permutation: None,
    };
    let item = Arc::new(arrow_schema::Field::new("item", DataType::Boolean, true));
    let storage = arrow_array::FixedSizeListArray::try_new_with_length(
        item,
        meta.cell_size() as i32,
        values,
        None,
        shape[0] as usize,
    )?;
    let field = arrow_schema::Field::new(name, storage.data_type().clone(), false)
        .with_metadata(meta.field_metadata());
    Ok((Arc::new(field), Arc::new(storage)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_tensor_is_a_writable_vector_of_numbers() {
        let v = || Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], vec![4]).unwrap();
        assert!(is_plain_1d(&v()));
        assert!(!is_plain_1d(&v().with_readonly(true)));
        assert!(!is_plain_1d(&Tensor::from_vec(vec![1.0f32; 4], vec![2, 2]).unwrap()));
        assert!(!is_plain_1d(&Tensor::from_vec(Vec::<f32>::new(), vec![0]).unwrap()));
        assert!(!is_plain_1d(
            &Tensor::from_vec(vec![1u8, 0], vec![2]).unwrap().view_as(DType::Bool).unwrap()
        ));
        let bf16 = Tensor::from_vec(vec![0u16; 2], vec![2]).unwrap().view_as(DType::BFloat16).unwrap();
        assert!(!is_plain_1d(&bf16));
    }
}

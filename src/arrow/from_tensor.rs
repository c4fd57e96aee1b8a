//! Tensor -> Arrow (without copying), restoring the logical type the tensor came from.

use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray, make_array};
use arrow_buffer::{BooleanBuffer, Buffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, FieldRef};

use super::extension::TensorMetadata;
use crate::decide::Cause;
use crate::dtype::{DType, storage_dtype};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, c_strides, is_c_contiguous};

/// An Arrow array over a tensor's memory (without copying); see [`tensor_to_column`].
///
/// # Errors
/// As [`tensor_to_column`].
pub fn tensor_to_array(tensor: &Tensor) -> Result<ArrayRef> {
    tensor_to_column(tensor, "").map(|(_, array)| array)
}

/// An Arrow column over a tensor's memory (without copying), with its field.
///
/// 1-D tensors become primitive arrays, N-d tensors `arrow.fixed_shape_tensor` columns (or the
/// nested FixedSizeList they came from), and a 0-d tensor one value. The logical type recorded
/// on the tensor is restored when it still fits the shape and dtype. The tensor (and so whatever
/// owns its memory) stays alive until the last Arrow buffer over it is dropped, on any thread.
///
/// # Errors
/// [`Error::CopyRequired`] for device memory, bool tensors (Arrow bit-packs booleans) and
/// strided layouts; [`Error::Misaligned`] for pointers not aligned to the element size. The
/// copying fallbacks live in the kernels layer.
pub fn tensor_to_column(tensor: &Tensor, name: &str) -> Result<(FieldRef, ArrayRef)> {
    if !tensor.device().is_host_accessible() {
        return Err(Cause::OnDevice(tensor.device()).refused());
    }
    if tensor.dtype() == crate::DType::Bool {
        return Err(Cause::BoolTensor.refused());
    }
    if tensor.numel() > 0 && !tensor.is_aligned() {
        return Err(Error::Misaligned { ptr: tensor.data_ptr() as usize, align: tensor.dtype().itemsize() });
    }
    let shape: Vec<i64> = if tensor.ndim() == 0 { vec![1] } else { tensor.shape().to_vec() };
    let strides: Vec<i64> = if tensor.ndim() == 0 { vec![1] } else { tensor.strides().to_vec() };
    let permutation = physical_order(&shape, &strides).ok_or_else(|| {
        Cause::Strided { shape: shape.clone(), strides: strides.clone(), needs: "contiguous" }.refused()
    })?;
    let leaf_type = leaf_type(tensor, &shape);
    let values = values_array(tensor, leaf_type)?;
    if shape.len() == 1 {
        let nullable = values.null_count() > 0;
        let field = match tensor.logical() {
            Some(f) if f.data_type() == values.data_type() && (f.is_nullable() || !nullable) => f.clone(),
            _ => Arc::new(value_field(name, tensor.dtype(), values.data_type(), nullable)),
        };
        return Ok((field, values));
    }
    let n = shape[0] as usize;
    if permutation.is_none()
        && let Some((field, array)) = restore_nested(tensor, &shape, &values, n)?
    {
        return Ok((field, array));
    }
    let phys: Vec<usize> = match &permutation {
        Some(order) => order.iter().map(|&i| shape[1 + i] as usize).collect(),
        None => shape[1..].iter().map(|&d| d as usize).collect(),
    };
    let meta = TensorMetadata { shape: phys, dim_names: None, permutation: permutation.map(|o| inverse(&o)) };
    let item = Arc::new(value_field("item", tensor.dtype(), values.data_type(), true));
    // An empty tensor's later dimensions are unbounded by its (zero) size, so their product
    // is checked here.
    let cell = meta.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let cell = cell.and_then(|c| i32::try_from(c).ok()).ok_or_else(|| {
        Error::layout(format!(
            "a cell of shape {:?} exceeds Arrow's list size (i32::MAX elements)",
            meta.shape
        ))
    })?;
    let storage = FixedSizeListArray::try_new_with_length(item, cell, values, None, n)?;
    let field = match tensor.logical() {
        Some(f)
            if f.data_type() == arrow_array::Array::data_type(&storage)
                && TensorMetadata::from_field(f)? == Some(meta.clone()) =>
        {
            f.clone()
        }
        _ => Arc::new(
            Field::new(name, arrow_array::Array::data_type(&storage).clone(), false)
                .with_metadata(meta.field_metadata()),
        ),
    };
    Ok((field, Arc::new(storage)))
}

/// The field of the leaf values: the dtype's own Arrow field (bfloat16 with its extension
/// metadata) when the values have its type, else a plain field of their (logical) type.
fn value_field(name: &str, dtype: DType, dt: &DataType, nullable: bool) -> Field {
    if *dt == dtype.to_arrow() {
        dtype.arrow_field(name, nullable)
    } else {
        Field::new(name, dt.clone(), nullable)
    }
}

/// The Arrow type of the leaf values: the recorded logical leaf when it stores this dtype. A
/// scalar logical type (a numpy datetime's timestamp or duration) is the leaf at any rank, so a
/// 2-D `m8[m]` keeps its unit rather than becoming bare integers.
fn leaf_type(tensor: &Tensor, shape: &[i64]) -> DataType {
    let mut dt = tensor.logical().map(|f| f.data_type().clone());
    let nested = matches!(dt, Some(DataType::FixedSizeList(..)));
    for _ in (1..shape.len()).filter(|_| nested) {
        dt = match dt {
            Some(DataType::FixedSizeList(child, _)) => Some(child.data_type().clone()),
            _ => None,
        };
    }
    match dt {
        Some(dt)
            if !matches!(dt, DataType::FixedSizeList(..))
                && storage_dtype(&dt).ok() == Some(tensor.dtype()) =>
        {
            dt
        }
        _ => tensor.dtype().to_arrow(),
    }
}

/// The flat values as one primitive array whose buffer is owned by a clone of the tensor.
fn values_array(tensor: &Tensor, leaf_type: DataType) -> Result<ArrayRef> {
    let numel = tensor.numel();
    let buffer = match NonNull::new(tensor.data_ptr() as *mut u8) {
        Some(ptr) if numel > 0 => {
            let len = tensor.nbytes();
            // SAFETY: the tensor is host-accessible, and its `numel` elements occupy exactly
            // [data, data + len) because the layout is contiguous up to a permutation with
            // non-negative strides (checked by the caller). The owner keeps the memory alive
            // and unchanged for as long as the Buffer lives.
            unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(tensor.clone())) }
        }
        // MutableBuffer aligns even its empty dangling pointer to 64 bytes.
        _ => arrow_buffer::MutableBuffer::new(0).into(),
    };
    let nulls = not_a_time(&leaf_type, &buffer, numel);
    let data = ArrayData::try_new(leaf_type, numel, nulls, 0, vec![buffer], vec![])?;
    Ok(make_array(data))
}

/// The validity of datetime values: numpy's NaT (the storage's smallest value) is null. One
/// pass over the values, which stay shared; None where there is no NaT or no datetime.
fn not_a_time(leaf_type: &DataType, values: &Buffer, numel: usize) -> Option<Buffer> {
    let valid = match leaf_type {
        DataType::Timestamp(..) | DataType::Duration(_) => {
            let v = &values.typed_data::<i64>()[..numel];
            BooleanBuffer::collect_bool(numel, |i| v[i] != i64::MIN)
        }
        DataType::Date32 => {
            let v = &values.typed_data::<i32>()[..numel];
            BooleanBuffer::collect_bool(numel, |i| v[i] != i32::MIN)
        }
        _ => return None,
    };
    (valid.count_set_bits() < numel).then(|| valid.into_inner())
}

/// Rebuilds the nested FixedSizeList the tensor came from, if its sizes still match.
fn restore_nested(
    tensor: &Tensor,
    shape: &[i64],
    values: &ArrayRef,
    n: usize,
) -> Result<Option<(FieldRef, ArrayRef)>> {
    let Some(field) = tensor.logical() else { return Ok(None) };
    if TensorMetadata::from_field(field)?.is_some() {
        return Ok(None);
    }
    let mut levels = Vec::new();
    let mut dt = field.data_type();
    while let DataType::FixedSizeList(child, size) = dt {
        levels.push((child.clone(), *size));
        dt = child.data_type();
    }
    let sizes: Vec<i64> = levels.iter().map(|(_, s)| *s as i64).collect();
    if sizes != shape[1..] || dt != values.data_type() {
        return Ok(None);
    }
    let mut array = values.clone();
    for (k, (child, size)) in levels.into_iter().enumerate().rev() {
        // Checked: with no rows, nested list sizes are not bounded by any buffer.
        let count = sizes[..k]
            .iter()
            .try_fold(n, |acc, &d| acc.checked_mul(d as usize))
            .ok_or_else(|| Error::layout(format!("nested list sizes {sizes:?} overflow")))?;
        array = Arc::new(FixedSizeListArray::try_new_with_length(child, size, array, None, count)?);
    }
    Ok(Some((field.clone(), array)))
}

/// `None` when the cells are not laid out densely (also with negative strides); `Some(None)`
/// for C order; `Some(Some(order))` when the inner dimensions are a permutation of C order,
/// where `order[j]` is the logical dimension stored as physical dimension `j`.
fn physical_order(shape: &[i64], strides: &[i64]) -> Option<Option<Vec<usize>>> {
    if is_c_contiguous(shape, strides) {
        return Some(None);
    }
    let (inner_shape, inner_strides) = (&shape[1..], &strides[1..]);
    let cell: i64 = inner_shape.iter().product();
    if inner_shape.len() < 2 || (shape[0] > 1 && strides[0] != cell) {
        return None;
    }
    let mut order: Vec<usize> = (0..inner_shape.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(inner_strides[i]), i));
    let phys_shape: Vec<i64> = order.iter().map(|&i| inner_shape[i]).collect();
    let expected = c_strides(&phys_shape);
    let dense = order.iter().zip(&expected).all(|(&i, &e)| inner_shape[i] == 1 || inner_strides[i] == e);
    dense.then_some(Some(order))
}

fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (j, &i) in order.iter().enumerate() {
        inv[i] = j;
    }
    inv
}

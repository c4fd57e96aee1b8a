//! Arrow -> Tensor (without copying).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, FixedSizeListArray};
use arrow_schema::{DataType, Field, FieldRef};

use super::layout::CellLayout;
use crate::decide::Cause;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, c_strides};

/// A tensor over an unnamed Arrow array (without copying).
///
/// Primitive arrays become 1-D, FixedSizeLists `(n, d1, ...)`. The array's type is kept on the
/// tensor so [`tensor_to_array`](super::tensor_to_array) restores it.
///
/// # Errors
/// [`Error::Nulls`] when the array (or a nested child) has nulls,
/// [`Error::UnsupportedArrowType`] for types with no tensor form, and [`Error::CopyRequired`]
/// for bit-packed booleans.
pub fn array_to_tensor(array: &dyn Array) -> Result<Tensor> {
    let field = Arc::new(Field::new("", array.data_type().clone(), true));
    column_to_tensor(&field, array)
}

/// A tensor over a named Arrow column (without copying), honouring the field's
/// `arrow.fixed_shape_tensor` extension metadata: such a column becomes `(n, *shape)` with
/// strides that follow its `permutation`.
///
/// # Errors
/// As [`array_to_tensor`], plus [`Error::InvalidExtensionMetadata`] when the metadata does not
/// fit the storage.
pub fn column_to_tensor(field: &FieldRef, array: &dyn Array) -> Result<Tensor> {
    if field.data_type() != array.data_type() {
        return Err(Error::InvalidArgument(format!(
            "field {:?} has type {} but the array has type {}",
            field.name(),
            field.data_type(),
            array.data_type()
        )));
    }
    if matches!(array.data_type(), DataType::List(_) | DataType::LargeList(_)) {
        let (field, array) = super::lists_as_fixed(field, &arrow_array::make_array(array.to_data()))?;
        return column_to_tensor(&field, array.as_ref());
    }
    // The field's layout names the leaf dtype (and refuses a leaf with none).
    let layout = CellLayout::from_field(field)?;
    let mut dims = vec![array.len() as i64];
    let leaf = descend(field.name(), array, &mut dims)?;
    let (shape, strides) = layout.column(array.len());
    Ok(from_leaf(leaf, layout.dtype, shape, Some(strides))?.with_logical(Some(field.clone())))
}

/// Walks FixedSizeLists down to the primitive leaf, pushing each list size onto `dims`.
/// Slices are already folded into the child arrays.
fn descend<'a>(column: &str, array: &'a dyn Array, dims: &mut Vec<i64>) -> Result<&'a dyn Array> {
    if array.null_count() > 0 {
        return Err(Error::Nulls {
            column: if dims.len() > 1 {
                format!("'{column}' (nested level {})", dims.len() - 1)
            } else {
                format!("'{column}'")
            },
            null_count: array.null_count(),
        });
    }
    match array.data_type() {
        DataType::FixedSizeList(_, size) => {
            let list: &FixedSizeListArray = array.as_fixed_size_list();
            dims.push(*size as i64);
            descend(column, list.values().as_ref(), dims)
        }
        DataType::Boolean => Err(Cause::BitPacked { column: column.to_string() }.refused()),
        // Its dtype was read from the field.
        _ => Ok(array),
    }
}

/// A tensor over a primitive leaf array's values (without copying; the leaf's nulls are not
/// read); `declared` is the leaf dtype its field gave.
pub(crate) fn from_leaf(
    leaf: &dyn Array,
    declared: DType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
) -> Result<Tensor> {
    let dtype = crate::dtype::leaf_dtype(leaf.data_type(), declared)?;
    let data = leaf.to_data();
    let buffer = data.buffers()[0].clone();
    let numel: usize = shape.iter().map(|&d| d as usize).product();
    if numel != leaf.len() {
        return Err(Error::layout(format!("shape {shape:?} does not hold the {} leaf values", leaf.len())));
    }
    let strides = strides.unwrap_or_else(|| c_strides(&shape));
    Tensor::from_buffer(buffer, data.offset() * dtype.itemsize(), shape, Some(strides), dtype)
}

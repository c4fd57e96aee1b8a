//! What a tensor column is in SQL: FixedSizeList storage (nested or flat with
//! `arrow.fixed_shape_tensor` metadata), a numeric leaf type and a fixed cell shape, as the
//! core's [`CellLayout`] reads it.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray};
use arrow_schema::{DataType, Field, FieldRef};
use dlframe::arrow::{CellLayout, TensorMetadata};
use dlframe::{DType, Error, Result};

/// The layout of a tensor column's rows, read from its field by the core's one rule
/// ([`CellLayout::from_field`]); scalar columns are refused here, since the tensor functions
/// take the FixedSizeList columns that `to_tensor` makes.
///
/// # Errors
/// [`Error::UnsupportedArrowType`] for a column that is not a FixedSizeList or has a
/// non-numeric leaf, and [`Error::InvalidExtensionMetadata`] when the metadata does not match
/// the storage.
pub fn tensor_type(field: &Field) -> Result<CellLayout> {
    if !matches!(field.data_type(), DataType::FixedSizeList(..)) {
        return Err(Error::UnsupportedArrowType {
            what: format!("column '{}' of type {}", field.name(), field.data_type()),
            remedy: "tensor functions take the FixedSizeList columns that to_tensor makes",
        });
    }
    CellLayout::from_field(field)
}

/// The leaf field the UDFs write for a dtype: `item`, non-null (bfloat16 with its extension
/// metadata).
pub fn item_field(dtype: DType) -> FieldRef {
    Arc::new(dtype.arrow_field("item", false))
}

/// The field of a flat tensor column: `FixedSizeList<item: leaf>[cell]` with
/// `arrow.fixed_shape_tensor` metadata.
pub fn tensor_field(name: &str, leaf: FieldRef, meta: &TensorMetadata, nullable: bool) -> Result<Field> {
    let cell = i32::try_from(meta.cell_size()).map_err(|_| {
        Error::InvalidArgument(format!("a cell of {} elements exceeds Arrow's list size", meta.cell_size()))
    })?;
    Ok(Field::new(name, DataType::FixedSizeList(leaf, cell), nullable).with_metadata(meta.field_metadata()))
}

/// The flat leaf values of a (possibly nested) FixedSizeList column, `len * cell` of them,
/// without copying. Nulls below the row level are refused, since a flat cell cannot keep them.
pub fn flat_values(array: &FixedSizeListArray) -> Result<ArrayRef> {
    let mut values = array.values().slice(0, array.len() * array.value_length() as usize);
    while let Some(inner) = values.as_any().downcast_ref::<FixedSizeListArray>() {
        if inner.null_count() > 0 {
            return Err(Error::InvalidArgument(
                "a nested list level has nulls, which a flat tensor cell cannot keep".into(),
            ));
        }
        values = inner.values().slice(0, inner.len() * inner.value_length() as usize);
    }
    Ok(values)
}

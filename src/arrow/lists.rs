//! Variable-size lists whose rows all have one length, seen as FixedSizeLists (no copy).
//!
//! With equal lengths the child values between the first and the last offset are exactly
//! `n * d` dense values, so a `List<T>` (or `LargeList<T>`) is a `FixedSizeList<T>[d]` over a
//! slice of its child. Every FixedSizeList path (zero-copy, fill, mask, nesting) then applies.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, OffsetSizeTrait};
use arrow_schema::{DataType, Field, FieldRef};

use crate::error::{Error, Result};

/// True for the column types whose rows are tensor cells: List, LargeList and FixedSizeList
/// (`arrow.fixed_shape_tensor` is stored as a FixedSizeList). A table whose only column is one
/// of these is that column's tensor; plain columns stack into a matrix.
pub fn is_list_like(dt: &DataType) -> bool {
    matches!(dt, DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..))
}

/// The column with every (nested) List/LargeList rewritten as a FixedSizeList view; other
/// columns come back unchanged.
///
/// # Errors
/// [`Error::LengthMismatch`] naming the first row whose length differs from row 0's.
pub fn lists_as_fixed(field: &FieldRef, array: &ArrayRef) -> Result<(FieldRef, ArrayRef)> {
    let fixed: ArrayRef = match array.data_type() {
        DataType::List(_) => fixed(field.name(), array.as_list::<i32>())?,
        DataType::LargeList(_) => fixed(field.name(), array.as_list::<i64>())?,
        DataType::FixedSizeList(child, size) => {
            let list = array.as_fixed_size_list();
            let (child_field, values) = lists_as_fixed(child, list.values())?;
            if Arc::ptr_eq(&values, list.values()) {
                return Ok((field.clone(), array.clone()));
            }
            Arc::new(FixedSizeListArray::try_new_with_length(
                child_field,
                *size,
                values,
                list.nulls().cloned(),
                list.len(),
            )?)
        }
        _ => return Ok((field.clone(), array.clone())),
    };
    let f = Field::new(field.name(), fixed.data_type().clone(), field.is_nullable())
        .with_metadata(field.metadata().clone());
    Ok((Arc::new(f), fixed))
}

fn fixed<O: OffsetSizeTrait>(name: &str, list: &arrow_array::GenericListArray<O>) -> Result<ArrayRef> {
    let offsets = list.value_offsets();
    let d = if list.is_empty() { 0 } else { (offsets[1] - offsets[0]).as_usize() };
    for (row, w) in offsets.windows(2).enumerate() {
        let len = (w[1] - w[0]).as_usize();
        if len != d && !list.is_null(row) {
            return Err(Error::LengthMismatch {
                what: format!("row {row} of list column '{name}'"),
                expected: d,
                found: len,
            });
        }
        if len != d {
            // A null row with another length cannot share the fixed layout.
            return Err(Error::LengthMismatch {
                what: format!("null row {row} of list column '{name}' (fill it with a list of {d} first)"),
                expected: d,
                found: len,
            });
        }
    }
    let size = i32::try_from(d).map_err(|_| Error::layout(format!("list length {d} exceeds i32")))?;
    let start = offsets[0].as_usize();
    let values = list.values().slice(start, list.len() * d);
    let (DataType::List(child) | DataType::LargeList(child)) = list.data_type() else {
        return Err(Error::InvalidArgument(format!("column '{name}' is not a list")));
    };
    let (child, values) = lists_as_fixed(child, &values)?;
    Ok(Arc::new(FixedSizeListArray::try_new_with_length(
        child,
        size,
        values,
        list.nulls().cloned(),
        list.len(),
    )?))
}

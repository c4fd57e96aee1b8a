//! ListView and LargeListView columns read as the List and LargeList columns of the same rows.
//!
//! A list view's rows are (offset, size) windows into its values, in any order and possibly
//! overlapping; a List's rows lie end to end. The rows are gathered end to end once (copies),
//! and every List path (equal lengths as tensors, `ragged=` pad and jagged) then applies.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use arrow_array::{Array, ArrayRef, GenericListArray, OffsetSizeTrait, PrimitiveArray};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, FieldRef};

use crate::error::{Error, Result};

/// True for a ListView or LargeListView column, which converts as the list column of its rows.
pub fn is_list_view(dt: &DataType) -> bool {
    matches!(dt, DataType::ListView(_) | DataType::LargeListView(_))
}

/// The List (for a ListView) or LargeList (for a LargeListView) column of the same rows, nulls
/// included, in new buffers; None for any other column.
///
/// # Errors
/// [`Error::InvalidArgument`] for a chunk whose type is not the field's; arrow's errors.
pub fn views_as_lists(field: &FieldRef, chunks: &[ArrayRef]) -> Result<Option<(FieldRef, Vec<ArrayRef>)>> {
    let to = match field.data_type() {
        DataType::ListView(child) => DataType::List(child.clone()),
        DataType::LargeListView(child) => DataType::LargeList(child.clone()),
        _ => return Ok(None),
    };
    let lists = chunks
        .iter()
        .map(|chunk| {
            if chunk.data_type() != field.data_type() {
                return Err(Error::InvalidArgument(format!(
                    "column '{}' has type {} but a chunk has type {}",
                    field.name(),
                    field.data_type(),
                    chunk.data_type()
                )));
            }
            match chunk.data_type() {
                DataType::ListView(_) => laid_end_to_end::<i32>(chunk),
                _ => laid_end_to_end::<i64>(chunk),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((Arc::new(field.as_ref().clone().with_data_type(to)), lists)))
}

/// One list-view chunk's rows gathered end to end into a list array (copies the values).
fn laid_end_to_end<O: OffsetSizeTrait>(chunk: &ArrayRef) -> Result<ArrayRef> {
    let view = chunk.as_list_view::<O>();
    let (DataType::ListView(child) | DataType::LargeListView(child)) = view.data_type() else {
        return Err(Error::InvalidArgument(format!("{} is not a list view", view.data_type())));
    };
    let rows = view.value_offsets().iter().zip(view.value_sizes());
    let indices: Vec<u64> = rows
        .clone()
        .flat_map(|(&at, &size)| (at.as_usize()..at.as_usize() + size.as_usize()).map(|i| i as u64))
        .collect();
    let indices = PrimitiveArray::<UInt64Type>::from(indices);
    let values = arrow_select::take::take(view.values().as_ref(), &indices, None)?;
    let offsets = OffsetBuffer::<O>::from_lengths(rows.map(|(_, size)| size.as_usize()));
    let list = GenericListArray::<O>::try_new(child.clone(), offsets, values, view.nulls().cloned())?;
    Ok(Arc::new(list))
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int32Array, ListViewArray};
    use arrow_buffer::{NullBuffer, ScalarBuffer};
    use arrow_schema::Field;

    use super::*;

    #[test]
    fn rows_in_any_order_become_a_list_of_the_same_rows() {
        let child = Arc::new(Field::new("item", DataType::Int32, false));
        let values: ArrayRef = Arc::new(Int32Array::from(vec![10, 11, 12, 13, 14, 15]));
        // Rows [13, 14], [10, 11], null, [11, 12]: out of order, overlapping.
        let view = ListViewArray::try_new(
            child.clone(),
            ScalarBuffer::from(vec![3, 0, 0, 1]),
            ScalarBuffer::from(vec![2, 2, 0, 2]),
            values,
            Some(NullBuffer::from(vec![true, true, false, true])),
        )
        .unwrap();
        let field: FieldRef = Arc::new(Field::new("v", view.data_type().clone(), true));
        let (f, lists) = views_as_lists(&field, &[Arc::new(view) as ArrayRef]).unwrap().unwrap();
        assert_eq!(f.data_type(), &DataType::List(child));
        let list = lists[0].as_list::<i32>();
        assert_eq!(list.value_offsets(), &[0, 2, 4, 4, 6]);
        let got: Vec<i32> = list.values().as_primitive::<arrow_array::types::Int32Type>().values().to_vec();
        assert_eq!(got, [13, 14, 10, 11, 11, 12]);
        assert!(list.is_null(2) && list.is_valid(3));
        let plain: FieldRef = Arc::new(Field::new("x", DataType::Int32, false));
        assert!(views_as_lists(&plain, &[]).unwrap().is_none());
    }
}

//! What a tensor column is in SQL: FixedSizeList storage (nested or flat with
//! `arrow.fixed_shape_tensor` metadata), a numeric leaf type and a fixed cell shape.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray};
use arrow_schema::{DataType, Field, FieldRef};
use dlframe::arrow::TensorMetadata;
use dlframe::dtype::storage_dtype;
use dlframe::{DType, Error, Result};

/// The type of a tensor column, read from its field.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorType {
    /// The dtype of the leaf values.
    pub dtype: DType,
    /// The Arrow leaf type (a temporal type keeps its name here; the dtype is its storage).
    pub leaf: FieldRef,
    /// The logical shape of one cell.
    pub shape: Vec<i64>,
    /// The logical strides of one cell, in elements of the flat cell.
    pub strides: Vec<i64>,
    /// The physical shape and permutation, when the field carries tensor metadata.
    pub metadata: Option<TensorMetadata>,
    /// Elements per cell.
    pub cell: usize,
}

impl TensorType {
    /// Reads a FixedSizeList field, with or without `arrow.fixed_shape_tensor` metadata.
    ///
    /// # Errors
    /// [`Error::UnsupportedArrowType`] for other types or a non-numeric leaf, and
    /// [`Error::InvalidExtensionMetadata`] when the metadata does not match the storage.
    pub fn from_field(field: &Field) -> Result<Self> {
        let not_tensor = || Error::UnsupportedArrowType {
            what: format!("column '{}' of type {}", field.name(), field.data_type()),
            remedy: "tensor functions take the FixedSizeList columns that to_tensor makes",
        };
        let mut sizes = Vec::new();
        let mut dt = field.data_type();
        let mut leaf = None;
        while let DataType::FixedSizeList(child, size) = dt {
            sizes.push(*size as usize);
            leaf = Some(child.clone());
            dt = child.data_type();
        }
        let leaf = leaf.ok_or_else(not_tensor)?;
        let dtype = storage_dtype(leaf.data_type())?;
        let cell: usize = sizes.iter().product();
        let metadata = TensorMetadata::from_field(field)?;
        let (shape, strides) = match &metadata {
            Some(meta) => {
                if sizes.len() != 1 || meta.cell_size() != cell {
                    return Err(Error::InvalidExtensionMetadata {
                        json: meta.to_json(),
                        reason: format!("the shape does not match the storage type {}", field.data_type()),
                    });
                }
                (meta.logical_shape(), meta.logical_strides())
            }
            None => {
                let shape: Vec<i64> = sizes.iter().map(|&d| d as i64).collect();
                let strides = dlframe::tensor::c_strides(&shape);
                (shape, strides)
            }
        };
        Ok(TensorType { dtype, leaf, shape, strides, metadata, cell })
    }

    /// The physical cell shape and permutation as tensor metadata.
    pub fn physical(&self) -> TensorMetadata {
        self.metadata.clone().unwrap_or_else(|| TensorMetadata {
            shape: self.shape.iter().map(|&d| d as usize).collect(),
            dim_names: None,
            permutation: None,
        })
    }
}

/// The field of a flat tensor column: `FixedSizeList<item: leaf>[cell]` with
/// `arrow.fixed_shape_tensor` metadata.
pub fn tensor_field(name: &str, leaf: FieldRef, meta: &TensorMetadata, nullable: bool) -> Result<Field> {
    let cell = i32::try_from(meta.cell_size()).map_err(|_| {
        Error::InvalidArgument(format!("a cell of {} elements exceeds Arrow's list size", meta.cell_size()))
    })?;
    Ok(Field::new(name, DataType::FixedSizeList(leaf, cell), nullable).with_metadata(meta.field_metadata()))
}

/// The leaf field the UDFs write: `item`, non-null.
pub fn item_field(dtype: &DataType) -> FieldRef {
    Arc::new(Field::new("item", dtype.clone(), false))
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

//! What tensor layout one row of a column has, read from its Arrow field alone: the one answer
//! for the conversions, the SQL functions and the Polars plugin. Reads the type and the tensor
//! extension's metadata (parsed here, once), never values.

use arrow_schema::{DataType, Field, FieldRef};

use super::extension::TensorMetadata;
use crate::dtype::{DType, field_dtype};
use crate::error::{Error, Result};
use crate::tensor::c_strides;

/// The layout of one row (a cell) of a column: a scalar, nested FixedSizeLists, or an
/// `arrow.fixed_shape_tensor` (whose logical dims may be permuted in memory).
#[derive(Debug, Clone, PartialEq)]
pub struct CellLayout {
    /// The dtype of the leaf values (a temporal type's storage dtype).
    pub dtype: DType,
    /// The Arrow leaf field (a temporal type keeps its name here).
    pub leaf: FieldRef,
    /// The logical shape of one cell: `[]` for a scalar column.
    pub shape: Vec<i64>,
    /// The logical strides of one cell, in elements of the flat cell (C order unless the
    /// tensor metadata permutes it).
    pub strides: Vec<i64>,
    /// The tensor extension's metadata, when the field carries it.
    pub metadata: Option<TensorMetadata>,
    /// Leaf values per cell.
    pub cell: usize,
}

impl CellLayout {
    /// Reads a column's field: a scalar, FixedSizeLists nested to any depth, or a flat
    /// FixedSizeList with `arrow.fixed_shape_tensor` metadata.
    ///
    /// # Errors
    /// [`Error::UnsupportedArrowType`] (naming the column) for a leaf with no tensor dtype, and
    /// [`Error::InvalidExtensionMetadata`] when the metadata does not fit the storage.
    pub fn from_field(field: &Field) -> Result<Self> {
        let mut sizes = Vec::new();
        let mut leaf: Option<&FieldRef> = None;
        let mut dt = field.data_type();
        while let DataType::FixedSizeList(child, size) = dt {
            sizes.push(*size as i64);
            leaf = Some(child);
            dt = child.data_type();
        }
        let leaf = match leaf {
            Some(f) => f.clone(),
            None => FieldRef::new(field.clone()),
        };
        let dtype = field_dtype(&leaf).map_err(|e| name_column(e, field))?;
        let metadata = TensorMetadata::from_field(field)?;
        let (shape, strides) = match &metadata {
            Some(meta) => {
                check_extension_storage(field, field.data_type(), meta)?;
                (meta.logical_shape(), meta.logical_strides())
            }
            None => {
                let strides = c_strides(&sizes);
                (sizes, strides)
            }
        };
        let cell = shape.iter().map(|&d| d as usize).product();
        Ok(CellLayout { dtype, leaf, shape, strides, metadata, cell })
    }

    /// Whether a row is one value.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// The physical cell shape and permutation as tensor metadata.
    pub fn physical(&self) -> TensorMetadata {
        self.metadata.clone().unwrap_or_else(|| TensorMetadata {
            shape: self.shape.iter().map(|&d| d as usize).collect(),
            dim_names: None,
            permutation: None,
        })
    }

    /// The shape and strides of `rows` such cells as one tensor: `[rows, *shape]`, C order, or
    /// the permuted order of a tensor column's cells.
    pub fn column(&self, rows: usize) -> (Vec<i64>, Vec<i64>) {
        let shape: Vec<i64> = std::iter::once(rows as i64).chain(self.shape.iter().copied()).collect();
        let strides = match self.metadata {
            Some(_) => std::iter::once(self.cell as i64).chain(self.strides.iter().copied()).collect(),
            None => c_strides(&shape),
        };
        (shape, strides)
    }
}

/// Puts the column's name into an unsupported-type error.
pub(crate) fn name_column(e: Error, field: &Field) -> Error {
    match e {
        Error::UnsupportedArrowType { what, remedy } => {
            Error::UnsupportedArrowType { what: format!("column '{}' of type {what}", field.name()), remedy }
        }
        e => e,
    }
}

/// Checks that a `fixed_shape_tensor` column's storage is a FixedSizeList of exactly the
/// metadata's cell size of scalars; every path that trusts the metadata's shape calls this.
pub(crate) fn check_extension_storage(
    field: &Field,
    storage: &DataType,
    meta: &TensorMetadata,
) -> Result<()> {
    let storage_ok = matches!(storage, DataType::FixedSizeList(child, size)
        if *size as usize == meta.cell_size() && !matches!(child.data_type(), DataType::FixedSizeList(..)));
    if !storage_ok {
        return Err(Error::InvalidExtensionMetadata {
            json: meta.to_json(),
            reason: format!(
                "column '{}' stores {storage}, not a FixedSizeList of {} scalars",
                field.name(),
                meta.cell_size()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::arrow::extension::{EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY, FIXED_SHAPE_TENSOR};

    fn list(child: DataType, size: i32) -> DataType {
        DataType::FixedSizeList(Arc::new(Field::new("item", child, false)), size)
    }

    #[test]
    fn scalars_nested_lists_and_permuted_tensors_have_one_layout() {
        let scalar = CellLayout::from_field(&Field::new("a", DataType::Date32, true)).unwrap();
        assert_eq!((scalar.dtype, scalar.is_scalar(), scalar.cell), (DType::Int32, true, 1));
        assert_eq!(scalar.leaf.data_type(), &DataType::Date32);
        assert_eq!(scalar.column(4), (vec![4], vec![1]));

        let nested =
            CellLayout::from_field(&Field::new("m", list(list(DataType::Float32, 3), 2), true)).unwrap();
        assert_eq!((nested.shape.clone(), nested.strides.clone(), nested.cell), (vec![2, 3], vec![3, 1], 6));
        assert_eq!(nested.column(5), (vec![5, 2, 3], vec![6, 3, 1]));

        let meta = |json: &str| {
            HashMap::from([
                (EXTENSION_NAME_KEY.to_string(), FIXED_SHAPE_TENSOR.to_string()),
                (EXTENSION_METADATA_KEY.to_string(), json.to_string()),
            ])
        };
        let permuted = Field::new("t", list(DataType::Int16, 6), false)
            .with_metadata(meta(r#"{"shape":[2,3],"permutation":[1,0]}"#));
        let t = CellLayout::from_field(&permuted).unwrap();
        assert_eq!((t.shape.clone(), t.strides.clone()), (vec![3, 2], vec![1, 3]));
        assert_eq!(t.physical().shape, vec![2, 3]);

        let misfit =
            Field::new("t", list(DataType::Int16, 5), false).with_metadata(meta(r#"{"shape":[2,3]}"#));
        let e = CellLayout::from_field(&misfit).unwrap_err();
        assert!(matches!(e, Error::InvalidExtensionMetadata { .. }), "{e}");
        let e = CellLayout::from_field(&Field::new("s", list(DataType::Utf8, 2), true)).unwrap_err();
        assert!(e.to_string().contains("column 's'"), "{e}");
    }
}

//! A bfloat16 or float8 column whose extension sits over variable-width binary: Polars keeps
//! the extension (`lance.bfloat16`, `dlframe.float8_*`) but stores its values as Binary,
//! BinaryView or (in the Parquet files it writes) LargeBinary. Such a column becomes the
//! `FixedSizeBinary` column of the same values, each checked to be the dtype's width, so it
//! converts as dlframe's own columns do.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray};
use arrow_schema::{DataType, Field, FieldRef};

use crate::decide::{Cause, decide};
use crate::dtype::{DType, EXTENSION_NAME_KEY};
use crate::error::{Error, Result};
use crate::options::ExportOptions;

/// A table's fields and their columns' chunks.
type Columns = (Vec<FieldRef>, Vec<Vec<ArrayRef>>);

/// The dtype an extension over variable-width binary names; None for any other column.
fn named_dtype(field: &Field) -> Option<DType> {
    if !matches!(field.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView) {
        return None;
    }
    let name = field.metadata().get(EXTENSION_NAME_KEY)?;
    DType::ALL.into_iter().find(|d| d.arrow_extension() == Some(name.as_str()))
}

/// True for an extension over variable-width binary, which is laid out before it converts.
pub(crate) fn needs_laying_out(field: &Field) -> bool {
    named_dtype(field).is_some()
}

/// The column as `FixedSizeBinary` of its dtype's width (copies: refused under `copy=False`);
/// None for a column that is not an extension over variable-width binary.
///
/// # Errors
/// [`Error::CopyRequired`] under `copy=False`; [`Error::InvalidArgument`] for a value whose
/// length is not the dtype's width, naming its row.
pub(crate) fn fixed_width_laid_out(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
) -> Result<Option<(FieldRef, Vec<ArrayRef>)>> {
    let Some(dtype) = named_dtype(field) else { return Ok(None) };
    let storage = field.data_type().to_string();
    decide(opts.copy, Some(Cause::FixedWidth { column: field.name().to_string(), dtype, storage }))?;
    let width = dtype.itemsize();
    let mut first_row = 0;
    let mut out = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        let values: Box<dyn Iterator<Item = Option<&[u8]>>> = match chunk.data_type() {
            DataType::Binary => Box::new(chunk.as_binary::<i32>().iter()),
            DataType::LargeBinary => Box::new(chunk.as_binary::<i64>().iter()),
            DataType::BinaryView => Box::new(chunk.as_binary_view().iter()),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "column '{}' is {}, but a chunk of it is {other}",
                    field.name(),
                    field.data_type()
                )));
            }
        };
        let mut bad = None;
        let checked = values.enumerate().map(|(i, v)| {
            if let Some(v) = v
                && v.len() != width
                && bad.is_none()
            {
                bad = Some((first_row + i, v.len()));
            }
            v.filter(|v| v.len() == width)
        });
        let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(checked, width as i32)?;
        if let Some((row, len)) = bad {
            return Err(Error::InvalidArgument(format!(
                "row {row} of {dtype} column '{}' holds {len} bytes, not {width}",
                field.name()
            )));
        }
        first_row += chunk.len();
        out.push(Arc::new(fixed) as ArrayRef);
    }
    let laid_out = Field::new(field.name(), DataType::FixedSizeBinary(width as i32), field.is_nullable())
        .with_metadata(field.metadata().clone());
    Ok(Some((Arc::new(laid_out), out)))
}

/// A table's columns with those of [`fixed_width_laid_out`] laid out; None where no column is
/// one of them (nothing is copied or cloned then).
///
/// # Errors
/// As [`fixed_width_laid_out`].
pub(crate) fn table_laid_out(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
) -> Result<Option<Columns>> {
    if !fields.iter().any(|f| named_dtype(f).is_some()) {
        return Ok(None);
    }
    let mut laid = (fields.to_vec(), columns.to_vec());
    for (f, c) in laid.0.iter_mut().zip(laid.1.iter_mut()) {
        if let Some((field, chunks)) = fixed_width_laid_out(f, c, opts)? {
            (*f, *c) = (field, chunks);
        }
    }
    Ok(Some(laid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, LargeBinaryArray};

    fn field(dt: DataType, ext: &str) -> FieldRef {
        let meta = [(EXTENSION_NAME_KEY.to_string(), ext.to_string())].into();
        Arc::new(Field::new("x", dt, true).with_metadata(meta))
    }

    #[test]
    fn binary_storage_becomes_fixed_width_and_other_widths_are_refused() {
        let opts = ExportOptions::default();
        let f = field(DataType::LargeBinary, "lance.bfloat16");
        let chunk: ArrayRef = Arc::new(LargeBinaryArray::from_opt_vec(vec![Some(&[0, 0x3f][..]), None]));
        let (laid, chunks) = fixed_width_laid_out(&f, &[chunk], &opts).unwrap().unwrap();
        assert_eq!(laid.data_type(), &DataType::FixedSizeBinary(2));
        assert_eq!(crate::dtype::field_dtype(&laid).unwrap(), DType::BFloat16);
        let fixed = chunks[0].as_fixed_size_binary();
        assert_eq!((fixed.value(0), fixed.is_null(1)), (&[0, 0x3f][..], true));
        let f8 = field(DataType::Binary, "dlframe.float8_e5m2");
        let chunks: Vec<ArrayRef> = vec![
            Arc::new(BinaryArray::from_vec(vec![&[1][..]])),
            Arc::new(BinaryArray::from_vec(vec![&[2][..], &[3, 4][..]])),
        ];
        let e = fixed_width_laid_out(&f8, &chunks, &opts).unwrap_err();
        assert!(e.to_string().contains("row 2 of float8_e5m2 column 'x' holds 2 bytes, not 1"), "{e}");
        let never = ExportOptions { copy: crate::options::CopyPolicy::Never, ..opts };
        assert!(matches!(fixed_width_laid_out(&f8, &chunks, &never), Err(Error::CopyRequired { .. })));
        // Plain binary is not this module's.
        let plain: FieldRef = Arc::new(Field::new("b", DataType::Binary, true));
        assert!(fixed_width_laid_out(&plain, &chunks, &opts).unwrap().is_none());
    }
}

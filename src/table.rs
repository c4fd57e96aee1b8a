//! A table (a struct column: a record batch, a Polars or pyarrow table) as tensors, on any
//! device: the one rule that `to_dlpack`, `dlframe.batches` and the Rust [`crate::batches`] API
//! share.
//!
//! | table | [`Columns::Stack`] | [`Columns::Dict`] |
//! |---|---|---|
//! | one list or tensor column (a `SELECT to_tensor(...)` result) | that column's `(n, *cell_shape)` tensor | one tensor per column |
//! | anything else | one `(n, k)` matrix (one fused pass) | one tensor per column |
//!
//! Layers: above [`crate::transfer`], which it calls for each conversion.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, FieldRef};

use crate::arrow::{Converted, is_list_like, is_list_view};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::options::ExportOptions;
use crate::transfer;

/// How a table becomes tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Columns {
    /// One `(n, k)` matrix (or a lone list column's own tensor).
    #[default]
    Stack,
    /// One tensor per column, by name.
    Dict,
}

impl Columns {
    /// `"stack"` or `"dict"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for anything else.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "stack" => Ok(Columns::Stack),
            "dict" => Ok(Columns::Dict),
            other => Err(Error::InvalidArgument(format!("columns={other:?}: expected 'stack' or 'dict'"))),
        }
    }
}

/// What a table became: one tensor (with its mask), or one per column in the table's order.
#[derive(Debug, Clone)]
// One value per table or batch, moved once: boxing the one tensor would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum TableTensors {
    /// [`Columns::Stack`]'s one tensor.
    One(Converted),
    /// [`Columns::Dict`]'s tensors, named.
    Dict(Vec<(String, Converted)>),
}

/// A table's fields and, per field, its chunks.
pub type TableColumns = (Vec<FieldRef>, Vec<Vec<ArrayRef>>);

/// A struct column's fields and per-field chunks (no copy: the children are shared), or None
/// for a column of another type.
///
/// # Errors
/// [`Error::UnsupportedArrowType`] for a struct chunk with null rows, whose children hold no
/// value there.
pub fn split_struct(field: &FieldRef, chunks: &[ArrayRef]) -> Result<Option<TableColumns>> {
    let DataType::Struct(fields) = field.data_type() else { return Ok(None) };
    let mut columns = vec![Vec::with_capacity(chunks.len()); fields.len()];
    for chunk in chunks {
        let s = chunk.as_struct();
        if s.null_count() > 0 {
            return Err(Error::UnsupportedArrowType {
                what: format!("struct column {:?} with {} null rows", field.name(), s.null_count()),
                remedy: "fill or drop the null rows first",
            });
        }
        for (col, child) in columns.iter_mut().zip(s.columns()) {
            col.push(child.clone());
        }
    }
    Ok(Some((fields.iter().cloned().collect(), columns)))
}

/// A table's columns (each in chunks of the same lengths) as tensors on `device`, by the rule
/// of this module's table: zero-copy where [`crate::arrow::to_tensor`] can share, otherwise one
/// fused copy per tensor.
///
/// # Errors
/// The conversions' errors (naming the column), and [`Error::InvalidArgument`] for
/// [`Columns::Dict`] over a table with a name twice, which a dict would lose.
pub fn table_on(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    layout: Columns,
    opts: &ExportOptions,
    device: Device,
) -> Result<TableTensors> {
    match layout {
        // A list view is a list column laid out otherwise (`to_tensor` makes it one).
        Columns::Stack
            if fields.len() == 1
                && (is_list_like(fields[0].data_type()) || is_list_view(fields[0].data_type())) =>
        {
            transfer::column_on(&fields[0], &columns[0], opts, device).map(TableTensors::One)
        }
        Columns::Stack => {
            // bfloat16 and float8 over variable-width binary (as Polars stores them) are laid
            // out at their width first; the single-column paths do that themselves.
            let laid = crate::arrow::table_laid_out(fields, columns, opts)?;
            let (fields, columns) = laid.as_ref().map_or((fields, columns), |(f, c)| (&f[..], &c[..]));
            transfer::matrix_on(fields, columns, opts, device).map(TableTensors::One)
        }
        Columns::Dict => {
            if let Some(name) = first_duplicate(fields.iter().map(|f| f.name().as_str())) {
                return Err(Error::InvalidArgument(format!(
                    "column '{name}' appears twice, so columns=\"dict\" would keep only one of them; \
                     rename one, or use columns=\"stack\""
                )));
            }
            fields
                .iter()
                .zip(columns)
                .map(|(f, chunks)| Ok((f.name().clone(), transfer::column_on(f, chunks, opts, device)?)))
                .collect::<Result<_>>()
                .map(TableTensors::Dict)
        }
    }
}

/// Any Arrow input (a column in chunks, or a table as a struct column) as tensors on `device`:
/// a struct column by [`table_on`], any other column as its one tensor
/// ([`transfer::column_on`]). What `to_dlpack` makes of what it is given.
///
/// # Errors
/// As [`split_struct`], [`table_on`] and [`transfer::column_on`].
pub fn input_on(
    field: &FieldRef,
    chunks: &[ArrayRef],
    layout: Columns,
    opts: &ExportOptions,
    device: Device,
) -> Result<TableTensors> {
    match split_struct(field, chunks)? {
        Some((fields, columns)) => table_on(&fields, &columns, layout, opts, device),
        None => transfer::column_on(field, chunks, opts, device).map(TableTensors::One),
    }
}

/// What `dlframe.tensor` makes of Arrow input (an Arrow device array or stream): [`input_on`]
/// with the defaults of a conversion, on `device`, as one tensor. Zero-copy for one chunk of
/// numbers without nulls; one fused copy for booleans, several chunks or a table's matrix.
///
/// # Errors
/// As [`input_on`]: nulls among them (the default is to refuse them).
pub fn tensor_of(field: &FieldRef, chunks: &[ArrayRef], device: Device) -> Result<crate::Tensor> {
    let TableTensors::One(c) = input_on(field, chunks, Columns::Stack, &ExportOptions::default(), device)?
    else {
        unreachable!("Columns::Stack gives one tensor")
    };
    Ok(c.values)
}

/// The first name that appears twice.
fn first_duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = std::collections::HashSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float32Array, Int32Array, StructArray};
    use arrow_buffer::NullBuffer;
    use arrow_schema::Field;

    use super::*;

    fn table() -> (FieldRef, ArrayRef) {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        let b: ArrayRef = Arc::new(Float32Array::from(vec![0.5, 1.5, 2.5]));
        let s = StructArray::try_from(vec![("a", a), ("b", b)]).unwrap();
        let field = Arc::new(Field::new("t", s.data_type().clone(), false));
        (field, Arc::new(s))
    }

    #[test]
    fn any_input_is_a_table_when_it_is_a_struct_and_one_column_otherwise() {
        let (field, s) = table();
        let f32s = ExportOptions { dtype: Some(crate::DType::Float32), ..ExportOptions::default() };
        let shape = |t: TableTensors| match t {
            TableTensors::One(c) => c.values.shape().to_vec(),
            TableTensors::Dict(d) => vec![d.len() as i64],
        };
        assert_eq!(
            shape(input_on(&field, std::slice::from_ref(&s), Columns::Stack, &f32s, Device::Cpu).unwrap()),
            [3, 2]
        );
        assert_eq!(
            shape(input_on(&field, std::slice::from_ref(&s), Columns::Dict, &f32s, Device::Cpu).unwrap()),
            [2]
        );
        let a = s.as_struct().column(0).clone();
        let a_field = Arc::new(arrow_schema::Field::new("a", a.data_type().clone(), true));
        assert_eq!(shape(input_on(&a_field, &[a], Columns::Stack, &f32s, Device::Cpu).unwrap()), [3]);
    }

    #[test]
    fn what_leaves_the_core_is_finished_a_mask_under_nulls_mask_for_every_tensor() {
        // The binding hands the parts over as they are: it no longer completes the mask.
        let (field, s) = table();
        let mask = ExportOptions { nulls: crate::options::NullPolicy::Mask, ..ExportOptions::default() };
        let masked =
            |c: &Converted| c.mask.as_ref().map(|m| m.shape().to_vec()) == Some(c.values.shape().to_vec());
        let chunks = std::slice::from_ref(&s);
        let TableTensors::One(m) = input_on(&field, chunks, Columns::Stack, &mask, Device::Cpu).unwrap()
        else {
            panic!("stacked")
        };
        assert!(masked(&m));
        let TableTensors::Dict(d) = input_on(&field, chunks, Columns::Dict, &mask, Device::Cpu).unwrap()
        else {
            panic!("a dict")
        };
        assert!(d.iter().all(|(_, c)| masked(c)));
        let TableTensors::One(plain) =
            input_on(&field, chunks, Columns::Stack, &ExportOptions::default(), Device::Cpu).unwrap()
        else {
            panic!("stacked")
        };
        assert!(plain.mask.is_none());
    }

    #[test]
    fn tensor_of_is_the_default_conversion_as_one_tensor() {
        let (field, s) = table();
        let m = tensor_of(&field, std::slice::from_ref(&s), Device::Cpu).unwrap();
        assert_eq!((m.shape(), m.dtype()), (&[3i64, 2][..], crate::DType::Float64));
        let a = s.as_struct().column(0).clone();
        let a_field = Arc::new(Field::new("a", a.data_type().clone(), true));
        let shared = tensor_of(&a_field, std::slice::from_ref(&a), Device::Cpu).unwrap();
        assert_eq!(shared.data_ptr(), a.to_data().buffers()[0].as_ptr(), "one chunk without nulls is shared");
        let nulls: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None]));
        let e = tensor_of(&a_field, &[nulls], Device::Cpu).unwrap_err();
        assert!(e.to_string().contains("null"), "{e}");
    }

    #[test]
    fn a_struct_splits_into_its_columns_and_stacks_or_goes_by_name() {
        let (field, s) = table();
        let (fields, cols) = split_struct(&field, &[s.clone(), s.slice(1, 2)]).unwrap().unwrap();
        assert_eq!(fields.iter().map(|f| f.name().as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(cols.iter().map(|c| c.len()).collect::<Vec<_>>(), [2, 2]);
        let opts = ExportOptions::default();
        let f32s = ExportOptions { dtype: Some(crate::DType::Float32), ..opts };
        let TableTensors::One(m) = table_on(&fields, &cols, Columns::Stack, &f32s, Device::Cpu).unwrap()
        else {
            panic!("stack gives one tensor")
        };
        assert_eq!(m.values.shape(), &[5, 2]);
        assert_eq!(m.values.as_slice::<f32>().unwrap(), [1.0, 0.5, 2.0, 1.5, 3.0, 2.5, 2.0, 1.5, 3.0, 2.5]);
        let TableTensors::Dict(d) = table_on(&fields, &cols, Columns::Dict, &opts, Device::Cpu).unwrap()
        else {
            panic!("dict gives one tensor per column")
        };
        assert_eq!(
            d.iter().map(|(n, c)| (n.as_str(), c.values.numel())).collect::<Vec<_>>(),
            [("a", 5), ("b", 5)]
        );
        assert_eq!(d[0].1.values.as_slice::<i32>().unwrap(), [1, 2, 3, 2, 3]);
        let not_a_struct = Arc::new(Field::new("x", DataType::Int32, false));
        assert!(split_struct(&not_a_struct, &[]).unwrap().is_none());
    }

    #[test]
    fn null_struct_rows_and_names_a_dict_would_lose_are_refused() {
        let (field, s) = table();
        let (fields, cols) = split_struct(&field, std::slice::from_ref(&s)).unwrap().unwrap();
        let with_nulls = StructArray::new(
            fields.clone().into(),
            cols.iter().map(|c| c[0].clone()).collect(),
            Some(NullBuffer::from(vec![true, false, true])),
        );
        let e = split_struct(&field, &[Arc::new(with_nulls)]).unwrap_err();
        assert!(e.to_string().contains("struct column \"t\" with 1 null rows"), "{e}");
        let twice = [fields[0].clone(), fields[0].clone()];
        let e = table_on(
            &twice,
            &[cols[0].clone(), cols[0].clone()],
            Columns::Dict,
            &ExportOptions::default(),
            Device::Cpu,
        )
        .unwrap_err();
        assert!(e.to_string().contains("column 'a' appears twice"), "{e}");
        assert!(Columns::parse("rows").unwrap_err().to_string().contains("expected 'stack' or 'dict'"));
    }
}

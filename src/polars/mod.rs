//! Polars Series and DataFrames to tensors and back (feature `polars`, polars-core 0.55).
//!
//! Series chunks cross into arrow-rs through the Arrow C data interface, which hands over
//! ownership of the buffers and copies no data; the conversions of [`crate::arrow`] then apply
//! unchanged, so a Series converts exactly as the Arrow column it is:
//!
//! | Series | tensor | data movement |
//! |---|---|---|
//! | one chunk of numbers, no nulls (also date/datetime/duration/time) | 1-D | zero-copy |
//! | `Array(T, d1)`, `Array(Array(T, d2), d1)`, ... | `(n, d1, d2, ...)` | zero-copy |
//! | `arrow.fixed_shape_tensor` extension column | `(n, *shape)` from the metadata | zero-copy |
//! | several chunks, nulls (by policy), booleans, a cast | as above | one fused copy |
//! | a DataFrame (several columns) | `(n, k)` in C or F order | one fused copy |
//! | strings, categoricals, structs, objects, decimals | - | an error naming the remedy |
//!
//! Back: [`tensor_to_series`] wraps contiguous host memory without copying (the Series' buffer
//! keeps the tensor, and so its producer, alive); N-d tensors become nested `Array` columns.

use std::mem::{align_of, size_of, transmute};
use std::sync::Arc;

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema, from_ffi};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, make_array};
use arrow_schema::{DataType, Field, FieldRef};
use polars_arrow::array::{Array as PlArray, FixedSizeListArray as PlFixedSizeListArray, new_empty_array};
use polars_arrow::datatypes::ArrowDataType;
use polars_arrow::ffi as plffi;
use polars_core::prelude::{ChunkedArray, CompatLevel, DataFrame, IntoSeries, PolarsDataType, Series};

use crate::arrow::{Converted, TensorMetadata, columns_to_tensor, tensor_to_column_with, to_tensor};
use crate::decide::{Cause, decide};
use crate::error::{Error, Result};
use crate::kernels;
use crate::options::{CopyPolicy, ExportOptions};
use crate::tensor::{Tensor, is_c_contiguous};

mod schema;

pub use schema::{arrow_field, cell_layout, polars_dtype, polars_dtype_of};

// The C data interface structs of polars-arrow and arrow-rs are both `#[repr(C)]` copies of the
// same C declaration (same fields, same order); the moves below rely on it.
const _: () = assert!(size_of::<plffi::ArrowArray>() == size_of::<FFI_ArrowArray>());
const _: () = assert!(align_of::<plffi::ArrowArray>() == align_of::<FFI_ArrowArray>());
const _: () = assert!(size_of::<plffi::ArrowSchema>() == size_of::<FFI_ArrowSchema>());
const _: () = assert!(align_of::<plffi::ArrowSchema>() == align_of::<FFI_ArrowSchema>());

/// A Series as an Arrow field and chunks that share the Series' buffers (no copy).
///
/// Logical types are kept (dates as `Date32`, Array as FixedSizeList, extension columns with
/// their `ARROW:extension:*` metadata); strings come out as `Utf8View`, which no tensor takes.
///
/// # Errors
/// [`Error::UnsupportedArrowType`] for object columns (they have no Arrow form);
/// [`Error::Arrow`] if arrow-rs refuses what Polars exported.
pub fn series_to_arrow(series: &Series) -> Result<(FieldRef, Vec<ArrayRef>)> {
    if series.dtype().is_object() {
        return Err(Error::UnsupportedArrowType {
            what: format!("column '{}' of type object", series.name()),
            remedy: "Python objects have no tensor form; convert the column to numbers first",
        });
    }
    let compat = CompatLevel::newest();
    let field = schema::arrow_field(series.name(), series.dtype())?;
    let schema = FFI_ArrowSchema::try_from(field.as_ref())?;
    let chunks = (0..series.n_chunks())
        .map(|i| {
            let exported = plffi::export_array_to_c(series.to_arrow(i, compat));
            // SAFETY: as for the schema: one owner after the move, `release` runs once.
            let array = unsafe { transmute::<plffi::ArrowArray, FFI_ArrowArray>(exported) };
            // SAFETY: the array was exported by Polars with the type the schema describes (both
            // from the same Series at the same compat level), and is consumed here once.
            let data = unsafe { from_ffi(array, &schema) }?;
            Ok(make_array(data))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((field, chunks))
}

/// One Series as a tensor under the given policies: zero-copy for one chunk of numeric data
/// without nulls (and for `Array` and tensor columns), one fused copy otherwise.
///
/// # Errors
/// As [`crate::arrow::to_tensor`], and [`series_to_arrow`]'s.
pub fn series_to_tensor(series: &Series, opts: &ExportOptions) -> Result<Converted> {
    let (field, chunks) = series_to_arrow(series)?;
    to_tensor(&field, &chunks, opts)
}

/// A typed ChunkedArray as a tensor: as [`series_to_tensor`] (the Series shares its chunks,
/// so this copies exactly when that does).
///
/// # Errors
/// As [`series_to_tensor`].
pub fn chunked_to_tensor<T: PolarsDataType>(ca: &ChunkedArray<T>, opts: &ExportOptions) -> Result<Converted>
where
    ChunkedArray<T>: IntoSeries,
{
    series_to_tensor(&ca.clone().into_series(), opts)
}

/// Several same-length Series as one `(n, k)` tensor in the order of `opts`, with the cast and
/// the null fill fused into the one copy.
///
/// # Errors
/// As [`crate::arrow::columns_to_tensor`] (lengths, types, nulls, `copy=False`).
pub fn series_to_matrix(series: &[Series], opts: &ExportOptions) -> Result<Converted> {
    let (fields, columns): (Vec<FieldRef>, Vec<Vec<ArrayRef>>) =
        series.iter().map(series_to_arrow).collect::<Result<Vec<_>>>()?.into_iter().unzip();
    columns_to_tensor(&fields, &columns, opts)
}

/// A DataFrame as one `(height, width)` tensor (copies; see [`series_to_matrix`]).
///
/// # Errors
/// As [`series_to_matrix`].
pub fn dataframe_to_tensor(df: &DataFrame, opts: &ExportOptions) -> Result<Converted> {
    let series: Vec<Series> = df.columns().iter().map(|c| c.as_materialized_series().clone()).collect();
    series_to_matrix(&series, opts)
}

/// A tensor as a Series named `name`, without copying when the memory is on the host, aligned
/// and C-contiguous (the Series then keeps the tensor alive); N-d tensors become nested `Array`
/// columns of shape `shape[1..]`. Otherwise one copy, unless [`CopyPolicy::Never`].
///
/// # Errors
/// [`Error::CopyRequired`] under [`CopyPolicy::Never`] when a copy is needed (strided layouts,
/// bool tensors, device memory); [`Error::Polars`] if Polars refuses the column.
pub fn tensor_to_series(tensor: &Tensor, name: &str, copy: CopyPolicy) -> Result<Series> {
    schema::check_polars_dtype(tensor.dtype())?;
    let mut copy = copy;
    let contiguous = if tensor.ndim() >= 2 && !is_c_contiguous(tensor.shape(), tensor.strides()) {
        let (shape, strides) = (tensor.shape().to_vec(), tensor.strides().to_vec());
        decide(copy, Some(Cause::Strided { shape, strides, needs: "C-contiguous, as an Array column is" }))?;
        copy = CopyPolicy::IfNeeded;
        kernels::contiguous_copy(tensor)?
    } else {
        tensor.clone()
    };
    let (field, array) = tensor_to_column_with(&contiguous, name, copy)?;
    let (field, array) = nested_lists(field, array, contiguous.shape())?;
    arrow_to_series(&field, array)
}

/// An Arrow column as a Series, sharing its buffers (Polars copies a buffer only if it is
/// misaligned for its type, which arrow-rs buffers never are).
///
/// # Errors
/// [`Error::Arrow`] for a field the C data interface cannot describe; [`Error::Polars`] for a
/// type Polars does not read.
pub fn arrow_to_series(field: &Field, array: ArrayRef) -> Result<Series> {
    // polars-arrow 0.55 panics importing a FixedSizeList whose cells hold no values (a zero in
    // the cell shape) but which has rows: it infers 0 rows from the empty values, then slices
    // to the exported length. Such a column crosses with no rows and gets them back below.
    let rows = array.len();
    let empty_cells =
        rows > 0 && matches!(array.data_type(), DataType::FixedSizeList(..)) && leaf_len(&array) == 0;
    let array = if empty_cells {
        if array.logical_null_count() > 0 {
            return Err(Error::UnsupportedArrowType {
                what: format!(
                    "column '{}' of type {} with nulls and empty cells",
                    field.name(),
                    field.data_type()
                ),
                remedy: "Polars cannot import it; drop the nulls or the zero-width dimension",
            });
        }
        array.slice(0, 0)
    } else {
        array
    };
    let schema = FFI_ArrowSchema::try_from(field)?;
    let exported = FFI_ArrowArray::new(&array.to_data());
    drop(array);
    // SAFETY: same #[repr(C)] layouts (asserted above); both values move, so each `release`
    // runs exactly once, on the Polars side.
    let (schema, exported) = unsafe {
        (
            transmute::<FFI_ArrowSchema, plffi::ArrowSchema>(schema),
            transmute::<FFI_ArrowArray, plffi::ArrowArray>(exported),
        )
    };
    // SAFETY: `schema` is a complete, live export of `field`.
    let pl_field = unsafe { plffi::import_field_from_c(&schema) }?;
    // SAFETY: `exported` is a live export of an array of exactly the type `pl_field` describes,
    // consumed here once; Polars keeps it (and through it our buffers) alive.
    let chunk = unsafe { plffi::import_array_from_c(exported, pl_field.dtype().clone()) }?;
    let chunk = if empty_cells { empty_cells_array(pl_field.dtype(), rows)? } else { chunk };
    Ok(Series::try_from((&pl_field, vec![chunk]))?)
}

/// The number of leaf values under the FixedSizeList levels of `array`.
fn leaf_len(array: &ArrayRef) -> usize {
    let mut current = array.clone();
    while let Some(list) = current.as_any().downcast_ref::<FixedSizeListArray>() {
        current = list.values().clone();
    }
    current.len()
}

/// `rows` cells of a FixedSizeList type (nested, extension-typed or not) that hold no values,
/// built in polars-arrow with explicit lengths (no data).
fn empty_cells_array(dtype: &ArrowDataType, rows: usize) -> Result<Box<dyn PlArray>> {
    match dtype.to_storage() {
        ArrowDataType::FixedSizeList(item, size) => {
            let values = empty_cells_array(item.dtype(), rows * size)?;
            Ok(PlFixedSizeListArray::try_new(dtype.clone(), rows, values, None)?.boxed())
        }
        _ if rows == 0 => Ok(new_empty_array(dtype.clone())),
        other => Err(Error::InvalidArgument(format!("{rows} values of type {other:?} in an empty cell"))),
    }
}

/// A fixed-shape-tensor column (C order) as the nested FixedSizeList Polars reads as `Array`,
/// over the same values (no copy). Other columns pass through.
fn nested_lists(field: FieldRef, array: ArrayRef, shape: &[i64]) -> Result<(FieldRef, ArrayRef)> {
    if TensorMetadata::from_field(&field)?.is_none() {
        return Ok((field, array));
    }
    let Some(storage) = array.as_any().downcast_ref::<FixedSizeListArray>() else {
        return Err(Error::InvalidArgument(format!("tensor column of type {}", array.data_type())));
    };
    let mut values = storage.values().clone();
    let dims: Vec<usize> = shape[1..].iter().map(|&d| d as usize).collect();
    for (level, &d) in dims.iter().enumerate().rev() {
        // Rows at this level: one per cell of the dimensions above it (counted, not divided,
        // so that a zero-width dimension keeps its row count).
        let rows = dims[..level].iter().product::<usize>() * array.len();
        let item = Arc::new(Field::new("item", values.data_type().clone(), true));
        let size = i32::try_from(d).map_err(|_| Error::layout(format!("Array width {d} exceeds i32")))?;
        values = Arc::new(FixedSizeListArray::try_new_with_length(item, size, values, None, rows)?);
    }
    let field = Arc::new(Field::new(field.name(), values.data_type().clone(), true));
    Ok((field, values))
}

#[cfg(test)]
mod tests {
    // Explicit, so it wins over arrow-rs's DataType from `super::*`.
    use polars_core::prelude::DataType;
    use polars_core::prelude::*;

    use super::*;
    use crate::dtype::DType;
    use crate::options::{NullPolicy, Order, Scalar};
    use crate::tensor::Native;

    fn opts() -> ExportOptions {
        ExportOptions::default()
    }

    /// The values in logical (C) order, copied out.
    fn vals<T: Native>(t: &Tensor) -> Vec<T> {
        kernels::contiguous_copy(t).unwrap().as_slice::<T>().unwrap().to_vec()
    }

    #[test]
    fn numeric_series_is_shared() {
        let s = Series::new("x".into(), &[1.0f32, 2.0, 3.0]);
        let t = series_to_tensor(&s, &opts()).unwrap().values;
        assert_eq!((t.shape(), t.dtype(), t.copied()), (&[3i64][..], DType::Float32, false));
        let values = s.f32().unwrap().downcast_iter().next().unwrap().values().as_ptr();
        assert_eq!(t.data_ptr(), values as *const u8);
        assert_eq!(vals::<f32>(&t), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn chunked_arrays_convert_as_their_series() {
        let ca = Float64Chunked::from_slice("c".into(), &[0.5, 1.5]);
        let t = chunked_to_tensor(&ca, &opts()).unwrap().values;
        let values = ca.downcast_iter().next().unwrap().values().as_ptr();
        assert_eq!((t.data_ptr(), vals::<f64>(&t)), (values as *const u8, vec![0.5, 1.5]));
        let bools = BooleanChunked::from_slice("b".into(), &[true, false]);
        assert_eq!(vals::<bool>(&chunked_to_tensor(&bools, &opts()).unwrap().values), vec![true, false]);
    }

    #[test]
    fn chunks_nulls_and_bools_copy_once() {
        let mut a = Series::new("a".into(), &[Some(1i32), None]);
        a.append(&Series::new("a".into(), &[Some(3i32)])).unwrap();
        assert_eq!(a.n_chunks(), 2);
        let err = series_to_tensor(&a, &opts()).unwrap_err();
        assert!(matches!(err, Error::Nulls { null_count: 1, .. }), "{err}");
        let fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-1)), ..opts() };
        let t = series_to_tensor(&a, &fill).unwrap().values;
        assert_eq!((t.copied(), vals::<i32>(&t)), (true, vec![1, -1, 3]));
        let b = Series::new("b".into(), &[true, false, true]);
        let t = series_to_tensor(&b, &opts()).unwrap().values;
        assert_eq!((t.dtype(), vals::<bool>(&t)), (DType::Bool, vec![true, false, true]));
    }

    #[test]
    fn dataframe_interleaves_in_c_and_f_order() {
        let df = DataFrame::new_infer_height(vec![
            Column::new("a".into(), &[1.0f32, 2.0]),
            Column::new("b".into(), &[Some(3i32), None]),
        ])
        .unwrap();
        let o = ExportOptions { nulls: NullPolicy::Nan, ..opts() };
        let t = dataframe_to_tensor(&df, &o).unwrap().values;
        assert_eq!((t.shape(), t.dtype()), (&[2i64, 2][..], DType::Float64));
        let v = vals::<f64>(&t);
        assert_eq!((v[0], v[1], v[2]), (1.0, 3.0, 2.0));
        assert!(v[3].is_nan());
        let f = ExportOptions {
            order: Order::F,
            dtype: Some(DType::Float32),
            nulls: NullPolicy::Fill(Scalar::Int(0)),
            ..opts()
        };
        let t = dataframe_to_tensor(&df, &f).unwrap().values;
        assert_eq!((t.strides(), vals::<f32>(&t)), (&[1i64, 2][..], vec![1.0, 3.0, 2.0, 0.0]));
        let short = DataFrame::new_infer_height(vec![Column::new("c".into(), &[1i64])]).unwrap();
        let mixed = [
            df.column("a").unwrap().as_materialized_series().clone(),
            short.column("c").unwrap().as_materialized_series().clone(),
        ];
        assert!(matches!(series_to_matrix(&mixed, &opts()), Err(Error::LengthMismatch { .. })));
    }

    #[test]
    fn strings_and_objectless_types_are_refused() {
        let s = Series::new("s".into(), &["a", "b"]);
        let err = series_to_tensor(&s, &opts()).unwrap_err();
        assert!(matches!(err, Error::UnsupportedArrowType { .. }), "{err}");
        assert!(err.to_string().contains("'s'"), "{err}");
    }

    #[test]
    fn array_columns_round_trip_without_copying() {
        let values: Vec<f64> = (0..24).map(f64::from).collect();
        let t = Tensor::from_vec(values, vec![2, 3, 4]).unwrap();
        let s = tensor_to_series(&t, "cube", CopyPolicy::Never).unwrap();
        let expected = DataType::Array(Box::new(DataType::Array(Box::new(DataType::Float64), 4)), 3);
        assert_eq!((s.name().as_str(), s.dtype(), s.len()), ("cube", &expected, 2));
        let back = series_to_tensor(&s, &opts()).unwrap().values;
        assert_eq!((back.shape(), back.data_ptr()), (&[2i64, 3, 4][..], t.data_ptr()));
        assert_eq!(vals::<f64>(&back), vals::<f64>(&t));
    }

    #[test]
    fn zero_width_cells_keep_every_row() {
        for shape in [vec![3, 2, 0], vec![3, 0, 2]] {
            let t = Tensor::from_vec(Vec::<f32>::new(), shape.clone()).unwrap();
            let s = tensor_to_series(&t, "z", CopyPolicy::IfNeeded).unwrap();
            let (a, b) = (shape[1] as usize, shape[2] as usize);
            let expected = DataType::Array(Box::new(DataType::Array(Box::new(DataType::Float32), b)), a);
            assert_eq!((s.len(), s.dtype()), (3, &expected), "{shape:?}");
        }
    }

    #[test]
    fn strided_tensors_copy_unless_refused() {
        let buffer = arrow_buffer::Buffer::from_vec((0..6).map(|v| v as i64).collect::<Vec<_>>());
        // The transpose of [[0, 1, 2], [3, 4, 5]].
        let tt = Tensor::from_buffer(buffer, 0, vec![3, 2], Some(vec![1, 3]), DType::Int64).unwrap();
        assert!(matches!(tensor_to_series(&tt, "t", CopyPolicy::Never), Err(Error::CopyRequired { .. })));
        let s = tensor_to_series(&tt, "t", CopyPolicy::IfNeeded).unwrap();
        let back = series_to_tensor(&s, &opts()).unwrap().values;
        assert_eq!((back.shape(), vals::<i64>(&back)), (&[3i64, 2][..], vec![0, 3, 1, 4, 2, 5]));
        let one = Tensor::from_vec(vec![1.5f32, 2.5], vec![2]).unwrap();
        let s = tensor_to_series(&one, "v", CopyPolicy::Never).unwrap();
        assert_eq!((s.dtype(), s.f32().unwrap().get(1)), (&DataType::Float32, Some(2.5)));
    }

    #[test]
    fn series_owns_the_tensor_memory_exactly_once() {
        let (owner, drops) = crate::testing::DropCounter::new((0..12).map(|v| v as f32).collect());
        let t = owner.tensor(vec![4, 3]);
        let ptr = t.data_ptr();
        let s = tensor_to_series(&t, "m", CopyPolicy::Never).unwrap();
        drop(t);
        assert_eq!(drops.get(), 0, "the Series keeps the tensor's owner alive");
        let again = series_to_tensor(&s, &opts()).unwrap().values;
        assert_eq!(again.data_ptr(), ptr);
        drop(s);
        assert_eq!(drops.get(), 0, "the tensor made from the Series still holds the memory");
        assert_eq!(vals::<f32>(&again)[11], 11.0);
        drop(again);
        assert_eq!(drops.get(), 1, "released exactly once");
    }

    #[test]
    fn fixed_shape_tensor_columns_take_their_shape_from_the_metadata() {
        let cells = Tensor::from_vec((0..12).collect::<Vec<i32>>(), vec![2, 2, 3]).unwrap();
        let (field, array) = crate::arrow::tensor_to_column(&cells, "x").unwrap();
        assert!(TensorMetadata::from_field(&field).unwrap().is_some());
        let s = arrow_to_series(&field, array).unwrap();
        let t = series_to_tensor(&s, &opts()).unwrap().values;
        assert_eq!((t.shape(), t.data_ptr()), (&[2i64, 2, 3][..], cells.data_ptr()));
        assert_eq!(vals::<i32>(&t), (0..12).collect::<Vec<i32>>());
    }
}

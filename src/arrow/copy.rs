//! The CPU executor: one column (chunked or not), or several columns into one `(n, k)` matrix,
//! as a tensor, from the specs of `spec.rs`.
//!
//! Zero-copy is tried first unless `copy=True`; when it is impossible, the one fused copy pass
//! of [`crate::kernels`] makes the tensor, unless `copy=False`, which refuses with the reason.
//! Copies are marked [`Tensor::copied`] (DLPack `IS_COPIED`) and are writable.

use arrow_array::{Array, ArrayRef};
use arrow_data::ArrayData;
use arrow_schema::{DataType, FieldRef};

use super::ragged::{is_ragged, ragged_to_tensor};
use super::read::{bool_bytes, column_ref, leaf_of, segments, validity_bytes, validity_of};
use super::spec::{ColumnSpec, MatrixSpec};
use super::to_tensor::from_leaf;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, BitSlice, Column, ColumnRef};
use crate::options::{CopyPolicy, ExportOptions, Order, Scalar};
use crate::tensor::{Tensor, is_f_contiguous};

/// A tensor and, under [`NullPolicy::Mask`](crate::options::NullPolicy::Mask), its validity
/// (bool, same shape, true = valid); for a ragged list column also its lengths or offsets.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The values.
    pub values: Tensor,
    /// The validity mask, when asked for.
    pub mask: Option<Tensor>,
    /// A ragged column's int64 lengths (`ragged="pad"`) or offsets (`ragged="jagged"`).
    pub index: Option<Tensor>,
}

/// One column, in one or more chunks, as one tensor: zero-copy for one chunk without nulls
/// (or with nulls under [`NullPolicy::Mask`](crate::options::NullPolicy::Mask)), otherwise one
/// fused copy pass.
///
/// # Errors
/// [`Error::Nulls`] under [`NullPolicy::Error`](crate::options::NullPolicy::Error),
/// [`Error::UnsupportedArrowType`] for a leaf with no tensor dtype, [`Error::InvalidArgument`]
/// for chunks of another type, a boolean column cast to numbers or NaN for a dtype without it,
/// [`Error::InvalidExtensionMetadata`] for tensor metadata that does not fit the storage, and
/// [`Error::CopyRequired`]
/// under [`CopyPolicy::Never`] when a copy is needed, [`Error::ValueOutOfRange`] for a value
/// that does not fit a lossy cast.
pub fn to_tensor(field: &FieldRef, chunks: &[ArrayRef], opts: &ExportOptions) -> Result<Converted> {
    if is_ragged(field, opts) {
        return ragged_to_tensor(field, chunks, opts).and_then(|c| in_order(c, opts.order));
    }
    let spec = ColumnSpec::new(field, chunks, opts)?;
    let values = match &spec.copy_reason {
        None => shared(&spec)?,
        Some(reason) if opts.copy == CopyPolicy::Never => {
            return Err(Error::CopyRequired { reason: reason.clone() });
        }
        // The F-order copy below is the one copy.
        Some(_) if spec.fortran && spec.shareable => shared(&spec)?,
        Some(_) => copy_column(&spec)?,
    };
    let mask = spec.mask.then(|| validity_mask(&spec)).transpose()?;
    in_order(Converted { values, mask, index: None }, opts.order)
}

/// Under [`Order::F`], the values and the mask (two or more dimensions: a tensor column's
/// `(n, *cell)`, a padded ragged column) in F order, as numpy's `asfortranarray` lays them out:
/// one gather each, unless they already are. The index (lengths, offsets) is 1-D. Under
/// [`Order::C`], unchanged (copies only to reorder).
fn in_order(c: Converted, order: Order) -> Result<Converted> {
    let reorder = |t: Tensor| -> Result<Tensor> {
        if order == Order::C || is_f_contiguous(t.shape(), t.strides()) {
            return Ok(t);
        }
        kernels::ordered_copy(&t, Order::F)
    };
    Ok(Converted { values: reorder(c.values)?, mask: c.mask.map(reorder).transpose()?, index: c.index })
}

/// The one chunk of a column that needs no copy, as a tensor over its leaf values (the slots of
/// nulls hold whatever Arrow left there; the mask says which they are).
fn shared(spec: &ColumnSpec) -> Result<Tensor> {
    let (leaf, _) = leaf_of(&spec.chunks[0]);
    Ok(from_leaf(leaf.as_ref(), spec.shape.clone(), Some(spec.strides.clone()))?.with_logical(spec.logical()))
}

/// Several same-length columns (each in chunks) as one `(n, k)` tensor in C or F order, with
/// the cast to the common (or requested) dtype and the null fill fused into one pass (copies).
///
/// # Errors
/// [`Error::LengthMismatch`] for columns of different lengths, [`Error::UnsupportedArrowType`]
/// for non-numeric columns, [`Error::Nulls`] under [`NullPolicy::Error`](crate::options::NullPolicy::Error),
/// [`Error::CopyRequired`] under [`CopyPolicy::Never`] (a matrix is always a copy),
/// [`Error::ValueOutOfRange`] for values or a fill that do not fit the dtype.
pub fn columns_to_tensor(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
) -> Result<Converted> {
    let MatrixSpec { n, k, target, storage, fill, shape, strides, mask: want_mask } =
        MatrixSpec::new(fields, columns, opts)?;
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    let segments = segments(columns);
    let rows: Vec<usize> = segments.iter().map(|s| s.end - s.start).collect();
    let mut out = Output::new(storage, n * k)?;
    let parallel = out.parallel(segments.len());
    let pieces = out.pieces(opts.order, n, k, &rows)?;
    each(segments.iter().zip(pieces).collect(), parallel, |(seg, mut piece)| {
        // A bool column of the segment is unpacked to bytes first (one pass over its bits).
        let bytes = seg
            .slices
            .iter()
            .map(|a| (a.data_type() == &DataType::Boolean).then(|| bool_bytes(a.as_ref())).transpose())
            .collect::<Result<Vec<_>>>()?;
        let cols = seg
            .slices
            .iter()
            .zip(&bytes)
            .zip(&names)
            .map(|((a, unpacked), name)| {
                let col = match unpacked {
                    Some(b) => {
                        Column::new(ColumnRef::U8(b)).with_validity(validity_of(a.as_ref())?).named(name)
                    }
                    None => column_ref(a.as_ref(), name)?,
                };
                Ok(col.starting_at(seg.start))
            })
            .collect::<Result<Vec<_>>>()?;
        piece.write(&cols, fill)
    })?;
    let values = out.into_tensor(target, shape.clone(), strides.clone())?;
    let mask = if want_mask {
        let mut m = Output::new(DType::UInt8, n * k)?;
        let pieces = m.pieces(opts.order, n, k, &rows)?;
        each(segments.iter().zip(pieces).collect(), parallel, |(seg, mut piece)| {
            let bytes: Vec<Vec<u8>> =
                seg.slices.iter().map(|a| validity_bytes(a.as_ref())).collect::<Result<_>>()?;
            let cols: Vec<Column> =
                bytes.iter().zip(&names).map(|(v, name)| Column::new(ColumnRef::U8(v)).named(name)).collect();
            piece.write(&cols, None)
        })?;
        Some(m.into_tensor(DType::Bool, shape, strides)?)
    } else {
        None
    };
    Ok(Converted { values, mask, index: None })
}

/// Leaf validity of each chunk, with list-level nulls expanded over their cells, unpacked to
/// one byte per value (1 = valid) and laid out like the values (copies).
fn validity_mask(spec: &ColumnSpec) -> Result<Tensor> {
    let mut out = vec![0u8; spec.rows * spec.cell_size];
    let mut pos = 0;
    for chunk in &spec.chunks {
        let slots = chunk.len() * spec.cell_size;
        expand_validity(chunk.as_ref(), &mut out[pos..pos + slots])?;
        pos += slots;
    }
    let t = Tensor::from_vec(out, spec.shape.clone())?;
    // The mask follows the values' memory order (permuted tensors too). Relabel u8 -> bool:
    // both are one byte per element and every byte is 0 or 1.
    // SAFETY: the same allocation and element count, with a permutation of C strides.
    let t = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr() as *mut u8,
            spec.shape.clone(),
            Some(spec.strides.clone()),
            DType::Bool,
            t.device(),
            false,
            t.owner().clone(),
        )
    }?;
    Ok(t.with_copied(true))
}

/// Writes 1 for valid leaf slots and 0 for null ones (at any level) into `out`.
fn expand_validity(array: &dyn Array, out: &mut [u8]) -> Result<()> {
    let data = array.to_data();
    match array.data_type() {
        DataType::FixedSizeList(..) => {
            let list = arrow_array::cast::AsArray::as_fixed_size_list(array);
            expand_validity(list.values().as_ref(), out)?;
            if let Some(nulls) = data.nulls() {
                // The leaf slots a row covers, through every level below it.
                let size = out.len() / array.len().max(1);
                for row in (0..array.len()).filter(|&r| nulls.is_null(r)) {
                    out[row * size..(row + 1) * size].fill(0);
                }
            }
        }
        _ => match data.nulls() {
            Some(n) => kernels::unpack_bits(BitSlice::new(n.validity(), n.offset(), n.len())?, out),
            None => out.fill(1),
        },
    }
    Ok(())
}

/// One copy of a column into a fresh buffer: chunks concatenated, nulls filled, cast fused.
fn copy_column(spec: &ColumnSpec) -> Result<Tensor> {
    let target = spec.target;
    let mut out = Output::new(target, spec.rows * spec.cell_size)?;
    if spec.is_plain_concat() {
        concat_plain(&spec.chunks, target, out.buf.as_mut_slice())?;
    } else {
        let slots: Vec<usize> = spec.chunks.iter().map(|c| c.len() * spec.cell_size).collect();
        let starts = slots.iter().scan(0, |pos, &s| {
            *pos += s;
            Some(*pos - s)
        });
        let parallel = out.parallel(spec.chunks.len());
        let pieces = out.pieces(Order::C, spec.rows * spec.cell_size, 1, &slots)?;
        let work: Vec<_> = spec.chunks.iter().zip(starts).zip(pieces).collect();
        each(work, parallel, |((chunk, pos), mut piece)| {
            let (leaf_array, list_nulls) = leaf_of(chunk);
            if spec.leaf == DType::Bool {
                piece.unpack_bools(leaf_array.as_ref(), bool_byte(spec.fill))?;
            } else {
                let col = column_ref(leaf_array.as_ref(), spec.field.name())?.starting_at(pos);
                piece.write(std::slice::from_ref(&col), spec.fill)?;
            }
            for (size, validity) in list_nulls {
                for row in (0..validity.len()).filter(|&r| validity.is_null(r)) {
                    piece.fill(spec.fill, row * size..(row + 1) * size)?;
                }
            }
            Ok(())
        })?;
    }
    Ok(out.into_tensor(target, spec.shape.clone(), spec.strides.clone())?.with_logical(spec.logical()))
}

/// The byte a null becomes in a bool tensor: the spec gives a bool's fill as its 0/1 byte.
fn bool_byte(fill: Option<Scalar>) -> u8 {
    matches!(fill, Some(Scalar::Int(1))) as u8
}

/// Concatenates chunks without nulls or casts: each chunk's leaf bytes are copied to their
/// place, chunks in parallel (copies).
fn concat_plain(chunks: &[ArrayRef], dtype: DType, out: &mut [u8]) -> Result<()> {
    let item = dtype.itemsize();
    let leaves: Vec<ArrayData> = chunks.iter().map(|c| leaf_of(c).0.to_data()).collect();
    let mut pieces = Vec::with_capacity(leaves.len());
    let out_len = out.len();
    let mut rest = out;
    for data in &leaves {
        let bytes = data.buffers()[0].as_slice();
        let src = bytes.get(data.offset() * item..(data.offset() + data.len()) * item).ok_or_else(|| {
            Error::layout(format!("a chunk of {} values has a buffer of {} bytes", data.len(), bytes.len()))
        })?;
        if src.len() > rest.len() {
            return Err(Error::layout(format!(
                "the chunks hold more values than the {}-element output",
                out_len / item.max(1)
            )));
        }
        let (dst, tail) = std::mem::take(&mut rest).split_at_mut(src.len());
        pieces.push((src, dst));
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(Error::layout(format!("{} output bytes left after the chunks", rest.len())));
    }
    each(pieces, out_len >= kernels::PARALLEL_THRESHOLD_BYTES, |(src, dst)| {
        dst.copy_from_slice(src);
        Ok(())
    })
}

/// Runs `f` on each item, in parallel on the kernels' pool when `parallel`; every item runs,
/// and the first error in the items' order is the one returned, as on one thread.
fn each<T: Send>(items: Vec<T>, parallel: bool, f: impl Fn(T) -> Result<()> + Sync + Send) -> Result<()> {
    if !parallel {
        return items.into_iter().try_for_each(f);
    }
    use rayon::prelude::*;
    let results: Vec<Result<()>> = kernels::install(|| items.into_par_iter().map(f).collect());
    results.into_iter().collect()
}

/// The bytes of an output that one row range (a segment, or a chunk of one column) writes:
/// one run of elements, or in F order one run per column.
struct Piece<'a> {
    dtype: DType,
    parts: Vec<&'a mut [u8]>,
}

impl Piece<'_> {
    /// Writes the range's columns, cast and filled: all into its one run (C order, or one
    /// column), or each into its own run (F order) (copies).
    fn write(&mut self, cols: &[Column], fill: Option<Scalar>) -> Result<()> {
        let dtype = self.dtype;
        match self.parts.as_mut_slice() {
            [run] => kernels::interleave_into(dtype, cols, Order::C, fill, run),
            parts => cols.iter().zip(parts).try_for_each(|(col, run)| {
                kernels::interleave_into(dtype, std::slice::from_ref(col), Order::C, fill, run)
            }),
        }
    }

    /// The one run of a column's chunk.
    fn run(&mut self) -> Result<&mut [u8]> {
        match self.parts.as_mut_slice() {
            [run] => Ok(run),
            parts => Err(Error::layout(format!("a column's chunk in {} runs", parts.len()))),
        }
    }

    /// Unpacks a bool chunk into its run, `fill` for nulls (copies).
    fn unpack_bools(&mut self, array: &dyn Array, fill: u8) -> Result<()> {
        let data = array.to_data();
        let values = BitSlice::new(data.buffers()[0].as_slice(), data.offset(), data.len())?;
        let validity = data.nulls().map(|n| BitSlice::new(n.validity(), n.offset(), n.len())).transpose()?;
        kernels::unpack_bits_fill(values, validity, fill, self.run()?)
    }

    /// Writes `fill` into elements `range` of its run.
    fn fill(&mut self, fill: Option<Scalar>, range: std::ops::Range<usize>) -> Result<()> {
        let (dtype, item) = (self.dtype, self.dtype.itemsize());
        let run = self.run()?;
        let len = run.len() / item.max(1);
        let bytes = run
            .get_mut(range.start * item..range.end * item)
            .ok_or_else(|| Error::layout(format!("elements {range:?} outside a run of {len}")))?;
        if dtype == DType::Bool {
            bytes.fill(bool_byte(fill));
            return Ok(());
        }
        kernels::fill_into(dtype, fill, bytes)
    }
}

/// A fresh, 64-byte aligned output buffer, filled range by range by the kernels.
struct Output {
    dtype: DType,
    buf: kernels::HostBuffer,
}

impl Output {
    fn new(dtype: DType, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(dtype.itemsize())
            .ok_or_else(|| Error::layout(format!("{len} elements overflow")))?;
        // Every caller writes each element of the output exactly once (the property tests
        // compare whole outputs), so a recycled buffer is fine.
        Ok(Output { dtype, buf: kernels::HostBuffer::for_overwrite(bytes)? })
    }

    /// Whether `pieces` pieces of this output are written in parallel: more than one, in an
    /// output of the kernels' parallel size.
    fn parallel(&self, pieces: usize) -> bool {
        pieces > 1 && self.buf.len() >= kernels::PARALLEL_THRESHOLD_BYTES
    }

    /// The pieces of an `(n, k)` matrix in `order` that consecutive row ranges of `rows` rows
    /// each fill: one run of elements per range in C order, or one per range and column in F
    /// order. No copy; the pieces borrow the output.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when the ranges do not fill `n` rows of `k` columns.
    fn pieces(&mut self, order: Order, n: usize, k: usize, rows: &[usize]) -> Result<Vec<Piece<'_>>> {
        let dtype = self.dtype;
        let item = dtype.itemsize();
        let total: usize = rows.iter().sum();
        let bytes = self.buf.as_mut_slice();
        if total != n || bytes.len() != n * k * item {
            return Err(Error::layout(format!(
                "{total} rows in pieces for a {n} x {k} matrix of {} bytes",
                bytes.len()
            )));
        }
        let mut pieces: Vec<Piece> = rows.iter().map(|_| Piece { dtype, parts: Vec::new() }).collect();
        let (runs, width): (Vec<&mut [u8]>, usize) = match order {
            Order::C => (vec![bytes], k),
            Order::F => (bytes.chunks_mut((n * item).max(1)).collect(), 1),
        };
        for mut rest in runs {
            for (piece, &r) in pieces.iter_mut().zip(rows) {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(r * width * item);
                piece.parts.push(part);
                rest = tail;
            }
        }
        Ok(pieces)
    }

    /// The buffer as a copied tensor, labelled `dtype` (the bool mask is written as u8).
    fn into_tensor(self, dtype: DType, shape: Vec<i64>, strides: Vec<i64>) -> Result<Tensor> {
        let label = if dtype == DType::Bool { DType::Bool } else { self.dtype };
        Ok(Tensor::from_buffer(self.buf.into_buffer(), 0, shape, Some(strides), label)?.with_copied(true))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::options::NullPolicy;

    use arrow_array::{BooleanArray, Int16Array};
    use arrow_buffer::NullBuffer;
    use arrow_schema::Field;

    use super::*;

    fn field(name: &str, dt: DataType) -> FieldRef {
        Arc::new(Field::new(name, dt, true))
    }

    fn matrix(cols: Vec<(FieldRef, Vec<ArrayRef>)>, opts: &ExportOptions) -> Result<Tensor> {
        let (fields, chunks): (Vec<_>, Vec<_>) = cols.into_iter().unzip();
        columns_to_tensor(&fields, &chunks, opts).map(|c| c.values)
    }

    #[test]
    fn bool_columns_stack_as_bool_or_join_numbers_as_zero_and_one() {
        let p: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)]));
        // Two chunks, so the segments split the bits at an offset that is not a byte boundary.
        let q1: ArrayRef = Arc::new(BooleanArray::from(vec![true]));
        let q2: ArrayRef = Arc::new(BooleanArray::from(vec![false, true]));
        let bools = || {
            vec![
                (field("p", DataType::Boolean), vec![p.clone()]),
                (field("q", DataType::Boolean), vec![q1.clone(), q2.clone()]),
            ]
        };
        let err = matrix(bools(), &ExportOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Nulls { null_count: 1, .. }), "{err}");
        let fill_true = ExportOptions { nulls: NullPolicy::Fill(Scalar::Bool(true)), ..Default::default() };
        let t = matrix(bools(), &fill_true).unwrap();
        assert_eq!((t.dtype(), t.shape()), (DType::Bool, &[3i64, 2][..]));
        assert_eq!(t.as_slice::<bool>().unwrap(), &[true, true, true, false, false, true]);
        let bad_fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(7)), ..Default::default() };
        assert!(matches!(matrix(bools(), &bad_fill), Err(Error::ValueOutOfRange { .. })));

        let r: ArrayRef = Arc::new(Int16Array::from(vec![-5, 300, 7]));
        let mut mixed = bools();
        mixed.push((field("r", DataType::Int16), vec![r]));
        let zero =
            ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-1)), order: Order::F, ..Default::default() };
        let t = matrix(mixed.clone(), &zero).unwrap();
        assert_eq!((t.dtype(), t.strides()), (DType::Int16, &[1i64, 3][..]));
        assert_eq!(
            kernels::contiguous_copy(&t).unwrap().as_slice::<i16>().unwrap(),
            &[1, 1, -5, -1, 0, 300, 0, 1, 7]
        );

        let to_bool = ExportOptions { dtype: Some(DType::Bool), ..zero };
        let err = matrix(mixed, &to_bool).unwrap_err();
        assert!(err.to_string().contains("'r' is int16"), "{err}");
    }

    /// A tensor's values in C order, whatever its layout (a copy), as f64.
    fn logical(t: &Tensor) -> Vec<f64> {
        let c = kernels::contiguous_copy(t).unwrap();
        match c.dtype() {
            DType::Int32 => c.as_slice::<i32>().unwrap().iter().map(|&v| f64::from(v)).collect(),
            DType::Float64 => c.as_slice::<f64>().unwrap().to_vec(),
            DType::Bool => c.as_slice::<bool>().unwrap().iter().map(|&v| f64::from(u8::from(v))).collect(),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn f_order_lays_out_tensor_columns_with_the_first_index_fastest() {
        use std::collections::HashMap;

        use arrow_array::{FixedSizeListArray, Int32Array};

        use crate::arrow::extension::{EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY};
        use crate::tensor::f_strides;

        // (rows, 2, 3) int32 cells, values 0.. in C order, with a null at leaf slot 4.
        let cells = |rows: usize, first: i32, null_at: Option<usize>| -> ArrayRef {
            let leaf = Arc::new(Field::new("item", DataType::Int32, true));
            let values: Int32Array =
                (0..rows * 6).map(|i| (Some(i) != null_at).then_some(first + i as i32)).collect();
            let inner = FixedSizeListArray::new(leaf, 3, Arc::new(values), None);
            let inner_field = Arc::new(Field::new("item", inner.data_type().clone(), true));
            Arc::new(FixedSizeListArray::new(inner_field, 2, Arc::new(inner), None))
        };
        let one = [cells(4, 0, None)];
        let f = field("m", one[0].data_type().clone());
        let c_opts = ExportOptions::default();
        let f_opts = ExportOptions { order: Order::F, ..Default::default() };

        let c = to_tensor(&f, &one, &c_opts).unwrap().values;
        let t = to_tensor(&f, &one, &f_opts).unwrap().values;
        assert!(!c.copied() && t.copied() && !t.readonly());
        assert_eq!((t.shape(), t.strides()), (&[4, 2, 3][..], &f_strides(&[4, 2, 3])[..]));
        assert_eq!(logical(&t), logical(&c));
        // Row i, cell [j, k] holds 6i + 3j + k, at element i + 4j + 8k of F memory.
        let got: Vec<i32> = {
            // The F buffer read in memory order.
            // SAFETY: the 24 elements of `t`'s own allocation, kept alive by its owner.
            let raw = unsafe {
                Tensor::from_raw_parts(
                    t.data_ptr() as *mut u8,
                    vec![24],
                    None,
                    DType::Int32,
                    t.device(),
                    true,
                    t.owner().clone(),
                )
            }
            .unwrap();
            raw.as_slice::<i32>().unwrap().to_vec()
        };
        for i in 0..4 {
            for j in 0..2 {
                for k in 0..3 {
                    assert_eq!(got[i + 4 * j + 8 * k], (6 * i + 3 * j + k) as i32, "[{i}, {j}, {k}]");
                }
            }
        }
        // copy=True makes one copy, F-ordered; copy=False refuses, saying why.
        let always = ExportOptions { copy: CopyPolicy::Always, ..f_opts };
        let again = to_tensor(&f, &one, &always).unwrap().values;
        assert_eq!((again.strides(), logical(&again)), (t.strides(), logical(&c)));
        let never = ExportOptions { copy: CopyPolicy::Never, ..f_opts };
        let e = to_tensor(&f, &one, &never).unwrap_err();
        assert!(matches!(&e, Error::CopyRequired { reason } if reason.contains("order='F'")), "{e}");

        // Two chunks, a null filled and a cast, with and without a mask: the same values as C.
        let chunks = vec![cells(3, 0, Some(4)), cells(2, 100, None)];
        for nulls in [NullPolicy::Fill(Scalar::Int(-1)), NullPolicy::Mask] {
            let cast = ExportOptions { nulls, dtype: Some(DType::Float64), ..Default::default() };
            let c = to_tensor(&f, &chunks, &cast).unwrap();
            let t = to_tensor(&f, &chunks, &ExportOptions { order: Order::F, ..cast }).unwrap();
            assert_eq!(t.values.strides(), &f_strides(&[5, 2, 3])[..], "{nulls:?}");
            assert_eq!(logical(&t.values), logical(&c.values), "{nulls:?}");
            if let (Some(cm), Some(tm)) = (&c.mask, &t.mask) {
                assert_eq!(tm.strides(), t.values.strides());
                assert_eq!(logical(tm), logical(cm));
                assert_eq!(logical(tm).iter().filter(|&&v| v == 0.0).count(), 1);
            } else {
                assert!(c.mask.is_none() && t.mask.is_none(), "{nulls:?}");
            }
        }

        // A permuted fixed_shape_tensor: the same logical values, in F order.
        let meta = HashMap::from([
            (EXTENSION_NAME_KEY.to_string(), crate::arrow::FIXED_SHAPE_TENSOR.to_string()),
            (EXTENSION_METADATA_KEY.to_string(), r#"{"shape":[2,3],"permutation":[1,0]}"#.to_string()),
        ]);
        let leaf = Arc::new(Field::new("item", DataType::Int32, false));
        let flat = FixedSizeListArray::new(leaf, 6, Arc::new(Int32Array::from_iter_values(0..24)), None);
        let pf = Arc::new(Field::new("t", flat.data_type().clone(), false).with_metadata(meta));
        let chunk: [ArrayRef; 1] = [Arc::new(flat)];
        let c = to_tensor(&pf, &chunk, &c_opts).unwrap().values;
        let t = to_tensor(&pf, &chunk, &f_opts).unwrap().values;
        assert_eq!((c.shape(), t.shape()), (&[4, 3, 2][..], &[4, 3, 2][..]));
        assert_eq!((t.strides(), logical(&t)), (&f_strides(&[4, 3, 2])[..], logical(&c)));

        // A scalar column is in F order already: shared, not copied.
        let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        assert!(!to_tensor(&field("a", DataType::Int32), &[a], &f_opts).unwrap().values.copied());
    }

    #[test]
    fn outer_list_nulls_cover_every_leaf_slot_of_their_row() {
        use arrow_array::{FixedSizeListArray, Int32Array};
        let leaf = Arc::new(Field::new("item", DataType::Int32, true));
        let inner = FixedSizeListArray::new(
            leaf.clone(),
            2,
            Arc::new(Int32Array::from((1..=8).collect::<Vec<_>>())),
            None,
        );
        let inner_field = Arc::new(Field::new("item", inner.data_type().clone(), true));
        let outer = FixedSizeListArray::new(
            inner_field,
            2,
            Arc::new(inner),
            Some(NullBuffer::from(vec![false, true])),
        );
        let f = field("x", outer.data_type().clone());
        let chunks: Vec<ArrayRef> = vec![Arc::new(outer)];
        let fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-1)), ..Default::default() };
        let t = to_tensor(&f, &chunks, &fill).unwrap().values;
        assert_eq!(t.shape(), &[2, 2, 2]);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[-1, -1, -1, -1, 5, 6, 7, 8]);
        let mask = to_tensor(&f, &chunks, &ExportOptions { nulls: NullPolicy::Mask, ..Default::default() })
            .unwrap()
            .mask
            .unwrap();
        assert_eq!(mask.as_slice::<bool>().unwrap(), &[false, false, false, false, true, true, true, true]);
    }

    #[test]
    fn cast_errors_name_the_row_in_the_whole_column_not_in_its_chunk() {
        let a: ArrayRef = Arc::new(Int16Array::from(vec![1, 2]));
        let b: ArrayRef = Arc::new(Int16Array::from(vec![3, 300]));
        let to_u8 = ExportOptions { dtype: Some(DType::UInt8), ..Default::default() };
        let e = to_tensor(&field("x", DataType::Int16), &[a.clone(), b.clone()], &to_u8).unwrap_err();
        assert!(
            matches!(&e, Error::ValueOutOfRange { place, .. } if place == "at row 3 of column 'x'"),
            "{e}"
        );
        for order in [Order::C, Order::F] {
            let cols = vec![
                (field("y", DataType::Int16), vec![a.clone().slice(0, 1), a.slice(1, 1), b.clone()]),
                (field("x", DataType::Int16), vec![a.clone(), b.clone()]),
            ];
            let e = matrix(cols, &ExportOptions { order, ..to_u8 }).unwrap_err();
            assert!(
                matches!(&e, Error::ValueOutOfRange { place, .. } if place == "at row 3 of column 'y'"),
                "{e}"
            );
        }
    }

    /// Chunked columns in an output above the parallel size are written segment by segment on
    /// several threads: every cell (cast, filled, unpacked), the mask, and a single chunked
    /// column equal values computed cell by cell, in C and F order; of two bad values in
    /// different chunks, the first is reported, every time.
    #[test]
    fn chunked_outputs_written_in_parallel_hold_every_cell_and_report_the_first_error() {
        use arrow_array::{Float64Array, Int32Array, Int64Array};
        // Uneven chunks, different per column, so segments cut chunks at many places.
        let cuts = |n: usize, seed: usize| {
            let mut bounds = vec![0];
            while *bounds.last().unwrap() < n {
                let b = bounds.last().unwrap() + 1 + (bounds.len() * 7919 + seed) % 40_000;
                bounds.push(b.min(n));
            }
            bounds
        };
        let chunked = |n: usize, seed: usize, make: &dyn Fn(std::ops::Range<usize>) -> ArrayRef| {
            cuts(n, seed).windows(2).map(|w| make(w[0]..w[1])).collect::<Vec<ArrayRef>>()
        };
        let n = 150_000; // x 3 columns x 8 bytes: 3.6 MB, above the parallel threshold
        assert!(n * 3 * 8 >= kernels::PARALLEL_THRESHOLD_BYTES);
        let int = |i: usize| (i % 11 != 3).then_some(i as i32 - 5000);
        let float = |i: usize| i as f64 * 0.5;
        let flag = |i: usize| (i % 5 != 0).then_some(i % 3 == 0);
        let cols = vec![
            (field("a", DataType::Int32), chunked(n, 1, &|r| Arc::new(r.map(int).collect::<Int32Array>()))),
            (
                field("b", DataType::Float64),
                chunked(n, 2, &|r| Arc::new(r.map(float).collect::<Float64Array>())),
            ),
            (
                field("c", DataType::Boolean),
                chunked(n, 3, &|r| Arc::new(r.map(flag).collect::<BooleanArray>())),
            ),
        ];
        let cell = |i: usize, j: usize| match j {
            0 => int(i).map(f64::from),
            1 => Some(float(i)),
            _ => flag(i).map(|b| f64::from(u8::from(b))),
        };
        for order in [Order::C, Order::F] {
            let opts =
                ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-7)), order, ..Default::default() };
            // In F order the strides say so; a C-order copy of it reads as rows.
            let t = kernels::contiguous_copy(&matrix(cols.clone(), &opts).unwrap()).unwrap();
            let got = t.as_slice::<f64>().unwrap();
            let masked = ExportOptions { nulls: NullPolicy::Mask, order, ..Default::default() };
            let (fields, chunks): (Vec<_>, Vec<_>) = cols.iter().cloned().unzip();
            let mask = columns_to_tensor(&fields, &chunks, &masked).unwrap().mask.unwrap();
            let mask = kernels::contiguous_copy(&mask).unwrap();
            let mask = mask.as_slice::<bool>().unwrap();
            for i in 0..n {
                for j in 0..3 {
                    assert_eq!(got[i * 3 + j], cell(i, j).unwrap_or(-7.0), "{order:?} row {i} column {j}");
                    assert_eq!(mask[i * 3 + j], cell(i, j).is_some(), "{order:?} mask row {i} column {j}");
                }
            }
        }
        // One column in chunks, filled and cast: 200k f64 is 1.6 MB.
        let one = chunked(200_000, 4, &|r| Arc::new(r.map(int).collect::<Int32Array>()));
        let opts = ExportOptions {
            nulls: NullPolicy::Fill(Scalar::Int(-7)),
            dtype: Some(DType::Float64),
            ..Default::default()
        };
        let t = to_tensor(&field("a", DataType::Int32), &one, &opts).unwrap().values;
        for (i, &v) in t.as_slice::<f64>().unwrap().iter().enumerate() {
            assert_eq!(v, int(i).map_or(-7.0, f64::from), "row {i}");
        }
        // Values too big for int32 in the second and the last chunk of a 2 MB int64 column.
        let big = |i: usize| if i == 50_001 || i == 249_999 { 1i64 << 40 } else { i as i64 };
        let chunks: Vec<ArrayRef> = (0..5)
            .map(|c| Arc::new((c * 50_000..(c + 1) * 50_000).map(big).collect::<Int64Array>()) as ArrayRef)
            .collect();
        let to_i32 = ExportOptions { dtype: Some(DType::Int32), ..Default::default() };
        for _ in 0..20 {
            let e = to_tensor(&field("x", DataType::Int64), &chunks, &to_i32).unwrap_err();
            assert!(
                matches!(&e, Error::ValueOutOfRange { place, .. } if place == "at row 50001 of column 'x'"),
                "{e}"
            );
        }
    }
}

//! The CPU executor: one column (chunked or not), or several columns into one `(n, k)` matrix,
//! as a tensor, from the specs of `spec.rs`.
//!
//! Zero-copy is tried first unless `copy=True`; when it is impossible, the one fused copy pass
//! of [`crate::kernels`] makes the tensor, unless `copy=False`, which refuses with the reason.
//! Copies are marked [`Tensor::copied`] (DLPack `IS_COPIED`) and are writable.

use arrow_array::{Array, ArrayRef};
use arrow_data::ArrayData;
use arrow_schema::{DataType, FieldRef};

use super::read::{
    bool_bytes, column_ref, leaf_of, leaf_validity, null_row_slots, segments, validity_bytes, validity_of,
};
use super::spec::{ColumnSpec, Execution, Made, MatrixSpec};
use super::to_tensor::from_leaf;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, BitSlice, Column, ColumnRef};
use crate::options::{ExportOptions, Inexact, Order};
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

/// One column that is not ragged ([`super::to_tensor`] sends ragged and list-view columns
/// elsewhere), in one or more chunks, as one tensor: zero-copy for one chunk without nulls
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
pub(crate) fn plain_to_tensor(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
) -> Result<Converted> {
    let spec = ColumnSpec::new(field, chunks, opts)?;
    let values = match spec.execution(opts.copy)? {
        // Under order="F", `in_order` below makes the one copy.
        Execution::Share | Execution::ShareThenReorder => shared(&spec)?,
        Execution::Copy => copy_column(&spec)?,
    };
    let mask = spec.made.mask.then(|| validity_mask(&spec)).transpose()?;
    in_order(Converted { values, mask, index: None }, opts.order)
}

/// Under [`Order::F`], the values and the mask (two or more dimensions: a tensor column's
/// `(n, *cell)`, a padded ragged column) in F order, as numpy's `asfortranarray` lays them out:
/// one gather each, unless they already are. The index (lengths, offsets) is 1-D. Under
/// [`Order::C`], unchanged (copies only to reorder).
pub(crate) fn in_order(c: Converted, order: Order) -> Result<Converted> {
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
    Ok(from_leaf(leaf.as_ref(), spec.leaf, spec.made.shape.clone(), Some(spec.made.strides.clone()))?
        .with_logical(spec.made.logical.clone()))
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
    let MatrixSpec { n, k, dtypes, made, inexact } = MatrixSpec::new(fields, columns, opts)?;
    let Made { target, storage, fill, shape, strides, mask: want_mask, .. } = made;
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
            .zip(&dtypes)
            .map(|(((a, unpacked), name), &declared)| {
                let col = match unpacked {
                    Some(b) => {
                        Column::new(ColumnRef::UInt8(b)).with_validity(validity_of(a.as_ref())?).named(name)
                    }
                    None => column_ref(a.as_ref(), declared, name)?,
                };
                Ok(col.starting_at(seg.start))
            })
            .collect::<Result<Vec<_>>>()?;
        piece.write(&cols, fill, inexact)
    })?;
    let values = out.into_tensor(target, shape.clone(), strides.clone())?;
    let mask = if want_mask {
        let mut m = Output::new(DType::UInt8, n * k)?;
        let pieces = m.pieces(opts.order, n, k, &rows)?;
        each(segments.iter().zip(pieces).collect(), parallel, |(seg, mut piece)| {
            let bytes: Vec<Vec<u8>> =
                seg.slices.iter().map(|a| validity_bytes(a.as_ref())).collect::<Result<_>>()?;
            let cols: Vec<Column> = bytes
                .iter()
                .zip(&names)
                .map(|(v, name)| Column::new(ColumnRef::UInt8(v)).named(name))
                .collect();
            piece.write(&cols, None, inexact)
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
        expand_validity(chunk, &mut out[pos..pos + slots])?;
        pos += slots;
    }
    let t = Tensor::from_vec(out, spec.made.shape.clone())?;
    // The mask follows the values' memory order (permuted tensors too). Relabel u8 -> bool:
    // both are one byte per element and every byte is 0 or 1.
    // SAFETY: the same allocation and element count, with a permutation of C strides.
    let t = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr() as *mut u8,
            spec.made.shape.clone(),
            Some(spec.made.strides.clone()),
            DType::Bool,
            t.device(),
            false,
            t.owner().clone(),
        )
    }?;
    Ok(t.with_copied(true))
}

/// Writes 1 for valid leaf slots and 0 for null ones (at any level) into `out`: the leaf's
/// own bits unpacked, or, under null list rows, [`leaf_validity`]'s (the CUDA plan's too).
fn expand_validity(array: &ArrayRef, out: &mut [u8]) -> Result<()> {
    let (leaf, levels) = leaf_of(array);
    let combined;
    let nulls = if levels.is_empty() {
        leaf.nulls()
    } else {
        combined = leaf_validity(leaf.as_ref(), &levels);
        Some(&combined)
    };
    match nulls {
        Some(n) => kernels::unpack_bits(BitSlice::new(n.validity(), n.offset(), n.len())?, out),
        None => out.fill(1),
    }
    Ok(())
}

/// One copy of a column into a fresh buffer: chunks concatenated, nulls filled, cast fused.
fn copy_column(spec: &ColumnSpec) -> Result<Tensor> {
    let target = spec.made.target;
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
                piece.unpack_bools(leaf_array.as_ref(), bool_byte(spec.made.fill))?;
            } else {
                let col = column_ref(leaf_array.as_ref(), spec.leaf, spec.field.name())?.starting_at(pos);
                piece.write(std::slice::from_ref(&col), spec.made.fill, spec.inexact)?;
            }
            null_row_slots(&list_nulls).try_for_each(|slots| piece.fill(spec.made.fill, slots))
        })?;
    }
    let made = &spec.made;
    Ok(out.into_tensor(target, made.shape.clone(), made.strides.clone())?.with_logical(made.logical.clone()))
}

/// The byte a null becomes in a bool tensor: the spec gives a bool's fill as its 0/1 byte.
fn bool_byte(fill: Option<u64>) -> u8 {
    fill.unwrap_or(0) as u8
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
    fn write(&mut self, cols: &[Column], fill: Option<u64>, inexact: Inexact) -> Result<()> {
        let dtype = self.dtype;
        match self.parts.as_mut_slice() {
            [run] => kernels::interleave_into(dtype, cols, Order::C, fill, inexact, run),
            parts => cols.iter().zip(parts).try_for_each(|(col, run)| {
                kernels::interleave_into(dtype, std::slice::from_ref(col), Order::C, fill, inexact, run)
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
    fn fill(&mut self, fill: Option<u64>, range: std::ops::Range<usize>) -> Result<()> {
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
mod tests;

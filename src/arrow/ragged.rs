//! List columns whose rows have different lengths (tokens, events, embeddings per item), as
//! [`Ragged::Pad`] (a padded `(n, width, *cell)` tensor plus lengths) or [`Ragged::Jagged`]
//! (the values end to end plus offsets).
//!
//! The rows' values are read as the list's child column and converted by [`to_tensor`], so a
//! cast, the null policy on the elements and the zero-copy rules are those of every column.
//! Null rows have no values: under [`NullPolicy::Error`] they are refused, under any other
//! policy they become empty rows (length 0). Under [`NullPolicy::Mask`] the mask is false for
//! null elements and for padding.
//!
//! | mode | values | index | copies |
//! |---|---|---|---|
//! | pad | `(n, width, *cell)` | lengths `(n,)` int64 | always (one pass after the child's) |
//! | jagged | `(total, *cell)` | offsets `(n + 1,)` int64 | none for one chunk of a LargeList starting at 0 that needs no cast, fill or row removal; otherwise the offsets (n + 1 integers) and, where needed, the values |

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, GenericListArray, OffsetSizeTrait, new_empty_array};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, FieldRef};

use super::copy::{Converted, plain_to_tensor};
use super::read::check_chunk_types;
use crate::decide::{Cause, Decision, decide};
use crate::dtype::DType;
use crate::error::{Error, Place, Result};
use crate::kernels::{self, HostBuffer};
use crate::options::{CopyPolicy, ExportOptions, Inexact, NullPolicy, Order, Ragged, Scalar};
use crate::tensor::Tensor;

/// True when `opts` asks for a ragged form and the column is a List or LargeList: the one test
/// both executors make before [`ragged_to_tensor`].
pub fn is_ragged(field: &Field, opts: &ExportOptions) -> bool {
    opts.ragged != Ragged::Error && matches!(field.data_type(), DataType::List(_) | DataType::LargeList(_))
}

/// A List or LargeList column (in chunks) as [`Ragged::Pad`] or [`Ragged::Jagged`] tensors:
/// [`Converted::index`] holds the lengths or the offsets. Copies as this module's table says.
///
/// # Errors
/// [`Error::Nulls`] for null rows under [`NullPolicy::Error`], [`Error::CopyRequired`] under
/// [`CopyPolicy::Never`] when a copy is needed (padding always is), [`Error::ValueOutOfRange`]
/// for a pad value that does not fit the dtype, and the child column's errors (naming this
/// column), such as null elements under [`NullPolicy::Error`] or a child with no tensor dtype.
pub fn ragged_to_tensor(field: &FieldRef, chunks: &[ArrayRef], opts: &ExportOptions) -> Result<Converted> {
    let (DataType::List(child) | DataType::LargeList(child)) = field.data_type() else {
        return Err(Error::InvalidArgument(format!("column '{}' is not a List or LargeList", field.name())));
    };
    check_chunk_types(field, chunks)?;
    let cap = match opts.ragged {
        Ragged::Pad { max_len, .. } => max_len,
        _ => None,
    };
    let mut rows = Rows::read(chunks, cap)?;
    opts.nulls.admit(rows.null_rows, || format!("'{}' (null list rows)", field.name()))?;
    // The child under the column's name, so that its errors name the column.
    let child_field = Arc::new(
        Field::new(field.name(), child.data_type().clone(), child.is_nullable())
            .with_metadata(child.metadata().clone()),
    );
    let pieces = match std::mem::take(&mut rows.pieces) {
        p if p.is_empty() => vec![new_empty_array(child.data_type())],
        p => p,
    };
    match opts.ragged {
        Ragged::Pad { pad, max_len } => {
            decide(opts.copy, Some(Cause::RaggedPad { column: field.name().to_string() }))?;
            // The rows are padded from the C-ordered values; `to_tensor` lays the result out
            // in the asked order.
            let child_opts =
                ExportOptions { ragged: Ragged::Error, copy: CopyPolicy::IfNeeded, order: Order::C, ..*opts };
            let flat = plain_to_tensor(&child_field, &pieces, &child_opts)?;
            let width = max_len.unwrap_or_else(|| rows.lengths.iter().copied().max().unwrap_or(0));
            pad_all(flat, &rows.lengths, width, pad, opts.nulls == NullPolicy::Mask)
        }
        Ragged::Jagged => {
            let child_opts = ExportOptions { ragged: Ragged::Error, ..*opts };
            let flat = plain_to_tensor(&child_field, &pieces, &child_opts)?;
            let shared = rows.shared_offsets(chunks);
            let cause = shared.is_none().then(|| Cause::RaggedOffsets { column: field.name().to_string() });
            let offsets = match (decide(opts.copy, cause)?, shared) {
                (Decision::Share, Some(t)) => t?,
                _ => rows.offsets()?,
            };
            Ok(Converted { index: Some(offsets), ..flat })
        }
        Ragged::Error => {
            Err(Error::InvalidArgument("ragged_to_tensor needs ragged='pad' or 'jagged'".into()))
        }
    }
}

/// The rows of a list column: their (kept) lengths and the child values they cover.
struct Rows {
    /// Kept length of each row: 0 for a null row, at most the cap.
    lengths: Vec<usize>,
    /// The kept values, as slices of the chunks' children (adjacent rows merged).
    pieces: Vec<ArrayRef>,
    /// Null rows.
    null_rows: usize,
    /// Whether some values between the first and the last offset are left out (a null row
    /// that covers values, a truncated row).
    skips: bool,
}

impl Rows {
    fn read(chunks: &[ArrayRef], cap: Option<usize>) -> Result<Self> {
        let mut rows = Rows { lengths: Vec::new(), pieces: Vec::new(), null_rows: 0, skips: false };
        for chunk in chunks {
            match chunk.data_type() {
                DataType::List(_) => rows.add(chunk.as_list::<i32>(), cap),
                DataType::LargeList(_) => rows.add(chunk.as_list::<i64>(), cap),
                other => return Err(Error::InvalidArgument(format!("a {other} chunk is not a list"))),
            }
        }
        Ok(rows)
    }

    fn add<O: OffsetSizeTrait>(&mut self, list: &GenericListArray<O>, cap: Option<usize>) {
        let offsets = list.value_offsets();
        let values = list.values();
        let mut run: Option<(usize, usize)> = None;
        for (row, w) in offsets.windows(2).enumerate() {
            let (start, end) = (w[0].as_usize(), w[1].as_usize());
            let len = if list.is_null(row) {
                self.null_rows += 1;
                0
            } else {
                end - start
            };
            let kept = cap.map_or(len, |c| len.min(c));
            self.skips |= kept < end - start;
            self.lengths.push(kept);
            if kept == 0 {
                continue;
            }
            run = match run {
                Some((s, e)) if e == start => Some((s, start + kept)),
                Some((s, e)) => {
                    self.pieces.push(values.slice(s, e - s));
                    Some((start, start + kept))
                }
                None => Some((start, start + kept)),
            };
        }
        if let Some((s, e)) = run {
            self.pieces.push(values.slice(s, e - s));
        }
    }

    /// The int64 offsets tensor of the kept lengths (copies `n + 1` integers).
    fn offsets(&self) -> Result<Tensor> {
        let offsets = OffsetBuffer::<i64>::from_lengths(self.lengths.iter().copied());
        let n = self.lengths.len() as i64 + 1;
        Ok(Tensor::from_buffer(offsets.into_inner().into_inner(), 0, vec![n], None, DType::Int64)?
            .with_copied(true))
    }

    /// The column's own offsets as the int64 offsets tensor, without copying: for one
    /// LargeList chunk whose offsets start at 0, where no values are left out.
    fn shared_offsets(&self, chunks: &[ArrayRef]) -> Option<Result<Tensor>> {
        let [chunk] = chunks else { return None };
        let DataType::LargeList(_) = chunk.data_type() else { return None };
        let list = chunk.as_list::<i64>();
        if self.skips || list.value_offsets()[0] != 0 {
            return None;
        }
        let buffer = list.offsets().inner().inner().clone();
        Some(Tensor::from_buffer(buffer, 0, vec![list.len() as i64 + 1], None, DType::Int64))
    }
}

/// The padded `(n, width, *cell)` values (and, under `mask`, the padded validity), from the
/// rows' values end to end (copies).
fn pad_all(flat: Converted, lengths: &[usize], width: usize, pad: Scalar, mask: bool) -> Result<Converted> {
    let values = host_contiguous(flat.values)?;
    let cell_shape = values.shape()[1..].to_vec();
    let cell_elems: usize = cell_shape.iter().map(|&d| d as usize).product();
    let one = pad_item(values.dtype(), pad)?;
    let padded = |src: &Tensor, item: &[u8]| -> Result<Tensor> {
        let mut shape = vec![lengths.len() as i64, width as i64];
        shape.extend_from_slice(&cell_shape);
        let cell = item.repeat(cell_elems);
        let mut out = HostBuffer::for_overwrite(lengths.len() * width * cell.len())?;
        kernels::pad_rows(src.as_bytes()?, lengths, cell.len(), width, &cell, out.as_mut_slice())?;
        Ok(Tensor::from_buffer(out.into_buffer(), 0, shape, None, src.dtype())?.with_copied(true))
    };
    let out_values = padded(&values, &one)?.with_logical(None);
    let out_mask = if mask {
        let valid = match flat.mask {
            Some(m) => host_contiguous(m)?,
            None => Tensor::from_vec(vec![true; values.numel()], values.shape().to_vec())?,
        };
        Some(padded(&valid, &[0])?)
    } else {
        None
    };
    let lengths = lengths.iter().map(|&l| l as i64).collect::<Vec<_>>();
    let n = lengths.len() as i64;
    Ok(Converted {
        values: out_values,
        mask: out_mask,
        index: Some(Tensor::from_vec(lengths, vec![n])?.with_copied(true)),
    })
}

/// A C-contiguous host tensor: itself, or a copy of a permuted one.
fn host_contiguous(t: Tensor) -> Result<Tensor> {
    if t.is_c_contiguous() { Ok(t) } else { kernels::contiguous_copy(&t) }
}

/// The pad value's bytes in `dtype`, range-checked as a fill value is (and rounded where the
/// dtype holds it only rounded).
fn pad_item(dtype: DType, pad: Scalar) -> Result<Vec<u8>> {
    let bits = kernels::fill_bits(dtype, pad, Inexact::Round).map_err(|e| match e {
        Error::ValueOutOfRange { value, target, .. } => {
            Error::ValueOutOfRange { value, place: Place::Pad, target }
        }
        other => other,
    })?;
    Ok(bits.to_le_bytes()[..dtype.itemsize()].to_vec())
}

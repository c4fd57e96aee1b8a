//! What a conversion will make, decided once for both executors: [`ColumnSpec`] for one column
//! and [`MatrixSpec`] for several columns stacked into an `(n, k)` matrix. The CPU copy engine
//! (`copy.rs`) and the CUDA planner (`cuda/plan.rs`) build their work from these, so every
//! check (nulls, types, layouts, the null and copy policies, the fill value) is written once
//! and both paths refuse a bad column with the same error. Reads metadata and validity counts,
//! never values, and copies nothing.

use arrow_array::ArrayRef;
use arrow_schema::{DataType, FieldRef};

use super::layout::{CellLayout, name_column};
use super::read::{check_chunk_types, lists_as_fixed_chunks, nested_null_count};
use crate::decide::{Cause, Decision, decide};
use crate::dtype::{DType, field_dtype};
use crate::error::{Error, Result};
use crate::kernels;
use crate::options::{CopyPolicy, ExportOptions, Inexact, Order};
use crate::tensor::{c_strides, is_f_contiguous};

/// What a conversion makes, as both executors write it (the CPU copy engine and the CUDA
/// plan hold this one description, not their own).
#[derive(Debug, Clone)]
pub(crate) struct Made {
    /// The dtype of the result.
    pub target: DType,
    /// The dtype written: bools are written as their 0/1 bytes, into u8 storage labelled bool
    /// when every column of a matrix is bool, or cast like any u8 column (numpy's True -> 1)
    /// when they join numbers; a column's is its target.
    pub storage: DType,
    /// The result's shape: `[rows, *cell]` for a column, `[n, k]` for a matrix.
    pub shape: Vec<i64>,
    /// Its strides (elements): C order, a tensor column's permuted cells, or a matrix's F order.
    pub strides: Vec<i64>,
    /// Whether a validity mask is made (asked for, and there are nulls).
    pub mask: bool,
    /// The value null slots become, checked once against `target` ([`kernels::fill_bits`]), as
    /// its little-endian bytes (a bool's 0/1 byte); `None` when the copy writes no null and no
    /// fill was given.
    pub fill: Option<u64>,
    /// The Arrow field the result keeps for the way back: a column's own when the dtype is
    /// unchanged.
    pub logical: Option<FieldRef>,
}

/// One column (in one or more chunks) as one tensor, checked.
#[derive(Debug, Clone)]
pub(crate) struct ColumnSpec {
    /// The column's field, List/LargeList normalised to FixedSizeList.
    pub field: FieldRef,
    /// The chunks, normalised like the field.
    pub chunks: Vec<ArrayRef>,
    /// The dtype of the scalar leaf.
    pub leaf: DType,
    /// What the conversion makes.
    pub made: Made,
    /// Nulls at every level, in leaf slots covered.
    pub null_count: usize,
    /// Rows.
    pub rows: usize,
    /// Leaf slots per row.
    pub cell_size: usize,
    /// What an integer that a float target cannot hold exactly does.
    pub inexact: Inexact,
    /// Why the column cannot be shared as it is, in the asked order (`None`: zero-copy is
    /// possible; `copy=True` still copies).
    pub copy_reason: Option<Cause>,
    /// Whether the chunk's own memory holds the tensor as `shape` and `strides` say (one chunk,
    /// no cast, no nulls to fill, no bit-packed bools), whatever the copy policy and order ask.
    pub shareable: bool,
    /// Whether `order="F"` asks for another layout than `strides`: the result is then the
    /// F-ordered copy of the tensor those describe.
    pub fortran: bool,
}

/// What a conversion does with a column's memory ([`ColumnSpec::execution`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Execution {
    /// A tensor over the column's own memory (no copy).
    Share,
    /// A view of the column's own memory, gathered into F order (`order="F"`: the one copy).
    ShareThenReorder,
    /// One fused copy pass on the host.
    Copy,
}

impl ColumnSpec {
    /// Share, copy or refuse on the host: [`decide`] on this column's reason under `copy`. A
    /// column the host shares as it is stays shared (also under `order="F"`, gathered into F
    /// order after). Onto a device, `transfer` has decided the move before the device plan is
    /// made, and the plan copies.
    ///
    /// # Errors
    /// [`Error::CopyRequired`] under [`CopyPolicy::Never`] when a copy is needed.
    pub fn execution(&self, copy: CopyPolicy) -> Result<Execution> {
        Ok(match decide(copy, self.copy_reason.clone())? {
            Decision::Share => Execution::Share,
            Decision::Copy if self.fortran && self.shareable => Execution::ShareThenReorder,
            Decision::Copy => Execution::Copy,
        })
    }

    /// Checks one column against `opts` and says what its tensor will be.
    ///
    /// # Errors
    /// [`Error::Nulls`] under `NullPolicy::Error`, [`Error::UnsupportedArrowType`] for a leaf
    /// with no tensor dtype, [`Error::InvalidArgument`] for chunks of another type, a boolean
    /// column cast to numbers or NaN for a dtype without it, [`Error::ValueOutOfRange`] for a
    /// fill value that does not fit, [`Error::InvalidExtensionMetadata`] for tensor metadata
    /// that does not fit the storage, and the errors of ragged list columns.
    pub fn new(field: &FieldRef, chunks: &[ArrayRef], opts: &ExportOptions) -> Result<Self> {
        if matches!(field.data_type(), DataType::List(_) | DataType::LargeList(_)) {
            let (field, chunks) = lists_as_fixed_chunks(field, chunks)?;
            return Self::new(&field, &chunks, opts);
        }
        check_chunk_types(field, chunks)?;
        let null_count: usize = chunks.iter().map(|c| nested_null_count(c.as_ref())).sum();
        let layout = CellLayout::from_field(field)?;
        let leaf = layout.dtype;
        let target = opts.dtype.unwrap_or(leaf);
        // Nulls are refused before the cast is looked at, as they always were.
        let (mask, fill) = nulls_made(opts, [(field.name().as_str(), null_count)], target)?;
        if leaf == DType::Bool && target != DType::Bool {
            return Err(Error::InvalidArgument(format!(
                "column '{}' is boolean; dlframe exports it as bool (cast it in Arrow for {target})",
                field.name()
            )));
        }
        let rows: usize = chunks.iter().map(|c| c.len()).sum();
        let (shape, strides) = layout.column(rows);
        let fortran = opts.order == Order::F && !is_f_contiguous(&shape, &strides);
        let column = || field.name().to_string();
        let needs_copy = if chunks.len() != 1 {
            Some(Cause::Chunks { column: column(), chunks: chunks.len() })
        } else if target != leaf {
            Some(Cause::Cast { column: column(), from: leaf, to: target })
        } else if null_count > 0 && !mask {
            Some(Cause::NullFill { column: column(), nulls: null_count })
        } else if leaf == DType::Bool {
            Some(Cause::BitPacked { column: column() })
        } else {
            None
        };
        let shareable = needs_copy.is_none();
        let copy_reason =
            needs_copy.or_else(|| fortran.then(|| Cause::Fortran { column: column(), shape: shape.clone() }));
        let logical = (target == leaf).then(|| field.clone());
        Ok(ColumnSpec {
            field: field.clone(),
            chunks: chunks.to_vec(),
            leaf,
            made: Made { target, storage: target, shape, strides, mask, fill, logical },
            null_count,
            rows,
            cell_size: layout.cell,
            inexact: opts.inexact,
            copy_reason,
            shareable,
            fortran,
        })
    }

    /// Whether a copy is only the chunks' leaf bytes placed one after another: the same
    /// dtype, no nulls, no bit-packed bools.
    pub fn is_plain_concat(&self) -> bool {
        self.leaf != DType::Bool && self.made.target == self.leaf && self.null_count == 0
    }
}

/// What a conversion of `columns` (names and null counts) into `target` does with nulls, decided
/// once (`NullPolicy::decide`): whether a mask is made, and the fill's checked bits.
fn nulls_made<'a>(
    opts: &ExportOptions,
    columns: impl IntoIterator<Item = (&'a str, usize)>,
    target: DType,
) -> Result<(bool, Option<u64>)> {
    let nulls = opts.nulls.decide(columns, target)?;
    let fill = nulls.fill.map(|s| kernels::fill_bits(target, s, opts.inexact)).transpose()?;
    Ok((nulls.mask, fill))
}

/// Several same-length scalar columns as one `(n, k)` matrix, checked. A matrix is always a
/// copy.
pub(crate) struct MatrixSpec {
    /// Rows.
    pub n: usize,
    /// Columns.
    pub k: usize,
    /// The dtype each column's field gives ([`field_dtype`]), in order: its leaf arrays' dtype,
    /// which an extension's `FixedSizeBinary` storage does not say by itself.
    pub dtypes: Vec<DType>,
    /// What the conversion makes (`[n, k]`, in C or F order; no Arrow field of its own).
    pub made: Made,
    /// What an integer that a float target cannot hold exactly does.
    pub inexact: Inexact,
}

impl MatrixSpec {
    /// Checks several columns (lengths, types, nulls, copy policy, dtype, fill) and says what
    /// the matrix will be. Reads no values.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for columns of different lengths, [`Error::UnsupportedArrowType`]
    /// for non-scalar or non-numeric columns, [`Error::Nulls`] under `NullPolicy::Error`,
    /// [`Error::CopyRequired`] under [`CopyPolicy::Never`], and the fill errors of
    /// [`ColumnSpec::new`].
    pub fn new(fields: &[FieldRef], columns: &[Vec<ArrayRef>], opts: &ExportOptions) -> Result<Self> {
        if fields.len() != columns.len() {
            return Err(Error::InvalidArgument(format!(
                "{} fields for {} columns",
                fields.len(),
                columns.len()
            )));
        }
        let k = fields.len();
        let lens: Vec<usize> = columns.iter().map(|c| c.iter().map(|a| a.len()).sum()).collect();
        let n = lens.first().copied().unwrap_or(0);
        for (f, &len) in fields.iter().zip(&lens) {
            if len != n {
                return Err(Error::LengthMismatch {
                    what: format!("column '{}'", f.name()),
                    expected: n,
                    found: len,
                });
            }
        }
        let mut dtypes = Vec::with_capacity(k);
        for f in fields {
            let dt = match f.data_type() {
                DataType::FixedSizeList(..) => {
                    return Err(Error::UnsupportedArrowType {
                        what: format!("column '{}' of type {}", f.name(), f.data_type()),
                        remedy: "a matrix stacks scalar columns; convert list columns on their own",
                    });
                }
                _ => field_dtype(f).map_err(|e| name_column(e, f))?,
            };
            dtypes.push(dt);
        }
        decide(opts.copy, Some(Cause::Interleave { columns: k }))?;
        let target = match opts.dtype {
            Some(d) => d,
            None if dtypes.is_empty() => DType::Float64,
            None => kernels::common_dtype(&dtypes),
        };
        if let (DType::Bool, Some((f, dt))) =
            (target, fields.iter().zip(&dtypes).find(|(_, d)| **d != DType::Bool))
        {
            return Err(Error::InvalidArgument(format!(
                "column '{}' is {dt}, which dlframe does not cast to bool; compare it instead (x != 0)",
                f.name()
            )));
        }
        let counts = fields
            .iter()
            .zip(columns)
            .map(|(f, c)| (f.name().as_str(), c.iter().map(|a| a.null_count()).sum()));
        let (mask, fill) = nulls_made(opts, counts, target)?;
        let shape = vec![n as i64, k as i64];
        let strides = match opts.order {
            Order::C => c_strides(&shape),
            Order::F => vec![1, n as i64],
        };
        let storage = if target == DType::Bool { DType::UInt8 } else { target };
        let made = Made { target, storage, shape, strides, mask, fill, logical: None };
        Ok(MatrixSpec { n, k, dtypes, made, inexact: opts.inexact })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{BooleanArray, Int32Array};
    use arrow_schema::Field;

    use super::*;

    fn spec(a: ArrayRef, opts: &ExportOptions) -> ColumnSpec {
        let field = Arc::new(Field::new("a", a.data_type().clone(), true));
        ColumnSpec::new(&field, &[a], opts).unwrap()
    }

    #[test]
    fn one_answer_shares_copies_or_refuses_a_column_on_the_host() {
        use CopyPolicy::{Always, IfNeeded, Never};
        use Execution::{Copy, Share, ShareThenReorder};
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let bools: ArrayRef = Arc::new(BooleanArray::from(vec![true, false]));
        let with = |copy| ExportOptions { copy, ..Default::default() };
        let answer =
            |a: &ArrayRef, copy| spec(a.clone(), &with(copy)).execution(copy).map_err(|e| e.to_string());
        assert_eq!(answer(&ints, IfNeeded), Ok(Share));
        assert_eq!(answer(&ints, Never), Ok(Share));
        assert_eq!(answer(&ints, Always), Ok(Copy));
        assert_eq!(answer(&bools, IfNeeded), Ok(Copy));
        assert!(answer(&bools, Never).unwrap_err().contains("boolean, which Arrow bit-packs"));
        // A 2-D column shared on the CPU and asked for in F order: shared, then gathered.
        let cells: ArrayRef = Arc::new(arrow_array::FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            2,
            Arc::new(Int32Array::from(vec![1, 2, 3, 4])),
            None,
        ));
        let f = ExportOptions { order: Order::F, ..Default::default() };
        assert_eq!(spec(cells.clone(), &f).execution(IfNeeded).ok(), Some(ShareThenReorder));
        let f_never = ExportOptions { copy: Never, ..f };
        assert!(spec(cells, &f_never).execution(Never).unwrap_err().to_string().contains("order='F'"));
        // A boolean column with nulls cast to numbers: its nulls are what it is refused for.
        let field = Arc::new(Field::new("b", DataType::Boolean, true));
        let nulls: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None]));
        let cast = ExportOptions { dtype: Some(DType::Float32), ..Default::default() };
        let e = ColumnSpec::new(&field, &[nulls], &cast).unwrap_err();
        assert!(matches!(&e, Error::Nulls { null_count: 1, .. }), "{e}");
    }
}

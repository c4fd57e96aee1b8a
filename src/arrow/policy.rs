//! Null and copy policies, and the conversions that take them: one column (chunked or not),
//! several columns into one `(n, k)` matrix, and tensors back to Arrow with a copy fallback.
//!
//! Zero-copy is tried first unless `copy=True`; when it is impossible, the one fused copy pass
//! of [`crate::kernels`] makes the tensor, unless `copy=False`, which refuses with the reason.
//! Copies are marked [`Tensor::copied`] (DLPack `IS_COPIED`) and are writable.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_buffer::MutableBuffer;
use arrow_data::ArrayData;
use arrow_schema::{DataType, FieldRef};

use super::extension::TensorMetadata;
use super::{column_to_tensor, tensor_to_column};
use crate::dtype::{DType, storage_dtype};
use crate::error::{Error, Result};
use crate::kernels::{self, BitSlice, Column, ColumnRef, Order, Scalar};
use crate::tensor::{Tensor, c_strides};

/// What to do with nulls (docs/design.md, "Null policy").
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum NullPolicy {
    /// Refuse columns with nulls, naming the column and the count (the default).
    #[default]
    Error,
    /// Replace nulls by a value, fused into the copy.
    Fill(Scalar),
    /// Replace nulls by NaN (float dtypes only).
    Nan,
    /// Values as they are (zero-copy when possible) plus a separate bool validity tensor.
    Mask,
}

impl NullPolicy {
    /// The `nulls=` names, as messages list them.
    pub const NAMES: [&'static str; 4] = ["error", "fill", "nan", "mask"];

    /// The policy that a `nulls=` name and a fill value select, for every boundary (Python, the
    /// Polars plugin): a fill value under `"error"` (the default) means `"fill"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown name, or `"fill"` without a fill value.
    pub fn parse(name: &str, fill: Option<Scalar>) -> Result<Self> {
        Ok(match (name, fill) {
            ("error", None) => NullPolicy::Error,
            ("error" | "fill", Some(v)) => NullPolicy::Fill(v),
            ("fill", None) => return Err(Error::InvalidArgument("nulls='fill' needs fill_value=...".into())),
            ("nan", _) => NullPolicy::Nan,
            ("mask", _) => NullPolicy::Mask,
            (other, _) => {
                return Err(Error::InvalidArgument(format!(
                    "nulls={other:?}: expected 'error', 'fill', 'nan' or 'mask'"
                )));
            }
        })
    }
}

/// The array API's `copy` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyPolicy {
    /// `copy=None`: share memory when possible, else copy.
    #[default]
    IfNeeded,
    /// `copy=False`: never copy; refuse with the reason instead.
    Never,
    /// `copy=True`: always a fresh buffer.
    Always,
}

/// Options of the Arrow -> tensor conversions.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExportOptions {
    /// Null policy.
    pub nulls: NullPolicy,
    /// Copy policy.
    pub copy: CopyPolicy,
    /// Target dtype; `None` keeps the column's (or the columns' common) dtype.
    pub dtype: Option<DType>,
    /// Memory order of a multi-column matrix.
    pub order: Order,
}

/// A tensor and, under [`NullPolicy::Mask`], its validity (bool, same shape, true = valid).
#[derive(Debug, Clone)]
pub struct Converted {
    /// The values.
    pub values: Tensor,
    /// The validity mask, when asked for.
    pub mask: Option<Tensor>,
}

/// One column, in one or more chunks, as one tensor: zero-copy for one chunk without nulls
/// (or with nulls under [`NullPolicy::Mask`]), otherwise one fused copy pass.
///
/// # Errors
/// [`Error::Nulls`] under [`NullPolicy::Error`], [`Error::CopyRequired`] under
/// [`CopyPolicy::Never`] when a copy is needed, [`Error::ValueOutOfRange`] for a fill value or
/// cast that does not fit, and the errors of [`column_to_tensor`].
pub fn to_tensor(field: &FieldRef, chunks: &[ArrayRef], opts: &ExportOptions) -> Result<Converted> {
    if matches!(field.data_type(), DataType::List(_) | DataType::LargeList(_)) {
        let (field, chunks) = lists_as_fixed_chunks(field, chunks)?;
        return to_tensor(&field, &chunks, opts);
    }
    let null_count = checked_null_count(field, chunks, opts.nulls)?;
    let leaf = leaf_dtype(field)?;
    let target = opts.dtype.unwrap_or(leaf);
    let reason = if opts.copy == CopyPolicy::Always {
        None
    } else if chunks.len() != 1 {
        Some(format!("column '{}' has {} chunks; a tensor needs one buffer", field.name(), chunks.len()))
    } else if target != leaf {
        Some(format!("column '{}' is {leaf} and {target} was asked for", field.name()))
    } else if null_count > 0 && opts.nulls != NullPolicy::Mask {
        Some(format!("column '{}' has {null_count} null(s) to fill", field.name()))
    } else if leaf == DType::Bool {
        Some(format!("column '{}' is boolean, which Arrow bit-packs", field.name()))
    } else {
        let values = if null_count > 0 {
            zero_copy_ignoring_nulls(field, &chunks[0])?
        } else {
            column_to_tensor(field, chunks[0].as_ref())?
        };
        let mask = (null_count > 0).then(|| validity_mask(field, chunks, values.shape())).transpose()?;
        return Ok(Converted { values, mask });
    };
    if let (Some(reason), CopyPolicy::Never) = (&reason, opts.copy) {
        return Err(Error::CopyRequired { reason: reason.clone() });
    }
    let values = copy_column(field, chunks, target, opts.nulls)?;
    let mask = (null_count > 0 && opts.nulls == NullPolicy::Mask)
        .then(|| validity_mask(field, chunks, values.shape()))
        .transpose()?;
    Ok(Converted { values, mask })
}

/// The column's nulls at every level, after refusing chunks of another type and, under
/// [`NullPolicy::Error`], any null.
pub(crate) fn checked_null_count(field: &FieldRef, chunks: &[ArrayRef], nulls: NullPolicy) -> Result<usize> {
    check_chunk_types(field, chunks)?;
    let null_count: usize = chunks.iter().map(|c| nested_null_count(c.as_ref())).sum();
    if null_count > 0 && nulls == NullPolicy::Error {
        return Err(Error::Nulls { column: format!("'{}'", field.name()), null_count });
    }
    Ok(null_count)
}

/// The shape, strides and cell size (leaf slots per row) of a column of `n` rows as one tensor:
/// `[n, *cell]`, C order, or the permuted order of a tensor column's cells.
pub(crate) fn column_layout(field: &FieldRef, n: usize) -> Result<(Vec<i64>, Vec<i64>, usize)> {
    let (cell, cell_strides) = cell_layout(field)?;
    let cell_size: usize = cell.iter().map(|&d| d as usize).product();
    let shape: Vec<i64> = std::iter::once(n as i64).chain(cell).collect();
    let strides = match cell_strides {
        Some(s) => std::iter::once(cell_size as i64).chain(s).collect(),
        None => c_strides(&shape),
    };
    Ok((shape, strides, cell_size))
}

/// Refuses chunks whose type is not the column's.
pub(crate) fn check_chunk_types(field: &FieldRef, chunks: &[ArrayRef]) -> Result<()> {
    match chunks.iter().find(|c| c.data_type() != field.data_type()) {
        Some(c) => Err(Error::InvalidArgument(format!(
            "chunk of type {} in column '{}' of type {}",
            c.data_type(),
            field.name(),
            field.data_type()
        ))),
        None => Ok(()),
    }
}

/// Every chunk of a List/LargeList column as FixedSizeList views with one row length.
pub(crate) fn lists_as_fixed_chunks(
    field: &FieldRef,
    chunks: &[ArrayRef],
) -> Result<(FieldRef, Vec<ArrayRef>)> {
    let fixed = chunks.iter().map(|c| super::lists_as_fixed(field, c)).collect::<Result<Vec<_>>>()?;
    let Some(((first, _), _)) = fixed.split_first() else {
        return Err(Error::InvalidArgument(format!("list column '{}' has no chunks", field.name())));
    };
    if let Some((f, _)) = fixed.iter().find(|(f, _)| f.data_type() != first.data_type()) {
        return Err(Error::InvalidArgument(format!(
            "list column '{}' has chunks of different row lengths ({} and {})",
            field.name(),
            first.data_type(),
            f.data_type()
        )));
    }
    let field = first.clone();
    Ok((field, fixed.into_iter().map(|(_, a)| a).collect()))
}

/// Several same-length columns (each in chunks) as one `(n, k)` tensor in C or F order, with
/// the cast to the common (or requested) dtype and the null fill fused into one pass (copies).
///
/// # Errors
/// [`Error::LengthMismatch`] for columns of different lengths, [`Error::UnsupportedArrowType`]
/// for non-numeric columns, [`Error::Nulls`] under [`NullPolicy::Error`],
/// [`Error::CopyRequired`] under [`CopyPolicy::Never`] (a matrix is always a copy),
/// [`Error::ValueOutOfRange`] for values or a fill that do not fit the dtype.
pub fn columns_to_tensor(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
) -> Result<Converted> {
    let MatrixSpec { n, k, target, storage, fill, shape, strides, mask: want_mask } =
        matrix_spec(fields, columns, opts)?;
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    let mut out = Output::new(storage, n * k)?;
    for_segments(columns, |start, end, slices| {
        // A bool column of the segment is unpacked to bytes first (one pass over its bits).
        let bytes = slices
            .iter()
            .map(|a| (a.data_type() == &DataType::Boolean).then(|| bool_bytes(a.as_ref())).transpose())
            .collect::<Result<Vec<_>>>()?;
        let cols = slices
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
                Ok(col.starting_at(start))
            })
            .collect::<Result<Vec<_>>>()?;
        out.write_rows(&cols, opts.order, fill, n, start, end)
    })?;
    let values = out.into_tensor(target, shape.clone(), strides.clone())?;
    let mask = if want_mask {
        let mut m = Output::new(DType::UInt8, n * k)?;
        for_segments(columns, |start, end, slices| {
            let bytes: Vec<Vec<u8>> =
                slices.iter().map(|a| validity_bytes(a.as_ref())).collect::<Result<_>>()?;
            let cols: Vec<Column> =
                bytes.iter().zip(&names).map(|(v, name)| Column::new(ColumnRef::U8(v)).named(name)).collect();
            m.write_rows(&cols, opts.order, None, n, start, end)
        })?;
        Some(m.into_tensor(DType::Bool, shape, strides)?)
    } else {
        None
    };
    Ok(Converted { values, mask })
}

/// What a matrix of several columns is, validated once for the CPU and the device paths.
pub(crate) struct MatrixSpec {
    /// Rows.
    pub n: usize,
    /// Columns.
    pub k: usize,
    /// The dtype of the result.
    pub target: DType,
    /// The dtype written: bools are written as their 0/1 bytes, into u8 storage labelled bool
    /// when every column is bool, or cast like any u8 column (numpy's True -> 1) when they join
    /// numbers.
    pub storage: DType,
    /// The value nulls become.
    pub fill: Option<Scalar>,
    /// `[n, k]`.
    pub shape: Vec<i64>,
    /// C or F strides of the shape.
    pub strides: Vec<i64>,
    /// Whether a validity mask is made (asked for, and there are nulls).
    pub mask: bool,
}

/// Checks several columns for [`columns_to_tensor`] (lengths, types, nulls, copy policy, dtype,
/// fill) and says what the matrix will be. Reads no values.
pub(crate) fn matrix_spec(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    opts: &ExportOptions,
) -> Result<MatrixSpec> {
    if fields.len() != columns.len() {
        return Err(Error::InvalidArgument(format!("{} fields for {} columns", fields.len(), columns.len())));
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
    for (f, chunks) in fields.iter().zip(columns) {
        let dt = match f.data_type() {
            DataType::FixedSizeList(..) => {
                return Err(Error::UnsupportedArrowType {
                    what: format!("column '{}' of type {}", f.name(), f.data_type()),
                    remedy: "a matrix stacks scalar columns; convert list columns on their own",
                });
            }
            dt => storage_dtype(dt).map_err(|e| name_column(e, f))?,
        };
        let nulls: usize = chunks.iter().map(|c| c.null_count()).sum();
        if nulls > 0 && opts.nulls == NullPolicy::Error {
            return Err(Error::Nulls { column: format!("'{}'", f.name()), null_count: nulls });
        }
        dtypes.push(dt);
    }
    if opts.copy == CopyPolicy::Never {
        return Err(Error::CopyRequired {
            reason: format!("{k} columns become one matrix, which interleaves them"),
        });
    }
    let target = match opts.dtype {
        Some(d) => d,
        None if dtypes.is_empty() => DType::Float64,
        None => kernels::common_dtype(&dtypes),
    };
    check_nan_policy(opts.nulls, target)?;
    if let (DType::Bool, Some((f, dt))) =
        (target, fields.iter().zip(&dtypes).find(|(_, d)| **d != DType::Bool))
    {
        return Err(Error::InvalidArgument(format!(
            "column '{}' is {dt}, which dlframe does not cast to bool; compare it instead (x != 0)",
            f.name()
        )));
    }
    let shape = vec![n as i64, k as i64];
    let strides = match opts.order {
        Order::C => c_strides(&shape),
        Order::F => vec![1, n as i64],
    };
    let (storage, fill) = match target {
        DType::Bool => (DType::UInt8, Some(Scalar::Int(bool_fill(opts.nulls)?.into()))),
        t => (t, fill_for(opts.nulls)),
    };
    let mask = opts.nulls == NullPolicy::Mask && columns.iter().flatten().any(|c| c.null_count() > 0);
    Ok(MatrixSpec { n, k, target, storage, fill, shape, strides, mask })
}

/// A tensor as an Arrow column: zero-copy when the memory allows, else (unless
/// [`CopyPolicy::Never`]) one gather/pack pass into a fresh buffer. Bool tensors become Arrow
/// booleans (packed). Device memory is refused here: the CUDA layer copies it to the host.
///
/// # Errors
/// [`Error::CopyRequired`] under [`CopyPolicy::Never`] when a copy is needed, or for device
/// memory; the errors of [`tensor_to_column`].
pub fn tensor_to_column_with(tensor: &Tensor, name: &str, copy: CopyPolicy) -> Result<(FieldRef, ArrayRef)> {
    let reason = if tensor.dtype() == DType::Bool {
        Error::CopyRequired {
            reason: "bool tensors hold one byte per value and Arrow bit-packs booleans".into(),
        }
    } else if copy == CopyPolicy::Always {
        Error::CopyRequired { reason: "copy=True".into() }
    } else {
        match tensor_to_column(tensor, name) {
            Err(e @ (Error::CopyRequired { .. } | Error::Misaligned { .. })) => e,
            done => return done,
        }
    };
    if copy == CopyPolicy::Never || !tensor.device().is_host_accessible() {
        return Err(reason);
    }
    let fresh = kernels::contiguous_copy(tensor)?;
    if fresh.dtype() == DType::Bool {
        return bool_column(&fresh, name);
    }
    tensor_to_column(&fresh, name)
}

// ---------------------------------------------------------------------------------------------

/// The dtype of the scalar leaf of a column (through FixedSizeLists and tensor extensions).
pub(crate) fn leaf_dtype(field: &FieldRef) -> Result<DType> {
    let mut dt = field.data_type();
    while let DataType::FixedSizeList(child, _) = dt {
        dt = child.data_type();
    }
    storage_dtype(dt).map_err(|e| name_column(e, field))
}

/// Puts the column's name into an unsupported-type error.
fn name_column(e: Error, field: &FieldRef) -> Error {
    match e {
        Error::UnsupportedArrowType { what, remedy } => {
            Error::UnsupportedArrowType { what: format!("column '{}' of type {what}", field.name()), remedy }
        }
        e => e,
    }
}

/// The per-row cell shape of a column: `[]` for scalars, list sizes or the tensor's logical
/// shape otherwise; plus the strides of the cell when the column is a permuted tensor.
pub(crate) fn cell_layout(field: &FieldRef) -> Result<(Vec<i64>, Option<Vec<i64>>)> {
    if let Some(meta) = TensorMetadata::from_field(field)? {
        super::to_tensor::check_extension_storage(field, field.data_type(), &meta)?;
        return Ok((meta.logical_shape(), Some(meta.logical_strides())));
    }
    let mut dims = Vec::new();
    let mut dt = field.data_type();
    while let DataType::FixedSizeList(child, size) = dt {
        dims.push(*size as i64);
        dt = child.data_type();
    }
    Ok((dims, None))
}

/// Nulls at every level of a (possibly nested) column, counted in leaf slots covered.
pub(crate) fn nested_null_count(array: &dyn Array) -> usize {
    let own = array.null_count();
    match array.data_type() {
        DataType::FixedSizeList(..) => {
            own + nested_null_count(arrow_array::cast::AsArray::as_fixed_size_list(array).values().as_ref())
        }
        _ => own,
    }
}

/// The values of a column with nulls, shared (the null slots hold whatever Arrow left there).
fn zero_copy_ignoring_nulls(field: &FieldRef, array: &ArrayRef) -> Result<Tensor> {
    let stripped = strip_nulls(array.to_data());
    column_to_tensor(field, arrow_array::make_array(stripped).as_ref())
}

fn strip_nulls(data: ArrayData) -> ArrayData {
    let children = data.child_data().iter().cloned().map(strip_nulls).collect();
    let builder = data.into_builder().nulls(None).child_data(children);
    // SAFETY: removing validity never makes valid data invalid: every slot keeps its bytes.
    unsafe { builder.build_unchecked() }
}

/// Leaf validity of each chunk, with list-level nulls expanded over their cells, unpacked to
/// one byte per value (1 = valid) and shaped like the values.
fn validity_mask(field: &FieldRef, chunks: &[ArrayRef], shape: &[i64]) -> Result<Tensor> {
    let total: usize = shape.iter().map(|&d| d as usize).product();
    let mut out = vec![0u8; total];
    let mut pos = 0;
    for chunk in chunks {
        let cell: usize = shape[1..].iter().map(|&d| d as usize).product();
        let slots = chunk.len() * cell;
        expand_validity(chunk.as_ref(), &mut out[pos..pos + slots])?;
        pos += slots;
    }
    let (_, cell_strides) = cell_layout(field)?;
    let strides = cell_strides.map(|s| {
        let mut v = vec![shape[1..].iter().product::<i64>()];
        v.extend(s);
        v
    });
    let t = Tensor::from_vec(out, shape.to_vec())?;
    // The mask follows the values' memory order (permuted tensors too). Relabel u8 -> bool:
    // both are one byte per element and every byte is 0 or 1.
    let strides = strides.unwrap_or_else(|| c_strides(shape));
    // SAFETY: the same allocation and element count, with a permutation of C strides.
    let t = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr() as *mut u8,
            shape.to_vec(),
            Some(strides),
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

pub(crate) fn check_nan_policy(nulls: NullPolicy, target: DType) -> Result<()> {
    if nulls == NullPolicy::Nan && !target.is_float() {
        return Err(Error::InvalidArgument(format!(
            "nulls='nan' needs a float dtype but the tensor is {target}; pass dtype='float64' or nulls='fill'"
        )));
    }
    Ok(())
}

/// One copy of a column into a fresh buffer: chunks concatenated, nulls filled, cast fused.
fn copy_column(field: &FieldRef, chunks: &[ArrayRef], target: DType, nulls: NullPolicy) -> Result<Tensor> {
    let n: usize = chunks.iter().map(|c| c.len()).sum();
    let (shape, strides, cell_size) = column_layout(field, n)?;
    let leaf = leaf_dtype(field)?;
    check_copy_target(field, leaf, target, nulls)?;
    let mut out = Output::new(target, n * cell_size)?;
    let plain =
        leaf != DType::Bool && target == leaf && chunks.iter().all(|c| nested_null_count(c.as_ref()) == 0);
    if plain {
        concat_plain(chunks, target, out.buf.as_mut_slice())?;
    }
    let mut pos = 0;
    for chunk in chunks.iter().filter(|_| !plain) {
        let (leaf_array, list_nulls) = leaf_of(chunk.as_ref());
        let slots = chunk.len() * cell_size;
        if leaf == DType::Bool {
            out.unpack_bools(leaf_array.as_ref(), nulls, pos..pos + slots)?;
        } else {
            let col = column_ref(leaf_array.as_ref(), field.name())?.starting_at(pos);
            out.write_rows(std::slice::from_ref(&col), Order::C, fill_for(nulls), slots, pos, pos + slots)?;
        }
        for (size, validity) in list_nulls {
            for row in (0..validity.len()).filter(|&r| validity.is_null(r)) {
                out.fill_range(nulls, pos + row * size..pos + (row + 1) * size)?;
            }
        }
        pos += slots;
    }
    let logical = (target == leaf).then(|| field.clone());
    Ok(out.into_tensor(target, shape, strides)?.with_logical(logical))
}

/// Refuses what a copy of one column cannot make: a boolean column as numbers, NaN into
/// integers, a bool fill other than a bool, 0 or 1.
pub(crate) fn check_copy_target(
    field: &FieldRef,
    leaf: DType,
    target: DType,
    nulls: NullPolicy,
) -> Result<()> {
    if leaf == DType::Bool && target != DType::Bool {
        return Err(Error::InvalidArgument(format!(
            "column '{}' is boolean; dlframe exports it as bool (cast it in Arrow for {target})",
            field.name()
        )));
    }
    if target == DType::Bool {
        bool_fill(nulls)?;
    }
    check_nan_policy(nulls, target)
}

/// Concatenates chunks without nulls or casts: each chunk's leaf bytes are copied to their
/// place, chunks in parallel (copies).
fn concat_plain(chunks: &[ArrayRef], dtype: DType, out: &mut [u8]) -> Result<()> {
    use rayon::prelude::*;
    let item = dtype.itemsize();
    let leaves: Vec<ArrayData> = chunks.iter().map(|c| leaf_of(c.as_ref()).0.to_data()).collect();
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
    pieces.into_par_iter().with_min_len(4).for_each(|(src, dst)| dst.copy_from_slice(src));
    Ok(())
}

/// The leaf array of a (nested) chunk, and each list level's nulls with the number of leaf
/// slots one of its rows covers (outermost first).
pub(crate) fn leaf_of(array: &dyn Array) -> (ArrayRef, Vec<(usize, arrow_buffer::NullBuffer)>) {
    let mut levels = Vec::new();
    let mut current = arrow_array::make_array(array.to_data());
    while let DataType::FixedSizeList(_, _) = current.data_type() {
        let list = arrow_array::cast::AsArray::as_fixed_size_list(current.as_ref()).clone();
        levels.push((list.len(), list.nulls().cloned()));
        current = list.values().clone();
    }
    // A row of a level covers all the leaf slots below it, not just its own list's items.
    let leaves = current.len();
    let levels =
        levels.into_iter().filter_map(|(rows, nulls)| Some((leaves / rows.max(1), nulls?))).collect();
    (current, levels)
}

/// A typed view of a primitive array's values and validity, for the kernels (no copy).
pub(crate) fn column_ref<'a>(array: &'a dyn Array, name: &'a str) -> Result<Column<'a>> {
    let dtype = storage_dtype(array.data_type())?;
    let data = array.to_data();
    let (offset, len) = (data.offset(), data.len());
    let buf = &data.buffers()[0];
    macro_rules! typed {
        ($variant:ident, $t:ty) => {{
            let all: &'a [$t] = aligned_slice::<$t>(array, buf)?;
            ColumnRef::$variant(&all[offset..offset + len])
        }};
    }
    let values = match dtype {
        DType::Int8 => typed!(I8, i8),
        DType::Int16 => typed!(I16, i16),
        DType::Int32 => typed!(I32, i32),
        DType::Int64 => typed!(I64, i64),
        DType::UInt8 => typed!(U8, u8),
        DType::UInt16 => typed!(U16, u16),
        DType::UInt32 => typed!(U32, u32),
        DType::UInt64 => typed!(U64, u64),
        DType::Float16 => typed!(F16, half::f16),
        DType::Float32 => typed!(F32, f32),
        DType::Float64 => typed!(F64, f64),
        DType::Bool => {
            return Err(Error::InvalidArgument(format!(
                "column '{name}' is boolean; bools are unpacked, not cast"
            )));
        }
    };
    Ok(Column::new(values).with_validity(validity_of(array)?).named(name))
}

/// The validity bits of `array`, or None when it has no nulls.
pub(crate) fn validity_of(array: &dyn Array) -> Result<Option<BitSlice<'_>>> {
    match array.nulls() {
        Some(n) if n.null_count() > 0 => Ok(Some(BitSlice::new(n.validity(), n.offset(), n.len())?)),
        _ => Ok(None),
    }
}

/// A BooleanArray's values as 0/1 bytes (its validity is read separately; copies).
fn bool_bytes(array: &dyn Array) -> Result<Vec<u8>> {
    let data = array.to_data();
    let mut v = vec![0u8; array.len()];
    kernels::unpack_bits(BitSlice::new(data.buffers()[0].as_slice(), data.offset(), data.len())?, &mut v);
    Ok(v)
}

/// The byte a null becomes in a bool tensor: only a bool, 0 or 1 fills one.
pub(crate) fn bool_fill(nulls: NullPolicy) -> Result<u8> {
    match fill_for(nulls) {
        Some(Scalar::Bool(b)) => Ok(b as u8),
        Some(Scalar::Int(i @ (0 | 1))) => Ok(i as u8),
        Some(other) => Err(Error::ValueOutOfRange {
            value: format!("{other:?}"),
            place: "(fill_value)".into(),
            target: "bool".into(),
        }),
        None => Ok(0),
    }
}

/// A values buffer of `array` as `&[T]` for as long as `array` is borrowed, refusing
/// misaligned memory instead of panicking.
fn aligned_slice<'a, T>(array: &'a dyn Array, buf: &arrow_buffer::Buffer) -> Result<&'a [T]> {
    debug_assert!(array.to_data().buffers().iter().any(|b| b.as_ptr() == buf.as_ptr()));
    let ptr = buf.as_ptr();
    if (ptr as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Error::Misaligned { ptr: ptr as usize, align: std::mem::align_of::<T>() });
    }
    // SAFETY: `buf` is one of `array`'s buffers (a clone of the same reference-counted bytes),
    // so its memory lives as long as `array`, which is borrowed for 'a; it is aligned (checked
    // above) and holds len / size_of::<T>() plain values.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const T, buf.len() / std::mem::size_of::<T>()) })
}

/// Validity of one column segment as bytes (1 = valid), for the mask matrix.
fn validity_bytes(array: &dyn Array) -> Result<Vec<u8>> {
    let mut v = vec![1u8; array.len()];
    if let Some(n) = array.nulls() {
        kernels::unpack_bits(BitSlice::new(n.validity(), n.offset(), n.len())?, &mut v);
    }
    Ok(v)
}

/// Calls `f(start, end, slices)` for each row range over which every column is one chunk.
pub(crate) fn for_segments(
    columns: &[Vec<ArrayRef>],
    mut f: impl FnMut(usize, usize, &[ArrayRef]) -> Result<()>,
) -> Result<()> {
    let mut bounds: Vec<usize> = columns
        .iter()
        .flat_map(|chunks| {
            chunks.iter().scan(0, |acc, c| {
                *acc += c.len();
                Some(*acc)
            })
        })
        .collect();
    bounds.push(0);
    bounds.sort_unstable();
    bounds.dedup();
    let mut cursors = vec![(0usize, 0usize); columns.len()]; // (chunk index, rows before it)
    for w in bounds.windows(2) {
        let (start, end) = (w[0], w[1]);
        let mut slices = Vec::with_capacity(columns.len());
        for (chunks, cur) in columns.iter().zip(cursors.iter_mut()) {
            while cur.0 < chunks.len() && cur.1 + chunks[cur.0].len() <= start {
                cur.1 += chunks[cur.0].len();
                cur.0 += 1;
            }
            slices.push(chunks[cur.0].slice(start - cur.1, end - start));
        }
        f(start, end, &slices)?;
    }
    Ok(())
}

/// Packs a contiguous bool tensor into an Arrow boolean column (1-D) or tensor column.
fn bool_column(t: &Tensor, name: &str) -> Result<(FieldRef, ArrayRef)> {
    let bytes = t.as_slice::<u8>().or_else(|_| {
        // SAFETY: a contiguous host bool tensor is numel bytes of 0/1 kept alive by `t`.
        Ok::<_, Error>(unsafe { std::slice::from_raw_parts(t.data_ptr(), t.numel()) })
    })?;
    let mut packed = MutableBuffer::from_len_zeroed(bytes.len().div_ceil(8));
    kernels::pack_bits(bytes, packed.as_slice_mut());
    let values =
        arrow_array::BooleanArray::new(arrow_buffer::BooleanBuffer::new(packed.into(), 0, bytes.len()), None);
    let values: ArrayRef = Arc::new(values);
    let shape: Vec<i64> = if t.ndim() == 0 { vec![1] } else { t.shape().to_vec() };
    if shape.len() == 1 {
        return Ok((Arc::new(arrow_schema::Field::new(name, DataType::Boolean, false)), values));
    }
    let meta = TensorMetadata {
        shape: shape[1..].iter().map(|&d| d as usize).collect(),
        dim_names: None,
        permutation: None,
    };
    let item = Arc::new(arrow_schema::Field::new("item", DataType::Boolean, true));
    let storage = arrow_array::FixedSizeListArray::try_new_with_length(
        item,
        meta.cell_size() as i32,
        values,
        None,
        shape[0] as usize,
    )?;
    let field = arrow_schema::Field::new(name, storage.data_type().clone(), false)
        .with_metadata(meta.field_metadata());
    Ok((Arc::new(field), Arc::new(storage)))
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

    /// Writes rows `start..end` of a matrix with `n` rows and `cols.len()` columns.
    fn write_rows(
        &mut self,
        cols: &[Column],
        order: Order,
        fill: Option<Scalar>,
        n: usize,
        start: usize,
        end: usize,
    ) -> Result<()> {
        let k = cols.len();
        match order {
            Order::C => {
                kernels::interleave_into(self.dtype, cols, Order::C, fill, &mut self.buf, start * k..end * k)
            }
            Order::F => cols.iter().enumerate().try_for_each(|(j, col)| {
                let range = j * n + start..j * n + end;
                kernels::interleave_into(
                    self.dtype,
                    std::slice::from_ref(col),
                    Order::C,
                    fill,
                    &mut self.buf,
                    range,
                )
            }),
        }
    }

    fn unpack_bools(
        &mut self,
        array: &dyn Array,
        nulls: NullPolicy,
        range: std::ops::Range<usize>,
    ) -> Result<()> {
        let data = array.to_data();
        let values = BitSlice::new(data.buffers()[0].as_slice(), data.offset(), data.len())?;
        let validity = data.nulls().map(|n| BitSlice::new(n.validity(), n.offset(), n.len())).transpose()?;
        let fill = bool_fill(nulls)?;
        kernels::unpack_bits_fill(values, validity, fill, &mut self.buf.as_mut_slice()[range])
    }

    fn fill_range(&mut self, nulls: NullPolicy, range: std::ops::Range<usize>) -> Result<()> {
        if self.dtype == DType::Bool {
            let fill = matches!(fill_for(nulls), Some(Scalar::Bool(true) | Scalar::Int(1))) as u8;
            self.buf.as_mut_slice()[range].fill(fill);
            return Ok(());
        }
        kernels::fill_range(self.dtype, fill_for(nulls), &mut self.buf, range)
    }

    /// The buffer as a copied tensor, labelled `dtype` (the bool mask is written as u8).
    fn into_tensor(self, dtype: DType, shape: Vec<i64>, strides: Vec<i64>) -> Result<Tensor> {
        let label = if dtype == DType::Bool { DType::Bool } else { self.dtype };
        Ok(Tensor::from_buffer(self.buf.into_buffer(), 0, shape, Some(strides), label)?.with_copied(true))
    }
}

/// The value nulls become, if any: `Nan` is a float fill, `Mask` and `Error` fill zeros
/// (masked slots; `Error` never reaches a null).
pub(crate) fn fill_for(nulls: NullPolicy) -> Option<Scalar> {
    match nulls {
        NullPolicy::Fill(s) => Some(s),
        NullPolicy::Nan => Some(Scalar::Float(f64::NAN)),
        NullPolicy::Mask | NullPolicy::Error => Some(Scalar::Int(0)),
    }
}

#[cfg(test)]
mod tests {
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
}

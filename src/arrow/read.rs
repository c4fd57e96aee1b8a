//! Readers of Arrow columns for the executors: chunk checks, nested null counts, the leaf
//! array under FixedSizeLists, typed views of values and validity, and row ranges over which
//! several chunked columns are each one chunk. Views borrow; the few that copy say so.

use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, FieldRef};

use crate::dtype::{DType, leaf_dtype};
use crate::error::{Error, Result};
use crate::kernels::{self, BitSlice, Column, ColumnRef};

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

/// The leaf array of a (nested) chunk, and each list level's nulls with the number of leaf
/// slots one of its rows covers (outermost first). Shares the arrays (no copy); a chunk that
/// is its own leaf is returned as it is.
pub(crate) fn leaf_of(array: &ArrayRef) -> (ArrayRef, Vec<(usize, arrow_buffer::NullBuffer)>) {
    let mut levels = Vec::new();
    let mut current = array.clone();
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

/// The leaf slots that the null rows of every list level cover (`levels` as [`leaf_of`] gives
/// them), a range per null row: what the mask clears and the fill overwrites.
pub(crate) fn null_row_slots(
    levels: &[(usize, arrow_buffer::NullBuffer)],
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    levels.iter().flat_map(|(cell, rows)| {
        (0..rows.len()).filter(|&r| rows.is_null(r)).map(move |row| row * cell..(row + 1) * cell)
    })
}

/// The validity of every leaf slot: the leaf's own, cleared over the cells of null list rows
/// at every level, as [`leaf_of`] gives them (a new bitmap, one bit per slot; copies). The CPU's
/// mask and the CUDA plan's leaf validity are both this.
pub(crate) fn leaf_validity(
    leaf: &dyn Array,
    levels: &[(usize, arrow_buffer::NullBuffer)],
) -> arrow_buffer::NullBuffer {
    let len = leaf.len();
    let mut bits = arrow_buffer::MutableBuffer::new_null(len);
    match leaf.nulls() {
        // The leaf's bits realigned to bit 0 (a byte copy when they already are).
        Some(v) => bits.as_slice_mut().copy_from_slice(&v.inner().sliced().as_slice()[..len.div_ceil(8)]),
        None => bits.as_slice_mut().fill(0xff),
    }
    for slots in null_row_slots(levels) {
        for i in slots.start..slots.end.min(len) {
            arrow_buffer::bit_util::unset_bit(bits.as_slice_mut(), i);
        }
    }
    arrow_buffer::NullBuffer::new(arrow_buffer::BooleanBuffer::new(bits.into(), 0, len))
}

/// A typed view of a primitive array's values and validity, for the kernels (no copy).
/// `declared` is the dtype its column's field gave ([`crate::dtype::field_dtype`]), which
/// tells an extension's `FixedSizeBinary` storage apart (arrays carry no field metadata).
pub(crate) fn column_ref<'a>(array: &'a dyn Array, declared: DType, name: &'a str) -> Result<Column<'a>> {
    let dtype = leaf_dtype(array.data_type(), declared)?;
    let data = array.to_data();
    let (offset, len) = (data.offset(), data.len());
    let buf = &data.buffers()[0];
    macro_rules! typed {
        (Bool($($bool:tt)*) $($V:ident($T:ty, $($row:tt)*))*) => {
            match dtype {
                $(DType::$V => {
                    let all: &'a [$T] = aligned_slice::<$T>(array, buf)?;
                    ColumnRef::$V(&all[offset..offset + len])
                })*
                DType::Bool => {
                    return Err(Error::InvalidArgument(format!(
                        "column '{name}' is boolean; bools are unpacked, not cast"
                    )));
                }
            }
        };
    }
    let values = crate::dtype_table!(typed);
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
pub(crate) fn bool_bytes(array: &dyn Array) -> Result<Vec<u8>> {
    let data = array.to_data();
    let mut v = vec![0u8; array.len()];
    kernels::unpack_bits(BitSlice::new(data.buffers()[0].as_slice(), data.offset(), data.len())?, &mut v);
    Ok(v)
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
pub(crate) fn validity_bytes(array: &dyn Array) -> Result<Vec<u8>> {
    let mut v = vec![1u8; array.len()];
    if let Some(n) = array.nulls() {
        kernels::unpack_bits(BitSlice::new(n.validity(), n.offset(), n.len())?, &mut v);
    }
    Ok(v)
}

/// Rows `start..end`, over which every column is one chunk: each column's slice of them.
pub(crate) struct Segment {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) slices: Vec<ArrayRef>,
}

/// The row ranges over which every column is one chunk, in order (no copy: Arrow slices).
pub(crate) fn segments(columns: &[Vec<ArrayRef>]) -> Vec<Segment> {
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
    bounds
        .windows(2)
        .map(|w| {
            let (start, end) = (w[0], w[1]);
            let mut slices = Vec::with_capacity(columns.len());
            for (chunks, cur) in columns.iter().zip(cursors.iter_mut()) {
                while cur.0 < chunks.len() && cur.1 + chunks[cur.0].len() <= start {
                    cur.1 += chunks[cur.0].len();
                    cur.0 += 1;
                }
                slices.push(chunks[cur.0].slice(start - cur.1, end - start));
            }
            Segment { start, end, slices }
        })
        .collect()
}

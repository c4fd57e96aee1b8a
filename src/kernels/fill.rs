//! Null fill fused into the copy, and chunk concatenation into a preallocated destination.

use rayon::prelude::*;

use super::bits::{BitSlice, check_len};
use super::{PARALLEL_THRESHOLD_BYTES, ROWS_PER_TASK};
use crate::error::Result;

/// Copies `values` into `out`, writing `fill` where `validity` is 0: one read of the values
/// and the validity, one write (copies). Parallel over row blocks for large outputs.
///
/// # Errors
/// [`crate::Error::LengthMismatch`] when the lengths differ.
pub fn fill_nulls<T: Copy + Send + Sync>(
    values: &[T],
    validity: Option<BitSlice>,
    fill: T,
    out: &mut [T],
) -> Result<()> {
    check_len("values", values.len(), out.len())?;
    let Some(validity) = validity else {
        copy(values, out);
        return Ok(());
    };
    check_len("validity", validity.len(), out.len())?;
    let block = |start: usize, dst: &mut [T]| {
        fill_block(&values[start..start + dst.len()], validity.slice(start, dst.len()), fill, dst)
    };
    if std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES {
        out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(i, dst)| block(i * ROWS_PER_TASK, dst));
    } else {
        block(0, out);
    }
    Ok(())
}

#[inline]
fn fill_block<T: Copy>(values: &[T], validity: BitSlice, fill: T, out: &mut [T]) {
    for (c, (dst, src)) in out.chunks_mut(64).zip(values.chunks(64)).enumerate() {
        let full = if dst.len() == 64 { u64::MAX } else { (1u64 << dst.len()) - 1 };
        let mut nulls = !validity.word(c * 64) & full;
        if nulls.count_ones() <= 16 {
            // Sparse nulls: a vectorised copy of the block, then a store per null.
            dst.copy_from_slice(src);
            while nulls != 0 {
                dst[nulls.trailing_zeros() as usize] = fill;
                nulls &= nulls - 1;
            }
        } else if nulls == full {
            dst.fill(fill);
        } else {
            for (j, (d, &s)) in dst.iter_mut().zip(src).enumerate() {
                *d = if nulls >> j & 1 == 0 { s } else { fill };
            }
        }
    }
}

/// A plain copy, parallel for large outputs.
pub fn copy<T: Copy + Send + Sync>(src: &[T], out: &mut [T]) {
    if std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES {
        out.par_chunks_mut(ROWS_PER_TASK)
            .zip(src.par_chunks(ROWS_PER_TASK))
            .for_each(|(d, s)| d.copy_from_slice(s));
    } else {
        out.copy_from_slice(src);
    }
}

/// Concatenates chunks into `out` in one pass (copies); the lengths must add up.
///
/// # Errors
/// [`crate::Error::LengthMismatch`] when they do not.
pub fn concat_into<T: Copy + Send + Sync + Default>(chunks: &[&[T]], out: &mut [T]) -> Result<()> {
    let parts: Vec<(&[T], Option<BitSlice>)> = chunks.iter().map(|c| (*c, None)).collect();
    concat_fill_into(&parts, None, out)
}

/// Concatenates chunks with validity into `out`, filling nulls, in one pass (copies).
/// `fill` may be `None` only when no chunk has a validity bitmap.
///
/// # Errors
/// [`crate::Error::LengthMismatch`] when the lengths do not add up.
pub fn concat_fill_into<T: Copy + Send + Sync + Default>(
    chunks: &[(&[T], Option<BitSlice>)],
    fill: Option<T>,
    out: &mut [T],
) -> Result<()> {
    let total: usize = chunks.iter().map(|(c, _)| c.len()).sum();
    check_len("chunks", total, out.len())?;
    let mut rest = out;
    for (values, validity) in chunks {
        if fill.is_none() && validity.is_some() {
            return Err(crate::Error::InvalidArgument(
                "a chunk has nulls but no fill value was given".into(),
            ));
        }
        let (dst, tail) = rest.split_at_mut(values.len());
        fill_nulls(values, *validity, fill.unwrap_or_default(), dst)?;
        rest = tail;
    }
    Ok(())
}

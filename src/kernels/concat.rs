//! Chunks concatenated straight into a preallocated destination: one pass, no intermediate
//! concatenated array.

use rayon::prelude::*;

use super::PARALLEL_THRESHOLD_BYTES;
use super::bits::{BitSlice, check_len};
use super::fill::fill_nulls;
use crate::error::Result;

/// Copies the chunks one after another into `out` (copies, one pass). Chunks are copied in
/// parallel for large outputs.
///
/// # Errors
/// [`crate::Error::LengthMismatch`] when the chunk lengths do not add up to `out.len()`.
pub fn concat_into<T: Copy + Send + Sync>(chunks: &[&[T]], out: &mut [T]) -> Result<()> {
    for_each_chunk(
        chunks,
        |c| c.len(),
        out,
        |c, dst| {
            dst.copy_from_slice(c);
            Ok(())
        },
    )
}

/// Copies the chunks one after another into `out`, writing `fill` where a chunk's validity
/// is 0 (copies, one pass: [`fill_nulls`] per chunk). Chunks are copied in parallel for large
/// outputs.
///
/// # Errors
/// [`crate::Error::LengthMismatch`] when the chunk lengths do not add up to `out.len()`, or a
/// chunk's validity is not as long as its values. Nothing is written then.
pub fn concat_fill_into<T: Copy + Send + Sync>(
    chunks: &[(&[T], Option<BitSlice>)],
    fill: T,
    out: &mut [T],
) -> Result<()> {
    for (i, (values, validity)) in chunks.iter().enumerate() {
        if let Some(v) = validity {
            check_len(|| format!("the validity of chunk {i}"), v.len(), values.len())?;
        }
    }
    for_each_chunk(
        chunks,
        |c| c.0.len(),
        out,
        |(values, validity), dst| fill_nulls(values, *validity, fill, dst),
    )
}

/// Splits `out` by the chunk lengths and calls `write(chunk, dst)` for each piece, in
/// parallel when `out` is large.
fn for_each_chunk<C: Sync, T: Send>(
    chunks: &[C],
    len: impl Fn(&C) -> usize,
    out: &mut [T],
    write: impl Fn(&C, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let total = chunks.iter().try_fold(0usize, |acc, c| acc.checked_add(len(c)));
    check_len(|| "the chunks together".into(), total.unwrap_or(usize::MAX), out.len())?;
    let parallel = std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES;
    let mut pieces = Vec::with_capacity(chunks.len());
    let mut rest = out;
    for c in chunks {
        let (dst, tail) = rest.split_at_mut(len(c));
        pieces.push((c, dst));
        rest = tail;
    }
    if parallel {
        super::pool::install(|| pieces.into_par_iter().try_for_each(|(c, dst)| write(c, dst)))
    } else {
        pieces.into_iter().try_for_each(|(c, dst)| write(c, dst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_land_in_order_with_nulls_filled() {
        let (a, b, c) = ([1u16, 2, 3], [], [4u16, 5]);
        let mut out = [0u16; 5];
        concat_into(&[&a, &b, &c], &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5]);
        let valid = [0b10u8];
        let v = BitSlice::new(&valid, 0, 2).unwrap();
        concat_fill_into(&[(&a[..], None), (&b[..], None), (&c[..], Some(v))], 9, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 9, 5]);
        concat_into::<u8>(&[], &mut []).unwrap();
    }

    #[test]
    fn wrong_totals_and_validity_lengths_are_errors_and_write_nothing() {
        let a = [1u8, 2];
        let mut out = [0u8; 3];
        assert!(concat_into(&[&a], &mut out).is_err());
        assert!(concat_into(&[&a, &a], &mut out).is_err());
        let short = BitSlice::new(&[0xff], 0, 1).unwrap();
        let mut out = [0u8; 4];
        assert!(concat_fill_into(&[(&a[..], None), (&a[..], Some(short))], 0, &mut out).is_err());
        assert_eq!(out, [0; 4]);
    }
}

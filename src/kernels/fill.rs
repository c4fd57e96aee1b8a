//! Null fill fused into the copy: one read of the values and the validity, one write.

use super::bits::{BitSlice, by_blocks, check_len};
use crate::error::Result;

/// Copies `values` into `out`, writing `fill` where `validity` is 0 (copies, one pass).
/// `None` validity means no nulls: a plain copy. Parallel over row blocks for large outputs.
///
/// Validity is read 64 bits at a time: an all-valid word copies its 64 values as one block,
/// an all-null word fills, a word with a few nulls copies the block and then patches the
/// nulls, and a dense mix selects per element without branches.
///
/// # Errors
/// [`crate::Error::LengthMismatch`] when `values`, `validity` and `out` differ in length.
pub fn fill_nulls<T: Copy + Send + Sync>(
    values: &[T],
    validity: Option<BitSlice>,
    fill: T,
    out: &mut [T],
) -> Result<()> {
    check_len(|| "values".into(), values.len(), out.len())?;
    if let Some(v) = validity {
        check_len(|| "validity".into(), v.len(), out.len())?;
    }
    by_blocks(out, |start, dst| {
        let src = &values[start..start + dst.len()];
        match validity {
            Some(v) => fill_block(src, v.slice(start, dst.len()), fill, dst),
            None => dst.copy_from_slice(src),
        }
    });
    Ok(())
}

fn fill_block<T: Copy>(values: &[T], validity: BitSlice, fill: T, out: &mut [T]) {
    let mut dsts = out.chunks_exact_mut(64);
    for (c, (dst, src)) in (&mut dsts).zip(values.chunks_exact(64)).enumerate() {
        match validity.word(64 * c) {
            u64::MAX => dst.copy_from_slice(src),
            0 => dst.fill(fill),
            valid if valid.count_zeros() <= 16 => {
                dst.copy_from_slice(src);
                let mut nulls = !valid;
                while nulls != 0 {
                    dst[nulls.trailing_zeros() as usize] = fill;
                    nulls &= nulls - 1;
                }
            }
            valid => select(src, valid, fill, dst),
        }
    }
    let tail = dsts.into_remainder();
    let start = values.len() - tail.len();
    select(&values[start..], validity.word(start), fill, tail);
}

/// `out[i] = if valid bit i { src[i] } else { fill }`, for up to 64 elements.
#[inline(always)]
fn select<T: Copy>(src: &[T], valid: u64, fill: T, out: &mut [T]) {
    for (j, (d, &s)) in out.iter_mut().zip(src).enumerate() {
        *d = if valid >> j & 1 == 1 { s } else { fill };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pack_bools as bits_of;

    fn check(valid: &[bool], off: usize) {
        let len = valid.len() - off;
        let bits = bits_of(valid);
        let values: Vec<u32> = (0..len as u32).collect();
        let mut out = vec![7u32; len];
        fill_nulls(&values, Some(BitSlice::new(&bits, off, len).unwrap()), u32::MAX, &mut out).unwrap();
        let want: Vec<u32> = (0..len).map(|i| if valid[off + i] { i as u32 } else { u32::MAX }).collect();
        assert_eq!(out, want, "off {off} len {len}");
    }

    #[test]
    fn every_word_shape_and_offset_matches_the_reference() {
        let shapes: [fn(usize) -> bool; 6] = [
            |_| true,
            |_| false,
            |i| i % 9 != 0,
            |i| i % 2 == 0,
            |i| (i / 64) % 2 == 0,
            |i| (i * 31 + i / 5) % 7 < 3,
        ];
        for shape in shapes {
            for n in [0, 1, 63, 64, 65, 200] {
                for off in 0..64 {
                    let valid: Vec<bool> = (0..n + off).map(shape).collect();
                    check(&valid, off);
                }
            }
        }
    }

    #[test]
    fn no_validity_copies_and_lengths_are_checked() {
        let mut out = [0i8; 3];
        fill_nulls(&[1i8, 2, 3], None, 0, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert!(fill_nulls(&[1i8, 2], None, 0, &mut out).is_err());
        let bits = BitSlice::new(&[0xff], 0, 2).unwrap();
        assert!(fill_nulls(&[1i8, 2, 3], Some(bits), 0, &mut out).is_err());
        fill_nulls::<f64>(&[], None, 0.0, &mut []).unwrap();
    }
}

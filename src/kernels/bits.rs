//! Bit-packed Arrow bitmaps (validity and boolean values): LSB-first, starting at any bit
//! offset, 1 = valid/true. Unpacking to one byte per bit and packing back both copy.
//!
//! Bits are read 64 at a time ([`BitSlice::word`]); a byte-aligned offset skips the shifts.
//! Unpacking spreads each byte through a 256-entry table of `u64`s (8 bits -> 8 bytes), which
//! is safe code and runs within about 1.2x of a memcpy of the bytes it writes.

use rayon::prelude::*;

use super::{PARALLEL_THRESHOLD_BYTES, ROWS_PER_TASK};
use crate::error::{Error, Result};

/// A read-only view of `len` bits starting `offset` bits into `bits` (Arrow's layout:
/// bit `i` is `bits[i / 8] >> (i % 8) & 1`).
#[derive(Debug, Clone, Copy)]
pub struct BitSlice<'a> {
    bits: &'a [u8],
    offset: usize,
    len: usize,
}

impl<'a> BitSlice<'a> {
    /// A view of bits `offset..offset + len` of `bits` (without copying).
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when `offset + len` overflows or exceeds `bits.len() * 8`.
    pub fn new(bits: &'a [u8], offset: usize, len: usize) -> Result<Self> {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| Error::layout(format!("bit range {offset} + {len} overflows")))?;
        if end.div_ceil(8) > bits.len() {
            return Err(Error::layout(format!(
                "bits {offset}..{end} do not fit in a bitmap of {} bytes ({} bits)",
                bits.len(),
                bits.len().saturating_mul(8)
            )));
        }
        Ok(BitSlice { bits, offset, len })
    }

    /// Number of bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bit `i`.
    ///
    /// # Panics
    /// When `i >= self.len()`, like slice indexing.
    pub fn get(&self, i: usize) -> bool {
        assert!(i < self.len, "bit {i} out of a bit slice of {}", self.len);
        let p = self.offset + i;
        self.bits[p / 8] >> (p % 8) & 1 == 1
    }

    /// The sub-view of bits `start..start + len`, relative to this view (without copying).
    ///
    /// # Panics
    /// When the range is not inside this view.
    pub fn slice(&self, start: usize, len: usize) -> Self {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.len),
            "bit slice {start}+{len} out of a bit slice of {}",
            self.len
        );
        BitSlice { bits: self.bits, offset: self.offset + start, len }
    }

    /// Bits `i..i + 64` as a word, bit `i` in the lowest bit; bits past the end read as 0.
    #[inline]
    pub fn word(&self, i: usize) -> u64 {
        let n = self.len.saturating_sub(i).min(64);
        if n == 0 {
            return 0;
        }
        let p = self.offset + i;
        let (byte, shift) = (p / 8, p % 8);
        let src = &self.bits[byte..];
        let w = if let Some(b) = src.get(..9) {
            let lo = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            if shift == 0 { lo } else { (lo >> shift) | ((b[8] as u64) << (64 - shift)) }
        } else {
            let mut buf = [0u8; 16];
            buf[..src.len()].copy_from_slice(src);
            (u128::from_le_bytes(buf) >> shift) as u64
        };
        if n == 64 { w } else { w & ((1u64 << n) - 1) }
    }

    /// Number of zero bits (the null count, for a validity bitmap).
    pub fn count_zeros(&self) -> usize {
        self.len - (0..self.len).step_by(64).map(|i| self.word(i).count_ones() as usize).sum::<usize>()
    }

    /// The whole bytes holding the bits, when the view starts on a byte boundary.
    fn aligned_bytes(&self) -> Option<&'a [u8]> {
        (self.offset % 8 == 0).then(|| &self.bits[self.offset / 8..(self.offset + self.len).div_ceil(8)])
    }
}

/// Byte `b` spread over 8 bytes, each 0 or 1, bit `j` in byte `j` of the little-endian u64.
const fn spread_table() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            v |= (((b >> j) & 1) as u64) << (8 * j);
            j += 1;
        }
        t[b] = v;
        b += 1;
    }
    t
}
static SPREAD: [u64; 256] = spread_table();

#[inline(always)]
fn spread(b: u8) -> u64 {
    SPREAD[b as usize]
}

/// Runs `f(start, dst)` over blocks of `out` (a multiple of 64 elements each) in parallel
/// when `out` is large, else once on the calling thread.
pub(crate) fn by_blocks<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    if std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES {
        super::pool::install(|| {
            out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(i, dst)| f(i * ROWS_PER_TASK, dst))
        });
    } else {
        f(0, out);
    }
}

/// Unpacks bits to one byte each, 0 or 1 (copies): bool values to a `kDLBool` tensor, or a
/// validity bitmap to a byte mask. Parallel over blocks for large outputs.
///
/// # Panics
/// When `out.len() != bits.len()` (callers size `out` from the same array).
pub fn unpack_bits(bits: BitSlice, out: &mut [u8]) {
    assert_eq!(out.len(), bits.len(), "unpack_bits: output length");
    by_blocks(out, |start, dst| unpack_block(bits.slice(start, dst.len()), dst));
}

fn unpack_block(bits: BitSlice, out: &mut [u8]) {
    let Some(bytes) = bits.aligned_bytes() else {
        return blend_block(bits, None, 0, out);
    };
    // Two table entries per 16-byte store. Iterating by value (not through `&mut`) lets the
    // compiler drop the per-step length checks; that and the constant store size make this
    // loop about 1.5x faster than one 8-byte store per step.
    let whole = out.len() / 16 * 16;
    let (head, tail) = out.split_at_mut(whole);
    for (dst, pair) in head.chunks_exact_mut(16).zip(bytes.chunks_exact(2)) {
        let v = spread(pair[0]) as u128 | (spread(pair[1]) as u128) << 64;
        dst.copy_from_slice(&v.to_le_bytes());
    }
    blend_block(bits.slice(whole, tail.len()), None, 0, tail);
}

/// The general unpack, for any bit offset: 64 bits of values (and validity) per step, then
/// 8 bytes at a time `values & keep | fill & !keep`, with `keep` = 0xff for valid bytes.
/// `fills` is the fill byte repeated 8 times.
fn blend_block(values: BitSlice, validity: Option<BitSlice>, fills: u64, out: &mut [u8]) {
    let words = |i: usize| (values.word(i), validity.map_or(u64::MAX, |m| m.word(i)));
    let mut chunks = out.chunks_exact_mut(64);
    for (c, dst) in chunks.by_ref().enumerate() {
        let (v, ok) = words(64 * c);
        blend_word(v, ok, fills, dst.try_into().expect("64 bytes"));
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let (v, ok) = words(values.len() - tail.len());
        let mut last = [0u8; 64];
        blend_word(v, ok, fills, &mut last);
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

#[inline(always)]
fn blend_word(v: u64, ok: u64, fills: u64, dst: &mut [u8; 64]) {
    let (v, ok) = (v.to_le_bytes(), ok.to_le_bytes());
    for g in 0..8 {
        let keep = spread(ok[g]) * 0xff;
        dst[8 * g..8 * g + 8].copy_from_slice(&((spread(v[g]) & keep) | (fills & !keep)).to_le_bytes());
    }
}

/// Unpacks bool values to bytes 0/1, writing `fill` where `validity` is 0, in one pass
/// (copies). Branch-free: eight values at a time are blended with their validity.
///
/// # Errors
/// [`Error::LengthMismatch`] when `values`, `validity` and `out` differ in length.
pub fn unpack_bits_fill(
    values: BitSlice,
    validity: Option<BitSlice>,
    fill: u8,
    out: &mut [u8],
) -> Result<()> {
    check_len(|| "bool values".into(), values.len(), out.len())?;
    let Some(validity) = validity else {
        unpack_bits(values, out);
        return Ok(());
    };
    check_len(|| "validity".into(), validity.len(), out.len())?;
    let fills = u64::from_le_bytes([fill; 8]);
    by_blocks(out, |start, dst| {
        let len = dst.len();
        blend_block(values.slice(start, len), Some(validity.slice(start, len)), fills, dst)
    });
    Ok(())
}

/// Packs bytes into an LSB-first bitmap, nonzero = 1 (copies): a byte-bool tensor to an Arrow
/// boolean buffer. `out` holds at least `src.len().div_ceil(8)` bytes; the padding bits of
/// the last byte are written 0 and bytes past it are left alone.
///
/// `src` must be contiguous: gather a strided bool tensor first (the crate's
/// `contiguous_copy`, or [`super::gather_strided`]).
///
/// # Panics
/// When `out` is too short.
pub fn pack_bits(src: &[u8], out: &mut [u8]) {
    let need = src.len().div_ceil(8);
    assert!(out.len() >= need, "pack_bits: {} output bytes for {} bits", out.len(), src.len());
    let out = &mut out[..need];
    if src.len() >= PARALLEL_THRESHOLD_BYTES {
        let per_task = ROWS_PER_TASK / 8;
        super::pool::install(|| {
            out.par_chunks_mut(per_task)
                .zip(src.par_chunks(ROWS_PER_TASK))
                .for_each(|(d, s)| pack_block(s, d))
        });
    } else {
        pack_block(src, out);
    }
}

fn pack_block(src: &[u8], out: &mut [u8]) {
    let mut groups = src.chunks_exact(8);
    for (dst, g) in out.iter_mut().zip(&mut groups) {
        let mut x = u64::from_le_bytes([g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]]);
        // OR every bit of a byte into its lowest bit (bits shifted in from the next byte only
        // reach bits 1..7, which the mask drops), then gather the 8 low bits into one byte.
        x |= x >> 4;
        x |= x >> 2;
        x |= x >> 1;
        x &= 0x0101_0101_0101_0101;
        *dst = (x.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8;
    }
    let rest = groups.remainder();
    if !rest.is_empty() {
        out[src.len() / 8] = rest.iter().enumerate().fold(0, |acc, (j, &b)| acc | (((b != 0) as u8) << j));
    }
}

/// `Ok` when `found == expected`, else [`Error::LengthMismatch`] naming `what()` (made only then).
pub(crate) fn check_len(what: impl FnOnce() -> String, found: usize, expected: usize) -> Result<()> {
    if found != expected {
        return Err(Error::LengthMismatch { what: what(), expected, found });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pack_bools as bits_of;

    fn pattern(n: usize) -> Vec<bool> {
        (0..n).map(|i| (i * 7 + i / 3) % 5 < 2).collect()
    }

    #[test]
    fn get_word_count_and_unpack_match_bit_by_bit_at_every_offset() {
        let v = pattern(300);
        let bytes = bits_of(&v);
        for off in 0..70 {
            for len in [0, 1, 7, 8, 9, 63, 64, 65, 130, 300 - off] {
                if off + len > 300 {
                    continue;
                }
                let s = BitSlice::new(&bytes, off, len).unwrap();
                let want: Vec<u8> = v[off..off + len].iter().map(|&b| b as u8).collect();
                assert_eq!((0..len).map(|i| s.get(i) as u8).collect::<Vec<_>>(), want);
                let mut out = vec![9u8; len];
                unpack_bits(s, &mut out);
                assert_eq!(out, want, "off {off} len {len}");
                assert_eq!(s.count_zeros(), want.iter().filter(|&&b| b == 0).count());
                for i in (0..len).step_by(13) {
                    let w: u64 = (0..64.min(len - i)).map(|j| (want[i + j] as u64) << j).sum();
                    assert_eq!(s.word(i), w, "word at {i}, off {off} len {len}");
                }
            }
        }
    }

    #[test]
    fn pack_inverts_unpack_and_clears_padding_bits() {
        let v = pattern(200);
        for len in 0..200 {
            let bytes: Vec<u8> = v[..len].iter().map(|&b| b as u8 * (1 + (len % 200) as u8)).collect();
            let mut packed = vec![0xffu8; len.div_ceil(8) + 1];
            pack_bits(&bytes, &mut packed);
            assert_eq!(&packed[..len.div_ceil(8)], &bits_of(&v[..len])[..], "len {len}");
            assert_eq!(packed[len.div_ceil(8)], 0xff, "bytes past the bitmap are left alone");
        }
    }

    #[test]
    fn pack_treats_any_nonzero_byte_as_true() {
        let mut out = [0u8; 2];
        pack_bits(&[0, 2, 0x80, 0, 1, 0, 0, 0x10, 3], &mut out);
        assert_eq!(out, [0b1001_0110, 0b1]);
        let mut empty: [u8; 0] = [];
        pack_bits(&[], &mut empty);
    }

    #[test]
    fn unpack_fill_blends_values_validity_and_fill() {
        let v = pattern(150);
        let ok: Vec<bool> = (0..150).map(|i| i % 3 != 0).collect();
        let (vb, okb) = (bits_of(&v), bits_of(&ok));
        for (voff, koff, len) in [(0, 0, 150), (3, 5, 140), (8, 0, 1), (1, 63, 80), (0, 0, 0), (149, 2, 1)] {
            let values = BitSlice::new(&vb, voff, len).unwrap();
            let validity = BitSlice::new(&okb, koff, len).unwrap();
            let mut out = vec![7u8; len];
            unpack_bits_fill(values, Some(validity), 5, &mut out).unwrap();
            let want: Vec<u8> = (0..len).map(|i| if ok[koff + i] { v[voff + i] as u8 } else { 5 }).collect();
            assert_eq!(out, want, "{voff} {koff} {len}");
        }
        let all_null = vec![0u8; 20];
        let mut out = vec![0u8; 150];
        let values = BitSlice::new(&vb, 0, 150).unwrap();
        unpack_bits_fill(values, Some(BitSlice::new(&all_null, 0, 150).unwrap()), 1, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 1));
    }

    #[test]
    fn out_of_range_views_and_wrong_lengths_are_errors() {
        assert!(BitSlice::new(&[0u8; 2], 10, 7).is_err());
        assert!(BitSlice::new(&[0u8; 2], usize::MAX, 2).is_err());
        assert!(BitSlice::new(&[0u8; 2], 9, 7).is_ok());
        assert!(BitSlice::new(&[], 0, 0).is_ok());
        let one = BitSlice::new(&[0u8], 0, 2).unwrap();
        let mut out = [0u8; 3];
        assert!(matches!(unpack_bits_fill(one, None, 0, &mut out), Err(Error::LengthMismatch { .. })));
        let three = BitSlice::new(&[0u8], 0, 3).unwrap();
        assert!(unpack_bits_fill(three, Some(one), 0, &mut out).is_err());
    }

    #[test]
    #[should_panic(expected = "output length")]
    fn unpack_into_a_wrong_length_panics() {
        unpack_bits(BitSlice::new(&[0u8], 0, 2).unwrap(), &mut [0u8; 3]);
    }
}

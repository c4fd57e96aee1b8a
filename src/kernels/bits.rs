//! Bit-packed Arrow bitmaps (LSB first, any bit offset): unpack to bytes, pack from bytes.

use crate::error::{Error, Result};

/// A read-only view of `len` bits starting `offset` bits into `bits` (Arrow's layout).
#[derive(Debug, Clone, Copy)]
pub struct BitSlice<'a> {
    bits: &'a [u8],
    offset: usize,
    len: usize,
}

impl<'a> BitSlice<'a> {
    /// A view of bits `offset..offset + len`.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when the bits do not fit in `bits`.
    pub fn new(bits: &'a [u8], offset: usize, len: usize) -> Result<Self> {
        let end = offset.checked_add(len).ok_or_else(|| Error::layout("bit range overflows"))?;
        if end.div_ceil(8) > bits.len() {
            return Err(Error::layout(format!("bits {offset}..{end} do not fit in {} bytes", bits.len())));
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

    /// Bit `i` (panics when out of range, like slice indexing).
    pub fn get(&self, i: usize) -> bool {
        assert!(i < self.len, "bit {i} out of {}", self.len);
        let p = self.offset + i;
        self.bits[p / 8] >> (p % 8) & 1 == 1
    }

    /// The sub-view of bits `start..start + len` (relative to this view).
    pub fn slice(&self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.len, "bit slice {start}+{len} out of {}", self.len);
        BitSlice { bits: self.bits, offset: self.offset + start, len }
    }

    /// Up to 64 bits starting at bit `i`, LSB first; bits past the end read as 0.
    #[inline]
    pub fn word(&self, i: usize) -> u64 {
        let n = (self.len - i.min(self.len)).min(64);
        if n == 0 {
            return 0;
        }
        let p = self.offset + i;
        let (byte, shift) = (p / 8, p % 8);
        let avail = self.bits.len() - byte;
        let w = if avail >= 9 {
            let lo = u64::from_le_bytes(self.bits[byte..byte + 8].try_into().expect("8 bytes"));
            let hi = self.bits[byte + 8] as u64;
            if shift == 0 { lo } else { (lo >> shift) | (hi << (64 - shift)) }
        } else {
            let mut buf = [0u8; 16];
            buf[..avail].copy_from_slice(&self.bits[byte..]);
            (u128::from_le_bytes(buf) >> shift) as u64
        };
        if n == 64 { w } else { w & ((1u64 << n) - 1) }
    }

    /// Number of zero bits (nulls, for a validity bitmap).
    pub fn count_zeros(&self) -> usize {
        (0..self.len).step_by(64).map(|i| (self.len - i).min(64) - self.word(i).count_ones() as usize).sum()
    }
}

/// Byte `b` spread over 8 bytes, each 0 or 1, as a little-endian u64.
const fn spread_table() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut v = 0u64;
        let mut i = 0;
        while i < 8 {
            v |= (((b >> i) & 1) as u64) << (8 * i);
            i += 1;
        }
        t[b] = v;
        b += 1;
    }
    t
}
static SPREAD: [u64; 256] = spread_table();

/// Unpacks bits to one byte each, 0 or 1 (copies). `out.len()` must equal `bits.len()`.
///
/// # Panics
/// When the lengths differ (callers size `out` from the same array).
pub fn unpack_bits(bits: BitSlice, out: &mut [u8]) {
    assert_eq!(bits.len(), out.len(), "unpack_bits: output length");
    if bits.offset % 8 == 0 {
        let src = &bits.bits[bits.offset / 8..];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { unpack_aligned_avx2(src, out) };
            return;
        }
        unpack_aligned(src, out);
        return;
    }
    let mut chunks = out.chunks_exact_mut(64);
    let mut i = 0;
    for chunk in &mut chunks {
        let w = bits.word(i);
        for (j, dst) in chunk.chunks_exact_mut(8).enumerate() {
            dst.copy_from_slice(&SPREAD[(w >> (8 * j)) as u8 as usize].to_le_bytes());
        }
        i += 64;
    }
    let rest = chunks.into_remainder();
    let w = bits.word(i);
    for (j, dst) in rest.iter_mut().enumerate() {
        *dst = (w >> j) as u8 & 1;
    }
}

/// Byte-aligned unpack in a form the compiler vectorises: each output byte is a mask test.
#[inline(always)]
fn unpack_aligned(src: &[u8], out: &mut [u8]) {
    const MASKS: [u8; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
    let whole = out.len() / 8;
    let mut chunks = out.chunks_exact_mut(8);
    for (dst, &b) in (&mut chunks).zip(src) {
        for j in 0..8 {
            dst[j] = (b & MASKS[j] != 0) as u8;
        }
    }
    let rest = chunks.into_remainder();
    if let Some(&b) = src.get(whole) {
        for (j, dst) in rest.iter_mut().enumerate() {
            *dst = b >> j & 1;
        }
    }
}

/// Byte-aligned unpack with AVX2: 4 source bytes -> 32 output bytes per step (broadcast,
/// byte shuffle, bit mask, compare).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn unpack_aligned_avx2(src: &[u8], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let steps = out.len() / 32;
    // Within each 128-bit lane, output byte i takes source byte (lane * 2 + i / 8).
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bit = _mm256_setr_epi8(
        1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8,
        16, 32, 64, -128,
    );
    let one = _mm256_set1_epi8(1);
    for i in 0..steps {
        let word = u32::from_le_bytes(src[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let v = _mm256_shuffle_epi8(_mm256_set1_epi32(word as i32), spread);
        let r = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), one);
        // SAFETY: 32 * i + 32 <= 32 * steps <= out.len(); storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(32 * i).cast::<__m256i>(), r) };
    }
    unpack_aligned(&src[4 * steps..], &mut out[32 * steps..]);
}

/// Unpacks bool values, writing `fill` where `validity` is 0 (copies, one pass).
///
/// # Errors
/// [`Error::LengthMismatch`] when the lengths differ.
pub fn unpack_bits_fill(
    values: BitSlice,
    validity: Option<BitSlice>,
    fill: u8,
    out: &mut [u8],
) -> Result<()> {
    check_len("bool values", values.len(), out.len())?;
    let Some(validity) = validity else {
        unpack_bits(values, out);
        return Ok(());
    };
    check_len("validity", validity.len(), out.len())?;
    for (c, chunk) in out.chunks_mut(64).enumerate() {
        let (v, ok) = (values.word(c * 64), validity.word(c * 64));
        for (j, dst) in chunk.iter_mut().enumerate() {
            *dst = if ok >> j & 1 == 1 { (v >> j) as u8 & 1 } else { fill };
        }
    }
    Ok(())
}

/// Packs bytes (nonzero = true) into an LSB-first bitmap (copies). `out` holds
/// `src.len().div_ceil(8)` bytes; padding bits of the last byte are 0.
///
/// # Panics
/// When `out` is too short.
pub fn pack_bits(src: &[u8], out: &mut [u8]) {
    assert!(out.len() >= src.len().div_ceil(8), "pack_bits: output too short");
    let mut chunks = src.chunks_exact(8);
    for (dst, c) in out.iter_mut().zip(&mut chunks) {
        let mut x = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        // Any set bit in a byte -> its lowest bit.
        x |= x >> 4;
        x |= x >> 2;
        x |= x >> 1;
        x &= 0x0101_0101_0101_0101;
        *dst = (x.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let last = src.len() / 8;
        out[last] = rest.iter().enumerate().fold(0u8, |acc, (j, &b)| acc | (((b != 0) as u8) << j));
    }
}

pub(crate) fn check_len(what: &str, found: usize, expected: usize) -> Result<()> {
    if found != expected {
        return Err(Error::LengthMismatch { what: what.to_string(), expected, found });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits_of(v: &[bool]) -> Vec<u8> {
        let mut out = vec![0u8; v.len().div_ceil(8)];
        for (i, &b) in v.iter().enumerate() {
            out[i / 8] |= (b as u8) << (i % 8);
        }
        out
    }

    #[test]
    fn words_and_unpack_match_bit_by_bit_at_every_offset() {
        let v: Vec<bool> = (0..300).map(|i| (i * 7 + i / 3) % 5 < 2).collect();
        let bytes = bits_of(&v);
        for off in 0..70 {
            for len in [0, 1, 7, 63, 64, 65, 130, 300 - off] {
                if off + len > 300 {
                    continue;
                }
                let s = BitSlice::new(&bytes, off, len).unwrap();
                let mut out = vec![9u8; len];
                unpack_bits(s, &mut out);
                let want: Vec<u8> = v[off..off + len].iter().map(|&b| b as u8).collect();
                assert_eq!(out, want, "off {off} len {len}");
                assert_eq!(s.count_zeros(), want.iter().filter(|&&b| b == 0).count());
                let mut packed = vec![0xffu8; len.div_ceil(8)];
                pack_bits(&out, &mut packed);
                assert_eq!(packed, bits_of(&v[off..off + len]));
            }
        }
    }

    #[test]
    fn the_portable_and_simd_aligned_paths_agree() {
        let v: Vec<bool> = (0..700).map(|i| (i * 13 + i / 7) % 3 == 0).collect();
        let bytes = bits_of(&v);
        for len in 0..700 {
            let want: Vec<u8> = v[..len].iter().map(|&b| b as u8).collect();
            let mut out = vec![9u8; len];
            unpack_aligned(&bytes, &mut out);
            assert_eq!(out, want, "portable, len {len}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut out = vec![9u8; len];
                // SAFETY: AVX2 is present (checked above).
                unsafe { unpack_aligned_avx2(&bytes, &mut out) };
                assert_eq!(out, want, "avx2, len {len}");
            }
        }
    }

    #[test]
    fn pack_treats_any_nonzero_byte_as_true() {
        let mut out = [0u8; 2];
        pack_bits(&[0, 2, 0x80, 0, 1, 0, 0, 0x10, 3], &mut out);
        assert_eq!(out, [0b1001_0110, 0b1]);
    }

    #[test]
    fn out_of_range_views_are_errors() {
        assert!(BitSlice::new(&[0u8; 2], 10, 7).is_err());
        assert!(BitSlice::new(&[0u8; 2], usize::MAX, 2).is_err());
        assert!(BitSlice::new(&[0u8; 2], 9, 7).is_ok());
        let mut out = [0u8; 3];
        assert!(unpack_bits_fill(BitSlice::new(&[0u8], 0, 2).unwrap(), None, 0, &mut out).is_err());
    }
}

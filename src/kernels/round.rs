//! Doubles rounded once to the narrow floats that Rust's `as` does not reach (half and
//! bfloat16), bit for bit as the device kernels round them (`kernels.cu`). Nothing here copies.

use half::{bf16, f16};

/// An integer as a double rounded *to odd*: exact below 2^53, else truncated with the last
/// bit set, so that a later rounding to a narrower type (bfloat16) rounds once.
#[inline(always)]
pub(crate) fn odd_f64(v: i128) -> f64 {
    let d = v as f64;
    if d as i128 == v {
        return d;
    }
    let toward_zero =
        if (d as i128).unsigned_abs() > v.unsigned_abs() { f64::from_bits(d.to_bits() - 1) } else { d };
    f64::from_bits(toward_zero.to_bits() | 1)
}

/// A double as the nearest bfloat16, ties to even, overflow to infinity, NaN kept quiet: the
/// double is first rounded to f32 *to odd* (truncated, with the last bit set when anything was
/// dropped), which keeps 16 more bits than bfloat16 and so cannot create a false tie; then
/// `half::bf16::from_f32` rounds to nearest even once. (`half::bf16::from_f64` rounds through
/// f32 to nearest, which rounds twice.) Integers reach here through f64, exact below 2^53.
pub fn bf16_from_f64(d: f64) -> bf16 {
    let f = d as f32;
    if d.is_nan() || f.is_infinite() || f as f64 == d {
        return bf16::from_f32(f);
    }
    // Inexact: the f32 neighbour toward zero, made odd.
    let toward_zero = if (f as f64).abs() > d.abs() { f32::from_bits(f.to_bits() - 1) } else { f };
    bf16::from_f32(f32::from_bits(toward_zero.to_bits() | 1))
}

/// A double as the nearest half, ties to even, overflow to infinity, NaN kept quiet (what numpy's
/// `astype(float16)` gives). `half::f16::from_f64` drops the low 32 bits of the mantissa first,
/// which rounds a value just above a tie the wrong way; the device kernel (`f64_to_f16` in
/// `kernels.cu`) is this function, bit for bit.
pub fn f16_from_f64(d: f64) -> f16 {
    let x = d.to_bits();
    let sign = ((x >> 48) & 0x8000) as u16;
    let e = ((x >> 52) & 0x7ff) as i32;
    let mut m = x & 0x000f_ffff_ffff_ffff;
    if e == 0x7ff {
        return f16::from_bits(sign | 0x7c00 | if m != 0 { 0x200 | (m >> 42) as u16 } else { 0 });
    }
    let he = e - 1023 + 15;
    if he >= 31 {
        return f16::from_bits(sign | 0x7c00);
    }
    let (mut kept, rest, half) = if he <= 0 {
        if he < -10 {
            return f16::from_bits(sign);
        }
        m |= 1 << 52;
        let shift = 43 - he; // 43..=53 bits dropped
        (m >> shift, m & ((1u64 << shift) - 1), 1u64 << (shift - 1))
    } else {
        (((he as u64) << 10) | (m >> 42), m & ((1u64 << 42) - 1), 1u64 << 41)
    };
    if rest > half || (rest == half && kept & 1 == 1) {
        kept += 1;
    }
    f16::from_bits(sign | kept as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_round_to_the_nearest_half_with_ties_to_even() {
        // The oracle: the halves either side of d (exact in f64) and their midpoint.
        let check = |d: f64| {
            let got = f16_from_f64(d);
            if d.is_nan() {
                return assert!(got.is_nan());
            }
            let a = d.abs();
            if a >= 65520.0 {
                return assert_eq!(got.to_f64(), d.signum() * f64::INFINITY, "{d:e}");
            }
            // Largest non-negative half <= a, by bisection over the ordered bit patterns.
            let (mut lo, mut hi) = (0u16, 0x7c00u16);
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if f16::from_bits(mid).to_f64() <= a { lo = mid } else { hi = mid }
            }
            let (below, above) = (f16::from_bits(lo).to_f64(), f16::from_bits(lo + 1).to_f64());
            let midpoint = (below + above) / 2.0;
            let want = if a < midpoint || (a == midpoint && lo % 2 == 0) { lo } else { lo + 1 };
            let want = if a == below { lo } else { want };
            assert_eq!(got.to_bits() & 0x7fff, want, "{d:e}");
            assert_eq!(got.is_sign_negative(), d.is_sign_negative(), "{d:e}");
        };
        for h in 0..0x7bffu16 {
            let (a, b) = (f16::from_bits(h).to_f64(), f16::from_bits(h + 1).to_f64());
            let mid = (a + b) / 2.0;
            for d in [a, mid, f64::from_bits(mid.to_bits() + 1), f64::from_bits(mid.to_bits() - 1)] {
                check(d);
                check(-d);
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            check(f64::from_bits(x));
            check(f64::from_bits(x) * 1e-300 * 1e300 / 2f64.powi((x % 40) as i32 + 1));
        }
        for d in
            [0.0, -0.0, 65504.0, 65519.99, 2f64.powi(-25), 2f64.powi(-26), 2f64.powi(-24), f64::MIN_POSITIVE]
        {
            check(d);
        }
        // Where half::f16::from_f64 goes wrong: just above the tie between 0 and the least
        // subnormal, which rounds up.
        let above_tie = f64::from_bits(2f64.powi(-25).to_bits() + 1);
        assert_eq!(f16_from_f64(above_tie).to_bits(), 1);
    }
}

//! The two float8 element types of DLPack 1.1, torch and ml_dtypes (the OCP FP8 formats):
//! [`F8E4M3FN`] (4 exponent bits, 3 mantissa bits, no infinities, largest finite 448, NaN
//! `S.1111.111`) and [`F8E5M2`] (IEEE-style: 5 exponent bits, 2 mantissa bits, infinities,
//! largest finite 57344). Values go through `f64`, which holds every float8 exactly; the way in
//! rounds once, to nearest even. Nothing here copies.

use std::fmt;

/// The layout of a float8 format.
struct Format {
    /// Mantissa bits.
    man: u32,
    /// Exponent bias.
    bias: i32,
    /// The bits of the largest finite value.
    max_bits: u8,
    /// The bits of +infinity; None where the format has none (e4m3fn).
    inf: Option<u8>,
    /// The bits of a positive quiet NaN.
    nan: u8,
    /// The value of every pattern, for the way out.
    values: [f64; 256],
}

const fn format(man: u32, bias: i32, max_bits: u8, inf: Option<u8>, nan: u8) -> Format {
    let mut values = [0.0; 256];
    let mut b = 0;
    while b < 256 {
        values[b] = value(b as u8, man, bias, inf, nan);
        b += 1;
    }
    Format { man, bias, max_bits, inf, nan, values }
}

const E4M3FN_LAYOUT: Format = format(3, 7, 0x7e, None, 0x7f);
const E5M2_LAYOUT: Format = format(2, 15, 0x7b, Some(0x7c), 0x7e);
// What the codec reads at run time: statics, since a const would be materialised (its 2 KB
// table copied) at every use. The consts above serve compile-time reads only.
static E4M3FN: Format = E4M3FN_LAYOUT;
static E5M2: Format = E5M2_LAYOUT;

/// `2^e` for the exponents float8 reaches (well inside f64's normal range).
const fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// The exact value of a pattern, from the format's bit layout.
const fn value(bits: u8, man: u32, bias: i32, inf: Option<u8>, nan: u8) -> f64 {
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp_mask = (1u8 << (7 - man)) - 1;
    let e = (bits >> man) & exp_mask;
    let m = (bits & ((1u8 << man) - 1)) as f64;
    match inf {
        Some(i) if bits & 0x7f == i => return sign * f64::INFINITY,
        Some(_) if e == exp_mask => return f64::NAN,
        None if bits & 0x7f == nan => return f64::NAN,
        _ => {}
    }
    if e == 0 {
        sign * m * pow2(1 - bias - man as i32)
    } else {
        sign * (1.0 + m / (1u32 << man) as f64) * pow2(e as i32 - bias)
    }
}

impl Format {
    /// The exact value of `bits` (a table lookup).
    #[inline(always)]
    fn decode(&self, bits: u8) -> f64 {
        self.values[bits as usize]
    }

    /// `d` rounded once to nearest even, on its bits as `f16_from_f64` rounds (the device
    /// kernel computes the same with doubles). A NaN gives NaN; a value beyond the largest
    /// finite one (after rounding) gives infinity, or NaN in a format without infinities.
    #[inline(always)]
    fn encode(&self, d: f64) -> u8 {
        let x = d.to_bits();
        let sign = ((x >> 56) & 0x80) as u8;
        let e = ((x >> 52) & 0x7ff) as i32;
        let mut m = x & 0x000f_ffff_ffff_ffff;
        let overflow = sign | self.inf.unwrap_or(self.nan);
        if e == 0x7ff {
            return if m != 0 { sign | self.nan } else { overflow };
        }
        // The biased exponent in the target; below 1 the value is subnormal there.
        let he = e - 1023 + self.bias;
        if he > (self.max_bits >> self.man) as i32 + 1 {
            return overflow;
        }
        let drop = 52 - self.man;
        let (mut kept, rest, half) = if he <= 0 {
            if he < -(self.man as i32) - 1 {
                return sign;
            }
            m |= 1 << 52;
            let shift = drop + (1 - he) as u32;
            (m >> shift, m & ((1u64 << shift) - 1), 1u64 << (shift - 1))
        } else {
            (((he as u64) << self.man) | (m >> drop), m & ((1u64 << drop) - 1), 1u64 << (drop - 1))
        };
        // Branch-free: the rounding direction depends on the data.
        kept += (rest > half || (rest == half && kept & 1 == 1)) as u64;
        if kept > self.max_bits as u64 { overflow } else { sign | kept as u8 }
    }
}

macro_rules! float8 {
    ($($(#[$doc:meta])* $t:ident => $fmt:ident, $layout:ident),*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $t(u8);

        impl $t {
            /// The value with these bits.
            pub const fn from_bits(bits: u8) -> Self {
                $t(bits)
            }

            /// The bits.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// The nearest value, ties to even (once, from the exact `d`): infinity, or NaN where
            /// the format has no infinity, beyond the largest finite value.
            #[inline(always)]
            pub fn from_f64(d: f64) -> Self {
                $t($fmt.encode(d))
            }

            /// The value, exactly.
            #[inline(always)]
            pub fn to_f64(self) -> f64 {
                $fmt.decode(self.0)
            }

            /// The value, exactly (every float8 is an f32).
            pub fn to_f32(self) -> f32 {
                self.to_f64() as f32
            }

            /// True for a NaN.
            pub fn is_nan(self) -> bool {
                self.to_f64().is_nan()
            }

            /// The largest finite value.
            pub const MAX: f64 = $layout.values[$layout.max_bits as usize];
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.to_f32(), f)
            }
        }
    )*};
}

float8!(
    /// float8 e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, finite only (largest 448), one
    /// NaN per sign. DLPack `kDLFloat8_e4m3fn`, torch `float8_e4m3fn`, ml_dtypes `float8_e4m3fn`.
    F8E4M3FN => E4M3FN, E4M3FN_LAYOUT,
    /// float8 e5m2: 5 exponent bits (bias 15), 2 mantissa bits, infinities and NaNs as IEEE
    /// (largest finite 57344). DLPack `kDLFloat8_e5m2`, torch `float8_e5m2`, ml_dtypes
    /// `float8_e5m2`.
    F8E5M2 => E5M2, E5M2_LAYOUT
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite value of a format, decoded, re-encodes to the same bits (signed zeros too).
    fn round_trips(fmt: &Format) -> usize {
        let mut finite = 0;
        for b in 0..=255u8 {
            let v = fmt.decode(b);
            if v.is_nan() {
                assert!(fmt.decode(fmt.encode(v)).is_nan());
                continue;
            }
            assert_eq!(fmt.encode(v), b, "{b:#04x} = {v}");
            finite += v.is_finite() as usize;
        }
        finite
    }

    #[test]
    fn every_value_round_trips() {
        // e4m3fn: 256 codes less two NaNs; e5m2: less 6 NaNs and 2 infinities.
        assert_eq!(round_trips(&E4M3FN), 254);
        assert_eq!(round_trips(&E5M2), 248);
    }

    #[test]
    fn known_values_match_ml_dtypes() {
        // Bits from ml_dtypes 0.6: np.array([...], float32).astype(float8_*).view(uint8).
        for (v, b) in
            [(1.0, 0x38), (2.0, 0x40), (448.0, 0x7e), (-0.0, 0x80), (2f64.powi(-9), 0x01), (0.1, 0x1d)]
        {
            assert_eq!(F8E4M3FN::from_f64(v).to_bits(), b, "{v}");
        }
        for (v, b) in [(1.0, 0x3c), (2.0, 0x40), (57344.0, 0x7b), (512.0, 0x60), (2f64.powi(-16), 0x01)] {
            assert_eq!(F8E5M2::from_f64(v).to_bits(), b, "{v}");
        }
        assert_eq!(F8E4M3FN::MAX, F8E4M3FN::from_bits(0x7e).to_f64());
        assert_eq!(F8E5M2::MAX, F8E5M2::from_bits(0x7b).to_f64());
    }

    /// The nearest pattern by a scan of every finite value (ties to the even pattern; past the
    /// largest, the next step up stands for overflow): an independent reference.
    fn nearest(fmt: &Format, d: f64) -> u8 {
        let sign = if d.is_sign_negative() { 0x80 } else { 0 };
        let a = d.abs();
        let max = fmt.values[fmt.max_bits as usize];
        let step = max - fmt.values[fmt.max_bits as usize - 1];
        let v = |p: u8| if p > fmt.max_bits { max + step } else { fmt.values[p as usize] };
        let lo = (0..=fmt.max_bits).rev().find(|&p| v(p) <= a).unwrap_or(0);
        let pick = if v(lo) == a {
            lo
        } else {
            match (2.0 * a).partial_cmp(&(v(lo) + v(lo + 1))).unwrap() {
                std::cmp::Ordering::Less => lo,
                std::cmp::Ordering::Greater => lo + 1,
                std::cmp::Ordering::Equal => lo + (lo % 2),
            }
        };
        if pick > fmt.max_bits { sign | fmt.inf.unwrap_or(fmt.nan) } else { sign | pick }
    }

    #[test]
    fn rounding_matches_a_scan_of_every_value() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for fmt in [&E4M3FN, &E5M2] {
            let mut cases: Vec<f64> = Vec::new();
            for b in 0..fmt.max_bits {
                let (a, c) = (fmt.values[b as usize], fmt.values[b as usize + 1]);
                let mid = (a + c) / 2.0;
                cases.extend([a, mid, f64::from_bits(mid.to_bits() + 1), f64::from_bits(mid.to_bits() - 1)]);
            }
            for _ in 0..20_000 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                cases.push(f64::from_bits(rng) % 1e5);
            }
            for d in cases.into_iter().filter(|d| d.is_finite()) {
                for x in [d, -d] {
                    assert_eq!(fmt.encode(x), nearest(fmt, x), "{x:e}");
                }
            }
        }
    }

    #[test]
    fn ties_go_to_even_and_overflow_is_not_finite() {
        // 1 + 1/16 lies halfway between 1 and 1.125 in e4m3fn: to 1 (even mantissa).
        assert_eq!(F8E4M3FN::from_f64(1.0625).to_f64(), 1.0);
        assert_eq!(F8E4M3FN::from_f64(1.1875).to_f64(), 1.25);
        // 464 is halfway between 448 and the NaN code: to 448; above it, not finite.
        assert_eq!(F8E4M3FN::from_f64(464.0).to_f64(), 448.0);
        assert!(F8E4M3FN::from_f64(464.01).is_nan());
        assert!(F8E4M3FN::from_f64(f64::INFINITY).is_nan());
        assert_eq!(F8E5M2::from_f64(61440.0).to_f64(), f64::INFINITY);
        assert_eq!(F8E5M2::from_f64(-1e300).to_f64(), f64::NEG_INFINITY);
        // Underflow rounds to zero (keeping the sign), as IEEE says.
        assert_eq!(F8E4M3FN::from_f64(-1e-300).to_bits(), 0x80);
        assert_eq!(F8E4M3FN::from_f64(2f64.powi(-10)).to_bits(), 0x00);
        assert_eq!(F8E4M3FN::from_f64(2f64.powi(-10) * 1.5).to_bits(), 0x01);
    }
}

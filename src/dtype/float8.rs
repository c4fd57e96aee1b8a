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
    /// Largest finite value.
    max: f64,
    /// The bits of +infinity; None where the format has none (e4m3fn).
    inf: Option<u8>,
    /// The bits of a positive quiet NaN.
    nan: u8,
}

const E4M3FN: Format = Format { man: 3, bias: 7, max: 448.0, inf: None, nan: 0x7f };
const E5M2: Format = Format { man: 2, bias: 15, max: 57344.0, inf: Some(0x7c), nan: 0x7e };

/// `2^e` for the exponents float8 reaches (well inside f64's normal range).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

impl Format {
    /// The exact value of `bits`.
    fn decode(&self, bits: u8) -> f64 {
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp_mask = (1u8 << (7 - self.man)) - 1;
        let e = (bits >> self.man) & exp_mask;
        let m = bits & ((1u8 << self.man) - 1);
        match self.inf {
            Some(inf) if bits & 0x7f == inf => return sign * f64::INFINITY,
            Some(_) if e == exp_mask => return f64::NAN,
            None if bits & 0x7f == self.nan => return f64::NAN,
            _ => {}
        }
        let emin = 1 - self.bias;
        if e == 0 {
            sign * m as f64 * pow2(emin - self.man as i32)
        } else {
            sign * (1.0 + m as f64 / (1u32 << self.man) as f64) * pow2(e as i32 - self.bias)
        }
    }

    /// `d` rounded once to nearest even. A NaN gives NaN; a value beyond the largest finite one
    /// (after rounding) gives infinity, or NaN in a format without infinities.
    fn encode(&self, d: f64) -> u8 {
        let sign = if d.is_sign_negative() { 0x80 } else { 0 };
        let a = d.abs();
        if a.is_nan() {
            return sign | self.nan;
        }
        let overflow = sign | self.inf.unwrap_or(self.nan);
        if a.is_infinite() {
            return overflow;
        }
        let emin = 1 - self.bias;
        // The exponent of `a` (f64 subnormals and zero fall below emin anyway).
        let e = (((a.to_bits() >> 52) as i32) - 1023).max(emin);
        let one = 1u64 << self.man;
        // `a` in units of its quantum, 2^(e - man): exact, the powers of two are in range.
        let mut n = (a / pow2(e - self.man as i32)).round_ties_even() as u64;
        let mut e = e;
        if n == 2 * one {
            n = one;
            e += 1;
        }
        if n as f64 * pow2(e - self.man as i32) > self.max {
            return overflow;
        }
        if n < one {
            // Subnormal (or zero): exponent field 0.
            return sign | n as u8;
        }
        sign | (((e + self.bias) as u8) << self.man) | (n - one) as u8
    }
}

macro_rules! float8 {
    ($($(#[$doc:meta])* $t:ident => $fmt:ident),*) => {$(
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
            pub fn from_f64(d: f64) -> Self {
                $t($fmt.encode(d))
            }

            /// The value, exactly.
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
            pub const MAX: f64 = $fmt.max;
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
    F8E4M3FN => E4M3FN,
    /// float8 e5m2: 5 exponent bits (bias 15), 2 mantissa bits, infinities and NaNs as IEEE
    /// (largest finite 57344). DLPack `kDLFloat8_e5m2`, torch `float8_e5m2`, ml_dtypes
    /// `float8_e5m2`.
    F8E5M2 => E5M2
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

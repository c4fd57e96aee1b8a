//! Element types of the kernels, value casts (unchecked where lossless, checked where not),
//! fill values, and numpy's dtype promotion.
//!
//! Casting follows numpy's `same_kind` idea with checks: float -> narrower float rounds (as
//! IEEE says, underflow to zero included), but a finite value that would overflow to infinity
//! is refused (1e300 into float32, 70000 into float16), where numpy gives inf with a warning;
//! infinities and NaN stay as they are. Integer -> float refuses an integer the float cannot
//! hold exactly (int64 2^53 + 1 into float64), as pyarrow's safe cast does, unless the caller
//! opts into numpy's rounding ([`Inexact::Round`]). A cast that can lose an integer (narrowing,
//! signed <-> unsigned, float -> int) is checked value by value and refuses out-of-range
//! integers and non-finite or fractional floats.

use half::{bf16, f16};

use super::round::{bf16_from_f64, f16_from_f64, odd_f64};

use crate::dtype::{DType, F8E4M3FN, F8E5M2, Kind};
use crate::error::{Error, Place, Result};
use crate::options::{Inexact, Scalar};

/// A value on its way between element types: an exact integer, or a float.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// A signed integer.
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// A float (exact for every f16, f32 and f64).
    Float(f64),
}

mod sealed {
    pub trait Sealed {}
}

/// A tensor element the kernels read, write and cast: `i8..i64`, `u8..u64`, `f16`, `f32`,
/// `f64`. Sealed; the conversions go through [`Num`] and fold away once monomorphised.
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + std::fmt::Display + 'static
{
    /// Its dtype.
    const DTYPE: DType;
    /// The value as a [`Num`] (exact).
    fn to_num(self) -> Num;
    /// The value in this type, if it fits: integers need an in-range, whole, finite value;
    /// floats round, and refuse a finite value that would overflow to infinity.
    fn from_num(n: Num) -> Option<Self>;
    /// The value in this type like Rust's `as` (wrapping integers, saturating floats); the
    /// unchecked cast, used only where [`always_fits`] holds.
    fn from_num_lossy(n: Num) -> Self;
    /// Its little-endian bytes in the low bytes of a u64, the rest zero: how a checked fill
    /// value is kept and handed to a device kernel.
    fn to_word(self) -> u64;
    /// The value whose little-endian bytes are the low bytes of `bits`.
    fn from_word(bits: u64) -> Self;
}

macro_rules! int_element {
    ($($t:ty => $d:ident, $num:ident, $u:ty);* $(;)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_num(self) -> Num {
                Num::$num(self as _)
            }
            #[inline(always)]
            fn from_num(n: Num) -> Option<Self> {
                match n {
                    Num::Int(v) => <$t>::try_from(v).ok(),
                    Num::UInt(v) => <$t>::try_from(v).ok(),
                    // MAX as f64 + 1.0 is the power of two just above MAX, exactly.
                    Num::Float(v) => (v.fract() == 0.0 && v >= <$t>::MIN as f64 && v < <$t>::MAX as f64 + 1.0)
                        .then_some(v as $t),
                }
            }
            #[inline(always)]
            fn from_num_lossy(n: Num) -> Self {
                match n {
                    Num::Int(v) => v as $t,
                    Num::UInt(v) => v as $t,
                    Num::Float(v) => v as $t,
                }
            }
            #[inline(always)]
            fn to_word(self) -> u64 {
                self as $u as u64
            }
            #[inline(always)]
            fn from_word(bits: u64) -> Self {
                bits as $u as $t
            }
        }
    )*};
}
int_element!(
    i8 => Int8, Int, u8; i16 => Int16, Int, u16; i32 => Int32, Int, u32; i64 => Int64, Int, u64;
    u8 => UInt8, UInt, u8; u16 => UInt16, UInt, u16; u32 => UInt32, UInt, u32; u64 => UInt64, UInt, u64;
);

macro_rules! float_element {
    ($($t:ty => $d:ident, $u:ty, $from:expr, $to:expr);* $(;)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_num(self) -> Num {
                Num::Float($to(self))
            }
            #[inline(always)]
            fn from_num(n: Num) -> Option<Self> {
                // A finite value beyond the type's range would become infinite (or, in a
                // float8 without infinities, NaN): refused. Infinities stay infinite where the
                // type has them, and NaN stays NaN.
                let v = Self::from_num_lossy(n);
                let r = $to(v);
                let kept = match n {
                    Num::Float(f) if f.is_nan() => true,
                    Num::Float(f) if f.is_infinite() => r.is_infinite(),
                    _ => r.is_finite(),
                };
                kept.then_some(v)
            }
            #[inline(always)]
            fn from_num_lossy(n: Num) -> Self {
                $from(n)
            }
            #[inline(always)]
            fn to_word(self) -> u64 {
                <$t>::to_bits(self).into()
            }
            #[inline(always)]
            fn from_word(bits: u64) -> Self {
                <$t>::from_bits(bits as $u)
            }
        }
    )*};
}
// Each target rounds once from the exact value: f32 takes `v as f32` straight from the
// integer or f64 (no double rounding through f64); f16 rounds from f64, which is exact for
// every integer that does not overflow f16 anyway; bfloat16 takes integers through a double
// rounded to odd.
float_element!(
    f16 => Float16, u16, |n| f16_from_f64(as_f64(n)), |x: f16| x.to_f64();
    f32 => Float32, u32, |n| match n {
        Num::Int(v) => v as f32,
        Num::UInt(v) => v as f32,
        Num::Float(v) => v as f32,
    }, |x: f32| x as f64;
    f64 => Float64, u64, as_f64, |x: f64| x;
    bf16 => BFloat16, u16, |n| match n {
        Num::Int(v) => bf16_from_f64(odd_f64(v.into())),
        Num::UInt(v) => bf16_from_f64(odd_f64(v.into())),
        Num::Float(v) => bf16_from_f64(v),
    }, |x: bf16| x.to_f64();
    // Integers large enough to round in f64 overflow float8 anyway.
    F8E4M3FN => Float8E4M3FN, u8, |n| F8E4M3FN::from_f64(as_f64(n)), |x: F8E4M3FN| x.to_f64();
    F8E5M2 => Float8E5M2, u8, |n| F8E5M2::from_f64(as_f64(n)), |x: F8E5M2| x.to_f64();
);

/// The value as a double, rounded to nearest even once (integers beyond 2^53 round).
#[inline(always)]
fn as_f64(n: Num) -> f64 {
    match n {
        Num::Int(v) => v as f64,
        Num::UInt(v) => v as f64,
        Num::Float(v) => v,
    }
}

/// float8 holds few values: every float8 is exactly a value of every wider float (e5m2 has
/// float16's exponent range, e4m3fn a smaller one), and of the integers only bool's are all
/// exact in it; under rounding, the integers of int8 and uint8 lie in e4m3fn's range
/// (largest 448), and int16's in e5m2's (57344). `None` where neither side is a float8.
const fn f8_rule(from: DType, to: DType, exact: bool) -> Option<bool> {
    use DType::*;
    match (from, to) {
        (Float8E4M3FN, Float8E4M3FN) | (Float8E5M2, Float8E5M2) => Some(true),
        (Float8E4M3FN | Float8E5M2, Float16 | BFloat16 | Float32 | Float64) => Some(true),
        (Float8E4M3FN | Float8E5M2, _) => Some(false),
        (Bool, Float8E4M3FN | Float8E5M2) => Some(true),
        (Int8 | UInt8, Float8E4M3FN) | (Int8 | UInt8 | Int16, Float8E5M2) => Some(!exact),
        (_, Float8E4M3FN | Float8E5M2) => Some(false),
        _ => None,
    }
}

/// bfloat16 has float32's range and 8 significant bits, so size alone does not order it: every
/// integer and every float16 lies in its range, and only int8, uint8 and bool values are all
/// exact in it. `None` where the size rules below apply.
const fn bf16_rule(from: DType, to: DType, exact: bool) -> Option<bool> {
    match (from, to) {
        (DType::BFloat16, DType::BFloat16) => Some(true),
        (DType::BFloat16, DType::Float32 | DType::Float64) => Some(true),
        (DType::BFloat16, _) => Some(false),
        (DType::Bool | DType::Int8 | DType::UInt8, DType::BFloat16) => Some(true),
        (
            DType::Int16 | DType::UInt16 | DType::Int32 | DType::UInt32 | DType::Int64 | DType::UInt64,
            DType::BFloat16,
        ) => Some(!exact),
        (DType::Float16, DType::BFloat16) => Some(!exact),
        (DType::Float32 | DType::Float64, DType::BFloat16) => Some(false),
        _ => None,
    }
}

/// True when every value of `from` converts to `to` without a check: integer widening that
/// keeps every value, float widening, and integer -> float where every integer of `from` is
/// exactly a float of `to` (under [`Inexact::Round`]: lies within its finite range, and may
/// round, as numpy's `same_kind` allows). Such casts run unchecked; the others go through the
/// checks of [`cast()`]: float narrowing and integers into float16 (whose largest finite value
/// is 65504) can overflow, and wide integers into a float can be inexact.
pub const fn always_fits(from: DType, to: DType, inexact: Inexact) -> bool {
    if matches!(inexact, Inexact::Error) && int_to_float(from, to) {
        return exactly(from, to);
    }
    if let Some(fits) = f8_rule(from, to, false) {
        return fits;
    }
    if let Some(fits) = bf16_rule(from, to, false) {
        return fits;
    }
    let (a, b) = (from.itemsize(), to.itemsize());
    match (from.kind(), to.kind()) {
        (Kind::Float, Kind::Float) => b >= a,
        (Kind::Signed | Kind::Unsigned, Kind::Float) => b > 2 || a == 1 || matches!(from, DType::Int16),
        (Kind::Bool, Kind::Float) => true,
        (Kind::Signed, Kind::Signed) | (Kind::Unsigned, Kind::Unsigned) => b >= a,
        (Kind::Unsigned, Kind::Signed) => b > a,
        (Kind::Bool, _) => true,
        _ => false,
    }
}

/// True for an integer -> float cast.
const fn int_to_float(from: DType, to: DType) -> bool {
    matches!(from.kind(), Kind::Signed | Kind::Unsigned) && matches!(to.kind(), Kind::Float)
}

/// True when every integer of `from` is exactly a float of `to`: numpy's safe casting table
/// ([`can_cast_safely`]) without its one rounding exception, 64-bit integers into float64.
const fn exactly(from: DType, to: DType) -> bool {
    can_cast_safely(from, to) && !(from.itemsize() == 8 && to.itemsize() == 8)
}

/// True when a cast from `from` to `to` can fail only by a finite value overflowing to
/// infinity: a cast into a float type that is not [`always_fits`], and not an integer cast
/// that must be exact. The kernels run such casts unchecked, so that the copy loop vectorises,
/// and then look for the overflow in the output. Not for float8 e4m3fn, which overflows to NaN:
/// its casts are checked value by value.
pub const fn fails_only_by_overflow(from: DType, to: DType, inexact: Inexact) -> bool {
    let overflows_to_infinity = matches!(to.kind(), Kind::Float) && !matches!(to, DType::Float8E4M3FN);
    overflows_to_infinity
        && !always_fits(from, to, inexact)
        && !(matches!(inexact, Inexact::Error) && int_to_float(from, to))
}

/// True when `x` is an infinity of a float type.
#[inline(always)]
pub(crate) fn is_infinite<T: Element>(x: T) -> bool {
    matches!(x.to_num(), Num::Float(f) if f.is_infinite())
}

/// Casts one value from `S` to `D`: unchecked when [`always_fits`], else `None` for a value
/// that does not fit (out-of-range integers; NaN, infinite or fractional floats into ints; a
/// finite value that overflows a float; under [`Inexact::Error`], an integer the float cannot
/// hold exactly).
#[inline(always)]
pub fn cast<S: Element, D: Element>(s: S, inexact: Inexact) -> Option<D> {
    if always_fits(S::DTYPE, D::DTYPE, inexact) {
        return Some(D::from_num_lossy(s.to_num()));
    }
    let n = s.to_num();
    let d = D::from_num(n)?;
    if matches!(inexact, Inexact::Error) && int_to_float(S::DTYPE, D::DTYPE) && !holds(n, d) {
        return None;
    }
    Some(d)
}

/// Whether `d` is exactly the integer `n` (true for a float `n`).
#[inline(always)]
fn holds<D: Element>(n: Num, d: D) -> bool {
    match (n, d.to_num()) {
        // An integer rounds to an integer-valued float (or infinity, which saturates and differs).
        (Num::Int(i), Num::Float(f)) => f as i128 == i as i128,
        (Num::UInt(u), Num::Float(f)) => f as i128 == u as i128,
        _ => true,
    }
}

/// Converts a user's fill value to `D` (copies), refusing one that does not fit: 300 into
/// uint8, 1.5 into int32, NaN into any integer type, 1e300 into float32 (a finite value that
/// would become infinite). A float fill into a float type rounds, as casts do.
///
/// # Errors
/// [`Error::ValueOutOfRange`] with place `(fill_value)`.
pub fn fill_value<D: Element>(s: Scalar) -> Result<D> {
    let n = match s {
        Scalar::Int(i) => Num::Int(i),
        Scalar::Float(f) => Num::Float(f),
        Scalar::Bool(b) => Num::Int(b as i64),
    };
    D::from_num(n).ok_or_else(|| Error::ValueOutOfRange {
        value: match s {
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => format!("{f:?}"),
            Scalar::Bool(b) => b.to_string(),
        },
        place: Place::Fill,
        target: D::DTYPE.to_string(),
    })
}

/// A fill value's bytes in `dtype` (little-endian, in the low bytes of a u64), checked once
/// for every place that writes it: in range as [`fill_value`] checks it, a bool's only from a
/// bool, 0 or 1 (its 0/1 byte), and an integer that `dtype` holds only rounded refused under
/// [`Inexact::Error`], as the same value in the data is (1000 into float8_e5m2, which holds
/// 1024; 2^24 + 1 into float32). A float fill rounds, as float data does. Copies nothing.
///
/// # Errors
/// [`Error::ValueOutOfRange`] and [`Error::InexactCast`] with place `(fill_value)`.
pub fn fill_bits(dtype: DType, fill: Scalar, inexact: Inexact) -> Result<u64> {
    if dtype == DType::Bool {
        return match fill {
            Scalar::Bool(b) => Ok(b.into()),
            Scalar::Int(i @ (0 | 1)) => Ok(i as u64),
            other => Err(Error::ValueOutOfRange {
                value: format!("{other:?}"),
                place: Place::Fill,
                target: "bool".into(),
            }),
        };
    }
    with_numeric!(dtype, D => {
        // An integer that `D` holds, but only rounded.
        if let Scalar::Int(i) = fill {
            if cast::<i64, D>(i, inexact).is_none() && D::from_num(Num::Int(i)).is_some() {
                let (value, target) = (i.to_string(), dtype.to_string());
                return Err(Error::InexactCast { value, place: Place::Fill, target });
            }
        }
        fill_value::<D>(fill).map(D::to_word)
    })
}

/// numpy's "safe" casting table: every value of `from` is exactly a value of `to`
/// (int64 and uint64 into float64 are allowed, as numpy allows them).
pub const fn can_cast_safely(from: DType, to: DType) -> bool {
    if let Some(exact) = f8_rule(from, to, true) {
        return exact;
    }
    if let Some(exact) = bf16_rule(from, to, true) {
        return exact;
    }
    let (a, b) = (from.itemsize(), to.itemsize());
    match (from.kind(), to.kind()) {
        (Kind::Bool, _) => true,
        (_, Kind::Bool) => false,
        (Kind::Signed, Kind::Signed) | (Kind::Unsigned, Kind::Unsigned) | (Kind::Float, Kind::Float) => {
            b >= a
        }
        (Kind::Unsigned, Kind::Signed) => b > a,
        (Kind::Signed | Kind::Unsigned, Kind::Float) => b > a || (a == 8 && b == 8),
        _ => false,
    }
}

/// The dtype numpy's `result_type` gives for stacking columns of these dtypes: the smallest
/// dtype every one of them casts to safely ([`can_cast_safely`]). So int8 + uint8 -> int16,
/// int64 + uint64 -> float64, int32 + float32 -> float64, int16 + float32 -> float32,
/// int8 + float16 -> float16, and the result does not depend on the order. No dtypes gives
/// float64 (numpy's default).
pub fn common_dtype(dtypes: &[DType]) -> DType {
    use DType::*;
    // Ordered so that the first dtype everything casts to is numpy's answer.
    const LADDER: [DType; DType::ALL.len()] = [
        Bool,
        Float8E4M3FN,
        Float8E5M2,
        UInt8,
        Int8,
        UInt16,
        Int16,
        Float16,
        BFloat16,
        UInt32,
        Int32,
        Float32,
        UInt64,
        Int64,
        Float64,
    ];
    if dtypes.is_empty() {
        return Float64;
    }
    LADDER.into_iter().find(|&t| dtypes.iter().all(|&d| can_cast_safely(d, t))).unwrap_or(Float64)
}

#[cfg(test)]
mod tests;

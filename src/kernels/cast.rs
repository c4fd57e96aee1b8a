//! Element types for the kernels, checked casts, fill values and dtype promotion.

use half::f16;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A fill value, as the user gave it; converted to the tensor dtype with a range check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A signed integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

/// A tensor element the kernels can read, write and cast.
pub trait Element: Copy + Send + Sync + Default + PartialEq + std::fmt::Display + 'static {
    /// Its dtype.
    const DTYPE: DType;
    /// The value as an integer, for integer types.
    fn to_int(self) -> Option<i128>;
    /// The value as f64 (exact for every integer up to 2^53 and every float).
    fn to_f64(self) -> f64;
    /// The integer, if this type holds it exactly.
    fn from_int(v: i128) -> Option<Self>;
    /// The float, if this type holds it: floats round (numpy's same-kind casting), integers
    /// need a finite, whole value in range.
    fn from_f64(v: f64) -> Option<Self>;

    /// Casts one value, or says which value does not fit.
    #[inline]
    fn cast_from<S: Element>(s: S) -> Option<Self> {
        match s.to_int() {
            Some(i) => Self::from_int(i),
            None => Self::from_f64(s.to_f64()),
        }
    }
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline] fn to_int(self) -> Option<i128> { Some(self as i128) }
            #[inline] fn to_f64(self) -> f64 { self as f64 }
            #[inline] fn from_int(v: i128) -> Option<Self> { <$t>::try_from(v).ok() }
            #[inline] fn from_f64(v: f64) -> Option<Self> {
                (v.is_finite() && v.fract() == 0.0 && v >= <$t>::MIN as f64 && v <= <$t>::MAX as f64
                    && (v as $t) as f64 == v).then(|| v as $t)
            }
        }
    )*};
}
int_element!(i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64, u8 => UInt8, u16 => UInt16, u32 => UInt32, u64 => UInt64);

impl Element for f32 {
    const DTYPE: DType = DType::Float32;
    #[inline]
    fn to_int(self) -> Option<i128> {
        None
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn from_int(v: i128) -> Option<Self> {
        Some(v as f32)
    }
    #[inline]
    fn from_f64(v: f64) -> Option<Self> {
        Some(v as f32)
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::Float64;
    #[inline]
    fn to_int(self) -> Option<i128> {
        None
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline]
    fn from_int(v: i128) -> Option<Self> {
        Some(v as f64)
    }
    #[inline]
    fn from_f64(v: f64) -> Option<Self> {
        Some(v)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::Float16;
    #[inline]
    fn to_int(self) -> Option<i128> {
        None
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    #[inline]
    fn from_int(v: i128) -> Option<Self> {
        Some(f16::from_f64(v as f64))
    }
    #[inline]
    fn from_f64(v: f64) -> Option<Self> {
        Some(f16::from_f64(v))
    }
}

/// Converts a user's fill value to `D`, refusing values that do not fit exactly (300 into
/// uint8, 1.5 into int32, NaN into an integer type).
///
/// # Errors
/// [`Error::ValueOutOfRange`] with place `(fill_value)`.
pub fn fill_value<D: Element>(s: Scalar) -> Result<D> {
    let v = match s {
        Scalar::Int(i) => D::from_int(i as i128),
        Scalar::Bool(b) => D::from_int(b as i128),
        Scalar::Float(f) if D::DTYPE.is_float() => D::from_f64(f),
        Scalar::Float(f) => D::from_f64(f),
    };
    v.ok_or_else(|| Error::ValueOutOfRange {
        value: match s {
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        },
        place: "(fill_value)".into(),
        target: D::DTYPE.to_string(),
    })
}

/// numpy's result type for stacking these dtypes (bool < ints < floats; a signed and an
/// unsigned int of the same width widen; int64 with uint64 gives float64; int32/64 with
/// float16/32 gives float64).
pub fn common_dtype(dtypes: &[DType]) -> DType {
    dtypes.iter().copied().reduce(promote).unwrap_or(DType::Float64)
}

fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    let signed = |d| matches!(d, Int8 | Int16 | Int32 | Int64);
    let unsigned = |d| matches!(d, UInt8 | UInt16 | UInt32 | UInt64);
    let float_for = |bytes: usize| match bytes {
        1 => Float16,
        2 => Float32,
        _ => Float64,
    };
    let int_of = |bytes: usize| match bytes {
        1 => Int8,
        2 => Int16,
        4 => Int32,
        _ => Int64,
    };
    match (a, b) {
        (Bool, x) | (x, Bool) => x,
        (x, y) if x.is_float() && y.is_float() => {
            if x.itemsize() >= y.itemsize() {
                x
            } else {
                y
            }
        }
        (f, i) | (i, f) if f.is_float() => {
            // ints need a float with more mantissa bits than the int has value bits
            let need = float_for(i.itemsize());
            if need.itemsize() > f.itemsize() { need } else { f }
        }
        (x, y) if signed(x) == signed(y) => {
            if x.itemsize() >= y.itemsize() {
                x
            } else {
                y
            }
        }
        (s, u) | (u, s) if signed(s) && unsigned(u) => {
            if s.itemsize() > u.itemsize() {
                s
            } else if u.itemsize() < 8 {
                int_of(u.itemsize() * 2)
            } else {
                Float64
            }
        }
        _ => Float64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_follows_numpy() {
        let cases = [
            (vec![Int8, UInt8], Int16),
            (vec![Int64, UInt64], Float64),
            (vec![Int32, Float32], Float64),
            (vec![Int16, Float32], Float32),
            (vec![Int8, Float16], Float16),
            (vec![UInt8, Float16], Float16),
            (vec![Int32, Int64, UInt16], Int64),
            (vec![UInt32, Int32], Int64),
            (vec![Bool, UInt8], UInt8),
            (vec![Float32, Float64], Float64),
            (vec![Float32; 8], Float32),
        ];
        for (input, want) in cases {
            assert_eq!(common_dtype(&input), want, "{input:?}");
        }
    }

    #[test]
    fn checked_casts_refuse_what_does_not_fit() {
        assert_eq!(u8::cast_from(255i32), Some(255));
        assert_eq!(u8::cast_from(256i32), None);
        assert_eq!(u8::cast_from(-1i8), None);
        assert_eq!(i32::cast_from(2.0f64), Some(2));
        assert_eq!(i32::cast_from(2.5f64), None);
        assert_eq!(i64::cast_from(f64::NAN), None);
        assert_eq!(i64::cast_from(9.3e18f64), None);
        assert_eq!(u64::cast_from(u64::MAX), Some(u64::MAX));
        assert_eq!(f32::cast_from(1e300f64), Some(f32::INFINITY));
        assert_eq!(f64::cast_from(i64::MAX), Some(i64::MAX as f64));
    }

    #[test]
    fn fill_values_are_range_checked() {
        assert_eq!(fill_value::<u8>(Scalar::Int(7)).unwrap(), 7);
        assert!(fill_value::<u8>(Scalar::Int(300)).unwrap_err().to_string().contains("fill_value"));
        assert!(fill_value::<i32>(Scalar::Float(1.5)).is_err());
        assert!(fill_value::<i32>(Scalar::Float(f64::NAN)).is_err());
        assert!(fill_value::<f32>(Scalar::Float(f64::NAN)).unwrap().is_nan());
        assert_eq!(fill_value::<f64>(Scalar::Bool(true)).unwrap(), 1.0);
    }
}

use super::*;
use DType::*;
use Inexact::Round;

/// `np.promote_types(a, b)` for every pair, from numpy 2.4 (row = a, column = b, in this
/// order: b u1 i1 u2 i2 f2 u4 i4 f4 u8 i8 f8).
const NUMPY_PAIRS: [&str; 12] = [
    "b u1 i1 u2 i2 f2 u4 i4 f4 u8 i8 f8",
    "u1 u1 i2 u2 i2 f2 u4 i4 f4 u8 i8 f8",
    "i1 i2 i1 i4 i2 f2 i8 i4 f4 f8 i8 f8",
    "u2 u2 i4 u2 i4 f4 u4 i4 f4 u8 i8 f8",
    "i2 i2 i2 i4 i2 f4 i8 i4 f4 f8 i8 f8",
    "f2 f2 f2 f4 f4 f2 f8 f8 f4 f8 f8 f8",
    "u4 u4 i8 u4 i8 f8 u4 i8 f8 u8 i8 f8",
    "i4 i4 i4 i4 i4 f8 i8 i4 f8 f8 i8 f8",
    "f4 f4 f4 f4 f4 f4 f8 f8 f4 f8 f8 f8",
    "u8 u8 f8 u8 f8 f8 u8 f8 f8 u8 f8 f8",
    "i8 i8 i8 i8 i8 f8 i8 i8 f8 f8 i8 f8",
    "f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8",
];
const ORDER: [DType; 12] =
    [Bool, UInt8, Int8, UInt16, Int16, Float16, UInt32, Int32, Float32, UInt64, Int64, Float64];

fn short(d: DType) -> &'static str {
    ["b", "u1", "i1", "u2", "i2", "f2", "u4", "i4", "f4", "u8", "i8", "f8"]
        [ORDER.iter().position(|&x| x == d).unwrap()]
}

#[test]
fn promotion_matches_numpy_for_every_pair_and_is_order_free() {
    for (a, row) in ORDER.iter().zip(NUMPY_PAIRS) {
        for (b, want) in ORDER.iter().zip(row.split(' ')) {
            assert_eq!(short(common_dtype(&[*a, *b])), want, "{a} + {b}");
        }
    }
    // numpy's result_type is order-free where a left fold of pairs is not.
    assert_eq!(common_dtype(&[Int8, UInt8, Float16]), Float16);
    assert_eq!(common_dtype(&[Float16, Int8, UInt8]), Float16);
    assert_eq!(common_dtype(&[Int8, UInt16, Float32]), Float32);
    assert_eq!(common_dtype(&[Float32; 8]), Float32);
    assert_eq!(common_dtype(&[]), Float64);
}

#[test]
fn checked_casts_refuse_what_does_not_fit() {
    assert_eq!(cast::<i32, u8>(255, Round), Some(255));
    assert_eq!(cast::<i32, u8>(256, Round), None);
    assert_eq!(cast::<i8, u8>(-1, Round), None);
    assert_eq!(cast::<u64, i64>(u64::MAX, Round), None);
    assert_eq!(cast::<u64, i64>(i64::MAX as u64, Round), Some(i64::MAX));
    assert_eq!(cast::<f64, i32>(2.0, Round), Some(2));
    assert_eq!(cast::<f64, i32>(2.5, Round), None);
    assert_eq!(cast::<f64, i32>(-0.0, Round), Some(0));
    assert_eq!(cast::<f64, i64>(f64::NAN, Round), None);
    assert_eq!(cast::<f64, i64>(f64::INFINITY, Round), None);
    // 2^63 is one past i64::MAX: `as` would saturate it to i64::MAX.
    assert_eq!(cast::<f64, i64>(9_223_372_036_854_775_808.0, Round), None);
    assert_eq!(cast::<f64, i64>(-9_223_372_036_854_775_808.0, Round), Some(i64::MIN));
    assert_eq!(cast::<f64, u64>(18_446_744_073_709_551_616.0, Round), None);
    assert_eq!(cast::<f32, u8>(255.0, Round), Some(255));
    assert_eq!(cast::<f32, u8>(256.0, Round), None);
    assert_eq!(cast::<f16, i8>(f16::from_f32(-128.0), Round), Some(-128));
    assert_eq!(cast::<f16, u8>(f16::from_f32(0.5), Round), None);
    assert_eq!(cast::<u64, u64>(u64::MAX, Round), Some(u64::MAX));
}

#[test]
fn casts_to_floats_round_once_and_refuse_only_overflow() {
    // A finite value past the target's range would silently become inf: refused.
    assert_eq!(cast::<f64, f32>(1e300, Round), None);
    assert_eq!(cast::<f64, f32>(-1e39, Round), None);
    assert_eq!(cast::<f32, f16>(70_000.0, Round), None);
    assert_eq!(cast::<f64, f16>(65_520.0, Round), None);
    // Values that round into range, and inf and NaN themselves, pass.
    assert_eq!(cast::<f64, f32>(f32::MAX as f64, Round), Some(f32::MAX));
    assert_eq!(cast::<f64, f16>(65_519.99, Round), Some(f16::MAX));
    assert_eq!(cast::<f64, f32>(f64::NEG_INFINITY, Round), Some(f32::NEG_INFINITY));
    assert!(cast::<f64, f16>(f64::NAN, Round).unwrap().is_nan());
    assert_eq!(cast::<f64, f32>(1e-300, Round), Some(0.0));
    assert_eq!(cast::<i64, f64>(i64::MAX, Round), Some(i64::MAX as f64));
    // 2^24 + 1 rounds to even in f32, straight from the integer.
    assert_eq!(cast::<i64, f32>(16_777_217, Round), Some(16_777_216.0));
    // A value where rounding through f64 first would differ from rounding once.
    let v = (1i64 << 62) + (1 << 38) + 1;
    assert_eq!(cast::<i64, f32>(v, Round), Some(v as f32));
    assert_eq!(cast::<u64, f32>(u64::MAX, Round), Some(u64::MAX as f32));
    assert_eq!(cast::<i32, f16>(70_000, Round), None);
    assert_eq!(cast::<u16, f16>(u16::MAX, Round), None);
    assert_eq!(cast::<i16, f16>(i16::MIN, Round), Some(f16::from_f32(-32768.0)));
    assert_eq!(cast::<i64, f16>(-65_504, Round), Some(-f16::MAX));
    assert_eq!(cast::<u8, f16>(255, Round), Some(f16::from_f32(255.0)));
    assert!(cast::<f32, f64>(f32::NAN, Round).unwrap().is_nan());
}

#[test]
fn always_fits_matches_the_ranges() {
    assert!(
        always_fits(Int8, Int64, Round)
            && always_fits(UInt8, Int16, Round)
            && always_fits(UInt32, UInt64, Round)
    );
    assert!(
        always_fits(Int64, Float32, Round)
            && always_fits(UInt64, Float32, Round)
            && always_fits(Float16, Float64, Round)
    );
    assert!(
        always_fits(Int16, Float16, Round)
            && always_fits(UInt8, Float16, Round)
            && always_fits(Bool, Float16, Round)
    );
    // These can overflow to inf: 1e300 into float32, 65535 or 70000 into float16.
    assert!(
        !always_fits(Float64, Float32, Round)
            && !always_fits(Float32, Float16, Round)
            && !always_fits(Float64, Float16, Round)
    );
    assert!(
        !always_fits(UInt16, Float16, Round)
            && !always_fits(Int32, Float16, Round)
            && !always_fits(Int64, Float16, Round)
    );
    assert!(
        !always_fits(Int16, Int8, Round)
            && !always_fits(Int8, UInt64, Round)
            && !always_fits(UInt8, Int8, Round)
    );
    assert!(!always_fits(Float16, Int64, Round) && !always_fits(UInt64, Int64, Round));
    for from in DType::ALL {
        assert!(always_fits(from, from, Round));
    }
}

#[test]
fn integers_a_float_cannot_hold_are_refused_unless_rounding_is_asked_for() {
    use Inexact::Error as Exact;
    // 2^53 + 1 has no float64; 2^53 and 2^53 + 2 have.
    let big = (1i64 << 53) + 1;
    assert_eq!(cast::<i64, f64>(big, Exact), None);
    assert_eq!(cast::<i64, f64>(big, Round), Some(9_007_199_254_740_992.0));
    assert_eq!(cast::<i64, f64>(big + 1, Exact), Some((big + 1) as f64));
    assert_eq!(cast::<i32, f32>(16_777_217, Exact), None);
    assert_eq!(cast::<i32, f32>(-16_777_216, Exact), Some(-16_777_216.0));
    assert_eq!(cast::<u64, f64>(u64::MAX, Exact), None);
    assert_eq!(cast::<u64, f64>(1 << 63, Exact), Some(9_223_372_036_854_775_808.0));
    // i64::MAX rounds to 2^63, which is not i64::MAX (a saturating compare would say it is).
    assert_eq!(cast::<i64, f64>(i64::MAX, Exact), None);
    assert_eq!(cast::<i64, f64>(i64::MIN, Exact), Some(-9_223_372_036_854_775_808.0));
    assert_eq!(cast::<i16, f16>(2049, Exact), None);
    assert_eq!(cast::<i16, f16>(2048, Exact), Some(f16::from_f32(2048.0)));
    assert_eq!(cast::<i32, bf16>(257, Exact), None);
    assert_eq!(cast::<i32, bf16>(256, Exact), Some(bf16::from_f32(256.0)));
    // Overflow is refused under both modes.
    assert_eq!(cast::<i32, f16>(70_000, Exact), None);
    // Float narrowing rounds under both: underflow to zero is IEEE's rounding, not an error.
    assert_eq!(cast::<f64, f32>(1e-300, Exact), Some(0.0));
    assert_eq!(cast::<f64, f32>(0.1, Exact), Some(0.1f32));
    // Which casts run unchecked: exactly the integers the significand holds.
    for (from, to) in [
        (Int32, Float64),
        (UInt32, Float64),
        (Int16, Float32),
        (UInt16, Float32),
        (Int8, Float16),
        (UInt8, BFloat16),
        (Bool, Float16),
    ] {
        assert!(always_fits(from, to, Exact), "{from} -> {to}");
    }
    for (from, to) in
        [(Int64, Float64), (UInt64, Float64), (Int32, Float32), (Int16, Float16), (Int16, BFloat16)]
    {
        assert!(!always_fits(from, to, Exact) && !fails_only_by_overflow(from, to, Exact), "{from} -> {to}");
    }
    assert!(fails_only_by_overflow(Float64, Float32, Exact) && fails_only_by_overflow(Int32, Float16, Round));
}

#[test]
fn a_value_kept_as_a_word_is_the_same_value() {
    fn round_trip<D: Element>(v: D, word: u64) {
        assert_eq!(v.to_word(), word, "{v}");
        assert_eq!(D::from_word(word).to_word(), word, "{v}");
    }
    round_trip(-1i8, 0xff);
    round_trip(-2i32, 0xffff_fffe);
    round_trip(u64::MAX, u64::MAX);
    round_trip(f16::from_f64(-2.0), 0xc000);
    round_trip(bf16::from_f64(1.0), 0x3f80);
    round_trip(-0.0f32, 0x8000_0000);
    round_trip(f64::INFINITY, 0x7ff0_0000_0000_0000);
    round_trip(F8E4M3FN::from_f64(448.0), 0x7e);
    round_trip(F8E5M2::from_f64(-1.0), 0xbc);
}

#[test]
fn fill_values_are_range_checked() {
    assert_eq!(fill_value::<u8>(7.into()).unwrap(), 7);
    let e = fill_value::<u8>(300.into()).unwrap_err();
    assert!(matches!(&e, Error::ValueOutOfRange { place, .. } if place == "(fill_value)"), "{e}");
    assert!(e.to_string().contains("300") && e.to_string().contains("uint8"), "{e}");
    assert!(fill_value::<u8>((-1).into()).is_err());
    assert!(fill_value::<i32>(1.5.into()).is_err());
    assert_eq!(fill_value::<i32>((-2.0).into()).unwrap(), -2);
    assert!(fill_value::<i64>(f64::NAN.into()).is_err());
    assert!(fill_value::<f32>(f64::NAN.into()).unwrap().is_nan());
    assert_eq!(fill_value::<f32>(f64::NEG_INFINITY.into()).unwrap(), f32::NEG_INFINITY);
    assert!(fill_value::<f32>(1e300.into()).is_err());
    assert!(fill_value::<f16>(70_000.into()).is_err());
    assert_eq!(fill_value::<f16>(0.1.into()).unwrap(), f16::from_f64(0.1));
    assert_eq!(fill_value::<f64>(true.into()).unwrap(), 1.0);
    assert_eq!(fill_value::<u64>(Scalar::Int(i64::MAX)).unwrap(), i64::MAX as u64);
}

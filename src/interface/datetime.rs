//! numpy's `datetime64` and `timedelta64` units as Arrow types, for a tensor imported through an
//! array interface (whose typestr carries the unit, `"<M8[D]"`).
//!
//! | numpy unit | Arrow type | data movement |
//! |---|---|---|
//! | `s`, `ms`, `us`, `ns` | timestamp / duration of that unit | zero-copy |
//! | `D` of a datetime64 | date32 (days), each value range-checked into int32 | one pass (copies) |
//! | `h`, `m`; `D` of a timedelta64 | timestamp / duration in seconds, each value multiplied, overflow checked | one pass (copies) |
//! | `Y`, `M`, `W`, `ps`, `fs`, `as`, generic, multiples (`10s`) | - | refused, naming the unit |
//!
//! NaT is numpy's smallest int64. It stays the smallest value of the tensor's storage: int64 in
//! the shared units and in the seconds that `h`, `m` and `D` of a timedelta become, int32 in a
//! date32 (so the date of day -2^31, which would read as NaT, is refused). On the way to Arrow
//! that value becomes a null, as pyarrow makes NaT a null (`arrow::from_tensor`), with the
//! values still shared.

use std::sync::Arc;

use arrow_schema::{DataType, Field, TimeUnit};

use super::typestr::TypeStr;
use crate::decide::{Cause, decide};
use crate::error::{Error, Place, Result};
use crate::kernels::contiguous_copy;
use crate::options::CopyPolicy;
use crate::tensor::Tensor;

/// What a datetime typestr's unit becomes.
#[derive(Debug, Clone, PartialEq)]
pub enum Units {
    /// The values as they are, read as this Arrow type (zero-copy).
    Shared(DataType),
    /// Day counts narrowed to date32's int32, range-checked (copies).
    Date32,
    /// Counts multiplied by `factor` into this Arrow type's seconds, overflow checked (copies).
    Seconds {
        /// The Arrow type (timestamp or duration in seconds).
        to: DataType,
        /// Seconds per count: 60 for minutes, 3,600 for hours, 86,400 for days.
        factor: i64,
    },
}

/// The Arrow form of a typestr's datetime unit; None for a typestr that is no datetime.
///
/// # Errors
/// [`Error::UnsupportedDType`] for a unit Arrow has no type for (years, months, weeks, units
/// below nanoseconds, generic, and multiples such as `10s`), naming it.
pub fn units(typestr: &TypeStr) -> Result<Option<Units>> {
    let (kind, Some(unit)) = (typestr.kind, typestr.unit.as_deref()) else { return Ok(None) };
    if !matches!(kind, 'M' | 'm') {
        return Ok(None);
    }
    let arrow = |u: TimeUnit| if kind == 'M' { DataType::Timestamp(u, None) } else { DataType::Duration(u) };
    let seconds = |factor| Units::Seconds { to: arrow(TimeUnit::Second), factor };
    Ok(Some(match unit {
        "s" => Units::Shared(arrow(TimeUnit::Second)),
        "ms" => Units::Shared(arrow(TimeUnit::Millisecond)),
        "us" => Units::Shared(arrow(TimeUnit::Microsecond)),
        "ns" => Units::Shared(arrow(TimeUnit::Nanosecond)),
        "D" if kind == 'M' => Units::Date32,
        "D" => seconds(86_400),
        "h" => seconds(3_600),
        "m" => seconds(60),
        _ => {
            let example = if kind == 'M' { "datetime64[s]" } else { "timedelta64[s]" };
            return Err(Error::UnsupportedDType {
                what: format!("numpy {}", numpy_name(typestr)),
                remedy: format!(
                    "Arrow has seconds, milliseconds, microseconds, nanoseconds and days; convert the \
                     array to one of them first, e.g. x.astype('{example}')"
                )
                .into(),
            });
        }
    }))
}

/// `t`, read from an array interface with `typestr`, as its Arrow type says: a datetime in an
/// Arrow unit keeps its memory and gains the type; days become date32 and hours and minutes
/// seconds in one pass (copies, refused under [`CopyPolicy::Never`]); other tensors pass as
/// they are.
///
/// # Errors
/// The errors of [`units`]; [`Error::CopyRequired`] for a unit that needs a copy under
/// `copy=False`; [`Error::ValueOutOfRange`] for a value that does not fit, naming its index.
pub fn with_units(t: Tensor, typestr: &TypeStr, copy: CopyPolicy) -> Result<Tensor> {
    let Some(units) = units(typestr)? else { return Ok(t) };
    // Nullable: NaT becomes a null in Arrow.
    let logical = |dt: DataType| Some(Arc::new(Field::new("", dt, true)));
    if let Units::Shared(dt) = units {
        return Ok(t.with_logical(logical(dt)));
    }
    decide(
        copy,
        Some(Cause::Units { from: numpy_name(typestr).to_string(), to: target(&units).to_string() }),
    )?;
    let contiguous;
    let source = if t.is_c_contiguous() {
        &t
    } else {
        contiguous = contiguous_copy(&t)?;
        &contiguous
    };
    let counts = source.as_slice::<i64>()?;
    let bad = |i: usize, v: i64| Error::ValueOutOfRange {
        value: v.to_string(),
        place: Place::Index { index: i as u64, array: numpy_name(typestr) },
        target: target(&units),
    };
    let shape = t.shape().to_vec();
    let out = match &units {
        Units::Date32 => {
            let days: Vec<i32> = counts
                .iter()
                .enumerate()
                .map(|(i, &v)| match v {
                    i64::MIN => Ok(i32::MIN),
                    v => i32::try_from(v).ok().filter(|d| *d != i32::MIN).ok_or_else(|| bad(i, v)),
                })
                .collect::<Result<_>>()?;
            Tensor::from_vec(days, shape)?.with_logical(logical(DataType::Date32))
        }
        Units::Seconds { to, factor } => {
            let secs: Vec<i64> = counts
                .iter()
                .enumerate()
                .map(|(i, &v)| match v {
                    i64::MIN => Ok(i64::MIN),
                    v => v.checked_mul(*factor).filter(|s| *s != i64::MIN).ok_or_else(|| bad(i, v)),
                })
                .collect::<Result<_>>()?;
            Tensor::from_vec(secs, shape)?.with_logical(logical(to.clone()))
        }
        Units::Shared(_) => unreachable!("returned above"),
    };
    Ok(out.with_copied(true))
}

/// numpy's name of a datetime typestr's type: `datetime64[D]`, `timedelta64[h]`.
fn numpy_name(typestr: &TypeStr) -> String {
    let kind = if typestr.kind == 'M' { "datetime64" } else { "timedelta64" };
    format!("{kind}[{}]", typestr.unit.as_deref().unwrap_or(""))
}

/// The type a converted unit becomes, as errors name it.
fn target(units: &Units) -> String {
    match units {
        Units::Shared(dt) | Units::Seconds { to: dt, .. } => dt.to_string(),
        Units::Date32 => "date32 (int32 days)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> TypeStr {
        s.parse().unwrap()
    }

    fn tensor(v: &[i64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), vec![v.len() as i64]).unwrap()
    }

    #[test]
    fn every_numpy_unit_has_its_arrow_form_or_a_refusal_naming_it() {
        assert_eq!(
            units(&ts("<M8[ns]")).unwrap(),
            Some(Units::Shared(DataType::Timestamp(TimeUnit::Nanosecond, None)))
        );
        assert_eq!(units(&ts("<m8[s]")).unwrap(), Some(Units::Shared(DataType::Duration(TimeUnit::Second))));
        assert_eq!(units(&ts("<M8[D]")).unwrap(), Some(Units::Date32));
        assert_eq!(
            units(&ts("<m8[D]")).unwrap(),
            Some(Units::Seconds { to: DataType::Duration(TimeUnit::Second), factor: 86_400 })
        );
        assert_eq!(
            units(&ts("<M8[h]")).unwrap(),
            Some(Units::Seconds { to: DataType::Timestamp(TimeUnit::Second, None), factor: 3600 })
        );
        assert_eq!(
            units(&ts("<m8[m]")).unwrap(),
            Some(Units::Seconds { to: DataType::Duration(TimeUnit::Second), factor: 60 })
        );
        for unit in ["Y", "M", "W", "ps", "fs", "as", "generic", "10s"] {
            let e = units(&ts(&format!("<M8[{unit}]"))).unwrap_err();
            assert!(e.to_string().contains(&format!("datetime64[{unit}]")), "{e}");
        }
        assert_eq!(units(&ts("<i8")).unwrap(), None);
    }

    #[test]
    fn days_become_date32_and_hours_seconds_checked() {
        let t = with_units(tensor(&[0, -1, 19_000]), &ts("<M8[D]"), CopyPolicy::IfNeeded).unwrap();
        assert_eq!(t.as_slice::<i32>().unwrap(), &[0, -1, 19_000]);
        assert_eq!(t.logical().unwrap().data_type(), &DataType::Date32);
        assert!(t.copied());
        let e = with_units(tensor(&[1, 1 << 40]), &ts("<M8[D]"), CopyPolicy::IfNeeded).unwrap_err();
        assert!(e.to_string().contains("at index 1") && e.to_string().contains("date32"), "{e}");
        // NaT stays the smallest value; the day that would read as NaT is refused.
        let t = with_units(tensor(&[i64::MIN, 1]), &ts("<M8[D]"), CopyPolicy::IfNeeded).unwrap();
        assert_eq!(t.as_slice::<i32>().unwrap(), &[i32::MIN, 1]);
        let e = with_units(tensor(&[i32::MIN as i64]), &ts("<M8[D]"), CopyPolicy::IfNeeded).unwrap_err();
        assert!(e.to_string().starts_with("-2147483648 at index 0"), "{e}");
        let t = with_units(tensor(&[i64::MIN, 1]), &ts("<m8[m]"), CopyPolicy::IfNeeded).unwrap();
        assert_eq!(t.as_slice::<i64>().unwrap(), &[i64::MIN, 60]);
        let t = with_units(tensor(&[2, -3]), &ts("<m8[h]"), CopyPolicy::Always).unwrap();
        assert_eq!(t.as_slice::<i64>().unwrap(), &[7200, -10_800]);
        assert_eq!(t.logical().unwrap().data_type(), &DataType::Duration(TimeUnit::Second));
        let e = with_units(tensor(&[i64::MAX / 60 + 1]), &ts("<M8[m]"), CopyPolicy::IfNeeded).unwrap_err();
        assert!(matches!(e, Error::ValueOutOfRange { .. }), "{e}");
        let e = with_units(tensor(&[1]), &ts("<M8[h]"), CopyPolicy::Never).unwrap_err();
        assert!(matches!(&e, Error::CopyRequired { reason } if reason.contains("Timestamp")), "{e}");
        // The Arrow units share: the same memory, typed.
        let src = tensor(&[5]);
        let t = with_units(src.clone(), &ts("<M8[us]"), CopyPolicy::Never).unwrap();
        assert_eq!(t.data_ptr(), src.data_ptr());
        assert!(!t.copied());
    }
}

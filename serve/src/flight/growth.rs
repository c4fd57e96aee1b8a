//! How large a function's result can be, worked out from its arguments before it is built:
//! the rule of each exposed function (`functions.rs` assigns them), and the measure of an
//! argument's rows that the rules read. Nothing here allocates more than a few integers a row.

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, IntervalMonthDayNanoType};
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, IntervalUnit, TimeUnit};
use datafusion::arrow::datatypes::IntervalMonthDayNano;
use datafusion::common::Result;
use datafusion::logical_expr::ColumnarValue;

/// How a function's result size follows from its arguments, per row. "Bytes" of an argument
/// are its values' bytes in that row (a string's length, a list's elements, 8 for an i64);
/// "items" are the leaf values in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Growth {
    /// At most this many times the bytes of all arguments (math, comparisons, most string and
    /// list functions: their result is made of their input).
    Scaled(u64),
    /// `repeat(s, n)`: s n times.
    Repeat,
    /// `lpad(s, n, ...)`, `rpad(s, n, ...)`: n characters of up to 4 bytes.
    Pad,
    /// `array_repeat(x, n)`: x n times.
    ElementTimes,
    /// `array_resize(l, n, v)`, `to_tensor_padded(l, n, v)`: l, and n more elements of v.
    Resize,
    /// `range(a, b, step)`, `generate_series(a, b, step)`: (b - a) / step values of 8 bytes.
    Range,
    /// `replace(s, from, to)`: every occurrence of `from` becomes `to`.
    Replace,
    /// `regexp_replace(s, pattern, to, ...)`: each match (at most len(s) + 1 of them, empty ones
    /// included) becomes `to`, whose group references (`$1`, `\1`) add at most len(s) each.
    RegexpReplace,
    /// `concat_ws(sep, a, b, ...)`: the arguments with `sep` between them.
    Join,
    /// `array_to_string(l, sep, null)`: each item as text (at most 48 bytes for a number) with
    /// `sep`, or `null` for a null one.
    ListJoin,
    /// `array_replace*(l, from, to, ...)`: l with any of its items replaced by `to`.
    ReplaceItems,
    /// `levenshtein(a, b)`: a number, but len(a) x len(b) steps of work, which are held to the
    /// same limit so that one batch cannot take minutes of CPU.
    Pairwise,
}

impl std::fmt::Display for Growth {
    /// The rule in words, as `dlframe serve --functions` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Growth::Scaled(k) => write!(f, "at most {k}x its arguments"),
            Growth::Repeat => f.write_str("its text times the count"),
            Growth::Pad => f.write_str("the length asked for"),
            Growth::ElementTimes => f.write_str("its element times the count"),
            Growth::Resize => f.write_str("its list and the new length of elements"),
            Growth::Range => f.write_str("(stop - start) / step values"),
            Growth::Replace | Growth::RegexpReplace => f.write_str("each match replaced"),
            Growth::Join => f.write_str("its arguments and a separator between each"),
            Growth::ListJoin => f.write_str("each item as text with a separator"),
            Growth::ReplaceItems => f.write_str("each item replaced"),
            Growth::Pairwise => f.write_str("the product of its arguments' lengths, in steps of work"),
        }
    }
}

/// The size of each row of an argument.
struct Rows {
    bytes: Vec<u64>,
    items: Vec<u64>,
}

/// The bytes and items of each row of `array` (see [`Growth`]); a null row has none.
fn measure(array: &dyn Array) -> Rows {
    let mut rows = measure_values(array);
    if let Some(nulls) = array.logical_nulls() {
        for i in nulls.iter().enumerate().filter(|(_, valid)| !valid).map(|(i, _)| i) {
            rows.bytes[i] = 0;
            rows.items[i] = 0;
        }
    }
    rows
}

/// Whether the rows of a type differ in size: strings, binaries, lists, maps and structs. Every
/// row of another type takes [`same_width`].
fn variable(t: &DataType) -> bool {
    use DataType::*;
    matches!(
        t,
        Utf8 | LargeUtf8
            | Binary
            | LargeBinary
            | Utf8View
            | BinaryView
            | List(_)
            | LargeList(_)
            | ListView(_)
            | LargeListView(_)
            | FixedSizeList(..)
            | Map(..)
            | Struct(_)
    )
}

/// The bytes of each row of an array whose type is not [`variable`]: its fixed width, or for
/// the rest, the array's bytes shared evenly.
fn same_width(array: &dyn Array) -> u64 {
    let width = array.data_type().primitive_width().map(|w| w as u64).unwrap_or_else(|| {
        let total = array.to_data().get_slice_memory_size().unwrap_or(array.get_array_memory_size());
        (total / array.len().max(1)) as u64 + 1
    });
    width.max(1)
}

/// The bytes and items of each row of `array`'s values, nulls included.
fn measure_values(array: &dyn Array) -> Rows {
    let n = array.len();
    if !variable(array.data_type()) {
        return Rows { bytes: vec![same_width(array); n], items: vec![1; n] };
    }
    let sum_ranges = |child: &Rows, ranges: &mut dyn Iterator<Item = (usize, usize)>| {
        let mut rows = Rows { bytes: Vec::with_capacity(n), items: Vec::with_capacity(n) };
        for (start, end) in ranges {
            let end = end.min(child.bytes.len());
            let start = start.min(end);
            rows.bytes.push(8 + child.bytes[start..end].iter().sum::<u64>());
            rows.items.push(child.items[start..end].iter().sum::<u64>());
        }
        rows
    };
    let lengths = |lens: &mut dyn Iterator<Item = usize>| Rows {
        bytes: lens.map(|l| l as u64 + 8).collect(),
        items: vec![1; n],
    };
    match array.data_type() {
        DataType::Utf8 => lengths(&mut array.as_string::<i32>().offsets().lengths()),
        DataType::LargeUtf8 => lengths(&mut array.as_string::<i64>().offsets().lengths()),
        DataType::Binary => lengths(&mut array.as_binary::<i32>().offsets().lengths()),
        DataType::LargeBinary => lengths(&mut array.as_binary::<i64>().offsets().lengths()),
        DataType::Utf8View => lengths(&mut array.as_string_view().views().iter().map(|v| *v as u32 as usize)),
        DataType::BinaryView => {
            lengths(&mut array.as_binary_view().views().iter().map(|v| *v as u32 as usize))
        }
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let o = l.value_offsets();
            sum_ranges(&measure(l.values()), &mut o.windows(2).map(|w| (w[0] as usize, w[1] as usize)))
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            let o = l.value_offsets();
            sum_ranges(&measure(l.values()), &mut o.windows(2).map(|w| (w[0] as usize, w[1] as usize)))
        }
        DataType::ListView(_) => {
            let l = array.as_list_view::<i32>();
            let mut r =
                l.offsets().iter().zip(l.sizes().iter()).map(|(o, s)| (*o as usize, (*o + *s) as usize));
            sum_ranges(&measure(l.values()), &mut r)
        }
        DataType::LargeListView(_) => {
            let l = array.as_list_view::<i64>();
            let mut r =
                l.offsets().iter().zip(l.sizes().iter()).map(|(o, s)| (*o as usize, (*o + *s) as usize));
            sum_ranges(&measure(l.values()), &mut r)
        }
        DataType::FixedSizeList(_, k) => {
            let l = array.as_fixed_size_list();
            let k = (*k).max(0) as usize;
            let start = l.offset();
            sum_ranges(&measure(l.values()), &mut (0..n).map(|i| ((start + i) * k, (start + i + 1) * k)))
        }
        DataType::Map(..) => {
            let m = array.as_map();
            let o = m.value_offsets();
            sum_ranges(&measure(m.entries()), &mut o.windows(2).map(|w| (w[0] as usize, w[1] as usize)))
        }
        DataType::Struct(_) => {
            let mut rows = Rows { bytes: vec![1; n], items: vec![0; n] };
            for child in array.as_struct().columns() {
                let c = measure(child.as_ref());
                rows.bytes.iter_mut().zip(&c.bytes).for_each(|(a, b)| *a += b);
                rows.items.iter_mut().zip(&c.items).for_each(|(a, b)| *a += b);
            }
            rows
        }
        t => unreachable!("{t} is not variable: measured above"),
    }
}

/// One argument's size per row: the same for every row (a constant), or one per row.
enum PerRow {
    Same(u64),
    Each(Vec<u64>),
}

impl PerRow {
    fn at(&self, row: usize) -> u64 {
        match self {
            PerRow::Same(v) => *v,
            PerRow::Each(v) => v.get(row).copied().unwrap_or(0),
        }
    }
}

/// The arguments of one call, measured on demand.
pub(crate) struct Call<'a> {
    pub args: &'a [ColumnarValue],
    /// The rows the call is counted for.
    pub rows: usize,
}

impl Call<'_> {
    fn arg(&self, i: usize) -> Option<&ColumnarValue> {
        self.args.get(i)
    }

    /// Bytes (or items) of argument `i` per row; a missing argument is 0.
    fn size(&self, i: usize, items: bool) -> PerRow {
        match self.arg(i) {
            None => PerRow::Same(0),
            Some(ColumnarValue::Scalar(s)) => match s.to_array_of_size(1) {
                Ok(a) => {
                    let r = measure(a.as_ref());
                    PerRow::Same(if items { r.items[0] } else { r.bytes[0] })
                }
                Err(_) => PerRow::Same(s.size() as u64),
            },
            Some(ColumnarValue::Array(a)) => {
                let r = measure(a.as_ref());
                PerRow::Each(if items { r.items } else { r.bytes })
            }
        }
    }

    fn bytes(&self, i: usize) -> PerRow {
        self.size(i, false)
    }

    /// Bytes of argument `i` summed over the call's rows: an array whose rows all take the same
    /// bytes is not measured row by row (a batch of numbers would cost two vectors of its rows).
    fn total_bytes(&self, i: usize) -> u64 {
        if let Some(ColumnarValue::Array(a)) = self.arg(i)
            && a.len() <= self.rows
            && !variable(a.data_type())
        {
            return same_width(a.as_ref()).saturating_mul((a.len() - a.logical_null_count()) as u64);
        }
        let b = self.bytes(i);
        (0..self.rows).fold(0u64, |acc, r| acc.saturating_add(b.at(r)))
    }

    fn items(&self, i: usize) -> PerRow {
        self.size(i, true)
    }

    /// The values of integer argument `i` (negative and null as 0).
    fn count(&self, i: usize) -> Result<PerRow> {
        let Some(arg) = self.arg(i) else { return Ok(PerRow::Same(0)) };
        let ints = |a: &ArrayRef| -> Result<Vec<u64>> {
            let ints = datafusion::arrow::compute::cast(a, &DataType::Int64)?;
            let ints = ints.as_primitive::<Int64Type>();
            Ok(ints.iter().map(|n| n.map_or(0, |n| n.max(0) as u64)).collect())
        };
        Ok(match arg {
            ColumnarValue::Scalar(s) => PerRow::Same(ints(&s.to_array_of_size(1)?)?[0]),
            ColumnarValue::Array(a) => PerRow::Each(ints(a)?),
        })
    }

    /// The values of argument `i` as a count of its unit (nanoseconds for dates, times and
    /// intervals), per row; null as None.
    fn ordinal(&self, i: usize) -> Result<Option<Vec<Option<i128>>>> {
        let Some(arg) = self.arg(i) else { return Ok(None) };
        let array = match arg {
            ColumnarValue::Scalar(s) => s.to_array_of_size(1)?,
            ColumnarValue::Array(a) => a.clone(),
        };
        let ints = |a: &ArrayRef, scale: i128| -> Result<Vec<Option<i128>>> {
            let ints = datafusion::arrow::compute::cast(a, &DataType::Int64)?;
            Ok(ints.as_primitive::<Int64Type>().iter().map(|v| v.map(|v| v as i128 * scale)).collect())
        };
        const DAY: i128 = 86_400_000_000_000;
        Ok(Some(match array.data_type() {
            DataType::Date32 => ints(&datafusion::arrow::compute::cast(&array, &DataType::Int32)?, DAY)?,
            DataType::Date64 => ints(&array, 1_000_000)?,
            DataType::Timestamp(unit, _) => {
                let scale = match unit {
                    TimeUnit::Second => 1_000_000_000,
                    TimeUnit::Millisecond => 1_000_000,
                    TimeUnit::Microsecond => 1_000,
                    TimeUnit::Nanosecond => 1,
                };
                ints(&array, scale)?
            }
            DataType::Interval(_) => {
                let mdn = datafusion::arrow::compute::cast(
                    &array,
                    &DataType::Interval(IntervalUnit::MonthDayNano),
                )?;
                // The shortest time a step can take: 28-day months, 23-hour days.
                let steps = mdn.as_primitive::<IntervalMonthDayNanoType>();
                let min = |v: IntervalMonthDayNano| {
                    v.months as i128 * 28 * DAY + v.days as i128 * (DAY / 24 * 23) + v.nanoseconds as i128
                };
                steps.iter().map(|v| v.map(min)).collect()
            }
            _ => ints(&array, 1)?,
        }))
    }

    /// `range` and `generate_series`: the values of each row.
    fn range_counts(&self) -> Result<PerRow> {
        let one = self.args.len() == 1;
        let start = if one { None } else { self.ordinal(0)? };
        let stop = self.ordinal(usize::from(!one))?;
        let step = if self.args.len() >= 3 { self.ordinal(2)? } else { None };
        let at = |v: &Option<Vec<Option<i128>>>, r: usize, default: i128| match v {
            None => Some(default),
            Some(v) if v.len() == 1 => v[0],
            Some(v) => v.get(r).copied().flatten(),
        };
        let len = |v: &Option<Vec<Option<i128>>>| v.as_ref().map_or(0, Vec::len);
        let rows = len(&stop).max(len(&start)).max(len(&step));
        let counts = (0..rows).map(|r| {
            let (Some(a), Some(b), Some(s)) = (at(&start, r, 0), at(&stop, r, 0), at(&step, r, 1)) else {
                return 0;
            };
            let span = b.saturating_sub(a);
            if s == 0 || (span != 0 && span.signum() != s.signum()) {
                return 1;
            }
            (span / s).unsigned_abs().saturating_add(1).min(u64::MAX as u128) as u64
        });
        Ok(PerRow::Each(counts.collect()))
    }
}

impl Growth {
    /// The bytes of one call's result, at most (saturating), summed over `call.rows` rows.
    pub(crate) fn bytes(&self, call: &Call<'_>) -> Result<u64> {
        let rows = call.rows;
        let sum = |f: &dyn Fn(usize) -> u64| (0..rows).fold(0u64, |acc, r| acc.saturating_add(f(r)));
        let mul = |a: u64, b: u64| a.saturating_mul(b);
        Ok(match self {
            Growth::Scaled(k) => {
                // k times (16 and the arguments' bytes) in each row, summed: k times their sums.
                let args = (0..call.args.len()).fold(0u64, |acc, i| acc.saturating_add(call.total_bytes(i)));
                mul(*k, mul(16, rows as u64).saturating_add(args))
            }
            Growth::Repeat => {
                let (s, n) = (call.bytes(0), call.count(1)?);
                sum(&|r| mul(s.at(r), n.at(r)))
            }
            Growth::Pad => {
                let n = call.count(1)?;
                sum(&|r| mul(4, n.at(r)).saturating_add(16))
            }
            Growth::ElementTimes => {
                // A null element still takes its slot in the list.
                let (x, n) = (call.bytes(0), call.count(1)?);
                sum(&|r| mul(x.at(r).max(8), n.at(r)).saturating_add(16))
            }
            Growth::Resize => {
                let (l, n, v) = (call.bytes(0), call.count(1)?, call.bytes(2));
                sum(&|r| l.at(r).saturating_add(mul(n.at(r), v.at(r).saturating_add(8))))
            }
            Growth::Range => {
                let n = call.range_counts()?;
                let n = match n {
                    // The values of a constant call, for every row.
                    PerRow::Each(v) if v.len() == 1 => PerRow::Same(v[0]),
                    n => n,
                };
                sum(&|r| mul(n.at(r), 8).saturating_add(16))
            }
            Growth::Replace => {
                let (s, from, to) = (call.bytes(0), call.bytes(1), call.bytes(2));
                sum(&|r| {
                    let s = s.at(r);
                    let matches = s / from.at(r).saturating_sub(8).max(1) + 1;
                    s.saturating_add(mul(matches, to.at(r)))
                })
            }
            Growth::RegexpReplace => {
                let (s, to) = (call.bytes(0), call.bytes(2));
                let refs = match call.arg(2) {
                    Some(ColumnarValue::Scalar(v)) => references(&v.to_string()),
                    // Replacements that differ by row: each of their bytes may be a reference.
                    _ => u64::MAX,
                };
                sum(&|r| {
                    let s = s.at(r);
                    let per_ref = if refs == u64::MAX { to.at(r) } else { refs };
                    s.saturating_add(mul(s + 1, to.at(r))).saturating_add(mul(per_ref, s))
                })
            }
            Growth::Join => {
                let sep = call.bytes(0);
                let parts: Vec<PerRow> = (1..call.args.len()).map(|i| call.bytes(i)).collect();
                sum(&|r| {
                    let values = parts.iter().fold(0u64, |acc, p| acc.saturating_add(p.at(r)));
                    values.saturating_add(mul(parts.len() as u64, sep.at(r)))
                })
            }
            Growth::ListJoin => {
                let (l, items, sep, null) = (call.bytes(0), call.items(0), call.bytes(1), call.bytes(2));
                sum(&|r| {
                    let each = 48u64.saturating_add(sep.at(r)).saturating_add(null.at(r));
                    l.at(r).saturating_add(mul(items.at(r), each))
                })
            }
            Growth::ReplaceItems => {
                let (l, items, to) = (call.bytes(0), call.items(0), call.bytes(2));
                sum(&|r| l.at(r).saturating_add(mul(items.at(r), to.at(r))))
            }
            Growth::Pairwise => {
                let (a, b) = (call.bytes(0), call.bytes(1));
                sum(&|r| mul(a.at(r), b.at(r)))
            }
        })
    }
}

/// How many group references (`$1`, `${name}`, `\1`) a replacement may hold, at most.
fn references(replacement: &str) -> u64 {
    replacement.bytes().filter(|b| *b == b'$' || *b == b'\\').count() as u64
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, StringArray};
    use datafusion::common::ScalarValue;

    use super::*;

    #[test]
    fn a_scaled_call_counts_each_rows_bytes_whether_measured_or_not() {
        let numbers: ArrayRef = Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0), Some(4.0)]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), Some("bb"), None, Some("")]));
        let args = [
            ColumnarValue::Scalar(ScalarValue::Int64(Some(5))),
            ColumnarValue::Array(numbers),
            ColumnarValue::Array(strings),
        ];
        // Per row: 16, the scalar's 8, the numbers' 8 (0 when null), the strings' length + 8 (0
        // when null): 16 + 32 + 24 + 27 over the 4 rows, 3 times.
        assert_eq!(Growth::Scaled(3).bytes(&Call { args: &args, rows: 4 }).unwrap(), 3 * (64 + 32 + 24 + 27));
        let huge = [ColumnarValue::Scalar(ScalarValue::Int64(Some(5)))];
        assert_eq!(Growth::Scaled(u64::MAX).bytes(&Call { args: &huge, rows: 2 }).unwrap(), u64::MAX);
    }
}

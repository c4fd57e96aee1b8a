//! Several columns -> one `(n, k)` matrix in C or F order, with the cast and the null fill
//! fused into the one pass that writes it.
//!
//! C order is written in tiles of rows, so the output tile stays in cache while each column
//! is written into it; columns that already have the target type and no nulls (the common
//! case) are written whole rows at a time for `k <= 8`. F order is one contiguous copy (or
//! cast) per column.

use rayon::prelude::*;

use super::bits::{BitSlice, check_len};
use super::cast::{Element, always_fits, cast, fails_only_by_overflow, is_infinite};
use super::column::{Column, ColumnRef, Typed, each_ref};
use super::fill::fill_nulls;
use super::{PARALLEL_THRESHOLD_BYTES, ROWS_PER_TASK, elements_mut};
use crate::dtype::DType;
use crate::error::{Error, Place, Result, Rows};
use crate::options::{Inexact, Order};

/// Writes `cols` as the columns of `out` (`n` rows, `k = cols.len()`) in `order`, casting
/// each value to `D` and writing `fill` for nulls, in one pass (copies). Parallel over row
/// blocks for large outputs.
///
/// Lossless casts (widening, integers that the float holds exactly) run unchecked; float
/// narrowing (which rounds) is checked for overflow after an unchecked pass; the others check
/// every value, `inexact` saying what an integer that a float cannot hold exactly does (see
/// [`super::always_fits`] and [`super::cast()`]).
///
/// # Errors
/// - [`Error::LengthMismatch`] for columns (or validities) of different lengths, or `out` not
///   `n * k` long;
/// - [`Error::InvalidArgument`] for a column with nulls when `fill` is `None`;
/// - [`Error::ValueOutOfRange`] for a value that does not fit `D`, placed "at row r of column
///   'name'" (or "column j" for an unnamed column); with several threads, the value reported
///   is one of the bad ones, not necessarily the first. `out` is then partly written.
///
/// Lengths and nulls are checked before anything is written.
pub fn interleave<D: Typed>(
    cols: &[Column],
    order: Order,
    fill: Option<D>,
    inexact: Inexact,
    out: &mut [D],
) -> Result<()> {
    let k = cols.len();
    let n = cols.first().map_or(0, Column::len);
    for (j, c) in cols.iter().enumerate() {
        check_len(|| format!("column {}", c.label(j)), c.len(), n)?;
        if let Some(v) = c.validity {
            check_len(|| format!("the validity of column {}", c.label(j)), v.len(), n)?;
        }
    }
    check_len(|| "the output matrix".into(), out.len(), n.saturating_mul(k))?;
    if fill.is_none() {
        for (j, c) in cols.iter().enumerate() {
            let nulls = c.validity.map_or(0, |v| v.count_zeros());
            if nulls > 0 {
                return Err(Error::InvalidArgument(format!(
                    "column {} has {nulls} null(s) and no fill value was given",
                    c.label(j)
                )));
            }
        }
    }
    if out.is_empty() {
        return Ok(());
    }
    let fill = fill.unwrap_or_default();
    let parallel = std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES;
    match order {
        Order::F => try_chunks(out, n, parallel, |j, column| {
            try_chunks(column, ROWS_PER_TASK, parallel, |b, dst| {
                write_column(j, &cols[j], b * ROWS_PER_TASK, fill, inexact, dst, 1, 0)
            })
        }),
        Order::C => {
            // Columns already of the target type: whole rows at a time, nulls selected from
            // the validity words in the same loop.
            let same: Option<Vec<&[D]>> = cols.iter().map(|c| D::values(c.values)).collect();
            let validity: Vec<Option<BitSlice>> = cols.iter().map(|c| c.validity).collect();
            let dense = validity.iter().all(Option::is_none);
            // One column with nulls is a contiguous fill, which `write_column` does faster.
            let same = same.filter(|_| k <= 8 && (dense || k > 1));
            // Whole tiles per task, and about ROWS_PER_TASK elements per task.
            let tile = (4096 / k).max(1).next_multiple_of(64);
            let task = if parallel { (ROWS_PER_TASK / k).max(1).next_multiple_of(tile) } else { n };
            try_chunks(out, task * k, parallel, |t, dst| {
                match same.as_deref() {
                    Some(same) if dense => {
                        rows_k(same, t * task, dst);
                        return Ok(());
                    }
                    Some(same) => {
                        for (i, tile_out) in dst.chunks_mut(tile * k).enumerate() {
                            rows_k_fill(same, &validity, t * task + i * tile, fill, tile_out);
                        }
                        return Ok(());
                    }
                    None => {}
                }
                dst.chunks_mut(tile * k).enumerate().try_for_each(|(i, tile_out)| {
                    let r0 = t * task + i * tile;
                    cols.iter()
                        .enumerate()
                        .try_for_each(|(j, c)| write_column(j, c, r0, fill, inexact, tile_out, k, j))
                })
            })
        }
    }
}

/// Calls `f(i, chunk)` for the `chunk`-element pieces of `out`, in parallel if asked.
fn try_chunks<T: Send>(
    out: &mut [T],
    chunk: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync + Send,
) -> Result<()> {
    if parallel {
        super::pool::install(|| out.par_chunks_mut(chunk).enumerate().try_for_each(|(i, dst)| f(i, dst)))
    } else {
        out.chunks_mut(chunk).enumerate().try_for_each(|(i, dst)| f(i, dst))
    }
}

/// Rows `r0..` of `k <= 8` dense columns of the target type, whole rows at a time.
fn rows_k<D: Copy>(cols: &[&[D]], r0: usize, dst: &mut [D]) {
    match cols.len() {
        1 => rows_const::<1, D>(cols, r0, dst),
        2 => rows_const::<2, D>(cols, r0, dst),
        3 => rows_const::<3, D>(cols, r0, dst),
        4 => rows_const::<4, D>(cols, r0, dst),
        5 => rows_const::<5, D>(cols, r0, dst),
        6 => rows_const::<6, D>(cols, r0, dst),
        7 => rows_const::<7, D>(cols, r0, dst),
        8 => rows_const::<8, D>(cols, r0, dst),
        k => unreachable!("rows_k is only called for 1..=8 columns, not {k}"),
    }
}

fn rows_const<const K: usize, D: Copy>(cols: &[&[D]], r0: usize, dst: &mut [D]) {
    let n = dst.len() / K;
    let cols: [&[D]; K] = std::array::from_fn(|j| &cols[j][r0..r0 + n]);
    for (r, row) in dst.chunks_exact_mut(K).enumerate() {
        for j in 0..K {
            row[j] = cols[j][r];
        }
    }
}

/// Rows `r0..` of `k <= 8` columns of the target type, some with validity bitmaps; a null
/// becomes `fill`. The plain row copy vectorises; the nulls are then patched one set bit at a
/// time, so the cost above a copy grows with the number of nulls. `dst` is one cache-sized tile.
fn rows_k_fill<D: Copy>(cols: &[&[D]], validity: &[Option<BitSlice>], r0: usize, fill: D, dst: &mut [D]) {
    let k = cols.len();
    rows_k(cols, r0, dst);
    let rows = dst.len() / k;
    for (j, v) in validity.iter().enumerate() {
        let Some(v) = v else { continue };
        let v = v.slice(r0, rows);
        for w in (0..rows).step_by(64) {
            let in_block = if rows - w >= 64 { u64::MAX } else { (1u64 << (rows - w)) - 1 };
            let mut nulls = !v.word(w) & in_block;
            while nulls != 0 {
                dst[(w + nulls.trailing_zeros() as usize) * k + j] = fill;
                nulls &= nulls - 1;
            }
        }
    }
}

/// Writes rows `r0..` of column `j` into every `stride`-th element of `dst`, starting at
/// `pos` (`stride == 1`: a contiguous piece of an F-order matrix).
#[allow(clippy::too_many_arguments)]
fn write_column<D: Typed>(
    j: usize,
    col: &Column,
    r0: usize,
    fill: D,
    inexact: Inexact,
    dst: &mut [D],
    stride: usize,
    pos: usize,
) -> Result<()> {
    let rows = dst.len() / stride;
    let validity = col.validity.map(|v| v.slice(r0, rows));
    if let Some(src) = D::values(col.values) {
        let src = &src[r0..r0 + rows];
        if stride == 1 {
            return fill_nulls(src, validity, fill, dst);
        }
        // A copy refuses nothing, so there is no row to report.
        return strided(src, validity, fill, dst, stride, pos, Some).map_err(|_| unreachable!());
    }
    let overflow_only = fails_only_by_overflow(col.dtype(), D::DTYPE, inexact);
    // Decided once here, not per value: a cast that always fits needs no check at all.
    let fits = always_fits(col.dtype(), D::DTYPE, inexact);
    each_ref!(col.values, src => {
        let src = &src[r0..r0 + rows];
        let checked = |s| cast(s, inexact);
        let written = if fits || overflow_only {
            // Unchecked (vectorised); a cast that can overflow then scans the output once.
            let w = if stride == 1 {
                strided(src, validity, fill, dst, 1, 0, lossy)
            } else {
                strided(src, validity, fill, dst, stride, pos, lossy)
            };
            if overflow_only {
                w.and_then(|()| first_overflow(src, validity, dst, stride, pos).map_or(Ok(()), Err))
            } else {
                w
            }
        } else if stride == 1 {
            strided(src, validity, fill, dst, 1, 0, checked)
        } else {
            strided(src, validity, fill, dst, stride, pos, checked)
        };
        written.map_err(|r| refused::<_, D>(src[r], r0 + r, col, j))
    })
}

/// `s` as `D` like Rust's `as`; never refuses (see [`first_overflow`] for the check after it).
#[inline(always)]
fn lossy<S: Element, D: Element>(s: S) -> Option<D> {
    Some(D::from_num_lossy(s.to_num()))
}

/// The first valid row whose finite value became an infinity in `dst` (every `stride`-th
/// element from `pos`), after an unchecked cast into a float type. A fill that is itself
/// infinite, in a null slot, is no overflow.
fn first_overflow<S: Element, D: Element>(
    src: &[S],
    validity: Option<BitSlice>,
    dst: &[D],
    stride: usize,
    pos: usize,
) -> Option<usize> {
    let out = || dst[pos..].iter().step_by(stride).take(src.len());
    // Branch-free first: an output without infinities had no overflow.
    if !out().fold(false, |any, &d| any | is_infinite(d)) {
        return None;
    }
    out()
        .zip(src)
        .enumerate()
        .position(|(r, (&d, &s))| is_infinite(d) && !is_infinite(s) && validity.is_none_or(|v| v.get(r)))
}

/// The error for a value of column `j` (at `row`) that does not fit `D`: out of its range, or
/// an integer within its range that it cannot hold exactly.
fn refused<S: Element, D: Element>(value: S, row: usize, col: &Column, j: usize) -> Error {
    // Debug, not Display: 1e300 as "1e300", not as 301 digits.
    let (value_text, place, target) = (
        format!("{value:?}"),
        Place::Cell { row: (col.first_row + row) as u64, column: col.label(j), rows: Rows::Source },
        D::DTYPE.to_string(),
    );
    if D::from_num(value.to_num()).is_some() {
        return Error::InexactCast { value: value_text, place, target };
    }
    Error::ValueOutOfRange { value: value_text, place, target }
}

/// Checks that every valid value of column `j` casts to `D` as [`interleave`] would cast it,
/// without writing anything. Lossless casts pass unread.
///
/// # Errors
/// [`Error::ValueOutOfRange`] for the first valid value that does not fit, placed like
/// [`interleave`]'s.
pub(crate) fn check_column<D: Typed>(j: usize, col: &Column, inexact: Inexact) -> Result<()> {
    if always_fits(col.dtype(), D::DTYPE, inexact) {
        return Ok(());
    }
    each_ref!(col.values, src => {
        let bad = match col.validity {
            None => src.iter().position(|&s| cast::<_, D>(s, inexact).is_none()),
            Some(v) => (0..src.len()).find(|&r| v.get(r) && cast::<_, D>(src[r], inexact).is_none()),
        };
        bad.map_or(Ok(()), |r| Err(refused::<_, D>(src[r], r, col, j)))
    })
}

/// `dst[r * stride + pos] = conv(src[r])`, or `fill` where `validity` is 0; `Err(r)` names
/// the first valid row whose value `conv` refuses. Inlined, so a `conv` that never refuses
/// (a lossless cast) and a constant `stride` of 1 compile to a plain vectorisable loop.
#[inline(always)]
fn strided<S: Copy, D: Copy>(
    src: &[S],
    validity: Option<BitSlice>,
    fill: D,
    dst: &mut [D],
    stride: usize,
    pos: usize,
    conv: impl Fn(S) -> Option<D>,
) -> std::result::Result<(), usize> {
    match validity {
        None => {
            for (r, (row, &s)) in dst.chunks_exact_mut(stride).zip(src).enumerate() {
                row[pos] = conv(s).ok_or(r)?;
            }
        }
        Some(v) => {
            for (c, (rows, srcs)) in dst.chunks_mut(64 * stride).zip(src.chunks(64)).enumerate() {
                let w = v.word(64 * c);
                for (i, (row, &s)) in rows.chunks_exact_mut(stride).zip(srcs).enumerate() {
                    row[pos] = if w >> i & 1 == 1 { conv(s).ok_or(64 * c + i)? } else { fill };
                }
            }
        }
    }
    Ok(())
}

/// [`interleave`] into `out`, the bytes of `dtype` elements it fills (a whole buffer, or the
/// piece of one that these rows fill), with the fill whose bits [`fill_bits`](super::fill_bits)
/// gave (copies).
///
/// # Errors
/// As [`interleave`]; bool targets are refused, and bytes that are not whole aligned elements.
pub fn interleave_into(
    dtype: DType,
    cols: &[Column],
    order: Order,
    fill: Option<u64>,
    inexact: Inexact,
    out: &mut [u8],
) -> Result<()> {
    with_numeric!(dtype, D => {
        interleave(cols, order, fill.map(D::from_word), inexact, elements_mut::<D>(out)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_and_f_order_with_cast_and_fill() {
        let a = [1i32, 2, 3];
        let b = [0.5f32, 1.5, 2.5];
        let valid = [0b101u8];
        let cols = [
            Column::new(&a[..]).with_validity(Some(BitSlice::new(&valid, 0, 3).unwrap())).named("a"),
            Column::new(&b[..]),
        ];
        let mut c = [0f64; 6];
        interleave(&cols, Order::C, Some(-1.0), Inexact::Error, &mut c).unwrap();
        assert_eq!(c, [1.0, 0.5, -1.0, 1.5, 3.0, 2.5]);
        let mut f = [0f64; 6];
        interleave(&cols, Order::F, Some(-1.0), Inexact::Error, &mut f).unwrap();
        assert_eq!(f, [1.0, -1.0, 3.0, 0.5, 1.5, 2.5]);
        let e = interleave(&cols, Order::C, None::<f64>, Inexact::Error, &mut c).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("column 'a' has 1 null")), "{e}");
    }

    #[test]
    fn dense_same_type_rows_match_the_general_path_for_every_k() {
        let n = 333;
        let data: Vec<Vec<u16>> = (0..9).map(|j| (0..n).map(|i| (i * 9 + j) as u16).collect()).collect();
        for k in 1..=9 {
            let cols: Vec<Column> = data[..k].iter().map(|v| Column::new(&v[..])).collect();
            let mut out = vec![0u16; n * k];
            interleave(&cols, Order::C, None, Inexact::Error, &mut out).unwrap();
            assert!(out.iter().enumerate().all(|(at, &v)| v == data[at % k][at / k]), "k {k}");
            // A validity of all ones takes the fill path (the general one for k = 9) and must agree.
            let ones = vec![0xffu8; n.div_ceil(8)];
            let valid: Vec<Column> =
                cols.iter().map(|c| c.with_validity(Some(BitSlice::new(&ones, 0, n).unwrap()))).collect();
            let mut general = vec![0u16; n * k];
            interleave(&valid, Order::C, None, Inexact::Error, &mut general).unwrap();
            assert_eq!(out, general, "k {k}");
        }
    }

    #[test]
    fn same_type_rows_with_nulls_take_the_fill_for_every_k_offset_and_length() {
        // Bitmaps at a bit offset of 3, lengths around the 64-row blocks, and one matrix large
        // enough for several parallel tasks.
        for n in [0usize, 1, 63, 64, 65, 333, 1 << 18] {
            let data: Vec<Vec<f32>> = (0..9).map(|j| (0..n).map(|i| (i * 9 + j) as f32).collect()).collect();
            let bits: Vec<Vec<u8>> = (0..9)
                .map(|j| (0..(n + 3).div_ceil(8)).map(|b| (b * 37 + j * 11) as u8 ^ 0x5a).collect())
                .collect();
            let valid = |j: usize, r: usize| bits[j][(r + 3) / 8] >> ((r + 3) % 8) & 1 == 1;
            for k in 1..=9 {
                let cols: Vec<Column> = (0..k)
                    .map(|j| {
                        // Every third column has no bitmap: all valid.
                        let v = (j % 3 != 2).then(|| BitSlice::new(&bits[j], 3, n).unwrap());
                        Column::new(&data[j][..]).with_validity(v)
                    })
                    .collect();
                let mut out = vec![0f32; n * k];
                interleave(&cols, Order::C, Some(-1.0), Inexact::Error, &mut out).unwrap();
                for (at, &v) in out.iter().enumerate() {
                    let (r, j) = (at / k, at % k);
                    let want = if j % 3 == 2 || valid(j, r) { data[j][r] } else { -1.0 };
                    assert_eq!(v, want, "n {n} k {k} row {r} column {j}");
                }
            }
        }
    }

    #[test]
    fn narrowing_casts_name_row_and_column() {
        let a = [1i64, 300];
        let cols = [Column::new(&a[..]).named("x")];
        let mut out = [0u8; 2];
        let e = interleave(&cols, Order::C, None, Inexact::Error, &mut out).unwrap_err();
        assert!(
            matches!(&e, Error::ValueOutOfRange { value, place, target }
            if value == "300" && place == "at row 1 of column 'x'" && target == "uint8"),
            "{e}"
        );
        let f = [0.0f64, 1.0, 2.5];
        let e = interleave(
            &[Column::new(&a[..1]), Column::new(&f[..1])],
            Order::F,
            None,
            Inexact::Error,
            &mut [0i32; 2],
        );
        assert!(e.is_ok());
        let e = interleave(
            &[Column::new(&a[..]), Column::new(&f[1..])],
            Order::F,
            None,
            Inexact::Error,
            &mut [0i32; 4],
        );
        assert!(matches!(e, Err(Error::ValueOutOfRange { place, .. }) if place == "at row 1 of column 1"));
        // A bad value under a null is not read.
        let nulls = [0b01u8];
        let masked = [Column::new(&a[..]).with_validity(Some(BitSlice::new(&nulls, 0, 2).unwrap()))];
        interleave(&masked, Order::C, Some(7u8), Inexact::Error, &mut out).unwrap();
        assert_eq!(out, [1, 7]);
    }

    #[test]
    fn float_overflow_is_found_after_the_unchecked_cast() {
        let a = [1.0f64, 2.0, 3.0];
        let b = [1.0f64, f64::INFINITY, 1e300];
        for order in [Order::C, Order::F] {
            let cols = [Column::new(&a[..]), Column::new(&b[..]).named("b")];
            let e = interleave(&cols, order, None, Inexact::Error, &mut [0f32; 6]).unwrap_err();
            assert!(
                matches!(&e, Error::ValueOutOfRange { value, place, .. } if value == "1e300" && place == "at row 2 of column 'b'"),
                "{e}"
            );
            // An infinite fill in a null slot, an infinite value, and a garbage value under a
            // null are no overflow.
            let nulls = [0b011u8];
            let masked = [
                Column::new(&a[..]),
                Column::new(&b[..]).with_validity(Some(BitSlice::new(&nulls, 0, 3).unwrap())),
            ];
            let mut out = [0f32; 6];
            interleave(&masked, order, Some(f32::NEG_INFINITY), Inexact::Error, &mut out).unwrap();
            let want = match order {
                Order::C => [1.0, 1.0, 2.0, f32::INFINITY, 3.0, f32::NEG_INFINITY],
                Order::F => [1.0, 2.0, 3.0, 1.0, f32::INFINITY, f32::NEG_INFINITY],
            };
            assert_eq!(out, want);
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let (a, b) = ([1i64, 2], [1i64]);
        let bad = [Column::new(&a[..]), Column::new(&b[..]).named("y")];
        let e = interleave(&bad, Order::C, None, Inexact::Error, &mut [0u8; 4]).unwrap_err();
        assert!(matches!(&e, Error::LengthMismatch { what, .. } if what == "column 'y'"), "{e}");
        assert!(interleave(&[Column::new(&a[..])], Order::C, None, Inexact::Error, &mut [0u8; 3]).is_err());
        let short = BitSlice::new(&[0xff], 0, 1).unwrap();
        assert!(
            interleave(
                &[Column::new(&a[..]).with_validity(Some(short))],
                Order::F,
                Some(0u8),
                Inexact::Error,
                &mut [0u8; 2]
            )
            .is_err()
        );
        interleave::<f32>(&[], Order::C, None, Inexact::Error, &mut []).unwrap();
        interleave::<f32>(&[Column::new(&[0f32; 0][..])], Order::F, None, Inexact::Error, &mut []).unwrap();
    }
}

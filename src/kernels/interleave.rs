//! Several columns -> one `(n, k)` matrix in C or F order, with the cast and the null fill
//! fused into the one pass that writes it.

use std::any::TypeId;

use half::f16;
use rayon::prelude::*;

use super::bits::BitSlice;
use super::cast::Element;
use super::{PARALLEL_THRESHOLD_BYTES, ROWS_PER_TASK};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Memory order of a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Row-major.
    #[default]
    C,
    /// Column-major.
    F,
}

/// The typed values of one column.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub enum ColumnRef<'a> {
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    F16(&'a [f16]),
    F32(&'a [f32]),
    F64(&'a [f64]),
}

/// One input column of [`interleave`]: values, validity, and a name for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Column<'a> {
    /// The values.
    pub values: ColumnRef<'a>,
    /// Validity (1 = valid); `None` means no nulls.
    pub validity: Option<BitSlice<'a>>,
    /// The column's name, used in errors.
    pub name: &'a str,
}

macro_rules! each_ref {
    ($r:expr, $s:ident => $body:expr) => {
        match $r {
            ColumnRef::I8($s) => $body,
            ColumnRef::I16($s) => $body,
            ColumnRef::I32($s) => $body,
            ColumnRef::I64($s) => $body,
            ColumnRef::U8($s) => $body,
            ColumnRef::U16($s) => $body,
            ColumnRef::U32($s) => $body,
            ColumnRef::U64($s) => $body,
            ColumnRef::F16($s) => $body,
            ColumnRef::F32($s) => $body,
            ColumnRef::F64($s) => $body,
        }
    };
}

impl<'a> Column<'a> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        each_ref!(self.values, s => s.len())
    }
    /// True when the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values' dtype.
    pub fn dtype(&self) -> DType {
        each_ref!(self.values, s => element_dtype(s))
    }
    /// Rows `start..start + len`.
    pub fn slice(&self, start: usize, len: usize) -> Column<'a> {
        let values = match self.values {
            ColumnRef::I8(s) => ColumnRef::I8(&s[start..start + len]),
            ColumnRef::I16(s) => ColumnRef::I16(&s[start..start + len]),
            ColumnRef::I32(s) => ColumnRef::I32(&s[start..start + len]),
            ColumnRef::I64(s) => ColumnRef::I64(&s[start..start + len]),
            ColumnRef::U8(s) => ColumnRef::U8(&s[start..start + len]),
            ColumnRef::U16(s) => ColumnRef::U16(&s[start..start + len]),
            ColumnRef::U32(s) => ColumnRef::U32(&s[start..start + len]),
            ColumnRef::U64(s) => ColumnRef::U64(&s[start..start + len]),
            ColumnRef::F16(s) => ColumnRef::F16(&s[start..start + len]),
            ColumnRef::F32(s) => ColumnRef::F32(&s[start..start + len]),
            ColumnRef::F64(s) => ColumnRef::F64(&s[start..start + len]),
        };
        Column { values, validity: self.validity.map(|v| v.slice(start, len)), name: self.name }
    }
}

fn element_dtype<S: Element>(_: &[S]) -> DType {
    S::DTYPE
}

/// Writes `cols` as the columns of `out` (`n` rows, `k = cols.len()`), in `order`, casting each
/// value to `D` and writing `fill` for nulls, in one pass (copies).
///
/// # Errors
/// [`Error::LengthMismatch`] for columns of different lengths or a wrong `out` size,
/// [`Error::ValueOutOfRange`] for a value that does not fit `D` (named by row and column),
/// [`Error::InvalidArgument`] for nulls without a fill value.
pub fn interleave<D: Element>(cols: &[Column], order: Order, fill: Option<D>, out: &mut [D]) -> Result<()> {
    let k = cols.len();
    let n = cols.first().map_or(0, Column::len);
    for c in cols {
        if c.len() != n {
            return Err(Error::LengthMismatch {
                what: format!("column '{}'", c.name),
                expected: n,
                found: c.len(),
            });
        }
    }
    if out.len() != n * k {
        return Err(Error::LengthMismatch {
            what: "the output matrix".into(),
            expected: n * k,
            found: out.len(),
        });
    }
    if k == 0 || n == 0 {
        return Ok(());
    }
    let parallel = std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES;
    if order == Order::C && try_same_type(cols, out, parallel) {
        return Ok(());
    }
    match order {
        Order::F => {
            let job = |(j, dst): (usize, &mut [D])| write_column(&cols[j], fill, dst, 1, 0, 0);
            if parallel {
                out.par_chunks_mut(n).enumerate().try_for_each(job)
            } else {
                out.chunks_mut(n).enumerate().try_for_each(job)
            }
        }
        Order::C => {
            // Tiles of rows keep the output block in cache while each column is written;
            // parallel tasks take bigger tiles.
            let rows = if parallel { (ROWS_PER_TASK / k).max(64) } else { 1024 };
            let job = |(b, dst): (usize, &mut [D])| {
                let start = b * rows;
                let len = dst.len() / k;
                cols.iter()
                    .enumerate()
                    .try_for_each(|(j, c)| write_column(&c.slice(start, len), fill, dst, k, j, start))
            };
            if parallel {
                out.par_chunks_mut(rows * k).enumerate().try_for_each(job)
            } else {
                out.chunks_mut(rows * k).enumerate().try_for_each(job)
            }
        }
    }
}

/// The common fast case: every column already has type `D` and no nulls, and `k <= 8`.
/// Writes whole rows at a time so the compiler can turn the strided stores into shuffles and
/// wide stores. Returns false (having written nothing) when the case does not apply.
fn try_same_type<D: Element>(cols: &[Column], out: &mut [D], parallel: bool) -> bool {
    let mut typed: Vec<&[D]> = Vec::with_capacity(cols.len());
    for c in cols {
        if c.validity.is_some() || c.dtype() != D::DTYPE {
            return false;
        }
        each_ref!(c.values, s => {
            // SAFETY: the dtype equals D's (checked above), so the element types are the same.
            typed.push(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<D>(), s.len()) })
        });
    }
    macro_rules! rows {
        ($k:literal) => {{
            let cols: [&[D]; $k] = typed[..].try_into().expect("k columns");
            let block = (ROWS_PER_TASK / $k).max(64);
            let job = |(b, dst): (usize, &mut [D])| rows_k::<$k, D>(&cols, b * block, dst);
            if parallel {
                out.par_chunks_mut(block * $k).enumerate().for_each(job);
            } else {
                out.chunks_mut(block * $k).enumerate().for_each(job);
            }
            true
        }};
    }
    match typed.len() {
        1 => rows!(1),
        2 => rows!(2),
        3 => rows!(3),
        4 => rows!(4),
        5 => rows!(5),
        6 => rows!(6),
        7 => rows!(7),
        8 => rows!(8),
        _ => false,
    }
}

fn rows_k<const K: usize, D: Copy>(cols: &[&[D]; K], start: usize, dst: &mut [D]) {
    let n = dst.len() / K;
    let cols: [&[D]; K] = std::array::from_fn(|j| &cols[j][start..start + n]);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { rows_k_avx2::<K, D>(&cols, dst) };
        return;
    }
    rows_k_plain::<K, D>(&cols, dst);
}

#[inline(always)]
fn rows_k_plain<const K: usize, D: Copy>(cols: &[&[D]; K], dst: &mut [D]) {
    for (r, row) in dst.chunks_exact_mut(K).enumerate() {
        for j in 0..K {
            row[j] = cols[j][r];
        }
    }
}

/// [`rows_k_plain`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_k_avx2<const K: usize, D: Copy>(cols: &[&[D]; K], dst: &mut [D]) {
    rows_k_plain::<K, D>(cols, dst)
}

/// Writes one column into every `stride`-th element of `dst` starting at `j`.
fn write_column<D: Element>(
    col: &Column,
    fill: Option<D>,
    dst: &mut [D],
    stride: usize,
    j: usize,
    row0: usize,
) -> Result<()> {
    each_ref!(col.values, s => write_typed(s, col, fill, dst, stride, j, row0))
}

#[inline]
fn write_typed<S: Element, D: Element>(
    src: &[S],
    col: &Column,
    fill: Option<D>,
    dst: &mut [D],
    stride: usize,
    j: usize,
    row0: usize,
) -> Result<()> {
    let same = TypeId::of::<S>() == TypeId::of::<D>();
    let bad = |r: usize, s: S| Error::ValueOutOfRange {
        value: s.to_string(),
        place: format!("at row {} of column '{}'", row0 + r, col.name),
        target: D::DTYPE.to_string(),
    };
    let conv = |r: usize, s: S| -> Result<D> {
        if same {
            // SAFETY: S and D are the same type (checked by TypeId).
            Ok(unsafe { std::mem::transmute_copy::<S, D>(&s) })
        } else {
            D::cast_from(s).ok_or_else(|| bad(r, s))
        }
    };
    match col.validity {
        Some(validity) if same && stride == 1 && fill.is_some() => {
            // One contiguous column of the target type: the tuned null-fill kernel.
            // SAFETY: S and D are the same type (checked by TypeId).
            let src: &[D] = unsafe { std::slice::from_raw_parts(src.as_ptr().cast(), src.len()) };
            super::fill::fill_nulls(src, Some(validity), fill.unwrap_or_default(), dst)?;
        }
        None if same && stride == 1 => {
            // SAFETY: S and D are the same type, so the slices have the same layout.
            let src: &[D] = unsafe { std::slice::from_raw_parts(src.as_ptr().cast(), src.len()) };
            dst.copy_from_slice(src);
        }
        None if same => {
            // SAFETY: as above.
            let src: &[D] = unsafe { std::slice::from_raw_parts(src.as_ptr().cast(), src.len()) };
            for (row, &s) in dst.chunks_exact_mut(stride).zip(src) {
                row[j] = s;
            }
        }
        None => {
            for (r, (row, &s)) in dst.chunks_exact_mut(stride).zip(src).enumerate() {
                row[j] = conv(r, s)?;
            }
        }
        Some(validity) => {
            for (c, (rows, srcs)) in dst.chunks_mut(64 * stride).zip(src.chunks(64)).enumerate() {
                let w = validity.word(c * 64);
                for (i, (row, &s)) in rows.chunks_exact_mut(stride).zip(srcs).enumerate() {
                    row[j] = if w >> i & 1 == 1 {
                        conv(c * 64 + i, s)?
                    } else {
                        fill.ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "column '{}' has nulls and no fill value was given",
                                col.name
                            ))
                        })?
                    };
                }
            }
        }
    }
    Ok(())
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
            Column {
                values: ColumnRef::I32(&a),
                validity: Some(BitSlice::new(&valid, 0, 3).unwrap()),
                name: "a",
            },
            Column { values: ColumnRef::F32(&b), validity: None, name: "b" },
        ];
        let mut c = [0f64; 6];
        interleave(&cols, Order::C, Some(-1.0), &mut c).unwrap();
        assert_eq!(c, [1.0, 0.5, -1.0, 1.5, 3.0, 2.5]);
        let mut f = [0f64; 6];
        interleave(&cols, Order::F, Some(-1.0), &mut f).unwrap();
        assert_eq!(f, [1.0, -1.0, 3.0, 0.5, 1.5, 2.5]);
        assert!(interleave(&cols, Order::C, None::<f64>, &mut c).unwrap_err().to_string().contains("'a'"));
    }

    #[test]
    fn the_portable_row_path_matches_the_dispatched_one() {
        let cols: Vec<Vec<u16>> = (0..5).map(|j| (0..333).map(|i| (i * 5 + j) as u16).collect()).collect();
        let refs: [&[u16]; 5] = std::array::from_fn(|j| cols[j].as_slice());
        let mut plain = vec![0u16; 333 * 5];
        rows_k_plain::<5, u16>(&refs, &mut plain);
        let mut dispatched = vec![0u16; 333 * 5];
        rows_k::<5, u16>(&refs, 0, &mut dispatched);
        assert_eq!(plain, dispatched);
        assert_eq!(&plain[..6], &[0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn narrowing_casts_name_row_and_column() {
        let a = [1i64, 300];
        let cols = [Column { values: ColumnRef::I64(&a), validity: None, name: "x" }];
        let mut out = [0u8; 2];
        let e = interleave(&cols, Order::C, None, &mut out).unwrap_err().to_string();
        assert!(e.contains("300") && e.contains("row 1") && e.contains("'x'"), "{e}");
        let short = [1i64];
        let bad = [cols[0], Column { values: ColumnRef::I64(&short), validity: None, name: "y" }];
        assert!(interleave(&bad, Order::C, None, &mut [0u8; 4]).is_err());
    }
}

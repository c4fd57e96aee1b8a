//! Rows picked by index from several columns (each in chunks) into one `(n, k)` C-order
//! matrix: the gather of a shuffled batch and its interleave in one pass.

use super::column::{Column, Typed};
use crate::error::{Error, Result};

/// Writes row `rows[i]` of the columns as row `to[i]` of `out`, in C order (copies). The rows
/// count through the chunks (`chunks[c][j]` is chunk `c` of column `j`: every column is cut
/// into the same chunks) and must be increasing, so the columns are read forward; `to` must be
/// a permutation of `0..rows.len()`, so every row of `out` is written once. The columns must be
/// of type `D` with no nulls: no cast, no fill.
///
/// # Errors
/// - [`Error::LengthMismatch`] when `out` is not `rows.len() * k` long, `to` is not as long as
///   `rows`, or a chunk's columns differ in length;
/// - [`Error::InvalidArgument`] for a column that is not of type `D` or has nulls, rows that
///   do not increase or pass the end, or a `to` that is not a permutation.
///
/// Everything is checked before anything is written.
pub fn take_rows<D: Typed>(chunks: &[Vec<Column>], rows: &[u32], to: &[u32], out: &mut [D]) -> Result<()> {
    let k = chunks.first().map_or(0, Vec::len);
    let mut total = 0usize;
    let typed = chunks
        .iter()
        .map(|cols| {
            let len = cols.first().map_or(0, Column::len);
            total += len;
            cols.iter()
                .enumerate()
                .map(|(j, c)| {
                    if c.len() != len || cols.len() != k {
                        return Err(Error::LengthMismatch {
                            what: format!("column {} of a chunk", c.label(j)),
                            expected: len,
                            found: c.len(),
                        });
                    }
                    match (D::values(c.values), c.validity) {
                        (Some(v), None) => Ok(v),
                        _ => Err(Error::InvalidArgument(format!(
                            "column {} is not {} without nulls, which a plain gather needs",
                            c.label(j),
                            D::DTYPE
                        ))),
                    }
                })
                .collect::<Result<Vec<&[D]>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let n = rows.len();
    if to.len() != n || out.len() != n.saturating_mul(k) {
        return Err(Error::LengthMismatch {
            what: "the output rows of a gather".into(),
            expected: n * k,
            found: if to.len() != n { to.len() * k } else { out.len() },
        });
    }
    if rows.windows(2).any(|w| w[0] >= w[1]) || rows.last().is_some_and(|&r| r as usize >= total) {
        return Err(Error::InvalidArgument(format!(
            "the rows of a gather must increase and stay below {total}"
        )));
    }
    let mut seen = vec![false; n];
    for &t in to {
        match seen.get_mut(t as usize) {
            Some(s) if !*s => *s = true,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "output row {t} is outside 0..{n} or given twice"
                )));
            }
        }
    }
    if k == 0 {
        return Ok(());
    }
    let lens: Vec<usize> = typed.iter().map(|cols| cols[0].len()).collect();
    for ((c, r), &t) in chunk_rows(&lens, rows).zip(to) {
        let row = &mut out[t as usize * k..(t as usize + 1) * k];
        for (o, col) in row.iter_mut().zip(&typed[c]) {
            *o = col[r];
        }
    }
    Ok(())
}

/// `(chunk, row within it)` of each of `rows`, which increase and count through chunks of
/// `lens` rows, found by walking the chunks forward as the rows grow (no search).
///
/// # Panics
/// On a row past the last chunk: callers check `rows` against the chunks' total first.
pub fn chunk_rows<'a>(lens: &'a [usize], rows: &'a [u32]) -> impl Iterator<Item = (usize, usize)> + 'a {
    let (mut c, mut start) = (0usize, 0usize);
    rows.iter().map(move |&r| {
        let r = r as usize;
        while r >= start + lens[c] {
            start += lens[c];
            c += 1;
        }
        (c, r - start)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ColumnRef;

    #[test]
    fn rows_are_read_forward_and_written_where_told() {
        let (a0, b0): (&[i32], &[i32]) = (&[1, 2, 3], &[10, 20, 30]);
        let (a1, b1): (&[i32], &[i32]) = (&[4, 5], &[40, 50]);
        let chunk = |a: &'static [i32], b: &'static [i32]| {
            vec![Column::new(ColumnRef::Int32(a)), Column::new(ColumnRef::Int32(b))]
        };
        let chunks = vec![chunk(a0, b0), chunk(a1, b1)];
        let mut out = vec![0i32; 6];
        take_rows(&chunks, &[0, 2, 4], &[1, 2, 0], &mut out).unwrap();
        assert_eq!(out, [5, 50, 1, 10, 3, 30]);
        let e = take_rows(&chunks, &[0, 2, 5], &[1, 2, 0], &mut out).unwrap_err();
        assert!(e.to_string().contains("stay below 5"), "{e}");
        let e = take_rows(&chunks, &[2, 0, 4], &[1, 2, 0], &mut out).unwrap_err();
        assert!(e.to_string().contains("must increase"), "{e}");
        let e = take_rows(&chunks, &[0, 2, 4], &[1, 1, 0], &mut out).unwrap_err();
        assert!(e.to_string().contains("output row 1"), "{e}");
        let mut wrong = vec![0f32; 6];
        let e = take_rows(&chunks, &[0, 2, 4], &[1, 2, 0], &mut wrong).unwrap_err();
        assert!(e.to_string().contains("is not float32"), "{e}");
        assert_eq!(out, [5, 50, 1, 10, 3, 30], "nothing written on an error");
        assert_eq!(
            chunk_rows(&[3, 0, 2], &[0, 2, 3, 4]).collect::<Vec<_>>(),
            [(0, 0), (0, 2), (2, 0), (2, 1)]
        );
    }
}

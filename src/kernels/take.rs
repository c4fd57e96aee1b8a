//! Rows picked by index from several columns (each in chunks) into one `(n, k)` C-order
//! matrix: the gather of a shuffled batch and its interleave in one pass.

use rayon::prelude::*;

use super::column::{Column, Typed};
use super::{PARALLEL_THRESHOLD_BYTES, ROWS_PER_TASK};
use crate::error::{Error, Result};

/// Writes row `rows[i]` (a `(chunk, row)` pair) of the columns as row `i` of `out`, in C order
/// (copies). `chunks[c][j]` is chunk `c` of column `j`: every column is cut into the same
/// chunks. The columns must be of type `D` with no nulls; no cast, no fill. Parallel over row
/// blocks for large outputs.
///
/// # Errors
/// - [`Error::LengthMismatch`] when `out` is not `rows.len() * k` long or a chunk's columns
///   differ in length;
/// - [`Error::InvalidArgument`] for a column that is not of type `D` or has nulls, or a pair
///   outside the chunks.
///
/// Everything is checked before anything is written.
pub fn take_rows<D: Typed>(chunks: &[Vec<Column>], rows: &[(u32, u32)], out: &mut [D]) -> Result<()> {
    let k = chunks.first().map_or(0, Vec::len);
    let typed = chunks
        .iter()
        .map(|cols| {
            let len = cols.first().map_or(0, Column::len);
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
    if out.len() != rows.len().saturating_mul(k) {
        return Err(Error::LengthMismatch {
            what: "the output matrix".into(),
            expected: rows.len() * k,
            found: out.len(),
        });
    }
    if let Some(&(c, r)) = rows.iter().find(|&&(c, r)| {
        typed.get(c as usize).is_none_or(|t| t.first().is_some_and(|v| v.len() <= r as usize))
    }) {
        return Err(Error::InvalidArgument(format!(
            "row {r} of chunk {c} is outside the {} chunks",
            typed.len()
        )));
    }
    if k == 0 {
        return Ok(());
    }
    let write = |(block, dst): (usize, &mut [D])| {
        let first = block * ROWS_PER_TASK;
        for (i, row) in dst.chunks_exact_mut(k).enumerate() {
            let (c, r) = rows[first + i];
            let cols = &typed[c as usize];
            for (o, col) in row.iter_mut().zip(cols) {
                *o = col[r as usize];
            }
        }
    };
    if std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES {
        super::pool::install(|| out.par_chunks_mut(ROWS_PER_TASK * k).enumerate().for_each(write));
    } else {
        out.chunks_mut(ROWS_PER_TASK * k).enumerate().for_each(write);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ColumnRef;

    #[test]
    fn rows_are_taken_from_any_chunk_in_any_order() {
        let (a0, b0) = ([1i32, 2, 3], [10i32, 20, 30]);
        let (a1, b1) = ([4i32, 5], [40i32, 50]);
        let chunk = |a: &'static [i32], b: &'static [i32]| {
            vec![Column::new(ColumnRef::I32(a)), Column::new(ColumnRef::I32(b))]
        };
        let chunks = vec![
            chunk(Box::leak(Box::new(a0)), Box::leak(Box::new(b0))),
            chunk(Box::leak(Box::new(a1)), Box::leak(Box::new(b1))),
        ];
        let mut out = vec![0i32; 6];
        take_rows(&chunks, &[(1, 1), (0, 0), (0, 2)], &mut out).unwrap();
        assert_eq!(out, [5, 50, 1, 10, 3, 30]);
        let e = take_rows(&chunks, &[(1, 2), (0, 0), (0, 2)], &mut out).unwrap_err();
        assert!(e.to_string().contains("row 2 of chunk 1"), "{e}");
        let e = take_rows(&chunks, &[(2, 0), (0, 0), (0, 2)], &mut out).unwrap_err();
        assert!(e.to_string().contains("chunk 2"), "{e}");
        let mut wrong = vec![0f32; 6];
        let e = take_rows(&chunks, &[(0, 0), (0, 0), (0, 2)], &mut wrong).unwrap_err();
        assert!(e.to_string().contains("is not float32"), "{e}");
        assert_eq!(out, [5, 50, 1, 10, 3, 30], "nothing written on an error");
    }
}

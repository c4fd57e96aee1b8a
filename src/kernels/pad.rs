//! Ragged rows into a padded matrix: the one copy of `ragged="pad"`.

use rayon::prelude::*;

use super::PARALLEL_THRESHOLD_BYTES;
use crate::error::{Error, Result};

/// Writes row `i` of `out` (`width` cells of `cell` bytes each): the `lengths[i]` cells of
/// `src` that follow the rows before it (`src` holds the rows end to end), then `pad` (one
/// cell's bytes) in every slot past the row's end. Copies; large outputs are split over the
/// pool's threads.
///
/// # Errors
/// [`Error::InvalidLayout`] when `out`, `src` or `pad` do not have the sizes the lengths,
/// `width` and `cell` give, or a row is longer than `width`.
pub fn pad_rows(
    src: &[u8],
    lengths: &[usize],
    cell: usize,
    width: usize,
    pad: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let row_bytes = width * cell;
    let total: usize = lengths.iter().sum();
    if pad.len() != cell || out.len() != lengths.len() * row_bytes || src.len() != total * cell {
        return Err(Error::layout(format!(
            "padding {} rows of {width} cells of {cell} bytes: out has {} bytes, src {} for {total} cells, pad {}",
            lengths.len(),
            out.len(),
            src.len(),
            pad.len()
        )));
    }
    if let Some(row) = lengths.iter().position(|&l| l > width) {
        return Err(Error::layout(format!(
            "row {row} has {} cells, more than the width {width}",
            lengths[row]
        )));
    }
    let mut starts = Vec::with_capacity(lengths.len());
    let mut at = 0;
    for &l in lengths {
        starts.push(at * cell);
        at += l;
    }
    let write = |(dst, (&start, &len)): (&mut [u8], (&usize, &usize))| {
        let (head, tail) = dst.split_at_mut(len * cell);
        head.copy_from_slice(&src[start..start + len * cell]);
        for slot in tail.chunks_exact_mut(cell.max(1)) {
            slot.copy_from_slice(pad);
        }
    };
    if row_bytes == 0 {
        return Ok(());
    }
    if out.len() >= PARALLEL_THRESHOLD_BYTES {
        super::pool::install(|| {
            out.par_chunks_mut(row_bytes).zip(starts.par_iter().zip(lengths.par_iter())).for_each(write)
        });
    } else {
        out.chunks_mut(row_bytes).zip(starts.iter().zip(lengths)).for_each(write);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_copied_to_the_left_and_padded_to_the_width() {
        let src: Vec<u8> = vec![1, 2, 3, 4, 5, 6];
        let mut out = vec![0u8; 3 * 4];
        pad_rows(&src, &[2, 0, 4], 1, 4, &[9], &mut out).unwrap();
        assert_eq!(out, [1, 2, 9, 9, 9, 9, 9, 9, 3, 4, 5, 6]);
        // Two-byte cells.
        let src: Vec<u8> = vec![1, 0, 2, 0, 3, 0];
        let mut out = vec![0u8; 2 * 2 * 2];
        pad_rows(&src, &[1, 2], 2, 2, &[7, 7], &mut out).unwrap();
        assert_eq!(out, [1, 0, 7, 7, 2, 0, 3, 0]);
    }

    #[test]
    fn the_parallel_split_writes_what_one_thread_writes() {
        let lengths: Vec<usize> = (0..300_000).map(|i| i % 17).collect();
        let mut par = vec![0u8; lengths.len() * 16];
        let kept: Vec<usize> = lengths.iter().map(|&l| l.min(16)).collect();
        let src: Vec<u8> = (0..kept.iter().sum::<usize>()).map(|i| (i % 251) as u8).collect();
        pad_rows(&src, &kept, 1, 16, &[255], &mut par).unwrap();
        let mut one = vec![0u8; par.len()];
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        pool.install(|| pad_rows(&src, &kept, 1, 16, &[255], &mut one)).unwrap();
        assert_eq!(par, one);
        let mut row1 = [255u8; 16];
        row1[0] = 0;
        assert_eq!(&par[16..32], &row1);
        // Row 16 is full: the 16 cells after rows 1..=15 (120 of them).
        assert_eq!(&par[16 * 16..17 * 16], &(120..136).map(|i| i as u8).collect::<Vec<_>>()[..]);
        assert_eq!(&par[..16], &[255; 16]);
    }

    #[test]
    fn sizes_that_do_not_add_up_are_refused() {
        let mut out = vec![0u8; 4];
        assert!(pad_rows(&[1, 2, 3], &[3], 1, 2, &[0], &mut out).is_err());
        assert!(pad_rows(&[1], &[1], 1, 4, &[0, 0], &mut out).is_err());
        assert!(pad_rows(&[1], &[2], 1, 4, &[0], &mut out).is_err());
    }
}

//! Strided tensors (negative and zero strides too) gathered into one contiguous C-order
//! buffer.
//!
//! Dimensions of size 1 are dropped and dimensions that are contiguous with each other are
//! merged first, so a sliced or broadcast tensor copies whole rows with `copy_from_slice`
//! wherever its innermost stride is 1.

use rayon::prelude::*;

use super::alloc::HostBuffer;
use super::{PARALLEL_THRESHOLD_BYTES, ROWS_PER_TASK};
use crate::decide::Cause;
use crate::error::{Error, Result};
use crate::options::Order;
use crate::tensor::{Tensor, f_strides};

/// Copies the elements of the strided view at `base` into `out` in C order (copies).
/// `strides` are in elements and may be negative or zero (broadcast); `shape` may be empty
/// (one element) or contain zeros (nothing is read). Parallel over rows for large outputs.
///
/// # Errors
/// [`Error::InvalidLayout`] when `shape` and `strides` differ in length or the element count
/// overflows; [`Error::LengthMismatch`] when `out.len()` is not the product of `shape`.
/// Nothing is read then.
///
/// # Safety
/// For every index `i` of the index space of `shape`, `base.offset(sum(i_k * strides_k))`
/// must be valid for a read of a `T`, properly aligned (the caller validated the extent), and
/// the memory must not be written while this runs.
pub unsafe fn gather_strided<T: Copy + Send + Sync>(
    base: *const T,
    shape: &[usize],
    strides: &[isize],
    out: &mut [T],
) -> Result<()> {
    if shape.len() != strides.len() {
        return Err(Error::layout(format!("{} strides for {} dimensions", strides.len(), shape.len())));
    }
    let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let numel = numel.ok_or_else(|| Error::layout(format!("shape {shape:?} overflows")))?;
    if out.len() != numel {
        return Err(Error::LengthMismatch {
            what: format!("the output of shape {shape:?}"),
            expected: numel,
            found: out.len(),
        });
    }
    if numel == 0 {
        return Ok(());
    }
    let dims = coalesce(shape, strides);
    let (&(len, step), outer) = dims.split_last().unwrap_or((&(1, 0), &[]));
    if transposes(outer, len, step, numel / len, size_of::<T>()) {
        // SAFETY: as for the rows below; the caller's promise covers every element.
        unsafe { gather_tiled(base, outer, len, step, out) };
        return Ok(());
    }
    let src = Source(base);
    let rows = |first: usize, dst: &mut [T]| {
        // SAFETY: `dst` is whole rows (out.len() = rows * len, split in multiples of len), so
        // rows first..first + dst.len() / len exist in the index space, all of whose elements
        // the caller promised readable.
        unsafe { gather_rows(src.get(), outer, len, step, first, dst) }
    };
    if std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES {
        let per_task = (ROWS_PER_TASK / len).max(1);
        super::pool::install(|| {
            out.par_chunks_mut(per_task * len).enumerate().for_each(|(t, dst)| rows(t * per_task, dst))
        });
    } else {
        rows(0, out);
    }
    Ok(())
}

/// The source pointer, shared read-only between the threads of one gather.
#[derive(Clone, Copy)]
struct Source<T>(*const T);
// SAFETY: the gather only reads through the pointer, the caller promises nobody writes the
// memory meanwhile, and T: Sync makes shared reads from several threads sound.
unsafe impl<T: Sync> Send for Source<T> {}
// SAFETY: as for Send.
unsafe impl<T: Sync> Sync for Source<T> {}
impl<T> Source<T> {
    /// A method, so closures capture the whole (Send) wrapper and not the raw field.
    fn get(self) -> *const T {
        self.0
    }
}

/// `(size, stride)` pairs with size-1 dimensions dropped and each dimension merged into the
/// one outside it when the outer stride is `size * stride` of the inner (so they walk memory
/// as one dimension). Empty for a single element.
fn coalesce(shape: &[usize], strides: &[isize]) -> Vec<(usize, isize)> {
    let mut dims: Vec<(usize, isize)> = Vec::with_capacity(shape.len());
    for (&size, &stride) in shape.iter().zip(strides).filter(|(d, _)| **d != 1) {
        match dims.last_mut() {
            Some(last) if last.1 == stride.wrapping_mul(size as isize) => *last = (last.0 * size, stride),
            _ => dims.push((size, stride)),
        }
    }
    dims
}

/// Bytes of source a tile of [`gather_tiled`] spans: its rows' elements stay in the core's
/// cache while every output row takes its run from them.
const TILE_BYTES: usize = 256 * 1024;
/// The most output rows a tiled gather walks (it keeps one offset per row).
const MAX_TILED_ROWS: usize = 1 << 16;

/// The elements per tile of [`gather_tiled`] for a row stride of `step` elements of `item` bytes.
fn tile(step: isize, item: usize) -> usize {
    (TILE_BYTES / (step.unsigned_abs() * item).max(1)).max(64)
}

/// Whether a gather is a transpose worth tiling: the innermost dimension is strided (not
/// contiguous, not broadcast) by more than some outer dimension, so that rows read the same
/// cache lines, and long enough for two tiles, under a bounded number of rows. A plain strided
/// slice (`x[:, ::2]`), whose rows share nothing, is not.
fn transposes(outer: &[(usize, isize)], len: usize, step: isize, rows: usize, item: usize) -> bool {
    let shares_lines = outer.iter().any(|&(_, stride)| stride.unsigned_abs() < step.unsigned_abs());
    step != 1
        && step != 0
        && shares_lines
        && rows > 1
        && rows <= MAX_TILED_ROWS
        && len >= 2 * tile(step, item)
}

/// The multi-index of row `first` over the outer dimensions, and its element offset.
fn row_start(outer: &[(usize, isize)], first: usize) -> (Vec<usize>, isize) {
    let mut index = vec![0usize; outer.len()];
    let mut offset = 0isize;
    let mut rest = first;
    for (k, &(size, stride)) in outer.iter().enumerate().rev() {
        index[k] = rest % size;
        offset += index[k] as isize * stride;
        rest /= size;
    }
    (index, offset)
}

/// The output pointer, shared between the tasks of one tiled gather, which write disjoint
/// elements.
#[derive(Clone, Copy)]
struct Dest<T>(*mut T);
// SAFETY: each task of `gather_tiled` writes only the elements of its own tile in every row,
// so no element is written by two threads, and T: Send lets the values cross threads.
unsafe impl<T: Send> Send for Dest<T> {}
// SAFETY: as for Send: shared only to hand each task its own disjoint elements.
unsafe impl<T: Send> Sync for Dest<T> {}
impl<T> Dest<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

/// A transposing gather (the innermost dimension strided, as in an F-order copy): the
/// innermost dimension is cut into tiles, and each tile is written for every row before the
/// next, so the source elements a tile reads are loaded once and not once per row. Tiles run
/// in parallel for large outputs.
///
/// # Safety
/// As [`gather_rows`], for every row of `out` (`out.len()` a multiple of `len`).
unsafe fn gather_tiled<T: Copy + Send + Sync>(
    base: *const T,
    outer: &[(usize, isize)],
    len: usize,
    step: isize,
    out: &mut [T],
) {
    let rows = out.len() / len;
    let offsets: Vec<isize> = (0..rows).map(|r| row_start(outer, r).1).collect();
    let per_tile = tile(step, size_of::<T>());
    let (src, dst) = (Source(base), Dest(out.as_mut_ptr()));
    let write = |t: usize| {
        let columns = t * per_tile..((t + 1) * per_tile).min(len);
        for (r, &offset) in offsets.iter().enumerate() {
            for j in columns.clone() {
                // SAFETY: row r's element j is in the index space, so the caller promised it
                // readable; r * len + j < rows * len = out.len(), and only this tile writes
                // columns `columns` of any row.
                unsafe { *dst.get().add(r * len + j) = *src.get().offset(offset + j as isize * step) };
            }
        }
    };
    let tiles = len.div_ceil(per_tile);
    if std::mem::size_of_val(out) >= PARALLEL_THRESHOLD_BYTES {
        super::pool::install(|| (0..tiles).into_par_iter().for_each(write));
    } else {
        (0..tiles).for_each(write);
    }
}

/// Writes rows `first..` (each `len` elements along `step`) of the index space into `out`,
/// walking the outer dimensions with an odometer.
///
/// # Safety
/// As [`gather_strided`], for the dimensions `outer` + `(len, step)` after [`coalesce`].
unsafe fn gather_rows<T: Copy>(
    base: *const T,
    outer: &[(usize, isize)],
    len: usize,
    step: isize,
    first: usize,
    out: &mut [T],
) {
    let (mut index, mut offset) = row_start(outer, first);
    for dst in out.chunks_exact_mut(len) {
        // SAFETY: `offset` is the offset of element 0 of an in-bounds row; the row's other
        // elements are at offset + i * step for i < len, all inside the validated extent.
        unsafe {
            let row = base.offset(offset);
            match step {
                1 => dst.copy_from_slice(std::slice::from_raw_parts(row, len)),
                0 => dst.fill(*row),
                _ => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = *row.offset(i as isize * step);
                    }
                }
            }
        }
        // Next row: bump the innermost outer index, carrying into the outer ones.
        for (k, &(size, stride)) in outer.iter().enumerate().rev() {
            // Wrapping: past the last row the offset may leave the extent; it is never used.
            index[k] += 1;
            offset = offset.wrapping_add(stride);
            if index[k] < size {
                break;
            }
            offset = offset.wrapping_sub((size as isize).wrapping_mul(stride));
            index[k] = 0;
        }
    }
}

/// A fresh, writable, C-contiguous, 64-byte aligned copy of a host tensor, marked copied;
/// the logical type carries over (copies). Elements are moved as byte arrays of their size,
/// so misaligned foreign memory copies too.
///
/// # Errors
/// [`Error::CopyRequired`] for memory the CPU cannot read; layout errors as
/// [`gather_strided`].
pub fn contiguous_copy(t: &Tensor) -> Result<Tensor> {
    ordered_copy(t, Order::C)
}

/// As [`contiguous_copy`], laid out in `order`: C, or F (the first index fastest, as numpy's
/// `asfortranarray`), whose strides the copy carries (copies). An F copy is the C-order gather
/// of the tensor with its dimensions reversed.
///
/// # Errors
/// As [`contiguous_copy`].
pub fn ordered_copy(t: &Tensor, order: Order) -> Result<Tensor> {
    if !t.device().is_host_accessible() {
        return Err(Cause::OnDevice(t.device()).refused());
    }
    // The gather below writes every element, so a recycled buffer is fine.
    let mut buf = HostBuffer::for_overwrite(t.nbytes())?;
    let mut shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
    let mut strides: Vec<isize> = t.strides().iter().map(|&s| s as isize).collect();
    let out_strides = match order {
        Order::C => None,
        Order::F => {
            shape.reverse();
            strides.reverse();
            Some(f_strides(t.shape()))
        }
    };
    let out = buf.as_mut_slice();
    match t.dtype().itemsize() {
        1 => gather_bytes::<1>(t, &shape, &strides, out)?,
        2 => gather_bytes::<2>(t, &shape, &strides, out)?,
        4 => gather_bytes::<4>(t, &shape, &strides, out)?,
        8 => gather_bytes::<8>(t, &shape, &strides, out)?,
        n => return Err(Error::layout(format!("no gather for {n}-byte elements"))),
    }
    let copy = Tensor::from_buffer(buf.into_buffer(), 0, t.shape().to_vec(), out_strides, t.dtype())?;
    Ok(copy.with_copied(true).with_logical(t.logical().cloned()))
}

/// [`gather_strided`] over elements viewed as `[u8; N]` (alignment 1).
fn gather_bytes<const N: usize>(
    t: &Tensor,
    shape: &[usize],
    strides: &[isize],
    out: &mut [u8],
) -> Result<()> {
    // SAFETY: [u8; N] has alignment 1 and every bit pattern is valid, so the middle part is
    // all of `out` but a tail shorter than N (`as_chunks_mut` does this safely but is newer
    // than the crate's MSRV).
    let (head, elems, tail) = unsafe { out.align_to_mut::<[u8; N]>() };
    debug_assert!(head.is_empty() && tail.is_empty());
    // SAFETY: the tensor's layout was validated at construction, so every reachable element
    // is inside memory its owner keeps alive and host-readable (checked by the caller); like
    // every reader of a Tensor we rely on its contract that nobody writes it meanwhile; a
    // [u8; N] read needs no alignment.
    unsafe { gather_strided(t.data_ptr() as *const [u8; N], shape, strides, elems) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::device::Device;

    /// A nested-loop reference: the C-order flat index decomposed into a multi-index.
    fn reference(data: &[i32], start: isize, shape: &[usize], strides: &[isize]) -> Vec<i32> {
        let numel: usize = shape.iter().product();
        (0..numel)
            .map(|flat| {
                let (mut rem, mut off) = (flat, start);
                for (&d, &s) in shape.iter().zip(strides).rev() {
                    off += (rem % d) as isize * s;
                    rem /= d;
                }
                data[off as usize]
            })
            .collect()
    }

    fn gather(data: &[i32], start: isize, shape: &[usize], strides: &[isize]) -> Vec<i32> {
        let mut out = vec![-1; shape.iter().product()];
        // SAFETY: the tests pick views inside `data` (the reference indexes it with checks).
        unsafe { gather_strided(data.as_ptr().offset(start), shape, strides, &mut out) }.unwrap();
        out
    }

    #[test]
    fn transposes_reversals_broadcasts_and_degenerate_shapes_match_the_reference() {
        let data: Vec<i32> = (0..120).collect();
        let cases: &[(isize, &[usize], &[isize])] = &[
            (0, &[], &[]),
            (7, &[], &[]),
            (0, &[0], &[1]),
            (0, &[3, 0, 2], &[6, 2, 1]),
            (5, &[1], &[1]),
            (0, &[4, 6], &[6, 1]),
            (0, &[6, 4], &[1, 6]),
            (119, &[120], &[-1]),
            (5, &[3, 2], &[0, 1]),
            (5, &[3, 2], &[1, 0]),
            (3, &[4, 1, 5], &[20, 7, 2]),
            (100, &[2, 3, 4], &[-40, 8, -1]),
            (0, &[2, 3, 4], &[60, 20, 5]),
            (0, &[2, 3, 4, 5], &[60, 20, 5, 1]),
            (59, &[2, 3, 4, 5], &[60, -20, -5, -1]),
            (0, &[5, 1, 1, 4], &[0, 3, 9, 1]),
        ];
        for &(start, shape, strides) in cases {
            assert_eq!(
                gather(&data, start, shape, strides),
                reference(&data, start, shape, strides),
                "{shape:?} {strides:?}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let data = [1i32; 4];
        let mut out = [0i32; 3];
        // SAFETY: every call is refused before reading.
        unsafe {
            assert!(gather_strided(data.as_ptr(), &[2, 2], &[2, 1], &mut out).is_err());
            assert!(gather_strided(data.as_ptr(), &[3], &[], &mut out).is_err());
            assert!(gather_strided(data.as_ptr(), &[usize::MAX, 3], &[0, 0], &mut out).is_err());
        }
    }

    #[test]
    fn coalescing_merges_contiguous_dimensions() {
        assert_eq!(coalesce(&[2, 3, 4], &[12, 4, 1]), vec![(24, 1)]);
        assert_eq!(coalesce(&[2, 1, 4], &[8, 99, 1]), vec![(2, 8), (4, 1)]);
        assert_eq!(coalesce(&[1, 1], &[5, 5]), vec![]);
        assert_eq!(coalesce(&[3, 4], &[0, 0]), vec![(12, 0)]);
    }

    fn view(t: &Tensor, offset: isize, shape: Vec<i64>, strides: Vec<i64>) -> Tensor {
        // SAFETY: the tests pick views inside the 24-element allocation.
        unsafe {
            Tensor::from_raw_parts(
                (t.data_ptr() as *mut i32).offset(offset) as *mut u8,
                shape,
                Some(strides),
                DType::Int32,
                Device::Cpu,
                true,
                t.owner().clone(),
            )
        }
        .unwrap()
    }

    #[test]
    fn contiguous_copies_are_fresh_writable_and_c_ordered() {
        let base = Tensor::from_vec((0..24).collect::<Vec<i32>>(), vec![4, 6]).unwrap();
        let c = contiguous_copy(&view(&base, 0, vec![6, 4], vec![1, 6])).unwrap();
        assert!(c.copied() && !c.readonly() && c.is_c_contiguous());
        assert_eq!(&c.as_slice::<i32>().unwrap()[..5], &[0, 6, 12, 18, 1]);
        let s = contiguous_copy(&view(&base, 7, vec![], vec![])).unwrap();
        assert_eq!(s.as_slice::<i32>().unwrap(), &[7]);
        assert_eq!(contiguous_copy(&view(&base, 0, vec![0, 3], vec![3, 1])).unwrap().numel(), 0);
    }

    #[test]
    fn tiled_transposes_match_the_reference() {
        let data: Vec<i32> = (0..400_000).collect();
        let cases: &[(isize, &[usize], &[isize])] = &[
            // The F copy of a (100000, 3) C matrix, and of (25000, 3, 4) cells.
            (0, &[3, 100_000], &[1, 3]),
            (0, &[4, 3, 25_000], &[1, 4, 12]),
            // Reversed rows, an offset start, a ragged last tile.
            (399_999, &[2, 199_999], &[-1, -2]),
            (5, &[7, 50_000], &[1, 7]),
        ];
        for &(start, shape, strides) in cases {
            let rows: usize = shape[..shape.len() - 1].iter().product();
            let dims = coalesce(shape, strides);
            let (&(len, step), outer) = dims.split_last().unwrap();
            assert!(transposes(outer, len, step, rows, 4), "{shape:?} {strides:?} takes the tiled path");
            assert_eq!(
                gather(&data, start, shape, strides),
                reference(&data, start, shape, strides),
                "{shape:?}"
            );
        }
        // A strided slice whose rows share no cache lines keeps the row path.
        assert!(!transposes(&[(100, 100_000)], 50_000, 2, 100, 4));
        // A 4 MB transpose runs its tiles in parallel.
        let big: Vec<i32> = (0..1 << 20).collect();
        let got = gather(&big, 0, &[16, 1 << 16], &[1, 16]);
        assert_eq!(got, reference(&big, 0, &[16, 1 << 16], &[1, 16]));
    }

    #[test]
    fn f_copies_put_the_first_index_fastest() {
        let base = Tensor::from_vec((0..24).collect::<Vec<i32>>(), vec![2, 3, 4]).unwrap();
        let f = ordered_copy(&base, Order::F).unwrap();
        assert_eq!((f.shape(), f.strides()), (&[2, 3, 4][..], &[1, 2, 6][..]));
        assert!(f.copied() && !f.readonly() && !f.is_c_contiguous());
        let memory = view(&f, 0, vec![24], vec![1]);
        let memory = memory.as_slice::<i32>().unwrap();
        for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
            assert_eq!(memory[i + 2 * j + 6 * k], (12 * i + 4 * j + k) as i32, "[{i}, {j}, {k}]");
        }
        // A transposed view's F copy is the C copy of the original.
        let t = ordered_copy(&view(&base, 0, vec![4, 6], vec![1, 4]), Order::F).unwrap();
        assert_eq!(
            view(&t, 0, vec![24], vec![1]).as_slice::<i32>().unwrap(),
            base.as_slice::<i32>().unwrap()
        );
        assert_eq!(ordered_copy(&view(&base, 0, vec![0, 3], vec![3, 1]), Order::F).unwrap().numel(), 0);
    }

    #[test]
    fn misaligned_memory_is_copied_bytewise() {
        let bytes = Tensor::from_vec((0u8..17).collect::<Vec<_>>(), vec![17]).unwrap();
        // SAFETY: 1 + 2 * 8 = 17 bytes are inside the allocation.
        let t = unsafe {
            Tensor::from_raw_parts(
                (bytes.data_ptr() as *mut u8).add(1),
                vec![2],
                None,
                DType::Float64,
                Device::Cpu,
                true,
                bytes.owner().clone(),
            )
        }
        .unwrap();
        let c = contiguous_copy(&t).unwrap();
        assert!(c.is_aligned());
        let raw: Vec<u8> = c.as_slice::<f64>().unwrap().iter().flat_map(|f| f.to_ne_bytes()).collect();
        assert_eq!(raw, (1u8..17).collect::<Vec<_>>());
    }
}

//! CPU copy kernels: the one fused pass dlframe makes where zero-copy is impossible.
//!
//! Every function here copies. Each reads its inputs once and writes its output once:
//!
//! | kernel | from | to |
//! |---|---|---|
//! | [`fill_nulls`] | values + validity bitmap | values with `fill` in the null slots |
//! | [`unpack_bits`], [`unpack_bits_fill`] | bit-packed bools or validity | one byte (0/1) per bit |
//! | [`pack_bits`] | one byte per bool | an LSB-first bitmap |
//! | [`concat_into`], [`concat_fill_into`] | chunks (with validity) | one preallocated buffer |
//! | [`gather_strided`], [`contiguous_copy`], [`ordered_copy`] | a strided view (negative, zero strides) | C or F order |
//! | [`interleave`] | `k` columns of any numeric types (with validity) | an `(n, k)` matrix, C or F order, cast |
//! | [`take_rows`] | rows picked by increasing index from `k` columns of one type | an `(n, k)` C-order matrix, each row where told |
//! | [`pad_rows`] | ragged rows end to end | an `(n, width)` matrix, padded |
//! | [`stream_copy`] | bytes | bytes, with non-temporal stores (memory a device reads next) |
//!
//! Arrow bitmaps are LSB-first, may start at any bit offset (sliced arrays), and 1 means
//! valid/true ([`BitSlice`]). Casts follow numpy: [`common_dtype`] is `np.result_type`,
//! lossless casts run unchecked and lossy ones are checked value by value ([`cast()`]); fill
//! values are range-checked by [`fill_value`].
//!
//! Outputs of [`PARALLEL_THRESHOLD_BYTES`] or more are split into blocks of
//! [`ROWS_PER_TASK`] rows over rayon's current pool, or, called from outside any pool, over
//! dlframe's own pool of this process (`pool.rs`: forked children get a new one); smaller ones
//! run on the calling thread. To force one thread, call a kernel inside a one-thread pool's
//! `install`.
//!
//! Fresh outputs come from [`HostBuffer`]: 64-byte aligned, zeroed, huge pages for large ones.
//! The only `unsafe` here is that allocation, the raw-pointer reads of [`gather_strided`] and
//! the vector stores of [`stream_copy`]; the other kernels are safe code the compiler
//! vectorises.

/// Calls `$body` with `$D` bound to the Rust type of a numeric dtype (the dtype table's
/// element type); bool is refused. Defined before the modules, which dispatch with it too.
macro_rules! with_numeric {
    ($dtype:expr, $D:ident => $body:expr) => {
        $crate::dtype_table!(with_numeric_arms, ($dtype, $D, $body))
    };
}

/// The arms of [`with_numeric!`], one per numeric row of the dtype table.
macro_rules! with_numeric_arms {
    (($dtype:expr, $D:ident, $body:expr) Bool($($bool:tt)*) $($V:ident($T:ty, $($row:tt)*))*) => {
        match $dtype {
            $(DType::$V => {
                type $D = $T;
                $body
            })*
            DType::Bool => Err(Error::InvalidArgument(
                "bool is not a numeric target dtype; cast booleans explicitly".into(),
            )),
        }
    };
}

mod alloc;
mod bits;
mod cast;
mod column;
mod concat;
mod fill;
mod gather;
mod interleave;
mod pad;
pub(crate) mod pool;
mod round;
mod stream;
mod take;

pub use alloc::{HUGE_PAGE_THRESHOLD, HostBuffer, RECYCLE_THRESHOLD};
pub use bits::{BitSlice, pack_bits, unpack_bits, unpack_bits_fill};
pub use cast::{Element, Num, always_fits, can_cast_safely, cast, common_dtype, fill_bits, fill_value};
pub use column::{Column, ColumnRef, Typed};
pub use concat::{concat_fill_into, concat_into};
pub use fill::fill_nulls;
pub use gather::{contiguous_copy, gather_strided, ordered_copy};
pub use interleave::{interleave, interleave_into};
pub use pad::pad_rows;
pub(crate) use pool::{install, spawn};
#[cfg(feature = "cuda")]
pub(crate) use pool::{on_every_thread, on_own_pool};
pub use round::{bf16_from_f64, f16_from_f64};
pub use stream::stream_copy;
pub use take::{chunk_rows, take_rows};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::Inexact;

/// Outputs at least this large (in bytes) are split over rayon's threads; smaller ones stay
/// on the calling thread.
pub const PARALLEL_THRESHOLD_BYTES: usize = 1 << 20;
/// Rows (elements) per parallel task: a multiple of 64, so each task's validity bits start
/// at the same bit position within a byte as the whole bitmap's.
pub const ROWS_PER_TASK: usize = 64 * 1024;

/// Bytes of an output as whole elements of `D`, without copying.
///
/// # Errors
/// [`Error::InvalidLayout`] for bytes not aligned to `D` or not a whole number of elements.
fn elements_mut<D: Element>(bytes: &mut [u8]) -> Result<&mut [D]> {
    let len = bytes.len();
    // SAFETY: every bit pattern is a valid D (the sealed Element types are integers and
    // IEEE-style floats); align_to_mut leaves the bytes outside D's alignment in head and tail.
    let (head, body, tail) = unsafe { bytes.align_to_mut::<D>() };
    if !head.is_empty() || !tail.is_empty() {
        return Err(Error::layout(format!("{len} output bytes are not whole aligned {} elements", D::DTYPE)));
    }
    Ok(body)
}

/// [`take_rows`] into `out`, the bytes of a `dtype` matrix (copies).
///
/// # Errors
/// As [`take_rows`]; bool targets are refused, and bytes that are not whole aligned elements.
pub fn take_rows_into(
    dtype: DType,
    chunks: &[Vec<Column>],
    rows: &[u32],
    to: &[u32],
    out: &mut [u8],
) -> Result<()> {
    with_numeric!(dtype, D => take_rows(chunks, rows, to, elements_mut::<D>(out)?))
}

/// Checks that every valid value of column `j` casts to `dtype` as [`interleave`] would cast
/// it, reading the values once and writing nothing. Used where
/// the cast itself runs elsewhere (on a device). Lossless casts pass without reading.
///
/// # Errors
/// [`Error::ValueOutOfRange`] as [`interleave`] reports it; bool targets are refused.
pub fn check_cast(dtype: DType, col: &Column, j: usize, inexact: Inexact) -> Result<()> {
    with_numeric!(dtype, D => interleave::check_column::<D>(j, col, inexact))
}

/// Writes the fill whose bits [`fill_bits`] gave (zero for `None`) into every element of `out`
/// (copies).
///
/// # Errors
/// Bool targets are refused, and bytes that are not whole aligned elements.
pub fn fill_into(dtype: DType, fill: Option<u64>, out: &mut [u8]) -> Result<()> {
    with_numeric!(dtype, D => {
        elements_mut::<D>(out)?.fill(D::from_word(fill.unwrap_or(0)));
        Ok(())
    })
}

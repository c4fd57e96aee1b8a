//! CPU fused copy kernels: the one pass dlframe makes where zero-copy is impossible.
//!
//! Every function here copies. Each reads its inputs once and writes its output once: null
//! fill fused into the copy ([`fill_nulls`]), bit unpacking and packing ([`unpack_bits`],
//! [`pack_bits`]), chunk concatenation into a preallocated buffer ([`concat_fill_into`]),
//! strided gathers ([`contiguous_copy`]), and column interleaving with a fused cast and fill
//! ([`interleave`]). Large outputs are split into row blocks over rayon's pool; below
//! [`PARALLEL_THRESHOLD_BYTES`] they run on the calling thread.

mod alloc;
mod bits;
mod cast;
mod fill;
mod gather;
mod interleave;

use std::ops::Range;

use arrow_buffer::ArrowNativeType;

pub use alloc::{HUGE_PAGE_THRESHOLD, HostBuffer};
pub use bits::{BitSlice, pack_bits, unpack_bits, unpack_bits_fill};
pub use cast::{Element, Scalar, common_dtype, fill_value};
pub use fill::{concat_fill_into, concat_into, copy, fill_nulls};
pub use gather::{contiguous_copy, gather_strided};
pub use interleave::{Column, ColumnRef, Order, interleave};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Outputs at least this large are split over threads; smaller ones stay on one.
pub const PARALLEL_THRESHOLD_BYTES: usize = 4 << 20;
/// Elements per parallel task (a multiple of 64, so validity words stay aligned).
pub const ROWS_PER_TASK: usize = 64 * 1024;

/// Calls `$body` with `$D` bound to the Rust type of a numeric dtype.
macro_rules! with_numeric {
    ($dtype:expr, $D:ident => $body:expr) => {
        match $dtype {
            DType::Int8 => {
                type $D = i8;
                $body
            }
            DType::Int16 => {
                type $D = i16;
                $body
            }
            DType::Int32 => {
                type $D = i32;
                $body
            }
            DType::Int64 => {
                type $D = i64;
                $body
            }
            DType::UInt8 => {
                type $D = u8;
                $body
            }
            DType::UInt16 => {
                type $D = u16;
                $body
            }
            DType::UInt32 => {
                type $D = u32;
                $body
            }
            DType::UInt64 => {
                type $D = u64;
                $body
            }
            DType::Float16 => {
                type $D = half::f16;
                $body
            }
            DType::Float32 => {
                type $D = f32;
                $body
            }
            DType::Float64 => {
                type $D = f64;
                $body
            }
            DType::Bool => Err(Error::InvalidArgument(
                "bool is not a numeric target dtype; cast booleans explicitly".into(),
            )),
        }
    };
}

fn typed_range<D: ArrowNativeType>(buf: &mut HostBuffer, range: Range<usize>) -> Result<&mut [D]> {
    let out: &mut [D] = buf.typed_mut();
    let len = out.len();
    out.get_mut(range.clone()).ok_or_else(|| Error::layout(format!("range {range:?} outside {len} elements")))
}

/// [`interleave`] into elements `range` of a buffer of `dtype` elements, converting `fill`
/// to `dtype` first (copies).
///
/// # Errors
/// As [`interleave`] and [`fill_value`]; bool targets are refused.
pub fn interleave_into(
    dtype: DType,
    cols: &[Column],
    order: Order,
    fill: Option<Scalar>,
    buf: &mut HostBuffer,
    range: Range<usize>,
) -> Result<()> {
    with_numeric!(dtype, D => {
        let fill = fill.map(fill_value::<D>).transpose()?;
        interleave(cols, order, fill, typed_range::<D>(buf, range)?)
    })
}

/// Writes `fill` (converted to `dtype`) into elements `range` of the buffer.
///
/// # Errors
/// As [`fill_value`]; bool targets are refused.
pub fn fill_range(
    dtype: DType,
    fill: Option<Scalar>,
    buf: &mut HostBuffer,
    range: Range<usize>,
) -> Result<()> {
    with_numeric!(dtype, D => {
        let v = fill.map(fill_value::<D>).transpose()?.unwrap_or_default();
        typed_range::<D>(buf, range)?.fill(v);
        Ok(())
    })
}

//! Arrow arrays <-> [`Tensor`](crate::Tensor).
//!
//! | Arrow | tensor | data movement |
//! |---|---|---|
//! | int/uint/float 8-64 (and float16), no nulls | 1-D, same dtype | zero-copy, slice offset folded into `data` |
//! | date32, time32 / date64, time64, timestamp, duration | 1-D int32 / int64, Arrow type kept | zero-copy |
//! | FixedSizeList (nested too) | `(n, d1, d2, ...)` C order | zero-copy |
//! | List / LargeList with equal lengths | `(n, d)` | zero-copy; ragged rows are an error naming the row |
//! | `arrow.fixed_shape_tensor` (with `permutation`) | `(n, *logical_shape)`, permuted strides | zero-copy |
//!
//! The way back wraps CPU, aligned, contiguous (or permuted-contiguous) memory in an Arrow
//! `Buffer` whose owner is the tensor, so the memory lives exactly as long as the last Arrow
//! buffer that uses it, dropped on any thread. The logical type the tensor came from is
//! restored (timestamps stay timestamps, nested lists stay nested lists); other N-d tensors
//! become `arrow.fixed_shape_tensor` columns.

pub mod extension;
mod from_tensor;
mod lists;
pub(crate) mod policy;
mod to_tensor;

pub use crate::kernels::{Order, Scalar};
pub use extension::{FIXED_SHAPE_TENSOR, TensorMetadata};
pub use from_tensor::{tensor_to_array, tensor_to_column};
pub use lists::{is_list_like, lists_as_fixed};
pub use policy::{
    Converted, CopyPolicy, ExportOptions, NullPolicy, columns_to_tensor, tensor_to_column_with, to_tensor,
};
pub use to_tensor::{array_to_tensor, column_to_tensor};

//! Arrow arrays <-> [`Tensor`](crate::Tensor).
//!
//! | Arrow | tensor | data movement |
//! |---|---|---|
//! | int/uint/float 8-64 (and float16), no nulls | 1-D, same dtype | zero-copy, slice offset folded into `data` |
//! | date32, time32 / date64, time64, timestamp, duration | 1-D int32 / int64, Arrow type kept | zero-copy |
//! | FixedSizeList (nested too) | `(n, d1, d2, ...)` C order | zero-copy |
//! | any of these with two or more dimensions, under `order="F"` | F order | one gather (`copy.rs`) |
//! | List / LargeList with equal lengths | `(n, d)` | zero-copy; ragged rows are an error naming the row |
//! | List / LargeList under `ragged="pad"` / `"jagged"` | `(n, width)` + lengths / `(total,)` + offsets | `ragged.rs` |
//! | `arrow.fixed_shape_tensor` (with `permutation`) | `(n, *logical_shape)`, permuted strides | zero-copy |
//!
//! The way back wraps CPU, aligned, contiguous (or permuted-contiguous) memory in an Arrow
//! `Buffer` whose owner is the tensor, so the memory lives exactly as long as the last Arrow
//! buffer that uses it, dropped on any thread. The logical type the tensor came from is
//! restored (timestamps stay timestamps, nested lists stay nested lists); other N-d tensors
//! become `arrow.fixed_shape_tensor` columns.

//!
//! Files: `spec.rs` decides what a conversion makes (for the CPU and the CUDA executors alike),
//! `read.rs` reads Arrow columns for the executors, `copy.rs` is the CPU executor,
//! `to_tensor.rs` and `from_tensor.rs` are the zero-copy views, `back.rs` the way back with its
//! copy fallback, `layout.rs` the layout of a column's rows, `take.rs` the matrix of rows picked by index, `lists.rs` the List -> FixedSizeList views and `extension.rs` the tensor
//! extension's metadata.

mod back;
mod binary_storage;
pub(crate) use binary_storage::table_laid_out;
mod column;
mod copy;
pub mod device;
pub mod device_export;
pub mod device_stream;
pub mod extension;
mod from_tensor;
mod layout;
mod list_views;
mod lists;
mod ragged;
pub(crate) mod read;
mod rows;
pub(crate) mod spec;
mod take;
mod to_tensor;

pub use back::{is_plain_1d, tensor_to_column_with};
pub use column::to_tensor;
pub use copy::{Converted, columns_to_tensor};
pub use extension::{FIXED_SHAPE_TENSOR, TensorMetadata};
pub use from_tensor::{tensor_to_array, tensor_to_column};
pub use layout::CellLayout;
pub use list_views::{is_list_view, views_as_lists};
pub use lists::{is_list_like, lists_as_fixed};
pub use ragged::{is_ragged, ragged_to_tensor};
pub use rows::{rows_array, take_rows};
pub use spec::Execution;
pub use take::take_matrix;
pub use to_tensor::{array_to_tensor, column_to_tensor};

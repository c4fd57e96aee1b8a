//! dlframe: Arrow columns to DLPack tensors and back, without copying where the memory allows.
//!
//! | Arrow column | tensor | data movement |
//! |---|---|---|
//! | int/uint 8-64, float 16/32/64, no nulls | 1-D, same dtype | zero-copy |
//! | date, time, timestamp, duration | 1-D int32/int64, Arrow type kept for the way back | zero-copy |
//! | FixedSizeList (nested too) | `(n, d1, d2, ...)` | zero-copy |
//! | `arrow.fixed_shape_tensor` (with `permutation`) | `(n, *shape)`, permuted strides | zero-copy |
//! | strings, decimals, dictionaries, nulls, booleans | - | an error naming the remedy |
//!
//! Tensors from any DLPack producer come back as Arrow arrays zero-copy when they are on the
//! host, aligned and contiguous (N-d ones as `arrow.fixed_shape_tensor` columns); the Arrow
//! buffer then owns the producer's managed tensor and runs its deleter when it drops.
//!
//! Layers, bottom-up, as `tests/layers.rs` holds them: [`ffi`] (raw DLPack and Arrow device
//! structs) -> [`dtype`] / [`device`] / [`error`] / [`options`] / [`decide`] (share, copy or
//! refuse) -> [`tensor`] -> [`kernels`] / [`interface`] -> [`arrow`] -> `polars` / `cuda` ->
//! [`transfer`] (devices) -> [`dlpack`] (which moves an export to its device) / [`table`] (a
//! table's tensors) -> [`batches`] (exact-size batches of a stream).
//!
//! # Example: Arrow -> DLPack -> Arrow (without copying)
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{Array, Float32Array};
//! use dlframe::arrow::{array_to_tensor, tensor_to_array};
//! use dlframe::{export_versioned, ForeignTensor};
//!
//! let column = Float32Array::from(vec![1.0, 2.0, 3.0]);
//! let tensor = array_to_tensor(&column)?;
//! assert_eq!((tensor.shape(), tensor.readonly()), (&[3i64][..], true));
//!
//! // Hand the managed tensor to a C consumer...
//! let raw = export_versioned(tensor).into_raw();
//! // ...or import it again: validated once, deleter called exactly once on drop.
//! // SAFETY: `raw` is a fresh export and is imported exactly once.
//! let back = unsafe { ForeignTensor::from_versioned(raw) }?.into_tensor();
//! let array = tensor_to_array(&back)?;
//! assert_eq!(array.to_data(), column.to_data());
//! assert_eq!(back.data_ptr(), column.values().as_ptr() as *const u8);
//! # Ok::<(), dlframe::Error>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod arrow;
pub mod batches;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
pub mod decide;
pub mod device;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod ffi;
// Test helpers and fuzz harnesses: for the unit tests, and with feature `testing` for the
// integration tests and `fuzz/`; a normal build leaves them out.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod fuzz;
pub mod interface;
pub mod kernels;
pub mod options;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "polars")]
#[cfg_attr(docsrs, doc(cfg(feature = "polars")))]
pub mod polars;
pub mod table;
pub mod tensor;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod transfer;

pub use device::Device;
pub use dlpack::{ForeignTensor, export_legacy, export_versioned};
pub use dtype::DType;
pub use error::{Error, ErrorKind, Place, Result, Rows};
pub use tensor::Tensor;

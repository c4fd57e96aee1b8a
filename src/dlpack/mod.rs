//! Tensor <-> DLPack managed tensors, both versions.
//!
//! Ownership across the C boundary (one owner per allocation):
//! - **Export**: [`export_versioned`] / [`export_legacy`] box the managed struct and put the
//!   shape, the strides and a clone of the [`Tensor`](crate::Tensor) (which keeps the memory alive) into one
//!   boxed context behind `manager_ctx`. The `extern "C"` deleter reclaims both boxes, never
//!   unwinds, and ignores NULL. Until [`Exported::into_raw`] hands the pointer to a consumer,
//!   the [`Exported`] guard owns it and runs the deleter on drop (a capsule that was never
//!   consumed).
//! - **Import**: [`ForeignTensor`] takes ownership of a foreign managed tensor, validates it once,
//!   and calls its deleter exactly once on drop, from whatever thread drops it. A rejected
//!   tensor is released before the error returns.
//!
//! - **Negotiation**: [`request`] resolves a consumer's `__dlpack__` arguments into the tensor
//!   to export, the capsule kind and the stream action.
//!
//! Spec: <https://dmlc.github.io/dlpack/latest/c_api.html> (DLPack 1.3).

mod allocate;
mod consume;
mod export;
mod import;
pub mod request;

pub use allocate::{allocate_into, zeros_like};
pub use consume::{DlpackCall, Entry, Failure, ImportRequest, Keep, Offer, Rung, Then};
pub use export::{
    Exported, ExportedLegacy, ExportedVersioned, ManagedTensor, borrowed_view, export_legacy,
    export_versioned,
};
pub use import::ForeignTensor;
pub use request::{CapsuleKind, Export, ExportRequest, Resolved, StreamAction};

//! Share, copy or refuse: the one answer for every conversion, and the one place that builds
//! [`Error::CopyRequired`]. A path names the [`Cause`] that keeps it from sharing memory (or
//! none); [`decide`] weighs it against the copy policy and the device. The causes' words are
//! written here once, so a refusal reads the same from the CPU, a device plan, Polars, SQL and
//! batches. Copies nothing.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::CopyPolicy;

/// Why a conversion cannot share the memory it was given, in the words its refusal shows.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Cause {
    /// Host memory moves to a device; `what` names it ("column 'x'", "3 columns").
    #[error("{what} moves from host memory to {device}")]
    ToDevice { what: String, device: Device },
    /// The tensor is in device memory, which the CPU does not read in place.
    #[error("the tensor is on {0}; copy it to the host first")]
    OnDevice(Device),
    /// A column in several chunks.
    #[error("column '{column}' has {chunks} chunks; a tensor needs one buffer")]
    Chunks { column: String, chunks: usize },
    /// A column cast to another dtype.
    #[error("column '{column}' is {from} and {to} was asked for")]
    Cast { column: String, from: DType, to: DType },
    /// A column whose nulls are filled.
    #[error("column '{column}' has {nulls} null(s) to fill")]
    NullFill { column: String, nulls: usize },
    /// An Arrow boolean column: bits, where a tensor holds bytes.
    #[error("column '{column}' is boolean, which Arrow bit-packs; a tensor needs one byte per value")]
    BitPacked { column: String },
    /// A bool tensor: bytes, where Arrow holds bits.
    #[error("bool tensors hold one byte per value and Arrow bit-packs booleans")]
    BoolTensor,
    /// `order="F"` over a column Arrow stores row by row.
    #[error(
        "order='F' asks for column '{column}' of shape {shape:?} with its rows \
             innermost, and Arrow stores it row by row"
    )]
    Fortran { column: String, shape: Vec<i64> },
    /// Several columns interleaved into one matrix.
    #[error("{columns} columns become one matrix, which interleaves them")]
    Interleave { columns: usize },
    /// A list view column, whose rows are laid end to end.
    #[error("the rows of list view column '{column}' are laid end to end in a new buffer")]
    ListView { column: String },
    /// Values decoded from a file into a new tensor.
    #[error("values read from a Parquet file are decoded into a new tensor")]
    Decoded,
    /// The rows of a ragged list column padded to one length.
    #[error("padding the ragged rows of column '{column}' makes a new tensor")]
    RaggedPad { column: String },
    /// A ragged list column's offsets rebased to int64.
    #[error(
        "the offsets of column '{column}' are rebased to int64 (only one \
             LargeList chunk whose offsets start at 0, without null rows that hold values, is shared)"
    )]
    RaggedOffsets { column: String },
    /// bfloat16 or float8 values over variable-width binary, laid out at a fixed width.
    #[error(
        "column '{column}' holds its {dtype} values as {storage} (as Polars stores \
             them), laid out at a fixed width in a new buffer"
    )]
    FixedWidth { column: String, dtype: DType, storage: String },
    /// numpy datetimes in a unit Arrow does not have.
    #[error("numpy {from} values become {to} in a new buffer")]
    Units { from: String, to: String },
    /// A strided layout where `needs` (C-contiguous, dense, ...) is required.
    #[error("shape {shape:?} with strides {strides:?} is not {needs}")]
    Strided { shape: Vec<i64>, strides: Vec<i64>, needs: &'static str },
}

/// What a conversion does with the memory it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A view of the given memory.
    Share,
    /// A new buffer.
    Copy,
}

impl Cause {
    /// The refusal of a path that never copies (a view, a reshape): the one
    /// [`Error::CopyRequired`].
    pub fn refused(self) -> Error {
        Error::CopyRequired { reason: self.to_string() }
    }
}

/// Share, copy or refuse, on the host: a copy where `cause` keeps the memory from being shared
/// or `copy=True` asks for one, refused under `copy=False`.
///
/// # Errors
/// [`Error::CopyRequired`] naming `cause` under [`CopyPolicy::Never`].
pub fn decide(copy: CopyPolicy, cause: Option<Cause>) -> Result<Decision> {
    match (cause, copy) {
        (Some(cause), CopyPolicy::Never) => Err(cause.refused()),
        (Some(_), _) | (None, CopyPolicy::Always) => Ok(Decision::Copy),
        (None, _) => Ok(Decision::Share),
    }
}

/// The move of host memory to `device`, decided before the device is reached: a copy onto any
/// device but the CPU, whatever the data, and so refused under `copy=False` whatever the shape;
/// on the CPU, the shape's own [`decide`] answers. `what` names the subject.
///
/// # Errors
/// As [`decide`].
pub fn decide_on(copy: CopyPolicy, device: Device, what: impl FnOnce() -> String) -> Result<Decision> {
    decide(copy, (device != Device::Cpu).then(|| Cause::ToDevice { what: what(), device }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_meets_each_answer() {
        let cause = || Some(Cause::Interleave { columns: 2 });
        assert_eq!(decide(CopyPolicy::IfNeeded, None).ok(), Some(Decision::Share));
        assert_eq!(decide(CopyPolicy::Always, None).ok(), Some(Decision::Copy));
        assert_eq!(decide(CopyPolicy::IfNeeded, cause()).ok(), Some(Decision::Copy));
        assert_eq!(decide(CopyPolicy::Always, cause()).ok(), Some(Decision::Copy));
        let e = decide(CopyPolicy::Never, cause()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a copy is required because 2 columns become one matrix, which interleaves them, but copy=False; \
             pass copy=None or copy=True"
        );
        assert_eq!(decide(CopyPolicy::Never, None).ok(), Some(Decision::Share));
    }

    #[test]
    fn a_move_to_a_device_is_a_copy() {
        let cuda = Device::Cuda(0);
        let what = || "column 'x'".to_string();
        let e = decide_on(CopyPolicy::Never, cuda, what).unwrap_err();
        assert!(e.to_string().contains("column 'x' moves from host memory to cuda:0"), "{e}");
        assert_eq!(decide_on(CopyPolicy::IfNeeded, cuda, what).ok(), Some(Decision::Copy));
        assert_eq!(decide_on(CopyPolicy::Never, Device::Cpu, what).ok(), Some(Decision::Share));
    }
}

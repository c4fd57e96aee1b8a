//! One structured error type for the whole crate.
//!
//! Every variant carries the numbers that explain it, and its message says what was expected,
//! what was found, and (where there is one) the remedy. Boundaries map it once each: Python in
//! `python/src/error.rs`, DataFusion UDFs with `exec_err!`, Polars plugins with `polars_bail!`.

use std::fmt;

/// The result type of every fallible dlframe function.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a refused value sits: a cell of a column, the fill value, or an element of a numpy
/// array on its way to Arrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Row `row` of column `column` (`'x'`, or its position), counted as `rows` says.
    Cell {
        /// The row, from 0.
        row: u64,
        /// The column as errors name it: `'x'`, or its position.
        column: String,
        /// What the row counts.
        rows: Rows,
    },
    /// The `fill_value` of a null fill.
    Fill,
    /// The `pad` of a padded list.
    Pad,
    /// Element `index` of the flat numpy array `array` (its dtype's name).
    Index {
        /// The element, from 0.
        index: u64,
        /// The numpy dtype, e.g. `datetime64[D]`.
        array: String,
    },
}

/// What a [`Place::Cell`]'s row counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// The rows of the input as its caller numbers them: a table's, a stream's, or (for a batch
    /// of a training pass) its source's, wherever they are known.
    Source,
    /// The rows of one batch of `len` rows that a query engine handed over (Polars, a SQL
    /// function): where that batch lies in the result is not known.
    Batch {
        /// The batch's rows.
        len: u64,
    },
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Cell { row, column, rows: Rows::Source } => write!(f, "at row {row} of column {column}"),
            Place::Cell { row, column, rows: Rows::Batch { len } } => {
                write!(
                    f,
                    "at row {row} of a batch of {len} rows, column {column} (where the batch lies in the result is not known)"
                )
            }
            Place::Fill => f.write_str("(fill_value)"),
            Place::Pad => f.write_str("(pad_value)"),
            Place::Index { index, array } => write!(f, "at index {index} of the numpy {array} array"),
        }
    }
}

/// A place compares with the text it prints, so that tests and callers can match on it.
impl PartialEq<str> for Place {
    fn eq(&self, other: &str) -> bool {
        self.to_string().as_str() == other
    }
}

impl PartialEq<&str> for Place {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

/// Which kind of exception a boundary should raise for an [`Error`].
///
/// The array API says data that cannot be exported is a `BufferError`; bad arguments are
/// `ValueError`/`TypeError`. This lets the Python layer map errors in exactly one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The data cannot be represented or exchanged as asked (Python: `BufferError`).
    Buffer,
    /// An argument is out of range or malformed (Python: `ValueError`).
    Value,
    /// The input's type is not supported (Python: `TypeError`).
    Type,
    /// Something below us failed (Python: `RuntimeError`).
    Runtime,
    /// The object does not offer what was asked of it (Python: `AttributeError`, so that
    /// `hasattr` says False and a consumer tries its next protocol).
    Attribute,
}

/// Everything that can go wrong in dlframe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An Arrow type that has no tensor equivalent (strings, decimals, dictionaries, ...).
    #[error("{what} cannot become a tensor: {remedy}")]
    UnsupportedArrowType {
        /// The Arrow type, as Arrow prints it.
        what: String,
        /// What the user can do instead.
        remedy: &'static str,
    },
    /// A DLPack (code, bits, lanes) triple or a typestr we do not know.
    #[error("unsupported dtype {what}: {remedy}")]
    UnsupportedDType {
        /// The dtype as it arrived, e.g. `(code=5, bits=64, lanes=1)`.
        what: String,
        /// What is supported instead.
        remedy: std::borrow::Cow<'static, str>,
    },
    /// A DLPack device type we do not know, or one whose memory the CPU cannot read.
    #[error("unsupported device {what}: {remedy}")]
    UnsupportedDevice {
        /// The device as it arrived.
        what: String,
        /// What is supported instead.
        remedy: &'static str,
    },
    /// A column has nulls and the null policy is `error`.
    #[error(
        "column {column} has {null_count} null(s); pass nulls='fill' (with fill_value=...), \
         nulls='nan' or nulls='mask', or call fill_null first"
    )]
    Nulls {
        /// The column's name or position.
        column: String,
        /// How many nulls it has.
        null_count: usize,
    },
    /// A zero-copy conversion was required (`copy=False`) but is impossible.
    #[error("a copy is required because {reason}, but copy=False; pass copy=None or copy=True")]
    CopyRequired {
        /// Why the memory cannot be shared.
        reason: String,
    },
    /// Pointer not aligned to the element size.
    #[error(
        "data pointer {ptr:#x} is not aligned to {align} bytes; Arrow needs aligned memory, \
         so it must be copied (pass copy=True)"
    )]
    Misaligned {
        /// The data pointer (after `byte_offset`).
        ptr: usize,
        /// The alignment the element type needs.
        align: usize,
    },
    /// A shape, stride or size that is negative, overflows, or lies outside the allocation.
    #[error("invalid tensor layout: {0}")]
    InvalidLayout(String),
    /// A DLPack struct that breaks the spec (NULL pointers, unknown major version, ...).
    #[error("invalid DLPack tensor: {0}")]
    InvalidDlpack(String),
    /// An array-interface dict or typestr that breaks its spec.
    #[error("invalid array interface: {0}")]
    InvalidInterface(String),
    /// Tensor extension-type metadata that cannot be read.
    #[error("invalid arrow.fixed_shape_tensor metadata {json:?}: {reason}")]
    InvalidExtensionMetadata {
        /// The metadata as it arrived.
        json: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Columns or chunks whose lengths do not agree.
    #[error("length mismatch: {what} has length {found}, expected {expected}")]
    LengthMismatch {
        /// Which column, chunk or list row.
        what: String,
        /// The length everything else has.
        expected: usize,
        /// The length this one has.
        found: usize,
    },
    /// A value that does not fit the target dtype of a cast or a fill.
    #[error("{value} {place} does not fit {target}; {}", out_of_range_remedy(value, place, target))]
    ValueOutOfRange {
        /// The value, printed.
        value: String,
        /// Where it is: "at row 3 of column 'x'", "(fill_value)".
        place: Place,
        /// The target dtype.
        target: String,
    },
    /// An integer that the float target of a cast holds only rounded (int64 2^53 + 1 into
    /// float64), under `inexact="error"`.
    #[error(
        "{value} {place} has no exact {target}; pass inexact='round' to round it to the nearest \
         {target} as numpy does, or choose a wider dtype"
    )]
    InexactCast {
        /// The value, printed.
        value: String,
        /// Where it is: "at row 3 of column 'x'".
        place: Place,
        /// The target dtype.
        target: String,
    },
    /// A bad argument (an unknown option, an order other than C or F, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A CUDA driver, NVRTC or device error.
    #[error("CUDA: {0}")]
    Cuda(String),
    /// A device that this build or this machine cannot reach: a build without the `cuda`
    /// feature, no driver, no GPU, or an ordinal beyond the visible devices. Every "no CUDA"
    /// comes out as this one error.
    #[error(
        "{device} is not available: {visible} CUDA device(s) are visible{}",
        if *built_with_cuda {
            "; run where a GPU is visible (check the driver and CUDA_VISIBLE_DEVICES), or keep the data \
             on the CPU"
        } else {
            ", because this build of dlframe has no CUDA support (the `cuda` feature); install a build \
             with it, or keep the data on the CPU"
        }
    )]
    DeviceUnavailable {
        /// The device asked for, e.g. `cuda:1`.
        device: String,
        /// How many CUDA devices are visible (0 without the feature or a driver).
        visible: usize,
        /// Whether this build has the `cuda` feature.
        built_with_cuda: bool,
    },
    /// Device memory asked for as host memory without `copy=True`: dlframe moves device data to
    /// the host only when asked.
    #[error(
        "the tensor is on {device}; Arrow needs host memory, and dlframe copies device data to the host \
         only when asked: pass copy=True{}",
        if *copy_false { " (copy=False was given)" } else { "" }
    )]
    NotOnHost {
        /// Where the tensor is, e.g. `cuda:0` or `DLPack device (4, 0)`.
        device: String,
        /// Whether the caller passed `copy=False`.
        copy_false: bool,
    },
    /// A DLPack export that cannot be made as asked (a device, a capsule kind or a copy that
    /// the request rules out). The message names the remedy.
    #[error("{what}; {remedy}")]
    ExportRefused {
        /// What was asked and why it cannot be done.
        what: String,
        /// What the caller can do instead.
        remedy: &'static str,
    },
    /// A DLPack stream argument that this export cannot use.
    #[error("stream={stream} {reason}")]
    InvalidStream {
        /// The stream number as given.
        stream: i64,
        /// Why it is refused, and what is accepted.
        reason: String,
    },
    /// A saved training state that these batches cannot continue: a setting its position
    /// depends on differs, or its position lies past the end of the epoch.
    #[error("the state was saved with {setting}={saved}, but these batches have {setting}={here}: {remedy}")]
    StateMismatch {
        /// The setting, as the user's keyword names it (`seed`, `splits`, `source`).
        setting: &'static str,
        /// Its value in the state.
        saved: String,
        /// Its value here.
        here: String,
        /// Why that matters, or what to do.
        remedy: String,
    },
    /// An error from arrow-rs.
    #[error(transparent)]
    Arrow(arrow_schema::ArrowError),
    /// An Arrow C Device data interface struct that breaks the interface (a NULL or released
    /// array, a negative length, missing buffers).
    #[error("invalid Arrow device array: {0}")]
    InvalidDeviceArray(String),
    /// A file that is not Parquet as its footer or pages say (truncated, sizes or offsets that
    /// lie, values past a dictionary): the file is named.
    #[error("{file}: not a readable Parquet file: {why}")]
    InvalidParquet {
        /// The file's path.
        file: String,
        /// What is malformed, and where.
        why: String,
    },
    /// Memory offered in a form that cannot be taken as it is (a description that reaches
    /// outside its buffer, memory the host cannot read). The message names the remedy.
    #[error("{0}")]
    Refused(String),
    /// A tensor that does not offer an exchange protocol: an array interface of a device
    /// tensor, the CUDA interface of a host tensor.
    #[error("{protocol}: {why}")]
    NotOffered {
        /// The protocol, as Python names it (`__array_interface__`).
        protocol: &'static str,
        /// Why, and where the tensor is.
        why: String,
    },
    /// An error from Polars (moving chunks across its Arrow C interface, building a Series).
    #[cfg(feature = "polars")]
    #[error("polars: {0}")]
    Polars(#[from] polars_core::error::PolarsError),
}

/// The remedy for a value that does not fit its target: a wider dtype helps only an integer
/// (or finite float) that is too large; NaN, infinity and fractions need a float dtype or, for a
/// fill, another fill value.
fn out_of_range_remedy(value: &str, place: &Place, target: &str) -> &'static str {
    let fill = *place == Place::Fill;
    let whole = value.parse::<f64>().is_ok_and(|v| v.is_finite() && v.fract() == 0.0);
    if let Place::Index { .. } = place {
        // A numpy datetime on its way to Arrow: no dtype to choose there.
        return "the Arrow type cannot hold it; convert the array to a unit Arrow has, such as \
                x.astype('datetime64[s]'), or remove the value first";
    }
    match (target, fill) {
        ("bool", true) => "fill a bool column with True, False, 0 or 1",
        ("bool", false) => "only 0 and 1 become bool; compare the column instead (x != 0)",
        (t, true) if !t.starts_with("float") && !whole => "fill with an integer, or choose a float dtype",
        (t, false) if !t.starts_with("float") && !whole => {
            "integer dtypes hold no NaN, infinity or fraction; choose a float dtype, or round or \
             fill the values first"
        }
        (t, _) if t.starts_with('u') && value.starts_with('-') => "choose a signed dtype",
        _ => "choose a wider dtype",
    }
}

/// arrow-rs's error as ours; one of ours that crossed an arrow-rs iterator (a stream's array
/// refused by [`crate::arrow::device_stream`]) comes back as itself, with its own kind.
impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        match e {
            arrow_schema::ArrowError::ExternalError(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::Arrow(arrow_schema::ArrowError::ExternalError(other)),
            },
            other => Error::Arrow(other),
        }
    }
}

impl Error {
    /// The same error with a cell's row renumbered by `at` (a batch's row as its source row,
    /// or as a row of a batch whose place in the result is not known); other errors as they
    /// are.
    pub fn at_rows(self, at: impl FnOnce(u64) -> (u64, Rows)) -> Error {
        let cell = |place: Place| match place {
            Place::Cell { row, column, .. } => {
                let (row, rows) = at(row);
                Place::Cell { row, column, rows }
            }
            other => other,
        };
        match self {
            Error::ValueOutOfRange { value, place, target } => {
                Error::ValueOutOfRange { value, place: cell(place), target }
            }
            Error::InexactCast { value, place, target } => {
                Error::InexactCast { value, place: cell(place), target }
            }
            e => e,
        }
    }

    /// The exception family a boundary should use for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::UnsupportedArrowType { .. }
            | Error::UnsupportedDType { .. }
            | Error::UnsupportedDevice { .. }
            | Error::Nulls { .. }
            | Error::CopyRequired { .. }
            | Error::Misaligned { .. }
            | Error::InvalidDlpack(_)
            | Error::DeviceUnavailable { .. }
            | Error::NotOnHost { .. }
            | Error::ExportRefused { .. }
            | Error::Refused(_) => ErrorKind::Buffer,
            Error::InvalidLayout(_)
            | Error::InvalidInterface(_)
            | Error::InvalidDeviceArray(_)
            | Error::InvalidExtensionMetadata { .. }
            | Error::LengthMismatch { .. }
            | Error::ValueOutOfRange { .. }
            | Error::InexactCast { .. }
            | Error::InvalidArgument(_)
            | Error::InvalidParquet { .. }
            | Error::StateMismatch { .. }
            | Error::InvalidStream { .. } => ErrorKind::Value,
            Error::Arrow(_) | Error::Cuda(_) => ErrorKind::Runtime,
            Error::NotOffered { .. } => ErrorKind::Attribute,
            #[cfg(feature = "polars")]
            Error::Polars(_) => ErrorKind::Runtime,
        }
    }

    pub(crate) fn layout(msg: impl fmt::Display) -> Self {
        Error::InvalidLayout(msg.to_string())
    }
}

#[cfg(test)]
mod tests {
    use arrow_schema::ArrowError;

    use super::*;

    #[test]
    fn our_error_through_an_arrow_iterator_comes_back_as_itself() {
        let ours = ArrowError::ExternalError(Box::new(Error::InvalidDeviceArray("a negative length".into())));
        let back = Error::from(ours);
        assert!(matches!(back, Error::InvalidDeviceArray(_)), "{back:?}");
        assert_eq!(back.kind(), ErrorKind::Value);
        let theirs = ArrowError::ExternalError(Box::new(std::io::Error::other("disk")));
        assert!(matches!(Error::from(theirs), Error::Arrow(ArrowError::ExternalError(_))));
        assert!(matches!(Error::from(ArrowError::ComputeError("x".into())), Error::Arrow(_)));
    }
}

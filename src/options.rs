//! The options of a conversion, each with its one parser, shared by every boundary (the
//! Python binding, the Polars plugin, SQL) and by both executors (the CPU copy engine and the
//! CUDA planner): the null policy and its fill value, the copy policy, the matrix order, and
//! the target dtype. Nothing here reads data or copies.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Memory order of a matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Row-major: element `(r, c)` at `r * k + c`.
    #[default]
    C,
    /// Column-major: element `(r, c)` at `c * n + r`.
    F,
}

impl Order {
    /// The order an `order=` argument names: `"C"` or `"F"`, either case.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the accepted values.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "C" | "c" => Ok(Order::C),
            "F" | "f" => Ok(Order::F),
            other => Err(Error::InvalidArgument(format!("order={other:?}: expected 'C' or 'F'"))),
        }
    }
}

/// A fill value as the user gave it; [`crate::kernels::fill_value`] converts it to the tensor dtype with a
/// range check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A signed integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean (1 or 0).
    Bool(bool),
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

/// What to do with nulls (docs/design.md, "Null policy").
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum NullPolicy {
    /// Refuse columns with nulls, naming the column and the count (the default).
    #[default]
    Error,
    /// Replace nulls by a value, fused into the copy.
    Fill(Scalar),
    /// Replace nulls by NaN (float dtypes only).
    Nan,
    /// Values as they are (zero-copy when possible) plus a separate bool validity tensor.
    Mask,
}

impl NullPolicy {
    /// The `nulls=` names, as messages list them.
    pub const NAMES: [&'static str; 4] = ["error", "fill", "nan", "mask"];

    /// The policy that a `nulls=` name and a fill value select, for every boundary (Python, the
    /// Polars plugin): a fill value under `"error"` (the default) means `"fill"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown name, or `"fill"` without a fill value.
    pub fn parse(name: &str, fill: Option<Scalar>) -> Result<Self> {
        Ok(match (name, fill) {
            ("error", None) => NullPolicy::Error,
            ("error" | "fill", Some(v)) => NullPolicy::Fill(v),
            ("fill", None) => return Err(Error::InvalidArgument("nulls='fill' needs fill_value=...".into())),
            ("nan", _) => NullPolicy::Nan,
            ("mask", _) => NullPolicy::Mask,
            (other, _) => {
                return Err(Error::InvalidArgument(format!(
                    "nulls={other:?}: expected 'error', 'fill', 'nan' or 'mask'"
                )));
            }
        })
    }

    /// The value null slots become in a copy: the fill, NaN, or zero for `Mask` (masked slots)
    /// and `Error` (which never reaches a null).
    pub fn fill(self) -> Scalar {
        match self {
            NullPolicy::Fill(s) => s,
            NullPolicy::Nan => Scalar::Float(f64::NAN),
            NullPolicy::Mask | NullPolicy::Error => Scalar::Int(0),
        }
    }

    /// Refuses `null_count` nulls of the column `named` says under [`NullPolicy::Error`] (nulls
    /// of a nested level, which no policy fills, are refused where they are found).
    ///
    /// # Errors
    /// [`Error::Nulls`].
    pub fn admit(self, null_count: usize, named: impl FnOnce() -> String) -> Result<()> {
        if null_count > 0 && self == NullPolicy::Error {
            return Err(Error::Nulls { column: named(), null_count });
        }
        Ok(())
    }

    /// Decides once what a conversion of `columns` (each a name and its null count) into
    /// `target` does with their nulls: refuses them under [`NullPolicy::Error`], naming the first
    /// column with any, and NaN into a dtype that has none. Says whether a validity mask is made
    /// (asked for, and there are nulls; a result without nulls gets its all-true mask when it is
    /// finished) and which value the copy writes into null slots: a given fill always (so that
    /// a value that can never be stored is refused whatever the data), NaN or zero only where
    /// there is a null to write. The fill is checked against the dtype by the kernels.
    ///
    /// # Errors
    /// [`Error::Nulls`], and [`Error::InvalidArgument`] naming the remedy for NaN.
    pub fn decide<'a>(
        self,
        columns: impl IntoIterator<Item = (&'a str, usize)>,
        target: DType,
    ) -> Result<Nulls> {
        let mut null_count = 0;
        for (name, n) in columns {
            self.admit(n, || format!("'{name}'"))?;
            null_count += n;
        }
        if self == NullPolicy::Nan && null_count > 0 && !target.is_float() {
            return Err(Error::InvalidArgument(format!(
                "nulls='nan' needs a float dtype but the tensor is {target}; pass dtype='float64' or nulls='fill'"
            )));
        }
        let fill = match self {
            NullPolicy::Fill(s) => Some(s),
            _ => (null_count > 0).then(|| self.fill()),
        };
        Ok(Nulls { mask: null_count > 0 && self == NullPolicy::Mask, fill })
    }
}

/// What a conversion does with its nulls ([`NullPolicy::decide`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nulls {
    /// Whether a validity mask is made.
    pub mask: bool,
    /// The value written into null slots, not yet checked against the dtype; `None` when the
    /// copy writes no null and no fill was given.
    pub fill: Option<Scalar>,
}

/// The array API's `copy` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyPolicy {
    /// `copy=None`: share memory when possible, else copy.
    #[default]
    IfNeeded,
    /// `copy=False`: never copy; refuse with the reason instead.
    Never,
    /// `copy=True`: always a fresh buffer.
    Always,
}

impl From<Option<bool>> for CopyPolicy {
    /// The array API's `copy=None | False | True`.
    fn from(copy: Option<bool>) -> Self {
        match copy {
            None => CopyPolicy::IfNeeded,
            Some(false) => CopyPolicy::Never,
            Some(true) => CopyPolicy::Always,
        }
    }
}

/// What a List or LargeList column whose rows have different lengths becomes
/// (docs/design.md, "Ragged lists"). FixedSizeList columns and plain columns are never ragged.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Ragged {
    /// Only lists whose rows all have one length, as an `(n, len, ...)` tensor; others are
    /// refused, naming the first row that differs (the default).
    #[default]
    Error,
    /// An `(n, max_len, ...)` tensor padded with `pad`, plus an int64 lengths tensor `(n,)`.
    /// `max_len` truncates longer rows; without it the longest row sets the width. Always a copy.
    Pad {
        /// The value of the slots past a row's end.
        pad: Scalar,
        /// The width; None for the longest row.
        max_len: Option<usize>,
    },
    /// The values of all rows end to end, `(total, ...)`, plus int64 offsets `(n + 1,)`, as
    /// `torch.nested.nested_tensor_from_jagged` takes them. Zero-copy where the values and
    /// offsets allow.
    Jagged,
}

impl Ragged {
    /// The mode a `ragged=` name selects, for every boundary: `"error"` (the default), `"pad"`
    /// (with `pad_value`, default 0, and an optional `max_len`) or `"jagged"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown name, or `pad_value`/`max_len` without `"pad"`.
    pub fn parse(name: &str, pad: Option<Scalar>, max_len: Option<usize>) -> Result<Self> {
        match (name, pad.is_some() || max_len.is_some()) {
            ("pad", _) => Ok(Ragged::Pad { pad: pad.unwrap_or(Scalar::Int(0)), max_len }),
            ("error" | "jagged", true) => Err(Error::InvalidArgument(format!(
                "pad_value= and max_len= apply to ragged='pad', not ragged={name:?}"
            ))),
            ("error", false) => Ok(Ragged::Error),
            ("jagged", false) => Ok(Ragged::Jagged),
            (other, _) => {
                Err(Error::InvalidArgument(format!("ragged={other:?}: expected 'error', 'pad' or 'jagged'")))
            }
        }
    }
}

/// What a cast from integers into a float type does with an integer the float cannot hold
/// exactly (int64 2^53 + 1 into float64, int32 2^24 + 1 into float32, uint64 2^64 - 1 into
/// float64). Float -> float casts round either way, as IEEE says (underflow included: 1e-300
/// into float32 is 0); a finite value that would overflow to infinity is refused either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Inexact {
    /// Refused, naming the row and column (the default), as pyarrow's safe cast refuses it.
    #[default]
    Error,
    /// Rounded to the nearest float, ties to even, as numpy's `astype` rounds it.
    Round,
}

impl Inexact {
    /// The mode an `inexact=` name selects, for every boundary: `"error"` or `"round"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "error" => Ok(Inexact::Error),
            "round" => Ok(Inexact::Round),
            other => Err(Error::InvalidArgument(format!("inexact={other:?}: expected 'error' or 'round'"))),
        }
    }
}

/// Options of the Arrow -> tensor conversions.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ExportOptions {
    /// Null policy.
    pub nulls: NullPolicy,
    /// Copy policy.
    pub copy: CopyPolicy,
    /// Target dtype; `None` keeps the column's (or the columns' common) dtype.
    pub dtype: Option<DType>,
    /// Memory order of a multi-column matrix.
    pub order: Order,
    /// What a List column with rows of different lengths becomes.
    pub ragged: Ragged,
    /// What an integer that a float target cannot hold exactly does.
    pub inexact: Inexact,
}

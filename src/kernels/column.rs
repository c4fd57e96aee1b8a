//! The kernels' view of one input column: typed values borrowed from Arrow (never copied
//! here), validity bits, and the name and first row that errors report.

use super::bits::BitSlice;
use super::cast::Element;
use crate::dtype::DType;

/// The `ColumnRef` enum, its `each_ref!` match and its conversions, one variant per numeric
/// row of the dtype table.
macro_rules! column_refs {
    (Bool($($bool:tt)*) $($V:ident($T:ty, $name:literal, $($row:tt)*))*) => {
        /// The typed values of one column (borrowed, never copied by itself), one variant per
        /// numeric dtype, named as the dtype.
        #[derive(Debug, Clone, Copy)]
        pub enum ColumnRef<'a> {
            $(#[doc = concat!("`", $name, "` values.")] $V(&'a [$T]),)*
        }

        macro_rules! each_ref {
            ($r:expr, $s:ident => $body:expr) => {
                match $r {
                    $(ColumnRef::$V($s) => $body,)*
                }
            };
        }

        $(
            impl<'a> From<&'a [$T]> for ColumnRef<'a> {
                fn from(s: &'a [$T]) -> Self {
                    ColumnRef::$V(s)
                }
            }

            impl Typed for $T {
                #[inline(always)]
                fn values(col: ColumnRef<'_>) -> Option<&[Self]> {
                    match col {
                        ColumnRef::$V(s) => Some(s),
                        _ => None,
                    }
                }
            }
        )*
    };
}
crate::dtype_table!(column_refs);
pub(crate) use each_ref;

/// An element type whose values a [`ColumnRef`] can hold.
pub trait Typed: Element {
    /// The column's values, when they are of this type (without copying).
    fn values(col: ColumnRef<'_>) -> Option<&[Self]>;
}

impl ColumnRef<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        each_ref!(self, s => s.len())
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values' dtype.
    pub fn dtype(&self) -> DType {
        fn of<S: Element>(_: &[S]) -> DType {
            S::DTYPE
        }
        each_ref!(self, s => of(s))
    }
}

/// One input column of [`interleave`](super::interleave()): values, validity, and a name for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Column<'a> {
    /// The values.
    pub values: ColumnRef<'a>,
    /// Validity (1 = valid, as long as the values); `None` means no nulls.
    pub validity: Option<BitSlice<'a>>,
    /// The column's name for errors; empty means "use its position".
    pub name: &'a str,
    /// The row number of the first value, for errors (a chunk's place in its column).
    pub first_row: usize,
}

impl<'a> Column<'a> {
    /// A column without nulls and without a name (errors name it by position).
    pub fn new(values: impl Into<ColumnRef<'a>>) -> Self {
        Column { values: values.into(), validity: None, name: "", first_row: 0 }
    }

    /// The same column with a validity bitmap.
    pub fn with_validity(self, validity: Option<BitSlice<'a>>) -> Self {
        Column { validity, ..self }
    }

    /// The same column with a name for errors.
    pub fn named(self, name: &'a str) -> Self {
        Column { name, ..self }
    }

    /// The same column, its rows numbered from `first_row` in errors.
    pub fn starting_at(self, first_row: usize) -> Self {
        Column { first_row, ..self }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values' dtype.
    pub fn dtype(&self) -> DType {
        self.values.dtype()
    }

    /// How errors name column `j`: `'name'`, or its position when it has no name.
    pub(crate) fn label(&self, j: usize) -> String {
        if self.name.is_empty() { j.to_string() } else { format!("'{}'", self.name) }
    }
}

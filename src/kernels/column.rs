//! The kernels' view of one input column: typed values borrowed from Arrow (never copied
//! here), validity bits, and the name and first row that errors report.

use half::{bf16, f16};

use super::bits::BitSlice;
use super::cast::Element;
use crate::dtype::DType;

/// The typed values of one column (borrowed, never copied by itself).
#[derive(Debug, Clone, Copy)]
pub enum ColumnRef<'a> {
    /// `i8` values.
    I8(&'a [i8]),
    /// `i16` values.
    I16(&'a [i16]),
    /// `i32` values.
    I32(&'a [i32]),
    /// `i64` values.
    I64(&'a [i64]),
    /// `u8` values.
    U8(&'a [u8]),
    /// `u16` values.
    U16(&'a [u16]),
    /// `u32` values.
    U32(&'a [u32]),
    /// `u64` values.
    U64(&'a [u64]),
    /// `f16` values.
    F16(&'a [f16]),
    /// `bf16` values.
    BF16(&'a [bf16]),
    /// `f32` values.
    F32(&'a [f32]),
    /// `f64` values.
    F64(&'a [f64]),
}

macro_rules! each_ref {
    ($r:expr, $s:ident => $body:expr) => {
        match $r {
            ColumnRef::I8($s) => $body,
            ColumnRef::I16($s) => $body,
            ColumnRef::I32($s) => $body,
            ColumnRef::I64($s) => $body,
            ColumnRef::U8($s) => $body,
            ColumnRef::U16($s) => $body,
            ColumnRef::U32($s) => $body,
            ColumnRef::U64($s) => $body,
            ColumnRef::F16($s) => $body,
            ColumnRef::BF16($s) => $body,
            ColumnRef::F32($s) => $body,
            ColumnRef::F64($s) => $body,
        }
    };
}

macro_rules! column_from {
    ($($t:ty => $v:ident),*) => {$(
        impl<'a> From<&'a [$t]> for ColumnRef<'a> {
            fn from(s: &'a [$t]) -> Self {
                ColumnRef::$v(s)
            }
        }

        impl Typed for $t {
            #[inline(always)]
            fn values(col: ColumnRef<'_>) -> Option<&[Self]> {
                match col {
                    ColumnRef::$v(s) => Some(s),
                    _ => None,
                }
            }
        }
    )*};
}
pub(crate) use each_ref;

/// An element type whose values a [`ColumnRef`] can hold.
pub trait Typed: Element {
    /// The column's values, when they are of this type (without copying).
    fn values(col: ColumnRef<'_>) -> Option<&[Self]>;
}

column_from!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
             f16 => F16, f32 => F32, f64 => F64, bf16 => BF16);

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

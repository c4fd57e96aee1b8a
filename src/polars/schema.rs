//! Polars types <-> Arrow fields, through the Arrow C data interface's schema half (no data
//! crosses): the Polars side of [`CellLayout`], so the plugin's output type is decided by the
//! same rule as the conversion itself.

use std::mem::transmute;
use std::sync::Arc;

use arrow_array::ffi::FFI_ArrowSchema;
use arrow_schema::{Field, FieldRef};
use polars_arrow::ffi as plffi;
use polars_core::prelude::{CompatLevel, DataType as PlDataType, PlSmallStr};

use crate::arrow::CellLayout;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The Arrow field a Polars column of `dtype` exports as (dates as `Date32`, Array as
/// FixedSizeList, extension columns with their `ARROW:extension:*` metadata).
///
/// # Errors
/// [`crate::Error::Arrow`] if arrow-rs refuses what Polars describes.
pub fn arrow_field(name: &str, dtype: &PlDataType) -> Result<FieldRef> {
    let pl_field = dtype.to_arrow_field(PlSmallStr::from_str(name), CompatLevel::newest());
    // SAFETY: same #[repr(C)] layout (asserted in the module above); the value moves, so the
    // schema's `release` runs once, when the arrow-rs struct drops.
    let schema =
        unsafe { transmute::<plffi::ArrowSchema, FFI_ArrowSchema>(plffi::export_field_to_c(&pl_field)) };
    Ok(Arc::new(Field::try_from(&schema)?))
}

/// The Polars type of an Arrow field (the way back of [`arrow_field`]).
///
/// # Errors
/// [`crate::Error::Arrow`] for a field the C data interface cannot describe,
/// [`crate::Error::Polars`] for one Polars does not read.
pub fn polars_dtype(field: &Field) -> Result<PlDataType> {
    let schema = FFI_ArrowSchema::try_from(field)?;
    // SAFETY: same #[repr(C)] layout; the value moves, so `release` runs once, on the Polars side.
    let schema = unsafe { transmute::<FFI_ArrowSchema, plffi::ArrowSchema>(schema) };
    // SAFETY: `schema` is a complete, live export of `field`.
    let pl_field = unsafe { plffi::import_field_from_c(&schema) }?;
    Ok(PlDataType::from_arrow_field(&pl_field))
}

/// The Polars type that holds a tensor dtype's values.
///
/// # Errors
/// [`Error::UnsupportedDType`] for bfloat16 and float8, which Polars has no type for; as
/// [`polars_dtype`].
pub fn polars_dtype_of(dtype: DType) -> Result<PlDataType> {
    check_polars_dtype(dtype)?;
    polars_dtype(&Field::new("", dtype.to_arrow(), true))
}

/// Refuses a dtype Polars cannot hold as numbers: one Arrow keeps as an extension type
/// (bfloat16, float8) would arrive as opaque binary.
pub(crate) fn check_polars_dtype(dtype: DType) -> Result<()> {
    if dtype.arrow_extension().is_some() {
        return Err(Error::UnsupportedDType {
            what: format!("{dtype} in a Polars column (Polars has no {dtype})"),
            remedy: "Polars has no such type; cast to float32 first (dtype='float32')".into(),
        });
    }
    Ok(())
}

/// The tensor layout of one row of a Polars column of `dtype`: the rule of
/// [`CellLayout::from_field`], applied to the Arrow field the column exports as.
///
/// # Errors
/// As [`arrow_field`] and [`CellLayout::from_field`].
pub fn cell_layout(name: &str, dtype: &PlDataType) -> Result<CellLayout> {
    CellLayout::from_field(arrow_field(name, dtype)?.as_ref())
}

//! One column as a tensor, whatever its list kind: the entry that sends a list-view column to
//! be laid out as a List first, a ragged List column under `ragged=` to `ragged.rs`, and every
//! other column to the one-pass converter of `copy.rs`.

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;

use super::copy::{Converted, in_order, plain_to_tensor};
use super::ragged::{is_ragged, ragged_to_tensor};
use crate::decide::{Cause, decide};
use crate::error::Result;
use crate::options::ExportOptions;

/// One column, in one or more chunks, as one tensor: zero-copy for one chunk without nulls
/// (or with nulls under [`NullPolicy::Mask`](crate::options::NullPolicy::Mask)), otherwise one
/// fused copy pass.
///
/// # Errors
/// [`Error::Nulls`] under [`NullPolicy::Error`](crate::options::NullPolicy::Error),
/// [`Error::UnsupportedArrowType`] for a leaf with no tensor dtype, [`Error::InvalidArgument`]
/// for chunks of another type, a boolean column cast to numbers or NaN for a dtype without it,
/// [`Error::InvalidExtensionMetadata`] for tensor metadata that does not fit the storage, and
/// [`Error::CopyRequired`]
/// under [`CopyPolicy::Never`] when a copy is needed, [`Error::ValueOutOfRange`] for a value
/// that does not fit a lossy cast.
pub fn to_tensor(field: &FieldRef, chunks: &[ArrayRef], opts: &ExportOptions) -> Result<Converted> {
    // A column laid out anew (bfloat16 or float8 over variable-width binary, a list view) is
    // converted as the column it became, a copy.
    let laid = match super::binary_storage::fixed_width_laid_out(field, chunks, opts)? {
        None => list_views_laid_out(field, chunks, opts)?,
        laid => laid,
    };
    if let Some((laid, chunks)) = laid {
        let c = to_tensor(&laid, &chunks, opts)?;
        return Ok(Converted { values: c.values.with_copied(true), ..c });
    }
    if is_ragged(field, opts) {
        return ragged_to_tensor(field, chunks, opts).and_then(|c| in_order(c, opts.order));
    }
    plain_to_tensor(field, chunks, opts)
}

/// A ListView or LargeListView column as the List column of the same rows (copies: refused
/// under [`CopyPolicy::Never`]); None for any other column.
///
/// # Errors
/// [`Error::CopyRequired`] under `copy=False`, and [`super::views_as_lists`]'s.
fn list_views_laid_out(
    field: &FieldRef,
    chunks: &[ArrayRef],
    opts: &ExportOptions,
) -> Result<Option<(FieldRef, Vec<ArrayRef>)>> {
    if !super::is_list_view(field.data_type()) {
        return Ok(None);
    }
    decide(opts.copy, Some(Cause::ListView { column: field.name().to_string() }))?;
    super::views_as_lists(field, chunks)
}

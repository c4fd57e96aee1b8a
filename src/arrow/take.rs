//! The CPU executor of a gathered matrix: rows picked by index (a shuffled batch) from several
//! chunked columns, gathered and interleaved into one `(n, k)` matrix in one pass.

use arrow_array::{Array, ArrayRef};
use arrow_schema::FieldRef;

use super::copy::Converted;
use super::read::column_ref;
use super::spec::MatrixSpec;
use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::{self, Column, HostBuffer};
use crate::options::{ExportOptions, Order};
use crate::tensor::{Tensor, c_strides};

/// Rows `rows` (increasing, counted through the chunks) of several columns, cut into the same
/// chunks, as rows `to` of one C-order matrix in one pass (copies), when that pass is a plain
/// gather: columns of the matrix's dtype with no nulls, in C order. None otherwise: the caller
/// gathers the columns first and converts them as any others.
///
/// # Errors
/// [`MatrixSpec::new`]'s (the columns as a whole must make a matrix under `opts`), and
/// [`kernels::take_rows`]'s for pairs outside the chunks.
pub fn take_matrix(
    fields: &[FieldRef],
    columns: &[Vec<ArrayRef>],
    rows: &[u32],
    to: &[u32],
    opts: &ExportOptions,
) -> Result<Option<Converted>> {
    // bfloat16 or float8 over variable-width binary: gathered, then laid out by the caller.
    if fields.iter().any(|f| super::binary_storage::needs_laying_out(f)) {
        return Ok(None);
    }
    let spec = MatrixSpec::new(fields, columns, opts)?;
    let chunks = columns.first().map_or(0, Vec::len);
    let plain = opts.order == Order::C
        && !spec.made.mask
        && spec.made.target != DType::Bool
        && columns.iter().zip(&spec.dtypes).all(|(c, &d)| {
            c.len() == chunks
                && d == spec.made.storage
                && c.iter().zip(&columns[0]).all(|(a, first)| a.len() == first.len() && a.null_count() == 0)
        });
    if !plain {
        return Ok(None);
    }
    let by_chunk = (0..chunks)
        .map(|c| {
            columns
                .iter()
                .zip(fields.iter().zip(&spec.dtypes))
                .map(|(col, (f, &d))| column_ref(col[c].as_ref(), d, f.name()))
                .collect::<Result<Vec<Column>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let shape = vec![rows.len() as i64, fields.len() as i64];
    let mut buf = HostBuffer::for_overwrite(rows.len() * fields.len() * spec.made.storage.itemsize())?;
    kernels::take_rows_into(spec.made.storage, &by_chunk, rows, to, buf.as_mut_slice())?;
    let strides = c_strides(&shape);
    let values =
        Tensor::from_buffer(buf.into_buffer(), 0, shape, Some(strides), spec.made.storage)?.with_copied(true);
    Ok(Some(Converted { values, mask: None, index: None }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float32Array, Int32Array};
    use arrow_schema::{DataType, Field};

    use super::*;

    #[test]
    fn plain_columns_are_gathered_in_one_pass_and_others_are_left_to_the_caller() {
        let f = |n: &str, t| Arc::new(Field::new(n, t, true));
        let fields = [f("a", DataType::Float32), f("b", DataType::Float32)];
        let a: ArrayRef = Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0]));
        let b: ArrayRef = Arc::new(Float32Array::from(vec![10.0, 20.0, 30.0]));
        let cols = vec![vec![a.slice(0, 2), a.slice(2, 1)], vec![b.slice(0, 2), b.slice(2, 1)]];
        let opts = ExportOptions::default();
        let m = take_matrix(&fields, &cols, &[0, 2], &[1, 0], &opts).unwrap().unwrap();
        assert_eq!(m.values.shape(), &[2, 2]);
        assert_eq!(m.values.as_slice::<f32>().unwrap(), [3.0, 30.0, 1.0, 10.0]);
        assert!(m.values.copied());
        // A cast, nulls, or F order: not a plain gather.
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        let mixed = [fields[0].clone(), f("i", DataType::Int32)];
        let cols2 = vec![vec![a.clone()], vec![ints]];
        assert!(take_matrix(&mixed, &cols2, &[0], &[0], &opts).unwrap().is_none());
        let f_order = ExportOptions { order: Order::F, ..opts };
        assert!(take_matrix(&fields, &cols, &[0], &[0], &f_order).unwrap().is_none());
        let nulls: ArrayRef = Arc::new(Float32Array::from(vec![Some(1.0), None, Some(3.0)]));
        let filled = ExportOptions { nulls: crate::options::NullPolicy::Nan, ..opts };
        assert!(take_matrix(&fields, &[vec![nulls], vec![b]], &[0], &[0], &filled).unwrap().is_none());
    }
}

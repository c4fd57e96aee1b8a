//! A matrix held as Arrow holds one: an array of rows, each a `FixedSizeList` of fixed-width
//! values without nulls; and the gather of such rows, a row's bytes at a time.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray, make_array};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field};
use rayon::prelude::*;

use crate::error::Result;
use crate::kernels::{self, HostBuffer};

/// Rows gathered by one job: 4,096 rows of 8 f32 are 128 KB.
const JOB_ROWS: usize = 4096;

/// `buffer`, a C-order `(rows, k)` matrix of `item` values, as an array of `rows` rows of `k`
/// (no copy: the array owns the buffer).
///
/// # Errors
/// An `item` that is not fixed-width, or a buffer of fewer bytes than the rows need.
pub fn rows_array(item: DataType, k: usize, rows: usize, buffer: Buffer) -> Result<ArrayRef> {
    let values = ArrayData::builder(item.clone()).len(rows * k).add_buffer(buffer).build()?;
    let field = Arc::new(Field::new_list_field(item, false));
    let list = FixedSizeListArray::try_new_with_length(field, k as i32, make_array(values), None, rows)?;
    Ok(Arc::new(list))
}

/// The bytes of a chunk's rows (shared, not copied), and the bytes of one row, for a
/// `FixedSizeList` of fixed-width values without nulls at either level; None for other arrays.
fn row_bytes(chunk: &ArrayRef) -> Option<(Buffer, usize)> {
    let list = chunk.as_any().downcast_ref::<FixedSizeListArray>()?;
    let width = list.value_type().primitive_width()?;
    let values = list.values();
    if list.null_count() > 0 || values.null_count() > 0 || list.value_type() == DataType::Boolean {
        return None;
    }
    let data = values.to_data();
    let row = list.value_length() as usize * width;
    let start = (data.offset() + list.value_offset(0) as usize) * width;
    let len = list.len() * row;
    let bytes = data.buffers().first()?;
    (start + len <= bytes.len()).then(|| (bytes.slice_with_length(start, len), row))
}

/// The rows `pairs` (`(chunk, row)`, in the output's order) of `chunks`, the chunks of one
/// `FixedSizeList` column of fixed-width values without nulls, as one array of rows: each row
/// copied whole, on the pool's threads. None where a chunk is not such a column (the caller
/// gathers it otherwise).
///
/// # Errors
/// The output could not be allocated.
pub fn take_rows(chunks: &[ArrayRef], pairs: &[(usize, usize)]) -> Result<Option<ArrayRef>> {
    let Some(first) = chunks.first() else { return Ok(None) };
    let Some(parts) = chunks.iter().map(row_bytes).collect::<Option<Vec<_>>>() else { return Ok(None) };
    let row = parts[0].1;
    if parts.iter().any(|p| p.1 != row) || chunks.iter().any(|c| c.data_type() != first.data_type()) {
        return Ok(None);
    }
    let DataType::FixedSizeList(item, k) = first.data_type() else { return Ok(None) };
    if pairs.iter().any(|&(c, r)| c >= parts.len() || (r + 1) * row > parts[c].0.len()) {
        return Ok(None);
    }
    let mut out = HostBuffer::for_overwrite(pairs.len() * row)?;
    if row > 0 {
        kernels::install(|| {
            out.as_mut_slice().par_chunks_mut(JOB_ROWS * row).zip(pairs.par_chunks(JOB_ROWS)).for_each(
                |(dst, job)| {
                    for (d, &(c, r)) in dst.chunks_exact_mut(row).zip(job) {
                        d.copy_from_slice(&parts[c].0[r * row..(r + 1) * row]);
                    }
                },
            );
        });
    }
    rows_array(item.data_type().clone(), *k as usize, pairs.len(), out.into_buffer()).map(Some)
}

#[cfg(test)]
mod tests {
    use arrow_array::{Float32Array, Int64Array};
    use arrow_select::interleave::interleave;

    use super::*;

    fn matrix(first: i64, rows: usize, k: usize) -> ArrayRef {
        let v: Vec<i64> = (first..first + (rows * k) as i64).collect();
        rows_array(DataType::Int64, k, rows, Buffer::from_vec(v)).unwrap()
    }

    #[test]
    fn gathered_rows_equal_arrow_s_interleave_of_the_same_rows() {
        let a = matrix(0, 10, 3);
        let b = matrix(100, 6, 3).slice(2, 3);
        let chunks = vec![a.clone(), b.clone()];
        let pairs: Vec<(usize, usize)> = vec![(1, 2), (0, 0), (0, 9), (1, 0), (0, 4), (0, 4)];
        let got = take_rows(&chunks, &pairs).unwrap().expect("plain rows");
        let want = interleave(&[a.as_ref(), b.as_ref()], &pairs).unwrap();
        assert_eq!(got.to_data(), want.to_data());
        assert_eq!(got.len(), 6);
        let many: Vec<(usize, usize)> = (0..3 * JOB_ROWS + 5).map(|i| (0, (i * 7) % 10)).collect();
        let got = take_rows(&chunks, &many).unwrap().unwrap();
        assert_eq!(got.to_data(), interleave(&[a.as_ref(), b.as_ref()], &many).unwrap().to_data());
    }

    #[test]
    fn other_columns_are_left_to_the_caller() {
        let plain: ArrayRef = Arc::new(Float32Array::from(vec![1.0, 2.0]));
        assert!(take_rows(&[plain], &[(0, 1)]).unwrap().is_none());
        let item = Arc::new(Field::new_list_field(DataType::Int64, true));
        let values = Arc::new(Int64Array::from(vec![Some(1), None]));
        let nulls: ArrayRef = Arc::new(FixedSizeListArray::new(item, 2, values, None));
        assert!(take_rows(&[nulls], &[(0, 0)]).unwrap().is_none());
        // Two chunks of other widths.
        assert!(take_rows(&[matrix(0, 2, 2), matrix(0, 2, 3)], &[(0, 0)]).unwrap().is_none());
        // A row past a chunk.
        assert!(take_rows(&[matrix(0, 2, 2)], &[(0, 2)]).unwrap().is_none());
    }
}

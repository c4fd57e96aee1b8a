use std::sync::Arc;

use crate::options::{CopyPolicy, NullPolicy, Scalar};

use arrow_array::{BooleanArray, Int16Array};
use arrow_buffer::NullBuffer;
use arrow_schema::Field;

use super::*;
use crate::arrow::to_tensor;

fn field(name: &str, dt: DataType) -> FieldRef {
    Arc::new(Field::new(name, dt, true))
}

fn matrix(cols: Vec<(FieldRef, Vec<ArrayRef>)>, opts: &ExportOptions) -> Result<Tensor> {
    let (fields, chunks): (Vec<_>, Vec<_>) = cols.into_iter().unzip();
    columns_to_tensor(&fields, &chunks, opts).map(|c| c.values)
}

#[test]
fn bool_columns_stack_as_bool_or_join_numbers_as_zero_and_one() {
    let p: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)]));
    // Two chunks, so the segments split the bits at an offset that is not a byte boundary.
    let q1: ArrayRef = Arc::new(BooleanArray::from(vec![true]));
    let q2: ArrayRef = Arc::new(BooleanArray::from(vec![false, true]));
    let bools = || {
        vec![
            (field("p", DataType::Boolean), vec![p.clone()]),
            (field("q", DataType::Boolean), vec![q1.clone(), q2.clone()]),
        ]
    };
    let err = matrix(bools(), &ExportOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Nulls { null_count: 1, .. }), "{err}");
    let fill_true = ExportOptions { nulls: NullPolicy::Fill(Scalar::Bool(true)), ..Default::default() };
    let t = matrix(bools(), &fill_true).unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::Bool, &[3i64, 2][..]));
    assert_eq!(t.as_slice::<bool>().unwrap(), &[true, true, true, false, false, true]);
    let bad_fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(7)), ..Default::default() };
    assert!(matches!(matrix(bools(), &bad_fill), Err(Error::ValueOutOfRange { .. })));

    let r: ArrayRef = Arc::new(Int16Array::from(vec![-5, 300, 7]));
    let mut mixed = bools();
    mixed.push((field("r", DataType::Int16), vec![r]));
    let zero =
        ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-1)), order: Order::F, ..Default::default() };
    let t = matrix(mixed.clone(), &zero).unwrap();
    assert_eq!((t.dtype(), t.strides()), (DType::Int16, &[1i64, 3][..]));
    assert_eq!(
        kernels::contiguous_copy(&t).unwrap().as_slice::<i16>().unwrap(),
        &[1, 1, -5, -1, 0, 300, 0, 1, 7]
    );

    let to_bool = ExportOptions { dtype: Some(DType::Bool), ..zero };
    let err = matrix(mixed, &to_bool).unwrap_err();
    assert!(err.to_string().contains("'r' is int16"), "{err}");
}

/// A tensor's values in C order, whatever its layout (a copy), as f64.
fn logical(t: &Tensor) -> Vec<f64> {
    let c = kernels::contiguous_copy(t).unwrap();
    match c.dtype() {
        DType::Int32 => c.as_slice::<i32>().unwrap().iter().map(|&v| f64::from(v)).collect(),
        DType::Float64 => c.as_slice::<f64>().unwrap().to_vec(),
        DType::Bool => c.as_slice::<bool>().unwrap().iter().map(|&v| f64::from(u8::from(v))).collect(),
        other => panic!("{other}"),
    }
}

#[test]
fn f_order_lays_out_tensor_columns_with_the_first_index_fastest() {
    use std::collections::HashMap;

    use arrow_array::{FixedSizeListArray, Int32Array};

    use crate::arrow::extension::{EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY};
    use crate::tensor::f_strides;

    // (rows, 2, 3) int32 cells, values 0.. in C order, with a null at leaf slot 4.
    let cells = |rows: usize, first: i32, null_at: Option<usize>| -> ArrayRef {
        let leaf = Arc::new(Field::new("item", DataType::Int32, true));
        let values: Int32Array =
            (0..rows * 6).map(|i| (Some(i) != null_at).then_some(first + i as i32)).collect();
        let inner = FixedSizeListArray::new(leaf, 3, Arc::new(values), None);
        let inner_field = Arc::new(Field::new("item", inner.data_type().clone(), true));
        Arc::new(FixedSizeListArray::new(inner_field, 2, Arc::new(inner), None))
    };
    let one = [cells(4, 0, None)];
    let f = field("m", one[0].data_type().clone());
    let c_opts = ExportOptions::default();
    let f_opts = ExportOptions { order: Order::F, ..Default::default() };

    let c = to_tensor(&f, &one, &c_opts).unwrap().values;
    let t = to_tensor(&f, &one, &f_opts).unwrap().values;
    assert!(!c.copied() && t.copied() && !t.readonly());
    assert_eq!((t.shape(), t.strides()), (&[4, 2, 3][..], &f_strides(&[4, 2, 3])[..]));
    assert_eq!(logical(&t), logical(&c));
    // Row i, cell [j, k] holds 6i + 3j + k, at element i + 4j + 8k of F memory.
    let got: Vec<i32> = {
        // The F buffer read in memory order.
        // SAFETY: the 24 elements of `t`'s own allocation, kept alive by its owner.
        let raw = unsafe {
            Tensor::from_raw_parts(
                t.data_ptr() as *mut u8,
                vec![24],
                None,
                DType::Int32,
                t.device(),
                true,
                t.owner().clone(),
            )
        }
        .unwrap();
        raw.as_slice::<i32>().unwrap().to_vec()
    };
    for i in 0..4 {
        for j in 0..2 {
            for k in 0..3 {
                assert_eq!(got[i + 4 * j + 8 * k], (6 * i + 3 * j + k) as i32, "[{i}, {j}, {k}]");
            }
        }
    }
    // copy=True makes one copy, F-ordered; copy=False refuses, saying why.
    let always = ExportOptions { copy: CopyPolicy::Always, ..f_opts };
    let again = to_tensor(&f, &one, &always).unwrap().values;
    assert_eq!((again.strides(), logical(&again)), (t.strides(), logical(&c)));
    let never = ExportOptions { copy: CopyPolicy::Never, ..f_opts };
    let e = to_tensor(&f, &one, &never).unwrap_err();
    assert!(matches!(&e, Error::CopyRequired { reason } if reason.contains("order='F'")), "{e}");

    // Two chunks, a null filled and a cast, with and without a mask: the same values as C.
    let chunks = vec![cells(3, 0, Some(4)), cells(2, 100, None)];
    for nulls in [NullPolicy::Fill(Scalar::Int(-1)), NullPolicy::Mask] {
        let cast = ExportOptions { nulls, dtype: Some(DType::Float64), ..Default::default() };
        let c = to_tensor(&f, &chunks, &cast).unwrap();
        let t = to_tensor(&f, &chunks, &ExportOptions { order: Order::F, ..cast }).unwrap();
        assert_eq!(t.values.strides(), &f_strides(&[5, 2, 3])[..], "{nulls:?}");
        assert_eq!(logical(&t.values), logical(&c.values), "{nulls:?}");
        if let (Some(cm), Some(tm)) = (&c.mask, &t.mask) {
            assert_eq!(tm.strides(), t.values.strides());
            assert_eq!(logical(tm), logical(cm));
            assert_eq!(logical(tm).iter().filter(|&&v| v == 0.0).count(), 1);
        } else {
            assert!(c.mask.is_none() && t.mask.is_none(), "{nulls:?}");
        }
    }

    // A permuted fixed_shape_tensor: the same logical values, in F order.
    let meta = HashMap::from([
        (EXTENSION_NAME_KEY.to_string(), crate::arrow::FIXED_SHAPE_TENSOR.to_string()),
        (EXTENSION_METADATA_KEY.to_string(), r#"{"shape":[2,3],"permutation":[1,0]}"#.to_string()),
    ]);
    let leaf = Arc::new(Field::new("item", DataType::Int32, false));
    let flat = FixedSizeListArray::new(leaf, 6, Arc::new(Int32Array::from_iter_values(0..24)), None);
    let pf = Arc::new(Field::new("t", flat.data_type().clone(), false).with_metadata(meta));
    let chunk: [ArrayRef; 1] = [Arc::new(flat)];
    let c = to_tensor(&pf, &chunk, &c_opts).unwrap().values;
    let t = to_tensor(&pf, &chunk, &f_opts).unwrap().values;
    assert_eq!((c.shape(), t.shape()), (&[4, 3, 2][..], &[4, 3, 2][..]));
    assert_eq!((t.strides(), logical(&t)), (&f_strides(&[4, 3, 2])[..], logical(&c)));

    // A scalar column is in F order already: shared, not copied.
    let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
    assert!(!to_tensor(&field("a", DataType::Int32), &[a], &f_opts).unwrap().values.copied());
}

#[test]
fn outer_list_nulls_cover_every_leaf_slot_of_their_row() {
    use arrow_array::{FixedSizeListArray, Int32Array};
    let leaf = Arc::new(Field::new("item", DataType::Int32, true));
    let inner = FixedSizeListArray::new(
        leaf.clone(),
        2,
        Arc::new(Int32Array::from((1..=8).collect::<Vec<_>>())),
        None,
    );
    let inner_field = Arc::new(Field::new("item", inner.data_type().clone(), true));
    let outer =
        FixedSizeListArray::new(inner_field, 2, Arc::new(inner), Some(NullBuffer::from(vec![false, true])));
    let f = field("x", outer.data_type().clone());
    let chunks: Vec<ArrayRef> = vec![Arc::new(outer)];
    let fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-1)), ..Default::default() };
    let t = to_tensor(&f, &chunks, &fill).unwrap().values;
    assert_eq!(t.shape(), &[2, 2, 2]);
    assert_eq!(t.as_slice::<i32>().unwrap(), &[-1, -1, -1, -1, 5, 6, 7, 8]);
    let mask = to_tensor(&f, &chunks, &ExportOptions { nulls: NullPolicy::Mask, ..Default::default() })
        .unwrap()
        .mask
        .unwrap();
    assert_eq!(mask.as_slice::<bool>().unwrap(), &[false, false, false, false, true, true, true, true]);
}

#[test]
fn cast_errors_name_the_row_in_the_whole_column_not_in_its_chunk() {
    let a: ArrayRef = Arc::new(Int16Array::from(vec![1, 2]));
    let b: ArrayRef = Arc::new(Int16Array::from(vec![3, 300]));
    let to_u8 = ExportOptions { dtype: Some(DType::UInt8), ..Default::default() };
    let e = to_tensor(&field("x", DataType::Int16), &[a.clone(), b.clone()], &to_u8).unwrap_err();
    assert!(matches!(&e, Error::ValueOutOfRange { place, .. } if place == "at row 3 of column 'x'"), "{e}");
    for order in [Order::C, Order::F] {
        let cols = vec![
            (field("y", DataType::Int16), vec![a.clone().slice(0, 1), a.slice(1, 1), b.clone()]),
            (field("x", DataType::Int16), vec![a.clone(), b.clone()]),
        ];
        let e = matrix(cols, &ExportOptions { order, ..to_u8 }).unwrap_err();
        assert!(
            matches!(&e, Error::ValueOutOfRange { place, .. } if place == "at row 3 of column 'y'"),
            "{e}"
        );
    }
}

/// Chunked columns in an output above the parallel size are written segment by segment on
/// several threads: every cell (cast, filled, unpacked), the mask, and a single chunked
/// column equal values computed cell by cell, in C and F order; of two bad values in
/// different chunks, the first is reported, every time.
#[test]
fn chunked_outputs_written_in_parallel_hold_every_cell_and_report_the_first_error() {
    use arrow_array::{Float64Array, Int32Array, Int64Array};
    // Uneven chunks, different per column, so segments cut chunks at many places.
    let cuts = |n: usize, seed: usize| {
        let mut bounds = vec![0];
        while *bounds.last().unwrap() < n {
            let b = bounds.last().unwrap() + 1 + (bounds.len() * 7919 + seed) % 40_000;
            bounds.push(b.min(n));
        }
        bounds
    };
    let chunked = |n: usize, seed: usize, make: &dyn Fn(std::ops::Range<usize>) -> ArrayRef| {
        cuts(n, seed).windows(2).map(|w| make(w[0]..w[1])).collect::<Vec<ArrayRef>>()
    };
    let n = 150_000; // x 3 columns x 8 bytes: 3.6 MB, above the parallel threshold
    assert!(n * 3 * 8 >= kernels::PARALLEL_THRESHOLD_BYTES);
    let int = |i: usize| (i % 11 != 3).then_some(i as i32 - 5000);
    let float = |i: usize| i as f64 * 0.5;
    let flag = |i: usize| (i % 5 != 0).then_some(i % 3 == 0);
    let cols = vec![
        (field("a", DataType::Int32), chunked(n, 1, &|r| Arc::new(r.map(int).collect::<Int32Array>()))),
        (field("b", DataType::Float64), chunked(n, 2, &|r| Arc::new(r.map(float).collect::<Float64Array>()))),
        (field("c", DataType::Boolean), chunked(n, 3, &|r| Arc::new(r.map(flag).collect::<BooleanArray>()))),
    ];
    let cell = |i: usize, j: usize| match j {
        0 => int(i).map(f64::from),
        1 => Some(float(i)),
        _ => flag(i).map(|b| f64::from(u8::from(b))),
    };
    for order in [Order::C, Order::F] {
        let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-7)), order, ..Default::default() };
        // In F order the strides say so; a C-order copy of it reads as rows.
        let t = kernels::contiguous_copy(&matrix(cols.clone(), &opts).unwrap()).unwrap();
        let got = t.as_slice::<f64>().unwrap();
        let masked = ExportOptions { nulls: NullPolicy::Mask, order, ..Default::default() };
        let (fields, chunks): (Vec<_>, Vec<_>) = cols.iter().cloned().unzip();
        let mask = columns_to_tensor(&fields, &chunks, &masked).unwrap().mask.unwrap();
        let mask = kernels::contiguous_copy(&mask).unwrap();
        let mask = mask.as_slice::<bool>().unwrap();
        for i in 0..n {
            for j in 0..3 {
                assert_eq!(got[i * 3 + j], cell(i, j).unwrap_or(-7.0), "{order:?} row {i} column {j}");
                assert_eq!(mask[i * 3 + j], cell(i, j).is_some(), "{order:?} mask row {i} column {j}");
            }
        }
    }
    // One column in chunks, filled and cast: 200k f64 is 1.6 MB.
    let one = chunked(200_000, 4, &|r| Arc::new(r.map(int).collect::<Int32Array>()));
    let opts = ExportOptions {
        nulls: NullPolicy::Fill(Scalar::Int(-7)),
        dtype: Some(DType::Float64),
        ..Default::default()
    };
    let t = to_tensor(&field("a", DataType::Int32), &one, &opts).unwrap().values;
    for (i, &v) in t.as_slice::<f64>().unwrap().iter().enumerate() {
        assert_eq!(v, int(i).map_or(-7.0, f64::from), "row {i}");
    }
    // Values too big for int32 in the second and the last chunk of a 2 MB int64 column.
    let big = |i: usize| if i == 50_001 || i == 249_999 { 1i64 << 40 } else { i as i64 };
    let chunks: Vec<ArrayRef> = (0..5)
        .map(|c| Arc::new((c * 50_000..(c + 1) * 50_000).map(big).collect::<Int64Array>()) as ArrayRef)
        .collect();
    let to_i32 = ExportOptions { dtype: Some(DType::Int32), ..Default::default() };
    for _ in 0..20 {
        let e = to_tensor(&field("x", DataType::Int64), &chunks, &to_i32).unwrap_err();
        assert!(
            matches!(&e, Error::ValueOutOfRange { place, .. } if place == "at row 50001 of column 'x'"),
            "{e}"
        );
    }
}

//! `to_tensor_impl`, the work behind the `to_tensor` plugin expression, called directly with
//! Series as Polars would pass them (the Python tests drive it through Polars itself).

use dlframe_polars::{Fill, ToTensorKwargs, output_dtype, to_tensor_impl};
use polars_core::prelude::*;

fn kw() -> ToTensorKwargs {
    ToTensorKwargs::default()
}

fn arr(inner: DataType, width: usize) -> DataType {
    DataType::Array(Box::new(inner), width)
}

/// The rows of an `Array(f64, k)` column, as Polars sees them.
fn rows_f64(s: &Series) -> Vec<Vec<Option<f64>>> {
    let a = s.array().unwrap();
    a.amortized_iter()
        .map(|row| {
            let row = row.unwrap();
            let row = row.as_ref().cast(&DataType::Float64).unwrap();
            let row = row.f64().unwrap();
            (0..row.len()).map(|i| row.get(i)).collect()
        })
        .collect()
}

#[test]
fn columns_stack_into_an_array_of_their_common_dtype() {
    let a = Series::new("a".into(), &[1i32, 2, 3]);
    let b = Series::new("b".into(), &[0.5f32, 1.5, 2.5]);
    let c = Series::new("c".into(), &[true, false, true]);
    let out = to_tensor_impl(&[a, b, c], &kw()).unwrap();
    // numpy's promotion: int32 with float32 is float64.
    assert_eq!((out.name().as_str(), out.dtype()), ("a", &arr(DataType::Float64, 3)));
    assert_eq!(
        rows_f64(&out),
        vec![
            vec![Some(1.0), Some(0.5), Some(1.0)],
            vec![Some(2.0), Some(1.5), Some(0.0)],
            vec![Some(3.0), Some(2.5), Some(1.0)],
        ]
    );
}

#[test]
fn dtype_and_fill_are_one_pass_and_the_declared_type_holds() {
    let a = Series::new("a".into(), &[Some(1i64), None]);
    let b = Series::new("b".into(), &[None, Some(4.0f64)]);
    let k = ToTensorKwargs { dtype: Some("float32".into()), fill_value: Some(Fill::Int(-1)), ..kw() };
    let declared = output_dtype(&[a.dtype(), b.dtype()], &k).unwrap();
    let out = to_tensor_impl(&[a.clone(), b.clone()], &k).unwrap();
    assert_eq!((out.dtype(), &declared), (&arr(DataType::Float32, 2), &arr(DataType::Float32, 2)));
    assert_eq!(rows_f64(&out), vec![vec![Some(1.0), Some(-1.0)], vec![Some(-1.0), Some(4.0)]]);

    let nan = ToTensorKwargs { nulls: Some("nan".into()), ..kw() };
    let rows = rows_f64(&to_tensor_impl(&[a.clone(), b.clone()], &nan).unwrap());
    assert!(rows[0][1].unwrap().is_nan() && rows[1][0].unwrap().is_nan(), "{rows:?}");

    let err = to_tensor_impl(&[a.clone(), b.clone()], &kw()).unwrap_err();
    assert!(err.to_string().contains("null"), "{err}");
    let err = to_tensor_impl(&[a.clone(), b.clone()], &ToTensorKwargs { nulls: Some("fill".into()), ..kw() })
        .unwrap_err();
    assert!(matches!(err, PolarsError::InvalidOperation(_)), "{err}");
    let err = to_tensor_impl(&[a, b], &ToTensorKwargs { nulls: Some("mask".into()), ..kw() }).unwrap_err();
    assert!(err.to_string().contains("mask"), "{err}");
}

#[test]
fn lists_need_a_width_and_must_all_have_it() {
    let lists =
        Series::new("l".into(), [Series::new("".into(), &[1i32, 2]), Series::new("".into(), &[3i32, 4])]);
    assert!(matches!(lists.dtype(), DataType::List(_)));
    let err = to_tensor_impl(std::slice::from_ref(&lists), &kw()).unwrap_err();
    assert!(err.to_string().contains("width"), "{err}");

    let two = ToTensorKwargs { width: Some(2), ..kw() };
    let out = to_tensor_impl(std::slice::from_ref(&lists), &two).unwrap();
    assert_eq!(out.dtype(), &arr(DataType::Int32, 2));
    assert_eq!(rows_f64(&out), vec![vec![Some(1.0), Some(2.0)], vec![Some(3.0), Some(4.0)]]);

    let three = ToTensorKwargs { width: Some(3), ..kw() };
    let err = to_tensor_impl(std::slice::from_ref(&lists), &three).unwrap_err();
    assert!(matches!(err, PolarsError::ShapeMismatch(_)), "{err}");

    let ragged =
        Series::new("r".into(), [Series::new("".into(), &[1i32, 2]), Series::new("".into(), &[3i32])]);
    let err = to_tensor_impl(&[ragged], &two).unwrap_err();
    assert!(err.to_string().contains("length"), "{err}");
}

#[test]
fn array_columns_pass_through_or_cast() {
    let flat = Series::new("x".into(), &[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cells = flat.reshape_array(&[ReshapeDimension::Infer, ReshapeDimension::new(3)]).unwrap();
    assert_eq!(cells.dtype(), &arr(DataType::Float64, 3));
    let same = to_tensor_impl(std::slice::from_ref(&cells), &kw()).unwrap();
    assert_eq!((same.dtype(), rows_f64(&same)), (cells.dtype(), rows_f64(&cells)));
    let k = ToTensorKwargs { dtype: Some("int16".into()), ..kw() };
    let cast = to_tensor_impl(&[cells], &k).unwrap();
    assert_eq!(cast.dtype(), &arr(DataType::Int16, 3));
    assert_eq!(rows_f64(&cast)[1], vec![Some(4.0), Some(5.0), Some(6.0)]);
}

#[test]
fn bad_input_is_a_polars_error() {
    let s = Series::new("s".into(), &["a", "b"]);
    let n = Series::new("n".into(), &[1.0f64, 2.0]);
    let err = to_tensor_impl(&[n.clone(), s], &kw()).unwrap_err();
    assert!(matches!(err, PolarsError::InvalidOperation(_)) && err.to_string().contains("str"), "{err}");

    // One row would be broadcast (a literal); three rows against two are a mismatch.
    let long = Series::new("long".into(), &[1.0f64, 2.0, 3.0]);
    let err = to_tensor_impl(&[n.clone(), long], &kw()).unwrap_err();
    assert!(matches!(err, PolarsError::ShapeMismatch(_)), "{err}");

    let err = to_tensor_impl(
        std::slice::from_ref(&n),
        &ToTensorKwargs { dtype: Some("complex128".into()), ..kw() },
    );
    assert!(err.is_err());
    assert!(output_dtype(&[], &kw()).is_err());

    let empty = Series::new_empty("e".into(), &DataType::Float32);
    let out = to_tensor_impl(&[empty.clone(), empty], &kw()).unwrap();
    assert_eq!((out.len(), out.dtype()), (0, &arr(DataType::Float32, 2)));
}

#[test]
fn temporal_columns_stack_as_their_integer_storage() {
    let d = Series::new("d".into(), &[0i32, 1]).cast(&DataType::Date).unwrap();
    let out = to_tensor_impl(&[d.clone(), d], &kw()).unwrap();
    assert_eq!(out.dtype(), &arr(DataType::Int32, 2));
    assert_eq!(rows_f64(&out)[1], vec![Some(1.0), Some(1.0)]);
}

#[test]
fn tensor_extension_columns_take_their_cell_shape_from_the_metadata() {
    let cells = dlframe::Tensor::from_vec((0..12).collect::<Vec<i32>>(), vec![2, 2, 3]).unwrap();
    let (field, array) = dlframe::arrow::tensor_to_column(&cells, "t").unwrap();
    let s = dlframe::polars::arrow_to_series(&field, array).unwrap();
    assert!(matches!(s.dtype(), DataType::Extension(..)), "{}", s.dtype());
    let out = to_tensor_impl(std::slice::from_ref(&s), &kw()).unwrap();
    assert_eq!(out.dtype(), &arr(arr(DataType::Int32, 3), 2));
    let k = ToTensorKwargs { dtype: Some("float64".into()), ..kw() };
    assert_eq!(output_dtype(&[s.dtype()], &k).unwrap(), arr(arr(DataType::Float64, 3), 2));
    let out = to_tensor_impl(&[s], &k).unwrap();
    let row1 = out.array().unwrap().get_as_series(1).unwrap();
    assert_eq!(rows_f64(&row1)[1], vec![Some(9.0), Some(10.0), Some(11.0)]);
}

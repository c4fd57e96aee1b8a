//! float8 (e4m3fn, e5m2) end to end in Rust: `dlframe.float8_*` extension columns over
//! FixedSizeBinary(1) <-> DLPack 1.1 float8 tensors without copying, the two formats told apart
//! by their fields alone, and checked casts that name the row and column of a value out of range.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray, Float32Array};
use arrow_buffer::{Buffer, NullBuffer};
use arrow_schema::{DataType, FieldRef};
use dlframe::arrow::{columns_to_tensor, tensor_to_column, to_tensor};
use dlframe::dtype::{EXTENSION_NAME_KEY, F8E4M3FN, F8E5M2};
use dlframe::ffi::dlpack::type_code;
use dlframe::options::{ExportOptions, NullPolicy, Scalar};
use dlframe::{DType, Error, ForeignTensor, Tensor, export_versioned};

/// A float8 column of `dtype` with these values (rounded), `None` a null.
fn f8_column(name: &str, dtype: DType, values: &[Option<f64>]) -> (FieldRef, ArrayRef) {
    let bits: Vec<u8> = values
        .iter()
        .map(|v| {
            let v = v.unwrap_or(0.0);
            if dtype == DType::Float8E4M3FN {
                F8E4M3FN::from_f64(v).to_bits()
            } else {
                F8E5M2::from_f64(v).to_bits()
            }
        })
        .collect();
    let nulls =
        values.iter().any(Option::is_none).then(|| NullBuffer::from_iter(values.iter().map(Option::is_some)));
    let array = FixedSizeBinaryArray::new(1, Buffer::from_vec(bits), nulls);
    (Arc::new(dtype.arrow_field(name, true)), Arc::new(array))
}

fn one(field: &FieldRef, array: &ArrayRef, opts: &ExportOptions) -> dlframe::Result<Tensor> {
    to_tensor(field, std::slice::from_ref(array), opts).map(|c| c.values)
}

fn f32_column(name: &str, values: &[f32]) -> (FieldRef, ArrayRef) {
    (
        Arc::new(arrow_schema::Field::new(name, DataType::Float32, false)),
        Arc::new(Float32Array::from(values.to_vec())),
    )
}

#[test]
fn float8_columns_are_dlpack_float8_tensors_without_copying_and_come_back() {
    for (dtype, code, ext) in [
        (DType::Float8E4M3FN, type_code::KDL_FLOAT8_E4M3FN, "dlframe.float8_e4m3fn"),
        (DType::Float8E5M2, type_code::KDL_FLOAT8_E5M2, "dlframe.float8_e5m2"),
    ] {
        let (field, array) = f8_column("w", dtype, &[Some(1.5), Some(-2.0), Some(0.25)]);
        let t = one(&field, &array, &ExportOptions::default()).unwrap();
        assert_eq!((t.dtype(), t.shape()), (dtype, &[3i64][..]));
        assert_eq!(t.data_ptr(), array.to_data().buffers()[0].as_ptr(), "the column was copied");
        let dl = t.dtype().to_dlpack();
        assert_eq!((dl.code, dl.bits, dl.lanes), (code, 8, 1));
        let raw = export_versioned(t).into_raw();
        // SAFETY: a fresh export, imported once.
        let back = unsafe { ForeignTensor::from_versioned(raw) }.unwrap().into_tensor();
        let (f, a) = tensor_to_column(&back, "w").unwrap();
        assert_eq!(f.metadata().get(EXTENSION_NAME_KEY).map(String::as_str), Some(ext));
        assert_eq!(a.data_type(), &DataType::FixedSizeBinary(1));
        assert_eq!(a.to_data().buffers()[0].as_slice(), array.to_data().buffers()[0].as_slice());
    }
}

#[test]
fn the_two_formats_share_their_storage_but_not_their_values() {
    // 0x3c is 1.0 in e5m2 and 1.5 in e4m3fn: only the fields tell them apart.
    let (fa, a) = f8_column("a", DType::Float8E4M3FN, &[Some(1.5), Some(448.0)]);
    let (fb, b) = f8_column("b", DType::Float8E5M2, &[Some(1.0), Some(57344.0)]);
    let fields = [fa.clone(), fb.clone()];
    let m =
        columns_to_tensor(&fields, &[vec![a.clone()], vec![b.clone()]], &ExportOptions::default()).unwrap();
    // float8 + float8 of the other format: float16, which holds both exactly.
    assert_eq!(m.values.dtype(), DType::Float16);
    let got: Vec<f32> = m.values.as_slice::<half::f16>().unwrap().iter().map(|v| v.to_f32()).collect();
    assert_eq!(got, [1.5, 1.0, 448.0, 57344.0]);
    // Asking for e4m3fn converts the e5m2 column's values (57344 does not fit: refused, named).
    let opts = ExportOptions { dtype: Some(DType::Float8E4M3FN), ..Default::default() };
    let e = columns_to_tensor(&fields, &[vec![a], vec![b]], &opts).unwrap_err();
    match &e {
        Error::ValueOutOfRange { value, place, target } => {
            assert!(value.starts_with("57344") && target == "float8_e4m3fn", "{e}");
            assert!(place.to_string().contains("row 1") && place.to_string().contains("'b'"), "{e}");
        }
        e => panic!("{e}"),
    }
}

#[test]
fn casts_into_float8_round_once_and_refuse_what_is_out_of_range() {
    let to = |d: DType| ExportOptions { dtype: Some(d), ..Default::default() };
    // Rounds to nearest even: 1.0625 is a tie between 1 and 1.125 in e4m3fn.
    let (f, a) = f32_column("x", &[1.0625, 448.0, -0.1, f32::NAN]);
    let t = one(&f, &a, &to(DType::Float8E4M3FN)).unwrap();
    let got: Vec<f64> = t.as_slice::<F8E4M3FN>().unwrap().iter().map(|v| v.to_f64()).collect();
    assert_eq!(&got[..3], &[1.0, 448.0, F8E4M3FN::from_f64(-0.1).to_f64()]);
    assert!(got[3].is_nan());
    // e4m3fn tops out at 448 and has no infinity: both refused, naming row and column.
    for (bad, row) in [(500.0f32, 2), (f32::INFINITY, 1)] {
        let values: Vec<f32> = (0..4).map(|i| if i == row { bad } else { 1.0 }).collect();
        let (f, a) = f32_column("x", &values);
        let e = one(&f, &a, &to(DType::Float8E4M3FN)).unwrap_err();
        assert!(matches!(e, Error::ValueOutOfRange { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("row {row}")) && msg.contains("'x'") && msg.contains("float8_e4m3fn"),
            "{msg}"
        );
    }
    // e5m2 has infinities: an infinity stays one, a finite value beyond 57344 is refused.
    let (f, a) = f32_column("y", &[f32::INFINITY, 57344.0]);
    let t = one(&f, &a, &to(DType::Float8E5M2)).unwrap();
    let got: Vec<f64> = t.as_slice::<F8E5M2>().unwrap().iter().map(|v| v.to_f64()).collect();
    assert_eq!(got, [f64::INFINITY, 57344.0]);
    let (f, a) = f32_column("y", &[1.0, 70000.0]);
    assert!(matches!(one(&f, &a, &to(DType::Float8E5M2)), Err(Error::ValueOutOfRange { .. })));
    // Integers: int8 fits e4m3fn's range but rounds, which is refused unless asked for.
    let (f, a): (FieldRef, ArrayRef) = (
        Arc::new(arrow_schema::Field::new("i", DataType::Int8, false)),
        Arc::new(arrow_array::Int8Array::from(vec![16, 17])),
    );
    assert!(matches!(one(&f, &a, &to(DType::Float8E4M3FN)), Err(Error::InexactCast { .. })));
    let round = ExportOptions { inexact: dlframe::options::Inexact::Round, ..to(DType::Float8E4M3FN) };
    let t = one(&f, &a, &round).unwrap();
    assert_eq!(
        t.as_slice::<F8E4M3FN>().unwrap().iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
        [16.0, 16.0]
    );
}

#[test]
fn float8_nulls_are_filled_and_widening_is_exact() {
    let (f, a) = f8_column("z", DType::Float8E5M2, &[Some(0.5), None, Some(-3.0)]);
    let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Float(2.0)), ..Default::default() };
    let t = one(&f, &a, &opts).unwrap();
    assert_eq!(
        t.as_slice::<F8E5M2>().unwrap().iter().map(|v| v.to_f64()).collect::<Vec<_>>(),
        [0.5, 2.0, -3.0]
    );
    let wide = ExportOptions { dtype: Some(DType::Float32), ..opts };
    let t = one(&f, &a, &wide).unwrap();
    assert_eq!(t.as_slice::<f32>().unwrap(), [0.5, 2.0, -3.0]);
    // A fill that does not fit is refused.
    let bad = ExportOptions { nulls: NullPolicy::Fill(Scalar::Float(1e6)), ..opts };
    assert!(matches!(one(&f, &a, &bad), Err(Error::ValueOutOfRange { .. })));
}

//! bfloat16 end to end in Rust: `lance.bfloat16` columns (FixedSizeBinary(2) with the
//! extension name) <-> DLPack `kDLBfloat` tensors without copying, nulls, casts that round once
//! to nearest even and refuse overflow, and promotion next to the other dtypes.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, FixedSizeBinaryArray, FixedSizeListArray, Float32Array, Float64Array, Int8Array,
};
use arrow_buffer::{Buffer, NullBuffer};
use arrow_schema::{DataType, Field, FieldRef};
use dlframe::arrow::{TensorMetadata, columns_to_tensor, tensor_to_column, to_tensor};
use dlframe::dtype::{BFLOAT16_EXTENSION, EXTENSION_NAME_KEY};
use dlframe::ffi::dlpack::type_code;
use dlframe::options::{ExportOptions, Inexact, NullPolicy, Scalar};
use dlframe::{DType, Error, ForeignTensor, Tensor, export_versioned};
use half::bf16;

/// A `lance.bfloat16` column of these values (`None` is a null).
fn bf16_column(name: &str, values: &[Option<f32>]) -> (FieldRef, ArrayRef) {
    let bits: Vec<u8> =
        values.iter().flat_map(|v| bf16::from_f32(v.unwrap_or(0.0)).to_bits().to_le_bytes()).collect();
    let nulls =
        values.iter().any(Option::is_none).then(|| NullBuffer::from_iter(values.iter().map(Option::is_some)));
    let array = FixedSizeBinaryArray::new(2, Buffer::from_vec(bits), nulls);
    (Arc::new(DType::BFloat16.arrow_field(name, true)), Arc::new(array))
}

fn bf16_values(t: &Tensor) -> Vec<f32> {
    t.as_slice::<bf16>().unwrap().iter().map(|v| v.to_f32()).collect()
}

fn one(field: &FieldRef, array: &ArrayRef, opts: &ExportOptions) -> dlframe::Result<Tensor> {
    to_tensor(field, std::slice::from_ref(array), opts).map(|c| c.values)
}

#[test]
fn a_lance_bfloat16_column_is_a_kdlbfloat_tensor_without_copying_and_comes_back() {
    let (field, array) = bf16_column("w", &[Some(1.5), Some(-2.0), Some(3.140625)]);
    let t = one(&field, &array, &ExportOptions::default()).unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::BFloat16, &[3i64][..]));
    assert_eq!(t.data_ptr(), array.to_data().buffers()[0].as_ptr(), "the column was copied");
    let dl = t.dtype().to_dlpack();
    assert_eq!((dl.code, dl.bits, dl.lanes), (type_code::KDL_BFLOAT, 16, 1));
    assert_eq!(bf16_values(&t), [1.5, -2.0, 3.140625]);

    // Through a DLPack capsule and back to Arrow: the same bytes, the extension kept.
    let raw = export_versioned(t).into_raw();
    // SAFETY: a fresh export, imported once.
    let back = unsafe { ForeignTensor::from_versioned(raw) }.unwrap().into_tensor();
    let (f, a) = tensor_to_column(&back, "w").unwrap();
    assert_eq!(f.metadata().get(EXTENSION_NAME_KEY).map(String::as_str), Some(BFLOAT16_EXTENSION));
    assert_eq!(a.data_type(), &DataType::FixedSizeBinary(2));
    assert_eq!(a.to_data().buffers()[0].as_ptr(), back.data_ptr(), "the way back copied");
    assert_eq!(a.to_data().buffers()[0].as_slice(), array.to_data().buffers()[0].as_slice());
}

#[test]
fn two_opaque_bytes_without_the_extension_are_not_bfloat16() {
    let array: ArrayRef = Arc::new(FixedSizeBinaryArray::new(2, Buffer::from_vec(vec![0u8; 4]), None));
    let field: FieldRef = Arc::new(Field::new("b", DataType::FixedSizeBinary(2), false));
    let e = one(&field, &array, &ExportOptions::default()).unwrap_err();
    assert!(matches!(e, Error::UnsupportedArrowType { .. }), "{e}");
    assert!(e.to_string().contains("column 'b'"), "{e}");
}

#[test]
fn nd_bfloat16_tensors_are_tensor_columns_of_lance_bfloat16_items() {
    let values: Vec<bf16> = (0..6).map(|i| bf16::from_f32(i as f32 * 0.5)).collect();
    let t = Tensor::from_vec(values, vec![2, 3]).unwrap();
    let (field, array) = tensor_to_column(&t, "m").unwrap();
    assert_eq!(TensorMetadata::from_field(&field).unwrap().unwrap().shape, vec![3]);
    let list = array.as_fixed_size_list();
    let DataType::FixedSizeList(item, 3) = field.data_type() else { panic!("{}", field.data_type()) };
    assert_eq!(item.metadata().get(EXTENSION_NAME_KEY).map(String::as_str), Some(BFLOAT16_EXTENSION));
    assert_eq!(list.values().data_type(), &DataType::FixedSizeBinary(2));
    // And back into a tensor, zero-copy, through the same rule.
    let again = one(&field, &array, &ExportOptions::default()).unwrap();
    assert_eq!((again.shape(), again.data_ptr()), (&[2i64, 3][..], t.data_ptr()));
}

#[test]
fn nulls_are_filled_masked_or_refused() {
    let (field, array) = bf16_column("w", &[Some(1.0), None, Some(3.0)]);
    let e = one(&field, &array, &ExportOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Nulls { null_count: 1, .. }), "{e}");
    let fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Float(-1.5)), ..Default::default() };
    assert_eq!(bf16_values(&one(&field, &array, &fill).unwrap()), [1.0, -1.5, 3.0]);
    let nan = ExportOptions { nulls: NullPolicy::Nan, ..Default::default() };
    assert!(bf16_values(&one(&field, &array, &nan).unwrap())[1].is_nan());
    let masked = to_tensor(
        &field,
        std::slice::from_ref(&array),
        &ExportOptions { nulls: NullPolicy::Mask, ..Default::default() },
    )
    .unwrap();
    assert_eq!(masked.values.data_ptr(), array.to_data().buffers()[0].as_ptr());
    assert_eq!(masked.mask.unwrap().as_slice::<bool>().unwrap(), &[true, false, true]);
    // A fill beyond bfloat16's range would become infinite: refused whatever the data.
    let huge = ExportOptions { nulls: NullPolicy::Fill(Scalar::Float(1e39)), ..Default::default() };
    assert!(matches!(one(&field, &array, &huge), Err(Error::ValueOutOfRange { .. })));
}

#[test]
fn casts_round_once_to_nearest_even_and_refuse_overflow() {
    let as_bf16 = ExportOptions { dtype: Some(DType::BFloat16), ..Default::default() };
    // 1 + 2^-8 is the tie between 1 and 1 + 2^-7 (even: 1); 1 + 3 * 2^-8 ties to 1 + 2^-6.
    let f32s: ArrayRef =
        Arc::new(Float32Array::from(vec![1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -0.0]));
    let field: FieldRef = Arc::new(Field::new("x", DataType::Float32, false));
    let t = one(&field, &f32s, &as_bf16).unwrap();
    assert_eq!(bf16_values(&t), [1.0, 1.0 + 2f32.powi(-6), -0.0]);
    // Just above a tie in f64 (the bit f32 would drop) rounds up: no double rounding.
    let above_tie = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    let f64s: ArrayRef = Arc::new(Float64Array::from(vec![above_tie]));
    let field64: FieldRef = Arc::new(Field::new("y", DataType::Float64, false));
    assert_eq!(bf16_values(&one(&field64, &f64s, &as_bf16).unwrap()), [1.0 + 2f32.powi(-7)]);
    // An integer just above a tie, beyond 2^53: a double would round it onto the tie.
    let i64s: ArrayRef =
        Arc::new(arrow_array::Int64Array::from(vec![(1i64 << 60) + (1 << 52) + 1, (1 << 60) + (1 << 52)]));
    let fi: FieldRef = Arc::new(Field::new("i", DataType::Int64, false));
    let rounding = ExportOptions { inexact: Inexact::Round, ..as_bf16 };
    let got = bf16_values(&one(&fi, &i64s, &rounding).unwrap());
    assert_eq!(got, [2f32.powi(60) + 2f32.powi(53), 2f32.powi(60)]);
    // By default an integer that bfloat16 holds only rounded is refused, naming its row.
    let e = one(&fi, &i64s, &as_bf16).unwrap_err();
    assert!(matches!(&e, Error::InexactCast { place, .. } if place.to_string().contains("row 0")), "{e}");
    // float32's largest values round beyond bfloat16's largest: refused, naming the row.
    let big: ArrayRef = Arc::new(Float32Array::from(vec![1.0, f32::MAX]));
    let e = one(&field, &big, &as_bf16).unwrap_err();
    assert!(matches!(&e, Error::ValueOutOfRange { place, .. } if place.to_string().contains("row 1")), "{e}");
    // bfloat16 -> float32 is exact.
    let (wf, wa) = bf16_column("w", &[Some(3.140625), Some(-1e30)]);
    let back = one(&wf, &wa, &ExportOptions { dtype: Some(DType::Float32), ..Default::default() }).unwrap();
    assert_eq!(back.as_slice::<f32>().unwrap(), &[3.140625, bf16::from_f32(-1e30).to_f32()]);
}

#[test]
fn stacking_promotes_like_torch_and_jax() {
    let (wf, wa) = bf16_column("w", &[Some(1.0), Some(2.0)]);
    let i8s: ArrayRef = Arc::new(Int8Array::from(vec![-3, 4]));
    let i8f: FieldRef = Arc::new(Field::new("i", DataType::Int8, false));
    let m = columns_to_tensor(&[wf.clone(), i8f], &[vec![wa.clone()], vec![i8s]], &ExportOptions::default())
        .unwrap()
        .values;
    assert_eq!((m.dtype(), bf16_values(&m)), (DType::BFloat16, vec![1.0, -3.0, 2.0, 4.0]));
    let halves: ArrayRef = Arc::new(arrow_array::Float16Array::from(vec![half::f16::ONE, half::f16::ZERO]));
    let hf: FieldRef = Arc::new(Field::new("h", DataType::Float16, false));
    let m =
        columns_to_tensor(&[wf, hf], &[vec![wa], vec![halves]], &ExportOptions::default()).unwrap().values;
    assert_eq!(m.dtype(), DType::Float32);
    // The list of a bfloat16 column's cells stays bfloat16.
    let (_, cells) = bf16_column("c", &[Some(1.0), Some(2.0), Some(3.0), Some(4.0)]);
    let item = Arc::new(DType::BFloat16.arrow_field("item", true));
    let list = FixedSizeListArray::new(item, 2, cells, None);
    let lf: FieldRef = Arc::new(Field::new("l", list.data_type().clone(), false));
    let t = one(&lf, &(Arc::new(list) as ArrayRef), &ExportOptions::default()).unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::BFloat16, &[2i64, 2][..]));
}

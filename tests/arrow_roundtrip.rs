//! Arrow -> DLPack -> Arrow round trips: same bytes, same logical type, same memory.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::*;
use arrow_buffer::{Buffer, NullBuffer};
use arrow_schema::{DataType, Field, FieldRef};
use dlframe::arrow::{TensorMetadata, array_to_tensor, column_to_tensor, tensor_to_array, tensor_to_column};
use dlframe::testing::{DropCounter, ForeignFixture};
use dlframe::{DType, Error, ForeignTensor, Tensor, export_versioned};

/// Exports through a versioned managed tensor and imports it again, as a consumer would.
fn through_dlpack(t: Tensor) -> Tensor {
    let raw = export_versioned(t).into_raw();
    // SAFETY: a fresh export, handed to the importer once.
    unsafe { ForeignTensor::from_versioned(raw) }.unwrap().into_tensor()
}

/// The address of the first value of a primitive leaf, following FixedSizeList children.
fn first_value_ptr(array: &dyn Array) -> *const u8 {
    match array.data_type() {
        DataType::FixedSizeList(..) => first_value_ptr(array.as_fixed_size_list().values().as_ref()),
        _ => {
            let data = array.to_data();
            let size = data.data_type().primitive_width().unwrap();
            // SAFETY: offset is within the buffer of a valid array.
            unsafe { data.buffers()[0].as_ptr().add(data.offset() * size) }
        }
    }
}

fn assert_round_trip(field: FieldRef, array: ArrayRef) {
    let t = column_to_tensor(&field, array.as_ref()).unwrap();
    assert_eq!(
        t.data_ptr(),
        first_value_ptr(array.as_ref()),
        "{}: Arrow -> tensor copied",
        field.data_type()
    );
    assert!(t.readonly());
    let back_t = through_dlpack(t);
    let (back_field, back) = tensor_to_column(&back_t, field.name()).unwrap();
    assert_eq!(back.data_type(), array.data_type());
    assert_eq!(back_field.metadata(), field.metadata());
    assert_eq!(back.to_data(), array.to_data(), "{}", field.data_type());
    assert_eq!(
        first_value_ptr(back.as_ref()),
        first_value_ptr(array.as_ref()),
        "{}: copied on the way back",
        field.data_type()
    );
}

fn sliced<T: ArrowPrimitiveType>(values: Vec<T::Native>) -> ArrayRef {
    let a = PrimitiveArray::<T>::from_iter_values(values);
    Arc::new(a.slice(3, a.len() - 5))
}

fn plain(array: ArrayRef) -> FieldRef {
    Arc::new(Field::new("x", array.data_type().clone(), true))
}

#[test]
fn every_primitive_type_round_trips_zero_copy_with_slices() {
    let arrays: Vec<ArrayRef> = vec![
        sliced::<Int8Type>((0..40).map(|i| i as i8 - 20).collect()),
        sliced::<Int16Type>((0..40).map(|i| i * -300).collect()),
        sliced::<Int32Type>((0..40).map(|i| i * 70_000).collect()),
        sliced::<Int64Type>((0..40).map(|i| i << 40).collect()),
        sliced::<UInt8Type>((0..40).collect()),
        sliced::<UInt16Type>((0..40).map(|i| i * 1000).collect()),
        sliced::<UInt32Type>((0..40).map(|i| i * 100_000_000).collect()),
        sliced::<UInt64Type>((0..40).map(|i| u64::MAX - i).collect()),
        sliced::<Float16Type>((0..40).map(|i| half::f16::from_f32(i as f32 / 4.0)).collect()),
        sliced::<Float32Type>((0..40).map(|i| i as f32 * 0.5).collect()),
        sliced::<Float64Type>((0..40).map(|i| -(i as f64) / 3.0).collect()),
    ];
    for a in arrays {
        assert_round_trip(plain(a.clone()), a);
    }
}

#[test]
fn temporal_types_come_back_with_their_logical_type() {
    let arrays: Vec<ArrayRef> = vec![
        sliced::<Date32Type>((0..20).collect()),
        sliced::<Date64Type>((0..20).map(|i| i * 86_400_000).collect()),
        sliced::<Time32SecondType>((0..20).collect()),
        sliced::<Time32MillisecondType>((0..20).collect()),
        sliced::<Time64MicrosecondType>((0..20).collect()),
        sliced::<Time64NanosecondType>((0..20).collect()),
        Arc::new(TimestampNanosecondArray::from_iter_values(0..20).with_timezone("UTC").slice(2, 9)),
        sliced::<TimestampSecondType>((0..20).collect()),
        sliced::<DurationMillisecondType>((0..20).collect()),
        sliced::<DurationNanosecondType>((0..20).collect()),
    ];
    for a in arrays {
        let t = array_to_tensor(a.as_ref()).unwrap();
        assert!(matches!(t.dtype(), DType::Int32 | DType::Int64));
        assert_round_trip(plain(a.clone()), a);
    }
}

fn fsl(values: ArrayRef, size: i32) -> ArrayRef {
    let item = Arc::new(Field::new("item", values.data_type().clone(), true));
    Arc::new(FixedSizeListArray::new(item, size, values, None))
}

#[test]
fn fixed_size_lists_become_nd_and_come_back_nested() {
    let flat: ArrayRef = Arc::new(Float32Array::from_iter_values((0..60).map(|i| i as f32)));
    let one = fsl(flat.clone(), 3).slice(2, 15);
    let t = array_to_tensor(one.as_ref()).unwrap();
    assert_eq!((t.shape(), t.strides()), (&[15i64, 3][..], &[3i64, 1][..]));
    assert_eq!(t.as_slice::<f32>().unwrap()[0], 6.0);
    assert_round_trip(plain(one.clone()), one);

    let ints: ArrayRef = Arc::new(Int16Array::from_iter_values(0..120));
    let nested = fsl(fsl(ints, 2), 3).slice(1, 18);
    let t = array_to_tensor(nested.as_ref()).unwrap();
    assert_eq!(t.shape(), &[18, 3, 2]);
    assert_eq!(t.as_slice::<i16>().unwrap()[0], 6);
    assert_round_trip(plain(nested.clone()), nested);
}

fn tensor_field(meta: &TensorMetadata, storage: &ArrayRef) -> FieldRef {
    Arc::new(Field::new("t", storage.data_type().clone(), true).with_metadata(meta.field_metadata()))
}

#[test]
fn fixed_shape_tensors_with_and_without_permutation() {
    let values: ArrayRef = Arc::new(Int32Array::from_iter_values(0..(4 * 2 * 3)));
    let item = Arc::new(Field::new("item", DataType::Int32, true));
    let storage: ArrayRef = Arc::new(FixedSizeListArray::new(item, 6, values, None));

    let meta = TensorMetadata::parse(r#"{"shape":[2,3]}"#).unwrap();
    let t = column_to_tensor(&tensor_field(&meta, &storage), storage.as_ref()).unwrap();
    assert_eq!((t.shape(), t.strides()), (&[4i64, 2, 3][..], &[6i64, 3, 1][..]));
    assert_round_trip(tensor_field(&meta, &storage), storage.clone());

    // Logical (3, 2) over physical (2, 3): logical [i, j] is physical [j, i].
    let meta = TensorMetadata::parse(r#"{"shape":[2,3],"permutation":[1,0]}"#).unwrap();
    let t = column_to_tensor(&tensor_field(&meta, &storage), storage.as_ref()).unwrap();
    assert_eq!((t.shape(), t.strides()), (&[4i64, 3, 2][..], &[6i64, 1, 3][..]));
    assert_round_trip(tensor_field(&meta, &storage), storage.clone());

    // A transposed foreign tensor, with no recorded type, becomes a permuted tensor column.
    let (owner, _) = DropCounter::new((0..24).collect::<Vec<i32>>());
    let base = owner.tensor(vec![4, 2, 3]);
    // SAFETY: same memory and owner; the strides permute the two inner dims of a dense layout.
    let transposed = unsafe {
        Tensor::from_raw_parts(
            base.data_ptr() as *mut u8,
            vec![4, 3, 2],
            Some(vec![6, 1, 3]),
            DType::Int32,
            dlframe::Device::Cpu,
            false,
            base.owner().clone(),
        )
    }
    .unwrap();
    let (field, array) = tensor_to_column(&transposed, "t").unwrap();
    assert_eq!(TensorMetadata::from_field(&field).unwrap(), Some(meta));
    assert_eq!(first_value_ptr(array.as_ref()), base.data_ptr());
}

#[test]
fn arrow_rs_metadata_spelling_is_read() {
    let values: ArrayRef = Arc::new(Float64Array::from_iter_values((0..8).map(f64::from)));
    let storage = fsl(values, 4);
    let md = [
        ("ARROW:extension:name".to_string(), "arrow.fixed_shape_tensor".to_string()),
        (
            "ARROW:extension:metadata".to_string(),
            r#"{"shape":[2,2],"dim_names":null,"permutations":null}"#.to_string(),
        ),
    ];
    let field = Arc::new(Field::new("t", storage.data_type().clone(), true).with_metadata(md.into()));
    assert_eq!(column_to_tensor(&field, storage.as_ref()).unwrap().shape(), &[2, 2, 2]);
}

#[test]
fn foreign_tensors_without_a_recorded_type_get_default_arrow_types() {
    let (fixture, deletes) = ForeignFixture::new((0..12).map(|i| i as f64).collect::<Vec<_>>());
    // SAFETY: the fixture hands over a live tensor.
    let t = unsafe { ForeignTensor::from_versioned(fixture.into_raw()) }.unwrap().into_tensor();
    let array = tensor_to_array(&t).unwrap();
    assert_eq!(array.data_type(), &DataType::Float64);
    assert_eq!(array.as_primitive::<Float64Type>().value(11), 11.0);
    drop(t);
    assert_eq!(deletes.get(), 0, "the Arrow array still uses the memory");
    drop(array);
    assert_eq!(deletes.get(), 1);
}

#[test]
fn the_last_arrow_buffer_dropped_on_another_thread_frees_once() {
    let (owner, drops) = DropCounter::new((0..1000).map(|i| i as f32).collect::<Vec<_>>());
    let array = tensor_to_array(&through_dlpack(owner.tensor(vec![1000]))).unwrap();
    let sliced = array.slice(10, 5);
    drop(array);
    assert_eq!(drops.get(), 0);
    let handle = std::thread::spawn(move || {
        assert_eq!(sliced.as_primitive::<Float32Type>().value(0), 10.0);
        drop(sliced);
    });
    handle.join().unwrap();
    assert_eq!(drops.get(), 1);
}

#[test]
fn empty_and_zero_dim_tensors() {
    let empty: ArrayRef = Arc::new(Int64Array::from_iter_values(std::iter::empty()));
    let t = array_to_tensor(empty.as_ref()).unwrap();
    assert_eq!(t.shape(), &[0]);
    let back = tensor_to_array(&through_dlpack(t)).unwrap();
    assert_eq!(back.len(), 0);
    let scalar = Tensor::from_vec(vec![2.5f32], vec![]).unwrap();
    let a = tensor_to_array(&scalar).unwrap();
    assert_eq!(a.as_primitive::<Float32Type>().values().as_ref(), &[2.5]);
    let wide = Tensor::from_vec(Vec::<u8>::new(), vec![0, 4]).unwrap();
    let (field, a) = tensor_to_column(&wide, "w").unwrap();
    assert_eq!((a.len(), TensorMetadata::from_field(&field).unwrap().unwrap().shape), (0, vec![4]));
}

fn buffer_error(e: Error) -> String {
    assert_eq!(e.kind(), dlframe::ErrorKind::Buffer, "{e}");
    e.to_string()
}

#[test]
fn unsupported_columns_get_a_reason_and_a_remedy() {
    let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
    assert!(buffer_error(array_to_tensor(strings.as_ref()).unwrap_err()).contains("encode them"));
    let dec: ArrayRef = Arc::new(Decimal128Array::from(vec![1, 2]).with_precision_and_scale(10, 2).unwrap());
    assert!(buffer_error(array_to_tensor(dec.as_ref()).unwrap_err()).contains("float64"));
    let dict: ArrayRef = Arc::new(vec!["x", "y", "x"].into_iter().collect::<DictionaryArray<Int32Type>>());
    assert!(buffer_error(array_to_tensor(dict.as_ref()).unwrap_err()).contains("dictionary"));
    let nulls: ArrayRef = Arc::new(Float32Array::new(
        vec![1.0, 2.0, 3.0].into(),
        Some(NullBuffer::from(vec![true, false, false])),
    ));
    let msg = buffer_error(array_to_tensor(nulls.as_ref()).unwrap_err());
    assert!(msg.contains("2 null") && msg.contains("fill"), "{msg}");
    let inner_nulls: ArrayRef = Arc::new(Float32Array::from(vec![Some(1.0), None]));
    assert!(
        buffer_error(array_to_tensor(fsl(inner_nulls, 2).as_ref()).unwrap_err()).contains("nested level 1")
    );
    let bools: ArrayRef = Arc::new(BooleanArray::from(vec![true, false]));
    assert!(buffer_error(array_to_tensor(bools.as_ref()).unwrap_err()).contains("bit-packs"));
    // Nulls confined to the part sliced away do not count.
    assert!(array_to_tensor(nulls.slice(0, 1).as_ref()).is_ok());
}

#[test]
fn a_misaligned_foreign_pointer_is_refused_with_the_remedy() {
    let (mut fixture, deletes) = ForeignFixture::new(vec![0u8; 17]);
    fixture.set_dtype(DType::Float64);
    fixture.shape = vec![2];
    fixture.managed.dl_tensor.byte_offset = 1;
    // SAFETY: 1 + 2 * 8 = 17 bytes are in bounds.
    let t = unsafe { ForeignTensor::from_versioned(fixture.into_raw()) }.unwrap().into_tensor();
    assert!(!t.is_aligned());
    let msg = buffer_error(tensor_to_array(&t).unwrap_err());
    assert!(msg.contains("not aligned") && msg.contains("copy=True"), "{msg}");
    drop(t);
    assert_eq!(deletes.get(), 1);
}

#[test]
fn strided_and_bool_tensors_need_the_copy_path() {
    let t = Tensor::from_vec((0..10).map(|i| i as f32).collect(), vec![10]).unwrap();
    // SAFETY: every second element of the same 10-element allocation.
    let strided = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr() as *mut u8,
            vec![5],
            Some(vec![2]),
            DType::Float32,
            dlframe::Device::Cpu,
            true,
            t.owner().clone(),
        )
    }
    .unwrap();
    assert!(buffer_error(tensor_to_array(&strided).unwrap_err()).contains("not contiguous"));
    // SAFETY: the same memory read backwards from its last element.
    let reversed = unsafe {
        Tensor::from_raw_parts(
            (t.data_ptr() as *mut u8).wrapping_add(36),
            vec![10],
            Some(vec![-1]),
            DType::Float32,
            dlframe::Device::Cpu,
            true,
            t.owner().clone(),
        )
    }
    .unwrap();
    assert!(tensor_to_array(&reversed).is_err());
    let bools = Tensor::from_buffer(Buffer::from_vec(vec![1u8, 0]), 0, vec![2], None, DType::Bool).unwrap();
    assert!(buffer_error(tensor_to_array(&bools).unwrap_err()).contains("bit-packs"));
}

#[test]
fn bad_layouts_are_errors_not_panics() {
    let buf = Buffer::from_vec(vec![0i32; 4]);
    let neg = Tensor::from_buffer(buf.clone(), 0, vec![-1], None, DType::Int32).unwrap_err();
    assert!(neg.to_string().contains("negative"));
    let huge = Tensor::from_buffer(buf, 0, vec![1 << 40, 1 << 40], None, DType::Int32).unwrap_err();
    assert!(huge.to_string().contains("overflows"));
}

#[test]
fn equal_length_lists_are_viewed_without_copying_and_ragged_ones_name_the_row() {
    use arrow_array::builder::{Int32Builder, ListBuilder};
    let mut b = ListBuilder::new(Int32Builder::new());
    for row in 0..6 {
        b.values().append_slice(&[row * 3, row * 3 + 1, row * 3 + 2]);
        b.append(true);
    }
    let list: ArrayRef = Arc::new(b.finish().slice(1, 4));
    let t = array_to_tensor(list.as_ref()).unwrap();
    assert_eq!((t.shape(), t.as_slice::<i32>().unwrap()[0]), (&[4i64, 3][..], 3));
    let child = list.as_list::<i32>().values().to_data();
    // SAFETY: offset within the child buffer.
    let child_ptr = unsafe { child.buffers()[0].as_ptr().add((child.offset() + 3) * 4) };
    assert_eq!(t.data_ptr(), child_ptr, "a view, not a copy");

    let mut b = ListBuilder::new(Int32Builder::new());
    b.values().append_slice(&[1, 2]);
    b.append(true);
    b.values().append_slice(&[3]);
    b.append(true);
    let ragged: ArrayRef = Arc::new(b.finish());
    let e = array_to_tensor(ragged.as_ref()).unwrap_err().to_string();
    assert!(e.contains("row 1") && e.contains("expected 2"), "{e}");
}

#[test]
fn sliced_chunks_concatenate_in_order_without_nulls_or_casts() {
    let field_of = |a: &ArrayRef| Arc::new(Field::new("c", a.data_type().clone(), false)) as FieldRef;
    let whole: ArrayRef = Arc::new(Int32Array::from_iter_values(0..100));
    let chunks: Vec<ArrayRef> =
        vec![whole.slice(3, 10), whole.slice(50, 0), whole.slice(60, 7), whole.slice(0, 1)];
    let t = dlframe::arrow::to_tensor(&field_of(&whole), &chunks, &Default::default()).unwrap().values;
    let expected: Vec<i32> = (3..13).chain(60..67).chain(0..1).collect();
    assert_eq!(t.as_slice::<i32>().unwrap(), expected.as_slice());
    assert!(t.copied());
    let lists = fsl(Arc::new(Float64Array::from_iter_values((0..40).map(f64::from))), 4);
    let parts: Vec<ArrayRef> = vec![lists.slice(1, 2), lists.slice(7, 3)];
    let t = dlframe::arrow::to_tensor(&field_of(&lists), &parts, &Default::default()).unwrap().values;
    assert_eq!(t.shape(), &[5, 4]);
    let expected: Vec<f64> = (4..12).chain(28..40).map(f64::from).collect();
    assert_eq!(t.as_slice::<f64>().unwrap(), expected.as_slice());
}

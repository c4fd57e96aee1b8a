//! A tensor as an Arrow array for the Arrow PyCapsule interface: the column a consumer gets
//! (its own type, or the one the consumer asks for), and that column through the Arrow C Device
//! data interface (`ArrowDeviceArray`), the export twin of `device.rs`. The array owns what it
//! points to; its consumer releases it once. Host memory only so far: a device tensor's array
//! (over its memory, with an event to wait on) is the GPU part of this interface, not built
//! yet.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{DataType, Field, FieldRef};

use super::{tensor_to_column_with, to_tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::arrow_device::ArrowDeviceArray;
use crate::options::{CopyPolicy, ExportOptions};
use crate::tensor::Tensor;

/// The Arrow column a host tensor exports: [`tensor_to_column_with`] (no copy where the memory
/// allows; one pass for bool tensors, which Arrow bit-packs, and strided layouts; N-d tensors as
/// `fixed_shape_tensor` columns). A consumer's `requested` field is honoured in two ways:
/// - another number type for the values (of a primitive column, or the cells of a list or
///   tensor column) gives a copy cast as `to_dlpack(dtype=...)` casts: checked value by value,
///   so a value that does not fit (300 into int8, 1.5 into an integer, 1e300 into float32,
///   2^53 + 1 into float64) is an error naming it, never a null or an infinity; a float
///   narrowed to a smaller float rounds, as with `dtype=`. Only the number type is taken from
///   the request: the layout (a list's size, the shape) stays the tensor's;
/// - a request for the plain storage of an extension column (a FixedSizeList for a
///   `fixed_shape_tensor`, without the extension's name), which is what pyarrow asks for when
///   it is given the extension type, gets that storage, unlabelled (no copy).
///
/// Any other request (booleans, decimals, strings) is not honoured: the column keeps its own
/// type, as the PyCapsule interface lets a producer do.
///
/// # Errors
/// The errors of [`tensor_to_column_with`]; [`Error::ValueOutOfRange`] for a value the
/// requested type cannot hold.
pub fn exported_column(tensor: &Tensor, requested: Option<&Field>) -> Result<(FieldRef, ArrayRef)> {
    let (mut field, mut array) = tensor_to_column_with(tensor, "", CopyPolicy::IfNeeded)?;
    let Some(requested) = requested else { return Ok((field, array)) };
    let numeric = |d: &DType| *d != DType::Bool && d.arrow_extension().is_none();
    let cast_to = values_dtype(requested.data_type()).filter(|d| numeric(d) && *d != tensor.dtype());
    // From any number type, bfloat16 and float8 included; into the ones Arrow has.
    if tensor.dtype() != DType::Bool && cast_to.is_some() {
        let opts = ExportOptions { dtype: cast_to, ..ExportOptions::default() };
        (field, array) =
            tensor_to_column_with(&to_tensor(&field, &[array], &opts)?.values, "", CopyPolicy::IfNeeded)?;
    }
    if requested.extension_type_name().is_none() && field.data_type() == requested.data_type() {
        field = Arc::new(Field::new(field.name(), field.data_type().clone(), field.is_nullable()));
    }
    Ok((field, array))
}

/// The dtype of a type's values: a primitive's own, a fixed-size list's cells' (nested too).
fn values_dtype(dt: &DataType) -> Option<DType> {
    match dt {
        DataType::FixedSizeList(f, _) => values_dtype(f.data_type()),
        other => DType::from_arrow_type(other),
    }
}

/// A host tensor as an Arrow device array on the CPU and its schema: [`exported_column`],
/// device type 1, id -1 (as pyarrow writes it), no event.
///
/// # Errors
/// [`Error::UnsupportedDevice`] for a tensor the host cannot read; the errors of
/// [`exported_column`]; [`Error::Arrow`] for a field the C data interface cannot carry.
pub fn export_tensor(
    tensor: &Tensor,
    requested: Option<&Field>,
) -> Result<(FFI_ArrowSchema, ArrowDeviceArray)> {
    let device = tensor.device();
    if !device.is_host_accessible() {
        return Err(Error::UnsupportedDevice {
            what: format!("an Arrow device array of a tensor on {device}"),
            remedy: "dlframe exports Arrow device arrays of host memory so far; move the tensor to the \
                     CPU first (Tensor.to_arrow(copy=True))",
        });
    }
    let (field, array) = exported_column(tensor, requested)?;
    let schema = FFI_ArrowSchema::try_from(field.as_ref())?;
    Ok((schema, ArrowDeviceArray::on_cpu(FFI_ArrowArray::new(&array.to_data()))))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float32Array, Float64Array, Int32Array};
    use arrow_schema::Field;

    use super::*;
    use crate::arrow::device::import_on_host;
    use crate::device::Device;
    use crate::ffi::dlpack::DLDevice;

    /// [`import_on_host`] of the structs `export_tensor` made.
    fn import(schema: FFI_ArrowSchema, mut array: ArrowDeviceArray) -> Result<(FieldRef, ArrayRef)> {
        // SAFETY: our own live structs, owned here, the array moved from once.
        unsafe { import_on_host(&mut array, &schema) }
    }

    #[test]
    fn a_host_tensor_is_exported_in_place_and_imported_back() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], vec![3, 2]).unwrap();
        let (schema, array) = export_tensor(&t, None).unwrap();
        assert_eq!((array.device_type, array.device_id), (1, -1));
        assert!(array.sync_event.is_null());
        let (field, back) = import(schema, array).unwrap();
        assert_eq!(field.extension_type_name(), Some(crate::arrow::FIXED_SHAPE_TENSOR));
        let values = back.to_data().child_data()[0].clone();
        assert_eq!(values.buffers()[0].as_ptr(), t.data_ptr(), "no copy");
        let flat = Float32Array::from(values);
        assert_eq!(flat.values(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn a_bool_tensor_is_packed_and_device_memory_is_refused_naming_the_device() {
        let t = Tensor::from_vec(vec![true, false, true], vec![3]).unwrap();
        let (schema, array) = export_tensor(&t, None).unwrap();
        let (_, back) = import(schema, array).unwrap();
        assert_eq!(back.as_ref(), &arrow_array::BooleanArray::from(vec![true, false, true]) as &dyn Array);

        let cuda = Device::from_dlpack(DLDevice { device_type: 2, device_id: 0 }).unwrap();
        let host = [0f32; 4];
        // SAFETY: a tensor labelled as CUDA memory, never read: the export refuses it first.
        let on_gpu = unsafe {
            Tensor::from_raw_parts(
                host.as_ptr() as *mut u8,
                vec![4],
                None,
                crate::DType::Float32,
                cuda,
                true,
                Arc::new(()),
            )
        }
        .unwrap();
        let e = export_tensor(&on_gpu, None).unwrap_err().to_string();
        assert!(e.contains("an Arrow device array of a tensor on cuda:0"), "{e}");
    }

    #[test]
    fn a_requested_number_type_is_cast_as_to_dlpack_casts_and_others_are_not_honoured() {
        let t = Tensor::from_vec(vec![1i32, 300], vec![2]).unwrap();
        let asked = |dt: DataType| Field::new("", dt, true);
        let (field, wide) = exported_column(&t, Some(&asked(DataType::Float64))).unwrap();
        assert_eq!(field.data_type(), &DataType::Float64);
        assert_eq!(wide.as_ref(), &Float64Array::from(vec![1.0, 300.0]) as &dyn Array);
        let e = exported_column(&t, Some(&asked(DataType::Int8))).unwrap_err().to_string();
        assert!(e.contains("300 at row 1") && e.contains("does not fit int8"), "{e}");
        let refused = |values: Vec<f64>, to: DataType| {
            let t = Tensor::from_vec(values, vec![1]).unwrap();
            exported_column(&t, Some(&Field::new("", to, true))).unwrap_err().to_string()
        };
        assert!(refused(vec![1.5], DataType::Int32).contains("does not fit int32"));
        assert!(refused(vec![1e300], DataType::Float32).contains("does not fit float32"));
        assert!(refused(vec![70000.0], DataType::Float16).contains("does not fit float16"));
        // Booleans, decimals and other layouts keep the tensor's own type, shared.
        for to in [DataType::Boolean, DataType::Decimal128(5, 0), DataType::Struct(Default::default())] {
            let (field, own) = exported_column(&t, Some(&asked(to))).unwrap();
            assert_eq!(field.data_type(), &DataType::Int32);
            assert_eq!(own.as_ref(), &Int32Array::from(vec![1, 300]) as &dyn Array);
            assert_eq!(own.to_data().buffers()[0].as_ptr(), t.data_ptr(), "its own type: no copy");
        }
        // A tensor column's cells are cast, its shape kept; asked for with the extension's name
        // it keeps the extension, asked for as plain storage it comes back plain.
        let cells = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], vec![1, 2, 3]).unwrap();
        let (own, _) = exported_column(&cells, None).unwrap();
        let storage = DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float64, true)), 6);
        let labelled = asked(storage.clone()).with_metadata(own.metadata().clone());
        let (field, cast) = exported_column(&cells, Some(&labelled)).unwrap();
        assert_eq!(field.extension_type_name(), Some(crate::arrow::FIXED_SHAPE_TENSOR));
        assert_eq!(field.metadata(), own.metadata(), "the shape [2, 3] is kept");
        let values = Float64Array::from(cast.to_data().child_data()[0].clone());
        assert_eq!(values.values(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (plain, _) = exported_column(&cells, Some(&asked(storage.clone()))).unwrap();
        assert_eq!((plain.data_type(), plain.extension_type_name()), (&storage, None));
        let (same, shared) = exported_column(&cells, Some(&asked(own.data_type().clone()))).unwrap();
        assert!(same.extension_type_name().is_none());
        assert_eq!(shared.to_data().child_data()[0].buffers()[0].as_ptr(), cells.data_ptr(), "no copy");
    }
}

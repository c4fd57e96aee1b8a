//! A tensor as an Arrow array for the Arrow PyCapsule interface: the column a consumer gets
//! (its own type, or the one the consumer asks for), and that column through the Arrow C Device
//! data interface (`ArrowDeviceArray`), the export twin of `device.rs`. The array owns what it
//! points to; its consumer releases it once. Host memory only so far: a device tensor's array
//! (over its memory, with an event to wait on) is the GPU part of this interface, not built
//! yet.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_cast::{CastOptions, can_cast_types, cast_with_options};
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{DataType, Field, FieldRef};

use super::tensor_to_column_with;
use crate::error::{Error, Result};
use crate::ffi::arrow_device::ArrowDeviceArray;
use crate::options::CopyPolicy;
use crate::tensor::Tensor;

/// The Arrow column a host tensor exports: [`tensor_to_column_with`] (no copy where the memory
/// allows; one pass for bool tensors, which Arrow bit-packs, and strided layouts; N-d tensors as
/// `fixed_shape_tensor` columns). When a consumer asks for another type that the column can be
/// cast to, it gets that type, in a copy; the cast is checked, so a value that does not fit is
/// an error, never a null. A type the column cannot be cast to is not honoured: the column keeps
/// its own, as the PyCapsule interface lets a producer do.
///
/// # Errors
/// The errors of [`tensor_to_column_with`]; [`Error::InvalidArgument`] for a value the
/// requested type cannot hold.
pub fn exported_column(tensor: &Tensor, requested: Option<&DataType>) -> Result<(FieldRef, ArrayRef)> {
    let (field, array) = tensor_to_column_with(tensor, "", CopyPolicy::IfNeeded)?;
    let Some(to) = requested.filter(|to| *to != field.data_type() && can_cast_types(field.data_type(), to))
    else {
        return Ok((field, array));
    };
    let checked = CastOptions { safe: false, ..CastOptions::default() };
    let cast = cast_with_options(&array, to, &checked)
        .map_err(|e| Error::InvalidArgument(format!("the requested type {to}: {e}")))?;
    Ok((Arc::new(Field::new(field.name(), to.clone(), field.is_nullable())), cast))
}

/// A host tensor as an Arrow device array on the CPU and its schema: [`exported_column`],
/// device type 1, id -1 (as pyarrow writes it), no event.
///
/// # Errors
/// [`Error::UnsupportedDevice`] for a tensor the host cannot read; the errors of
/// [`exported_column`]; [`Error::Arrow`] for a field the C data interface cannot carry.
pub fn export_tensor(
    tensor: &Tensor,
    requested: Option<&DataType>,
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
    use arrow_array::{Float32Array, Float64Array, Int32Array};

    use super::*;
    use crate::arrow::device::import_on_host;
    use crate::device::Device;
    use crate::ffi::dlpack::DLDevice;

    #[test]
    fn a_host_tensor_is_exported_in_place_and_imported_back() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], vec![3, 2]).unwrap();
        let (schema, mut array) = export_tensor(&t, None).unwrap();
        assert_eq!((array.device_type, array.device_id), (1, -1));
        assert!(array.sync_event.is_null());
        // SAFETY: our own live structs, moved from once.
        let (field, back) = unsafe { import_on_host(&mut array, &schema) }.unwrap();
        assert_eq!(field.extension_type_name(), Some(crate::arrow::FIXED_SHAPE_TENSOR));
        let values = back.to_data().child_data()[0].clone();
        assert_eq!(values.buffers()[0].as_ptr(), t.data_ptr(), "no copy");
        let flat = Float32Array::from(values);
        assert_eq!(flat.values(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn a_bool_tensor_is_packed_and_device_memory_is_refused_naming_the_device() {
        let t = Tensor::from_vec(vec![true, false, true], vec![3]).unwrap();
        let (schema, mut array) = export_tensor(&t, None).unwrap();
        // SAFETY: our own live structs, moved from once.
        let (_, back) = unsafe { import_on_host(&mut array, &schema) }.unwrap();
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
    fn a_requested_type_is_a_checked_cast_and_an_impossible_one_is_not_honoured() {
        let t = Tensor::from_vec(vec![1i32, 300], vec![2]).unwrap();
        let (field, wide) = exported_column(&t, Some(&DataType::Float64)).unwrap();
        assert_eq!(field.data_type(), &DataType::Float64);
        assert_eq!(wide.as_ref(), &Float64Array::from(vec![1.0, 300.0]) as &dyn Array);
        let e = exported_column(&t, Some(&DataType::Int8)).unwrap_err();
        assert!(e.to_string().contains("the requested type Int8") && e.to_string().contains("300"), "{e}");
        let (field, own) = exported_column(&t, Some(&DataType::Struct(Default::default()))).unwrap();
        assert_eq!(field.data_type(), &DataType::Int32);
        assert_eq!(own.as_ref(), &Int32Array::from(vec![1, 300]) as &dyn Array);
        assert_eq!(own.to_data().buffers()[0].as_ptr(), t.data_ptr(), "its own type: no copy");
    }
}

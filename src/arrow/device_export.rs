//! A tensor as an Arrow array through the Arrow C Device data interface (`ArrowDeviceArray`):
//! the export twin of `device.rs`. The array owns what it points to; its consumer releases it
//! once. Host memory only so far: a device tensor's array (over its memory, with an event to
//! wait on) is the GPU part of this interface, not built yet.

use arrow_array::Array;
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;

use super::tensor_to_column_with;
use crate::error::{Error, Result};
use crate::ffi::arrow_device::ArrowDeviceArray;
use crate::options::CopyPolicy;
use crate::tensor::Tensor;

/// A host tensor as an Arrow device array on the CPU and its schema: the column
/// [`tensor_to_column_with`] makes of it (no copy where the memory allows; one pass for bool
/// tensors, which Arrow bit-packs, and strided layouts), N-d tensors as `fixed_shape_tensor`
/// columns. Device type 1, id -1 (as pyarrow writes it), no event.
///
/// # Errors
/// [`Error::UnsupportedDevice`] for a tensor the host cannot read; the errors of
/// [`tensor_to_column_with`]; [`Error::Arrow`] for a field the C data interface cannot carry.
pub fn export_tensor(tensor: &Tensor) -> Result<(FFI_ArrowSchema, ArrowDeviceArray)> {
    let device = tensor.device();
    if !device.is_host_accessible() {
        return Err(Error::UnsupportedDevice {
            what: format!("an Arrow device array of a tensor on {device}"),
            remedy: "dlframe exports Arrow device arrays of host memory so far; move the tensor to the \
                     CPU first (Tensor.to_arrow(copy=True))",
        });
    }
    let (field, array) = tensor_to_column_with(tensor, "", CopyPolicy::IfNeeded)?;
    let schema = FFI_ArrowSchema::try_from(field.as_ref())?;
    Ok((schema, ArrowDeviceArray::on_cpu(FFI_ArrowArray::new(&array.to_data()))))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::Float32Array;

    use super::*;
    use crate::arrow::device::import_on_host;
    use crate::device::Device;
    use crate::ffi::dlpack::DLDevice;

    #[test]
    fn a_host_tensor_is_exported_in_place_and_imported_back() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], vec![3, 2]).unwrap();
        let (schema, mut array) = export_tensor(&t).unwrap();
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
        let (schema, mut array) = export_tensor(&t).unwrap();
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
        let e = export_tensor(&on_gpu).unwrap_err().to_string();
        assert!(e.contains("an Arrow device array of a tensor on cuda:0"), "{e}");
    }
}

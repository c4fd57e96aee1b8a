//! `repr(C)` Arrow C Device data interface (Arrow's `abi.h`), written out by hand with layout
//! asserts: an `ArrowArray` with the device its buffers live on and an event a consumer waits
//! on before reading them, and the stream of such arrays. The device types are DLPack's codes.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;

/// The capsule name of `__arrow_c_device_array__`'s array.
pub const ARROW_DEVICE_ARRAY: &CStr = c"arrow_device_array";
/// The capsule name of `__arrow_c_device_stream__`'s stream.
pub const ARROW_DEVICE_ARRAY_STREAM: &CStr = c"arrow_device_array_stream";
/// The capsule name of `__arrow_c_stream__`'s stream.
pub const ARROW_ARRAY_STREAM: &CStr = c"arrow_array_stream";
/// The capsule name of `__arrow_c_array__`'s array.
pub const ARROW_ARRAY: &CStr = c"arrow_array";
/// The capsule name of the schema that comes with a device array.
pub const ARROW_SCHEMA: &CStr = c"arrow_schema";

/// `ArrowDeviceArray`: an Arrow array whose buffers live on `(device_type, device_id)`.
/// Dropping it releases the array (arrow-rs's `FFI_ArrowArray` calls its `release`).
#[repr(C)]
#[derive(Debug)]
pub struct ArrowDeviceArray {
    /// The array, as the C data interface has it; its buffers are on the device.
    pub array: FFI_ArrowArray,
    /// Which device of the type (-1 for the CPU, as pyarrow writes it).
    pub device_id: i64,
    /// DLPack's device type code (`ARROW_DEVICE_CPU` is 1, `ARROW_DEVICE_CUDA` 2).
    pub device_type: i32,
    /// An event (a `cudaEvent_t*` on CUDA) to wait on before reading the buffers; NULL when the
    /// data is ready.
    pub sync_event: *mut c_void,
    /// Reserved by the interface: never read.
    pub reserved: [i64; 3],
}

// SAFETY: the struct owns its array (arrow-rs's FFI_ArrowArray is Send); `sync_event` is an
// opaque handle that only the device's API dereferences.
unsafe impl Send for ArrowDeviceArray {}

impl ArrowDeviceArray {
    /// A device array in CPU memory that owns `array` (no copy): device type 1, id -1 (as
    /// pyarrow writes it), no event.
    pub fn on_cpu(array: FFI_ArrowArray) -> Self {
        ArrowDeviceArray {
            array,
            device_id: -1,
            device_type: 1,
            sync_event: std::ptr::null_mut(),
            reserved: [0; 3],
        }
    }
}

/// The C data interface's `ArrowArray` field by field, to check what a producer wrote before
/// arrow-rs (whose `FFI_ArrowArray` keeps its fields private) reads it: the same layout.
#[repr(C)]
#[derive(Debug)]
pub struct RawArrowArray {
    /// Rows.
    pub length: i64,
    /// Nulls, or -1 when not computed.
    pub null_count: i64,
    /// The first row.
    pub offset: i64,
    /// Entries of `buffers`.
    pub n_buffers: i64,
    /// Entries of `children`.
    pub n_children: i64,
    /// The buffer pointers.
    pub buffers: *mut *const c_void,
    /// The children.
    pub children: *mut *mut RawArrowArray,
    /// The dictionary, or NULL.
    pub dictionary: *mut RawArrowArray,
    /// Releases the array; NULL once released.
    pub release: Option<unsafe extern "C" fn(*mut RawArrowArray)>,
    /// The producer's data.
    pub private_data: *mut c_void,
}

/// The C data interface's `ArrowSchema` field by field, to check that a producer's schema is
/// live (arrow-rs's `FFI_ArrowSchema` does not say): the same layout.
#[repr(C)]
#[derive(Debug)]
pub struct RawArrowSchema {
    /// The type's format string.
    pub format: *const c_char,
    /// The field's name.
    pub name: *const c_char,
    /// The field's metadata.
    pub metadata: *const c_char,
    /// Nullable, dictionary-ordered, map-keys-sorted.
    pub flags: i64,
    /// Entries of `children`.
    pub n_children: i64,
    /// The children.
    pub children: *mut *mut RawArrowSchema,
    /// The dictionary's schema, or NULL.
    pub dictionary: *mut RawArrowSchema,
    /// Releases the schema; NULL once released (or moved from).
    pub release: Option<unsafe extern "C" fn(*mut RawArrowSchema)>,
    /// The producer's data.
    pub private_data: *mut c_void,
}

/// `ArrowDeviceArrayStream`: a stream of device arrays of one schema, on one device type.
#[repr(C)]
#[derive(Debug)]
pub struct ArrowDeviceArrayStream {
    /// The device type of every array of the stream.
    pub device_type: i32,
    /// Writes the stream's schema; 0 or an errno.
    pub get_schema: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream, *mut FFI_ArrowSchema) -> c_int>,
    /// Writes the next array (released, `array.release` NULL, at the end); 0 or an errno.
    pub get_next: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream, *mut ArrowDeviceArray) -> c_int>,
    /// The last error's message, valid until the next call; may be NULL.
    pub get_last_error: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream) -> *const c_char>,
    /// Releases the stream; NULL once released.
    pub release: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream)>,
    /// The producer's data.
    pub private_data: *mut c_void,
}

const _: () = {
    assert!(size_of::<FFI_ArrowArray>() == 80);
    assert!(size_of::<RawArrowArray>() == 80);
    assert!(size_of::<RawArrowSchema>() == size_of::<FFI_ArrowSchema>());
    assert!(size_of::<RawArrowSchema>() == 72);
    assert!(offset_of!(RawArrowSchema, release) == 56);
    assert!(offset_of!(RawArrowArray, buffers) == 40);
    assert!(offset_of!(RawArrowArray, release) == 64);
    assert!(size_of::<ArrowDeviceArray>() == 128);
    assert!(offset_of!(ArrowDeviceArray, device_id) == 80);
    assert!(offset_of!(ArrowDeviceArray, device_type) == 88);
    assert!(offset_of!(ArrowDeviceArray, sync_event) == 96);
    assert!(offset_of!(ArrowDeviceArray, reserved) == 104);
    assert!(size_of::<ArrowDeviceArrayStream>() == 48);
    assert!(offset_of!(ArrowDeviceArrayStream, get_schema) == 8);
    assert!(offset_of!(ArrowDeviceArrayStream, release) == 32);
};

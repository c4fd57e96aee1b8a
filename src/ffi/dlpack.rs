//! `repr(C)` DLPack 1.3 (`dlpack.h`), written out by hand with layout asserts.
//!
//! The names follow the header. Nothing here has logic or ownership rules: `crate::dlpack`
//! owns these structs (export) or wraps foreign ones (import). Sizes and offsets are checked at
//! compile time against the 64-bit C layout (docs/conformance.md, "The C structs").

use std::ffi::{CStr, c_void};
use std::mem::{offset_of, size_of};

/// The DLPack major version we produce and accept.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// The DLPack minor version we produce.
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// The data is read-only: a consumer must not write through it.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// The producer made a copy that the consumer now owns alone.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// Sub-byte types are padded to whole bytes rather than packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// Capsule name of an unconsumed legacy `DLManagedTensor`.
pub const DLTENSOR: &CStr = c"dltensor";
/// Capsule name of a consumed legacy `DLManagedTensor`.
pub const USED_DLTENSOR: &CStr = c"used_dltensor";
/// Capsule name of an unconsumed `DLManagedTensorVersioned`.
pub const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
/// Capsule name of a consumed `DLManagedTensorVersioned`.
pub const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";

/// `DLDeviceType` codes.
#[allow(missing_docs)]
pub mod device_type {
    pub const KDL_CPU: i32 = 1;
    pub const KDL_CUDA: i32 = 2;
    pub const KDL_CUDA_HOST: i32 = 3;
    pub const KDL_OPENCL: i32 = 4;
    pub const KDL_VULKAN: i32 = 7;
    pub const KDL_METAL: i32 = 8;
    pub const KDL_VPI: i32 = 9;
    pub const KDL_ROCM: i32 = 10;
    pub const KDL_ROCM_HOST: i32 = 11;
    pub const KDL_EXT_DEV: i32 = 12;
    pub const KDL_CUDA_MANAGED: i32 = 13;
    pub const KDL_ONEAPI: i32 = 14;
    pub const KDL_WEBGPU: i32 = 15;
    pub const KDL_HEXAGON: i32 = 16;
    pub const KDL_MAIA: i32 = 17;
    pub const KDL_TRN: i32 = 18;
}

/// `DLDataTypeCode` codes.
#[allow(missing_docs)]
pub mod type_code {
    pub const KDL_INT: u8 = 0;
    pub const KDL_UINT: u8 = 1;
    pub const KDL_FLOAT: u8 = 2;
    pub const KDL_OPAQUE_HANDLE: u8 = 3;
    pub const KDL_BFLOAT: u8 = 4;
    pub const KDL_COMPLEX: u8 = 5;
    pub const KDL_BOOL: u8 = 6;
    pub const KDL_FLOAT8_E3M4: u8 = 7;
    pub const KDL_FLOAT8_E4M3: u8 = 8;
    pub const KDL_FLOAT8_E4M3B11FNUZ: u8 = 9;
    pub const KDL_FLOAT8_E4M3FN: u8 = 10;
    pub const KDL_FLOAT8_E4M3FNUZ: u8 = 11;
    pub const KDL_FLOAT8_E5M2: u8 = 12;
    pub const KDL_FLOAT8_E5M2FNUZ: u8 = 13;
    pub const KDL_FLOAT8_E8M0FNU: u8 = 14;
    pub const KDL_FLOAT6_E2M3FN: u8 = 15;
    pub const KDL_FLOAT6_E3M2FN: u8 = 16;
    pub const KDL_FLOAT4_E2M1FN: u8 = 17;
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version; a consumer must not read past `flags` when it differs from its own.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// A `device_type` code.
    pub device_type: i32,
    /// The producer's own device numbering; 0 for CPU, pinned and managed memory.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// A `type_code` code.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a borrowed view; the managed structs below own it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    /// Start of the allocation (NULL is allowed for zero-size tensors).
    pub data: *mut c_void,
    /// Where the memory lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements; NULL means compact row-major (allowed before DLPack 1.2).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// Legacy (`"dltensor"`) managed tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor view.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees everything; called exactly once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack 1.x (`"dltensor_versioned"`) managed tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// Checked first: with a different major, only `deleter` may be used.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees everything; called exactly once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor view.
    pub dl_tensor: DLTensor,
}

// The 64-bit C layout (docs/conformance.md, "The C structs"), checked at compile time.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLDevice>() == 8);
    assert!(size_of::<DLDataType>() == 4);
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLTensor, data) == 0);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensor, dl_tensor) == 0);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, version) == 0);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};

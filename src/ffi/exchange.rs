//! `repr(C)` DLPack exchange API (`dlpack.h` 1.2 and 1.3, `DLPackExchangeAPI`), written out by
//! hand with layout asserts.
//!
//! A producer type publishes one static table of C functions; a consumer calls them instead of
//! `__dlpack__`, so no Python call, capsule or keyword parsing sits between the two. Python
//! objects appear here as `*mut c_void` (`PyObject*`), since this layer knows nothing of Python.
//! The functions are called with the GIL held and return 0 on success, or -1 with a Python
//! exception set (the allocator reports through its `SetError` callback instead).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

use super::dlpack::{DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPackVersion, DLTensor};

/// The capsule name of `type.__dlpack_c_exchange_api__` (DLPack 1.3).
pub const DLPACK_EXCHANGE_API: &CStr = c"dlpack_exchange_api";

/// `DLPackExchangeAPIHeader`: the version of the table, and an older table a consumer of an
/// older version may walk to.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPIHeader {
    /// The DLPack version the table follows; a consumer must refuse an unknown major.
    pub version: DLPackVersion,
    /// The previous version's table, or NULL.
    pub prev_api: *mut DLPackExchangeAPIHeader,
}

/// `SetError(error_ctx, kind, message)`: how the allocator reports a failure.
pub type DLPackSetError =
    unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char);

/// Reports a failure through a consumer's `set_error`, when it gave one: the error's kind (an
/// exception name) and message as C strings (a NUL inside the message becomes a space).
///
/// # Safety
/// `set_error`, when given, is a function that takes `error_ctx`.
pub unsafe fn report_error(
    set_error: Option<DLPackSetError>,
    error_ctx: *mut c_void,
    kind: &str,
    message: &str,
) {
    let Some(set_error) = set_error else { return };
    let kind = std::ffi::CString::new(kind).unwrap_or_default();
    let message = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the caller's callback, with its own context and two NUL-terminated strings that
    // live across the call.
    unsafe { set_error(error_ctx, kind.as_ptr(), message.as_ptr()) };
}

/// `DLPackManagedTensorAllocator`: a new tensor shaped like `prototype` (its shape, dtype and
/// device; strides and data ignored), owned by the caller.
pub type DLPackManagedTensorAllocator = unsafe extern "C" fn(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<DLPackSetError>,
) -> c_int;

/// `DLPackManagedTensorFromPyObjectNoSync`: exports `py_object` as an owned managed tensor,
/// without synchronising any stream.
pub type DLPackManagedTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int;

/// `DLPackManagedTensorToPyObjectNoSync`: wraps a managed tensor (taking ownership of it) as a
/// new reference to a Python object of the producer's type.
pub type DLPackManagedTensorToPyObjectNoSync =
    unsafe extern "C" fn(tensor: *mut DLManagedTensorVersioned, out_py_object: *mut *mut c_void) -> c_int;

/// `DLPackDLTensorFromPyObjectNoSync`: fills a non-owning view of `py_object`, valid while the
/// object lives.
pub type DLPackDLTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut DLTensor) -> c_int;

/// `DLPackCurrentWorkStream`: the stream the producer works on for a device (NULL on the CPU).
pub type DLPackCurrentWorkStream =
    unsafe extern "C" fn(device_type: c_int, device_id: i32, out_current_stream: *mut *mut c_void) -> c_int;

/// `DLPackExchangeAPI`: the header, then the five functions in this order.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPI {
    /// Version and previous table.
    pub header: DLPackExchangeAPIHeader,
    /// Allocates a tensor.
    pub managed_tensor_allocator: Option<DLPackManagedTensorAllocator>,
    /// Exports an object as an owned managed tensor.
    pub managed_tensor_from_py_object_no_sync: Option<DLPackManagedTensorFromPyObjectNoSync>,
    /// Wraps a managed tensor as an object.
    pub managed_tensor_to_py_object_no_sync: Option<DLPackManagedTensorToPyObjectNoSync>,
    /// Fills a non-owning view of an object.
    pub dltensor_from_py_object_no_sync: Option<DLPackDLTensorFromPyObjectNoSync>,
    /// The producer's current stream on a device.
    pub current_work_stream: Option<DLPackCurrentWorkStream>,
}

// SAFETY: the table is immutable after construction and its pointers are to functions and
// static tables, which any thread may read.
unsafe impl Sync for DLPackExchangeAPI {}

/// The first table of dlframe's DLPack major version in the chain that starts at `header` (a
/// newer table links to the older ones it still serves); None when the chain has none within 16
/// links.
///
/// # Safety
/// `header` is NULL or starts a chain of tables (each a header, and for major 1 the whole
/// [`DLPackExchangeAPI`]) that live for `'a`, as the exchange API makes them live for the
/// process.
pub unsafe fn supported_table<'a>(header: *const DLPackExchangeAPIHeader) -> Option<&'a DLPackExchangeAPI> {
    let mut header = header;
    for _ in 0..16 {
        // SAFETY: the caller's promise: NULL or a live header.
        let h = unsafe { header.as_ref() }?;
        if h.version.major == DLPACK_MAJOR_VERSION {
            // SAFETY: a header of this major starts a table of this layout.
            return Some(unsafe { &*(header as *const DLPackExchangeAPI) });
        }
        header = h.prev_api;
    }
    None
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLPackExchangeAPIHeader>() == 16);
    assert!(offset_of!(DLPackExchangeAPIHeader, prev_api) == 8);
    assert!(size_of::<DLPackExchangeAPI>() == 56);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_allocator) == 16);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync) == 24);
    assert!(offset_of!(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync) == 32);
    assert!(offset_of!(DLPackExchangeAPI, dltensor_from_py_object_no_sync) == 40);
    assert!(offset_of!(DLPackExchangeAPI, current_work_stream) == 48);
};

#[cfg(test)]
mod tests {
    use super::*;

    fn table(major: u32, prev: *mut DLPackExchangeAPIHeader) -> DLPackExchangeAPI {
        DLPackExchangeAPI {
            header: DLPackExchangeAPIHeader { version: DLPackVersion { major, minor: 0 }, prev_api: prev },
            managed_tensor_allocator: None,
            managed_tensor_from_py_object_no_sync: None,
            managed_tensor_to_py_object_no_sync: None,
            dltensor_from_py_object_no_sync: None,
            current_work_stream: None,
        }
    }

    #[test]
    fn the_chain_is_walked_to_our_major_and_no_further() {
        let mut ours = table(DLPACK_MAJOR_VERSION, std::ptr::null_mut());
        let mut newer = table(DLPACK_MAJOR_VERSION + 1, &mut ours.header);
        // SAFETY: both tables live across the calls.
        unsafe {
            let found = supported_table(&newer.header).map(|t| t as *const DLPackExchangeAPI);
            assert_eq!(found, Some(&ours as *const DLPackExchangeAPI));
            assert!(supported_table(std::ptr::null()).is_none());
            newer.header.prev_api = std::ptr::null_mut();
            assert!(supported_table(&newer.header).is_none());
            // A chain that loops is given up after 16 links.
            newer.header.prev_api = &mut newer.header;
            assert!(supported_table(&newer.header).is_none());
        }
    }

    /// A consumer's `set_error`: writes "kind|message" into the String its context points to.
    ///
    /// # Safety
    /// `ctx` is a live `String`; `kind` and `message` are NUL-terminated.
    unsafe extern "C" fn keep(ctx: *mut c_void, kind: *const c_char, message: *const c_char) {
        // SAFETY: the contract above.
        unsafe {
            let (kind, message) = (CStr::from_ptr(kind), CStr::from_ptr(message));
            *(ctx as *mut String) = format!("{}|{}", kind.to_string_lossy(), message.to_string_lossy());
        }
    }

    #[test]
    fn an_error_reaches_the_consumer_as_c_strings_and_none_is_fine() {
        let mut got = String::new();
        // SAFETY: `keep` takes a String context, alive across the call; with no callback,
        // nothing is called.
        unsafe {
            report_error(Some(keep), &mut got as *mut String as *mut c_void, "ValueError", "a\0b");
            assert_eq!(got, "ValueError|a b");
            report_error(None, std::ptr::null_mut(), "ValueError", "x");
        }
    }
}

//! numpy's ndarray, recognised once per type and read through the struct layout numpy's C API
//! publishes to compiled extensions (`PyArrayObject_fields` and the head of `PyArray_Descr`,
//! the same in numpy 1.x and 2.x), without calling Python: the few facts the small-call paths
//! need before they hand an array on.

use std::ffi::{c_char, c_int, c_long};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

use dlframe::{DType, Device, Tensor};

use crate::interface::PyOwner;
use crate::per_type::PerType;

/// Whether a type is exactly `numpy.ndarray`, learnt once per type.
static NDARRAY: PerType<bool> = PerType::new();

/// Whether `x`'s type is exactly `numpy.ndarray` (not a subclass, whose layout may differ).
pub fn is_ndarray(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    NDARRAY.get(&x.get_type(), |ty: &Bound<'_, PyType>| -> PyResult<bool> {
        Ok(ty.name()?.to_cow()? == "ndarray" && ty.module()?.to_cow()? == "numpy")
    })
}

/// The head of `PyArrayObject_fields` (numpy's `ndarraytypes.h`), up to the flags.
#[repr(C)]
struct ArrayHead {
    ob_base: ffi::PyObject,
    data: *mut c_char,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *const DescrHead,
    flags: c_int,
}

/// The head of `PyArray_Descr`, up to `type_num` (where numpy 1.x and 2.x still agree).
#[repr(C)]
struct DescrHead {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyTypeObject,
    kind: c_char,
    type_char: c_char,
    byteorder: c_char,
    flags: c_char,
    type_num: c_int,
}

/// `NPY_ARRAY_WRITEABLE`.
const WRITEABLE: c_int = 0x0400;
/// `NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE`.
const PLAIN_FLAGS: c_int = 0x0001 | 0x0100 | WRITEABLE;
/// numpy's type numbers of integers and IEEE floats: `NPY_BYTE` (1) to `NPY_DOUBLE` (12),
/// then `NPY_HALF` (23). Not `NPY_BOOL` (0), `NPY_LONGDOUBLE` (13) or anything after.
fn is_plain_type(type_num: c_int) -> bool {
    matches!(type_num, 1..=12 | 23)
}
/// The byte-order character of a swapped (non-native) dtype.
const SWAPPED: c_char = if cfg!(target_endian = "little") { b'>' } else { b'<' } as c_char;

/// The dtype of numpy's type number, as numpy's DLPack export gives it; None for the types it
/// refuses or dlframe has no dtype for (long double, complex, datetime, strings, objects).
fn dtype_of(type_num: c_int) -> Option<DType> {
    let long_is_64 = std::mem::size_of::<c_long>() == 8;
    Some(match type_num {
        0 => DType::Bool,
        1 => DType::Int8,
        2 => DType::UInt8,
        3 => DType::Int16,
        4 => DType::UInt16,
        5 => DType::Int32,
        6 => DType::UInt32,
        7 if long_is_64 => DType::Int64,
        7 => DType::Int32,
        8 if long_is_64 => DType::UInt64,
        8 => DType::UInt32,
        9 => DType::Int64,
        10 => DType::UInt64,
        11 => DType::Float32,
        12 => DType::Float64,
        23 => DType::Float16,
        _ => return None,
    })
}

/// A tensor over an exact `numpy.ndarray`'s memory ([`is_ndarray`]), read from its struct
/// (no copy, no Python call), with the array as its owner: what dlframe's import of numpy's
/// DLPack export gives, without making and consuming the capsule. Read-only arrays give
/// read-only tensors. None for what that export refuses or dlframe has no dtype for
/// (byte-swapped data, strides that are not whole elements, complex, datetime, strings,
/// objects) and for layouts the tensor refuses; the caller then asks `__dlpack__`, which
/// answers as before.
pub fn import(x: &Bound<'_, PyAny>) -> Option<Tensor> {
    // SAFETY: as in `is_plain_1d`: x is an exact numpy.ndarray (the caller checked), read
    // through numpy's published layout while the GIL is held; `dimensions` and `strides` have
    // `nd` entries each.
    let (data, shape, strides, dtype, readonly) = unsafe {
        let a = &*(x.as_ptr() as *const ArrayHead);
        let d = a.descr.as_ref()?;
        let dtype = dtype_of(d.type_num).filter(|_| d.byteorder != SWAPPED)?;
        let nd = usize::try_from(a.nd).ok().filter(|&n| n <= dlframe::tensor::MAX_NDIM)?;
        if nd > 0 && (a.dimensions.is_null() || a.strides.is_null()) {
            return None;
        }
        let item = dtype.itemsize() as isize;
        let shape: Vec<i64> = (0..nd).map(|i| *a.dimensions.add(i) as i64).collect();
        let mut strides = Vec::with_capacity(nd);
        for i in 0..nd {
            let bytes = *a.strides.add(i);
            if bytes % item != 0 {
                return None;
            }
            strides.push((bytes / item) as i64);
        }
        (a.data as *mut u8, shape, strides, dtype, a.flags & WRITEABLE == 0)
    };
    // SAFETY: the array's elements lie where its data pointer, extents and strides say, in
    // host memory the array keeps valid while it lives; the owner holds a reference to it.
    unsafe {
        Tensor::from_raw_parts(
            data,
            shape,
            Some(strides),
            dtype,
            Device::Cpu,
            readonly,
            Arc::new(PyOwner::new(x)),
        )
    }
    .ok()
}

/// Whether `x`, an exact `numpy.ndarray` ([`is_ndarray`]), is a non-empty, aligned, writable,
/// C-contiguous 1-D array of integers or IEEE floats in native byte order: what
/// `pyarrow.Array.from_dlpack` takes exactly as dlframe's own import would hand it on.
/// Reads the array's struct, calls nothing.
pub fn is_plain_1d(x: &Bound<'_, PyAny>) -> bool {
    // SAFETY: the caller checked that x's type is exactly numpy.ndarray, whose instances are
    // PyArrayObject_fields, a layout numpy's C API fixes for compiled extensions (PyArray_NDIM,
    // PyArray_DIMS, PyArray_FLAGS and PyArray_DESCR read these fields directly); `dimensions`
    // has `nd` entries and `descr` is set for every array. The GIL is held and `x` is
    // referenced, so the array and its descr (which it references) stay alive while read.
    unsafe {
        let a = &*(x.as_ptr() as *const ArrayHead);
        if a.nd != 1 || a.dimensions.is_null() || *a.dimensions <= 0 || a.flags & PLAIN_FLAGS != PLAIN_FLAGS {
            return false;
        }
        match a.descr.as_ref() {
            Some(d) => is_plain_type(d.type_num) && d.byteorder != SWAPPED,
            None => false,
        }
    }
}

/// Whether `x` is an exact `numpy.ndarray` that [`is_plain_1d`] accepts: exposed so that the
/// tests hold the struct read to numpy's own answers (`ndim`, `flags`, `dtype`), not an API.
#[pyfunction]
#[pyo3(name = "_plain_ndarray", signature = (x, /))]
pub fn plain_ndarray(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(is_ndarray(x)? && is_plain_1d(x))
}

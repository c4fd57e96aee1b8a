//! numpy's ndarray, recognised once per type and read through the struct layout numpy's C API
//! publishes to compiled extensions (`PyArrayObject_fields` and the head of `PyArray_Descr`,
//! the same in numpy 1.x and 2.x, the versions checked), without calling Python: the few facts
//! the small-call paths need before they hand an array on. `python/tests/test_consumer.py`
//! holds every fact read here to numpy's own answers.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

use dlframe::{DType, Device, Tensor};

use dlframe::interface::array_struct::read_dims;
use dlframe::interface::numpy_type_num;

use crate::interface::PyOwner;
use crate::per_type::PerType;

/// Whether a type is exactly `numpy.ndarray` of a numpy whose struct layout this module knows,
/// learnt once per type.
static NDARRAY: PerType<bool> = PerType::new();

/// The numpy major versions whose `PyArrayObject_fields` and `PyArray_Descr` heads this module
/// reads (the same in 1.x and 2.x). An array of another major version is not read here: it
/// goes through numpy's DLPack export, as any producer's does.
const KNOWN_NUMPY: [&str; 2] = ["1", "2"];

/// Whether `x`'s type is exactly `numpy.ndarray`, of a numpy in [`KNOWN_NUMPY`].
fn is_ndarray(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    NDARRAY.get(&x.get_type(), |ty: &Bound<'_, PyType>| -> PyResult<bool> {
        if ty.name()?.to_cow()? != "ndarray" || ty.module()?.to_cow()? != "numpy" {
            return Ok(false);
        }
        let version: String = ty.py().import("numpy")?.getattr("__version__")?.extract()?;
        Ok(KNOWN_NUMPY.contains(&version.split('.').next().unwrap_or("")))
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
/// The byte-order character of a swapped (non-native) dtype.
const SWAPPED: c_char = if cfg!(target_endian = "little") { b'>' } else { b'<' } as c_char;

/// An object whose type is exactly `numpy.ndarray` ([`as_ndarray`]): the only kind whose
/// struct this module reads.
#[derive(Clone, Copy)]
pub struct NdArray<'a, 'py>(&'a Bound<'py, PyAny>);

/// `x` as an [`NdArray`] when its type is exactly `numpy.ndarray` (not a subclass, whose
/// layout may differ); None for anything else.
pub fn as_ndarray<'a, 'py>(x: &'a Bound<'py, PyAny>) -> PyResult<Option<NdArray<'a, 'py>>> {
    Ok(is_ndarray(x)?.then_some(NdArray(x)))
}

impl NdArray<'_, '_> {
    /// The array's struct head.
    fn head(&self) -> &ArrayHead {
        // SAFETY: the type is exactly numpy.ndarray (checked by `as_ndarray`), whose instances
        // are PyArrayObject_fields, a layout numpy's C API fixes for compiled extensions
        // (PyArray_NDIM, PyArray_DIMS, PyArray_FLAGS and PyArray_DESCR read these fields
        // directly). The GIL is held and the array referenced for the borrow's lifetime.
        unsafe { &*(self.0.as_ptr() as *const ArrayHead) }
    }

    /// The descr's head; None for an array without one (numpy sets it for every array).
    fn descr(&self) -> Option<&DescrHead> {
        // SAFETY: a non-NULL descr is a PyArray_Descr the array references, alive as long as
        // the array.
        unsafe { self.head().descr.as_ref() }
    }

    /// A tensor over the array's memory, read from its struct (no copy, no Python call), with
    /// the array as its owner: what dlframe's import of numpy's DLPack export gives, without
    /// making and consuming the capsule. Read-only arrays give read-only tensors. None for
    /// what that export refuses or dlframe has no dtype for (byte-swapped data, strides that
    /// are not whole elements, complex, datetime, strings, objects) and for layouts the tensor
    /// refuses; the caller then asks `__dlpack__`, which answers as before.
    pub fn import(self) -> Option<Tensor> {
        let (a, d) = (self.head(), self.descr()?);
        let dtype = numpy_type_num(d.type_num).filter(|_| d.byteorder != SWAPPED)?;
        let nd = usize::try_from(a.nd).ok().filter(|&n| n <= dlframe::tensor::MAX_NDIM)?;
        if nd > 0 && (a.dimensions.is_null() || a.strides.is_null()) {
            return None;
        }
        // SAFETY: `dimensions` and `strides` have `nd` entries each, alive with the array.
        let (shape, strides) = unsafe { read_dims(nd, a.dimensions, a.strides, dtype.itemsize() as isize) }?;
        let readonly = a.flags & WRITEABLE == 0;
        // SAFETY: the array's elements lie where its data pointer, extents and strides say, in
        // host memory the array keeps valid while it lives; the owner holds a reference to it.
        unsafe {
            Tensor::from_raw_slices(
                a.data as *mut u8,
                &shape,
                Some(&strides),
                dtype,
                Device::Cpu,
                readonly,
                Arc::new(PyOwner::new(self.0)),
            )
        }
        .ok()
    }

    /// Whether the array is non-empty, aligned, writable, C-contiguous and 1-D, of integers or
    /// IEEE floats in native byte order: what `pyarrow.Array.from_dlpack` takes exactly as
    /// dlframe's own import would hand it on. Reads the array's struct, calls nothing.
    pub fn is_plain_1d(self) -> bool {
        let a = self.head();
        if a.nd != 1 || a.dimensions.is_null() || a.flags & PLAIN_FLAGS != PLAIN_FLAGS {
            return false;
        }
        // SAFETY: a 1-D array's `dimensions` has one entry, alive with the array.
        if unsafe { *a.dimensions } <= 0 {
            return false;
        }
        // Integers and IEEE floats: every dtype numpy exports but bool.
        self.descr().is_some_and(|d| {
            numpy_type_num(d.type_num).is_some_and(|t| t != DType::Bool) && d.byteorder != SWAPPED
        })
    }
}

/// Whether `x` is an exact `numpy.ndarray` that [`NdArray::is_plain_1d`] accepts: exposed so
/// that the tests hold the struct read to numpy's own answers (`ndim`, `flags`, `dtype`), not
/// an API.
#[pyfunction]
#[pyo3(name = "_plain_ndarray", signature = (x, /))]
pub fn plain_ndarray(x: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(as_ndarray(x)?.is_some_and(NdArray::is_plain_1d))
}

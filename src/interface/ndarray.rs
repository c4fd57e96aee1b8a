//! numpy's array object read through the struct layout numpy's C API publishes to compiled
//! extensions (`PyArrayObject_fields` and the head of `PyArray_Descr`, the same in numpy 1.x and
//! 2.x): the few facts a small call needs before it hands an array on, without calling Python.
//! Which objects are such arrays is the binding's to tell (an exact `numpy.ndarray` of a known
//! numpy major version); `python/tests/test_consumer.py` holds every fact read here to numpy's
//! own answers.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use super::array_struct::{NPY_ALIGNED, NPY_C_CONTIGUOUS, NPY_WRITEABLE, read_dims};
use super::numpy_type_num;
use crate::device::Device;
use crate::dtype::DType;
use crate::tensor::{MAX_NDIM, Owner, Tensor};

/// The numpy major versions whose struct heads this module reads.
pub const KNOWN_NUMPY: [&str; 2] = ["1", "2"];

/// `PyObject`'s head in CPython's default (not free-threaded) build, which the stable ABI fixes:
/// the reference count and the type.
#[repr(C)]
struct ObjectHead {
    refcnt: isize,
    ob_type: *const c_void,
}

/// The head of `PyArrayObject_fields` (numpy's `ndarraytypes.h`), up to the flags.
#[repr(C)]
struct ArrayHead {
    ob_base: ObjectHead,
    data: *mut c_char,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *const c_void,
    descr: *const DescrHead,
    flags: c_int,
}

/// The head of `PyArray_Descr`, up to `type_num` (where numpy 1.x and 2.x still agree).
#[repr(C)]
struct DescrHead {
    ob_base: ObjectHead,
    typeobj: *const c_void,
    kind: c_char,
    type_char: c_char,
    byteorder: c_char,
    flags: c_char,
    type_num: c_int,
}

/// The flags of an array whose memory a consumer can share as it is: C-contiguous, aligned
/// and writable.
const PLAIN_FLAGS: c_int = NPY_C_CONTIGUOUS | NPY_ALIGNED | NPY_WRITEABLE;
/// The byte-order character of a swapped (non-native) dtype.
const SWAPPED: c_char = if cfg!(target_endian = "little") { b'>' } else { b'<' } as c_char;

/// The dtype of a descr, None for what numpy's DLPack export refuses or dlframe has no dtype
/// for (byte-swapped data, complex, datetime, strings, objects, user types).
fn dtype_of(d: &DescrHead) -> Option<DType> {
    numpy_type_num(d.type_num).filter(|_| d.byteorder != SWAPPED)
}

/// A tensor over an array's memory, read from its struct (no copy), with `owner()` (which keeps
/// the array alive) as its owner: what dlframe's import of numpy's DLPack export gives, without
/// making and consuming the capsule. Read-only arrays give read-only tensors. None for what that
/// export refuses or dlframe has no dtype for, strides that are not whole elements, and layouts
/// the tensor refuses; the caller then asks `__dlpack__`, which answers as before.
///
/// # Safety
/// `array` is the address of a live `numpy.ndarray` of a numpy in [`KNOWN_NUMPY`], with a
/// CPython object head of the default build, unchanged while this runs; `owner` keeps it alive
/// (and so its memory, dims and descr) as long as the tensor.
pub unsafe fn import(array: *const c_void, owner: impl FnOnce() -> Arc<dyn Owner>) -> Option<Tensor> {
    // SAFETY: the caller's promise: the object is a PyArrayObject_fields, a layout numpy's C API
    // fixes for compiled extensions (PyArray_NDIM, PyArray_DIMS, PyArray_FLAGS and
    // PyArray_DESCR read these fields directly), and a non-NULL descr lives with it.
    let (a, d) = unsafe {
        let a = &*(array as *const ArrayHead);
        (a, a.descr.as_ref()?)
    };
    let dtype = dtype_of(d)?;
    let nd = usize::try_from(a.nd).ok().filter(|&n| n <= MAX_NDIM)?;
    if nd > 0 && (a.dimensions.is_null() || a.strides.is_null()) {
        return None;
    }
    // SAFETY: `dimensions` and `strides` have `nd` entries each, alive with the array.
    let (shape, strides) = unsafe { read_dims(nd, a.dimensions, a.strides, dtype.itemsize() as isize) }?;
    let readonly = a.flags & NPY_WRITEABLE == 0;
    // SAFETY: the array's elements lie where its data pointer, extents and strides say, in host
    // memory the array keeps valid while it lives; the owner keeps it alive.
    unsafe {
        Tensor::from_raw_slices(
            a.data as *mut u8,
            &shape,
            Some(&strides),
            dtype,
            Device::Cpu,
            readonly,
            owner(),
        )
    }
    .ok()
}

/// Whether an array is non-empty, aligned, writable, C-contiguous and 1-D, of integers or IEEE
/// floats in native byte order: what `pyarrow.Array.from_dlpack` takes exactly as dlframe's own
/// import would hand it on. Reads the array's struct, calls nothing.
///
/// # Safety
/// As [`import`], without the owner.
pub unsafe fn is_plain_1d(array: *const c_void) -> bool {
    // SAFETY: as in `import`.
    let a = unsafe { &*(array as *const ArrayHead) };
    if a.nd != 1 || a.dimensions.is_null() || a.flags & PLAIN_FLAGS != PLAIN_FLAGS {
        return false;
    }
    // SAFETY: a 1-D array's `dimensions` has one entry, and a non-NULL descr lives with it.
    let (len, d) = unsafe { (*a.dimensions, a.descr.as_ref()) };
    // Integers and IEEE floats: every dtype numpy exports but bool.
    len > 0 && d.and_then(dtype_of).is_some_and(|t| t != DType::Bool)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake array of `values` with numpy's struct heads, and what it points at.
    struct Fake {
        head: ArrayHead,
        _descr: Box<DescrHead>,
        _dims: Box<[isize; 2]>,
        _strides: Box<[isize; 2]>,
        values: Vec<f32>,
    }

    fn fake(
        values: Vec<f32>,
        dims: [isize; 2],
        nd: c_int,
        type_num: c_int,
        byteorder: u8,
        flags: c_int,
    ) -> Fake {
        let object = || ObjectHead { refcnt: 1, ob_type: std::ptr::null() };
        let descr = Box::new(DescrHead {
            ob_base: object(),
            typeobj: std::ptr::null(),
            kind: b'f' as c_char,
            type_char: b'f' as c_char,
            byteorder: byteorder as c_char,
            flags: 0,
            type_num,
        });
        let dims = Box::new(dims);
        // Shape [n, 1] of floats: 4 bytes a step either way.
        let strides = Box::new([4isize, 4]);
        let mut values = values;
        let head = ArrayHead {
            ob_base: object(),
            data: values.as_mut_ptr().cast(),
            nd,
            dimensions: dims.as_ptr(),
            strides: strides.as_ptr(),
            base: std::ptr::null(),
            descr: &*descr,
            flags,
        };
        Fake { head, _descr: descr, _dims: dims, _strides: strides, values }
    }

    /// What `import` made of a fake: shape, strides, dtype, data and whether read-only.
    type Read = (Vec<i64>, Vec<i64>, DType, *const u8, bool);

    /// What `import` reads of a fake (the tensor gone while the fake is borrowed), and whether
    /// `is_plain_1d` takes it.
    fn read(f: &Fake) -> (Option<Read>, bool) {
        let array = &f.head as *const ArrayHead as *const c_void;
        // SAFETY: a fake's heads point only at its own boxes and values, or at statics, alive
        // and unchanged while it is borrowed here; the tensor goes before the borrow ends, so
        // an owner that keeps nothing is enough.
        unsafe {
            let t = import(array, || Arc::new(()));
            let t =
                t.map(|t| (t.shape().to_vec(), t.strides().to_vec(), t.dtype(), t.data_ptr(), t.readonly()));
            (t, is_plain_1d(array))
        }
    }

    #[test]
    fn an_array_struct_reads_as_the_view_numpy_would_export() {
        let mut f = fake(vec![1.0, 2.0, 3.0], [3, 1], 1, 11, b'=', PLAIN_FLAGS);
        let (t, plain) = read(&f);
        let (shape, strides, dtype, data, readonly) = t.unwrap();
        assert_eq!((&shape[..], &strides[..], dtype), (&[3][..], &[1][..], DType::Float32));
        assert_eq!(data as *const f32, f.values.as_ptr());
        assert!(!readonly);
        assert!(plain);

        // A read-only array gives a read-only tensor, and is not plain.
        f.head.flags = PLAIN_FLAGS & !NPY_WRITEABLE;
        assert!(matches!(read(&f), (Some((.., true)), false)));
    }

    #[test]
    fn what_numpys_export_refuses_is_left_to_it() {
        static ODD: [isize; 1] = [6];
        let unreadable = |f: &Fake| matches!(read(f), (None, false));
        let importable = |f: &Fake| matches!(read(f), (Some(_), false));
        // Byte-swapped, complex (type 14), bool (plain refuses it; import reads it).
        assert!(unreadable(&fake(vec![1.0], [1, 1], 1, 11, SWAPPED as u8, PLAIN_FLAGS)));
        assert!(unreadable(&fake(vec![1.0], [1, 1], 1, 14, b'=', PLAIN_FLAGS)));
        assert!(importable(&fake(vec![1.0], [1, 1], 1, 0, b'=', PLAIN_FLAGS)));
        // A stride that is not a whole element.
        let mut odd = fake(vec![1.0, 2.0], [1, 1], 1, 11, b'=', PLAIN_FLAGS);
        odd.head.strides = ODD.as_ptr();
        assert!(read(&odd).0.is_none());
        // Empty, 2-D, or not C-contiguous: no plain 1-D array (but importable).
        let empty = fake(Vec::new(), [0, 1], 1, 11, b'=', PLAIN_FLAGS);
        let two = fake(vec![1.0, 2.0], [2, 1], 2, 11, b'=', PLAIN_FLAGS);
        let strided = fake(vec![1.0], [1, 1], 1, 11, b'=', PLAIN_FLAGS & !NPY_C_CONTIGUOUS);
        for f in [&empty, &two, &strided] {
            assert!(importable(f));
        }
    }
}

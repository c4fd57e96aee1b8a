//! numpy's `__array_struct__` payload, the `PyArrayInterface` C struct, both ways: a host tensor
//! described by one, and one read as a tensor (neither copies data). Also the dims of any
//! numpy-style C description (the struct, a numpy array's own struct, a `Py_buffer`) read as a
//! tensor's shape and strides. The capsules that carry the struct are the binding's.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use smallvec::SmallVec;

use super::TypeStr;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{MAX_NDIM, Owner, Tensor, c_strides};

/// `PyArrayInterface` as numpy's `ndarraytypes.h` declares it (`Py_ssize_t` is `isize`).
#[repr(C)]
#[derive(Debug)]
pub struct PyArrayInterface {
    /// Always 2.
    pub two: c_int,
    /// Number of dimensions.
    pub nd: c_int,
    /// The typestr's kind character.
    pub typekind: c_char,
    /// Bytes per element.
    pub itemsize: c_int,
    /// `NPY_*` flags.
    pub flags: c_int,
    /// `nd` extents.
    pub shape: *mut isize,
    /// `nd` byte strides, or NULL for C order.
    pub strides: *mut isize,
    /// The first element.
    pub data: *mut c_void,
    /// A descr object, or NULL (dlframe writes NULL and ignores it).
    pub descr: *mut c_void,
}

/// `PyArrayInterface.flags`: C-contiguous.
pub const NPY_C_CONTIGUOUS: c_int = 0x1;
/// `PyArrayInterface.flags`: aligned.
pub const NPY_ALIGNED: c_int = 0x100;
/// `PyArrayInterface.flags`: native byte order.
pub const NPY_NOTSWAPPED: c_int = 0x200;
/// `PyArrayInterface.flags`: writable.
pub const NPY_WRITEABLE: c_int = 0x400;

/// A tensor's `PyArrayInterface`, the extents and strides it points to, and the tensor whose
/// memory it describes, boxed so that the pointers stay valid: a capsule holds the box, which
/// keeps the memory alive, and frees it whole.
#[repr(C)]
pub struct ArrayStruct {
    /// The struct a consumer reads.
    pub iface: PyArrayInterface,
    shape: Vec<isize>,
    strides: Vec<isize>,
    _tensor: Tensor,
}

// SAFETY: the struct's pointers point into its own Vecs and at the memory of the tensor it
// holds; nothing is written through them.
unsafe impl Send for ArrayStruct {}

impl ArrayStruct {
    /// numpy's `__array_struct__` of a tensor (copies nothing), writable unless its memory is
    /// shared read-only.
    ///
    /// # Errors
    /// [`Error::NotOffered`] for a tensor the host cannot read, and for datetimes, whose unit
    /// the struct cannot say (numpy then reads `__array_interface__`, whose typestr can);
    /// [`Error::UnsupportedDType`] as [`ArrayStruct::describe`].
    pub fn export(t: &Tensor) -> Result<Box<Self>> {
        super::host_only(t, "__array_struct__")?;
        if t.logical().is_some_and(|f| {
            use arrow_schema::DataType::{Date64, Duration, Timestamp};
            matches!(f.data_type(), Timestamp(..) | Date64 | Duration(_))
        }) {
            let why = "datetimes are described by __array_interface__".into();
            return Err(Error::NotOffered { protocol: "__array_struct__", why });
        }
        Self::describe(t, !t.shared_readonly())
    }

    /// Describes a host tensor (without copying; the struct holds the tensor). `writable` is
    /// false for memory consumers must not write.
    ///
    /// # Errors
    /// [`Error::UnsupportedDType`] for a dtype with no typestr (bfloat16, float8).
    pub fn describe(t: &Tensor, writable: bool) -> Result<Box<Self>> {
        let item = t.dtype().itemsize() as isize;
        let typekind = TypeStr::from_dtype(t.dtype())?.kind as c_char;
        let mut flags = NPY_NOTSWAPPED;
        if t.is_aligned() {
            flags |= NPY_ALIGNED;
        }
        if t.is_c_contiguous() {
            flags |= NPY_C_CONTIGUOUS;
        }
        if writable {
            flags |= NPY_WRITEABLE;
        }
        let mut s = Box::new(ArrayStruct {
            iface: PyArrayInterface {
                two: 2,
                nd: t.ndim() as c_int,
                typekind,
                itemsize: item as c_int,
                flags,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                data: t.data_ptr() as *mut c_void,
                descr: std::ptr::null_mut(),
            },
            shape: t.shape().iter().map(|&d| d as isize).collect(),
            strides: t.strides().iter().map(|&s| s as isize * item).collect(),
            _tensor: t.clone(),
        });
        s.iface.shape = s.shape.as_mut_ptr();
        s.iface.strides = s.strides.as_mut_ptr();
        Ok(s)
    }
}

/// A host tensor over the memory a `PyArrayInterface` describes (without copying), kept alive
/// by `owner`.
///
/// # Errors
/// [`Error::InvalidInterface`] for a struct that breaks numpy's rules (`two != 2`, a negative
/// `nd` or more than [`MAX_NDIM`], NULL extents, a stride that is not a whole element),
/// [`Error::UnsupportedDType`] for byte-swapped data or a kind with no dtype.
///
/// # Safety
/// `s` points to a readable `PyArrayInterface` whose extents (and strides, unless NULL) hold
/// `nd` entries, and whose data stays valid while `owner` lives.
pub unsafe fn read(s: *const PyArrayInterface, owner: Arc<dyn Owner>) -> Result<Tensor> {
    let bad = |m: &str| Error::InvalidInterface(format!("__array_struct__: {m}"));
    // SAFETY: the caller's promise.
    let s = unsafe { &*s };
    if s.two != 2 || s.nd < 0 || s.itemsize <= 0 {
        return Err(bad("the struct does not start with two == 2"));
    }
    if s.flags & NPY_NOTSWAPPED == 0 {
        return Err(Error::UnsupportedDType {
            what: "byte-swapped __array_struct__ data".into(),
            remedy: "byteswap it first (arr.astype(arr.dtype.newbyteorder('=')))".into(),
        });
    }
    let nd = s.nd as usize;
    if nd > MAX_NDIM {
        return Err(bad(&format!("nd {nd} exceeds the limit of {MAX_NDIM}")));
    }
    if nd > 0 && s.shape.is_null() {
        return Err(bad("NULL shape"));
    }
    let dtype = format!("|{}{}", s.typekind as u8 as char, s.itemsize).parse::<TypeStr>()?.to_dtype()?;
    // SAFETY: the struct promises nd extents, and nd strides when they are not NULL.
    let (shape, strides) = unsafe { read_dims(nd, s.shape, s.strides, s.itemsize as isize) }
        .ok_or_else(|| bad("a byte stride that is not a whole element"))?;
    let readonly = s.flags & NPY_WRITEABLE == 0;
    // SAFETY: the caller's promise: the data stays valid while the owner lives.
    unsafe {
        Tensor::from_raw_slices(
            s.data as *mut u8,
            &shape,
            Some(&strides),
            dtype,
            Device::Cpu,
            readonly,
            owner,
        )
    }
}

/// Extents or strides read from a foreign description, inline up to four dimensions: with
/// [`Tensor::from_raw_slices`], importing a small array allocates nothing for them.
pub type Extents = SmallVec<[i64; 4]>;

/// `nd` extents and byte strides from the C arrays of a numpy-style description (a numpy
/// array's struct, `__array_struct__`, a `Py_buffer`) as a shape and strides in elements of
/// `item` bytes (no copy of the data); NULL `strides` are C order's. None when a byte stride is
/// not a whole element.
///
/// # Safety
/// Unless `nd` is 0, `shape` points to `nd` readable extents, and `strides` is NULL or points
/// to `nd` readable strides.
pub unsafe fn read_dims(
    nd: usize,
    shape: *const isize,
    strides: *const isize,
    item: isize,
) -> Option<(Extents, Extents)> {
    let slice = |p: *const isize| match nd {
        0 => &[][..],
        // SAFETY: the caller's promise, for nd entries.
        _ => unsafe { std::slice::from_raw_parts(p, nd) },
    };
    let extents: Extents = slice(shape).iter().map(|&d| d as i64).collect();
    if strides.is_null() || nd == 0 {
        return Some((extents.clone(), c_strides(&extents).into_iter().collect()));
    }
    Some((extents, element_strides(slice(strides), item)?))
}

/// Byte strides as strides in elements of `item` bytes; None when one is not a whole element.
pub fn element_strides(bytes: &[isize], item: isize) -> Option<Extents> {
    bytes.iter().map(|&b| (item != 0 && b % item == 0).then(|| (b / item) as i64)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`read`] of a struct `describe` made of `t`, with a clone of `t` as its owner.
    fn read_back(s: &ArrayStruct, t: &Tensor) -> Result<Tensor> {
        // SAFETY: every struct here describes the `t` it is read with (its extents and strides
        // in its own Vecs); what a test breaks (`two`, the flags, a stride that is not a whole
        // element) is refused before the data is read. The owner keeps `t`'s memory alive.
        unsafe { read(&s.iface, Arc::new(t.clone())) }
    }

    #[test]
    fn a_tensor_described_by_the_struct_reads_back_as_the_same_view() {
        let t = Tensor::from_vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), vec![3, 4]).unwrap();
        let s = ArrayStruct::describe(&t, false).unwrap();
        assert_eq!((s.iface.two, s.iface.nd, s.iface.typekind as u8, s.iface.itemsize), (2, 2, b'f', 4));
        assert_eq!(s.iface.flags & NPY_WRITEABLE, 0);
        assert_ne!(s.iface.flags & NPY_C_CONTIGUOUS, 0);
        let back = read_back(&s, &t).unwrap();
        assert_eq!((back.shape(), back.strides(), back.dtype()), (t.shape(), t.strides(), t.dtype()));
        assert_eq!(back.data_ptr(), t.data_ptr());
        assert!(back.readonly());
    }

    #[test]
    fn the_struct_keeps_the_memory_until_it_is_dropped() {
        let (owner, drops) = crate::testing::DropCounter::new(vec![1.0f64, 2.0]);
        let s = ArrayStruct::export(&owner.tensor(vec![2])).unwrap();
        assert_eq!(drops.get(), 0);
        drop(s);
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn broken_structs_are_errors() {
        let t = Tensor::from_vec(vec![1i32, 2, 3], vec![3]).unwrap();
        let mut s = ArrayStruct::describe(&t, true).unwrap();
        s.iface.two = 3;
        assert!(matches!(read_back(&s, &t), Err(Error::InvalidInterface(_))));
        s.iface.two = 2;
        s.iface.flags &= !NPY_NOTSWAPPED;
        assert!(matches!(read_back(&s, &t), Err(Error::UnsupportedDType { .. })));
        s.iface.flags |= NPY_NOTSWAPPED;
        s.strides[0] = 6;
        let e = read_back(&s, &t).unwrap_err();
        assert!(e.to_string().contains("whole element"), "{e}");
        // bfloat16 has no typestr kind: refused, not described as bytes.
        let b = Tensor::from_vec(vec![0u16; 2], vec![2]).unwrap().view_as(crate::DType::BFloat16).unwrap();
        assert!(matches!(ArrayStruct::describe(&b, false), Err(Error::UnsupportedDType { .. })));
    }
}

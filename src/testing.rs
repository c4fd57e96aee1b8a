//! Test helpers shared by unit tests, integration tests and benches: drop counters that prove
//! an allocation is freed exactly once, and a hand-built foreign DLPack producer.
//!
//! Not part of the stable API.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::device::Device;
use crate::dtype::DType;
use crate::ffi::dlpack::{
    DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};
use crate::tensor::{Native, Tensor};

/// Packs bools into an LSB-first Arrow bitmap, bit by bit: the reference for bit kernels.
pub fn pack_bools(v: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; v.len().div_ceil(8)];
    for (i, &b) in v.iter().enumerate() {
        out[i / 8] |= (b as u8) << (i % 8);
    }
    out
}

/// Counts how many times something was dropped or deleted.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// The count so far.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    fn bump(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A Vec that counts its own drop; becomes a tensor's owner.
pub struct DropCounter<T> {
    values: Vec<T>,
    counter: Counter,
}

impl<T> Drop for DropCounter<T> {
    fn drop(&mut self) {
        self.counter.bump();
    }
}

impl<T: Native> DropCounter<T> {
    /// The owner and a handle on its drop count.
    pub fn new(values: Vec<T>) -> (Self, Counter) {
        let counter = Counter::default();
        (DropCounter { values, counter: counter.clone() }, counter)
    }

    /// A writable C-contiguous CPU tensor owned by this counter.
    pub fn tensor(self, shape: Vec<i64>) -> Tensor {
        let data = self.values.as_ptr() as *mut u8;
        assert_eq!(shape.iter().product::<i64>() as usize, self.values.len());
        // SAFETY: the Vec's heap block moves with `self` into the Arc and holds exactly the
        // elements of `shape` (asserted above).
        unsafe { Tensor::from_raw_parts(data, shape, None, T::DTYPE, Device::Cpu, false, Arc::new(self)) }
            .expect("valid test layout")
    }
}

struct FixtureCtx {
    _values: Box<dyn std::any::Any>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
    deletes: Counter,
}

/// A foreign producer built by hand: a `DLManagedTensorVersioned` with a counting deleter,
/// whose fields a test may corrupt before handing it to an importer.
pub struct ForeignFixture {
    /// The managed tensor; `shape`/`strides` pointers are re-pointed at the vectors below by
    /// [`ForeignFixture::into_raw`] unless a test set them to NULL.
    pub managed: DLManagedTensorVersioned,
    /// The extents.
    pub shape: Vec<i64>,
    /// The strides, in elements.
    pub strides: Vec<i64>,
    /// Overrides `ndim` (otherwise `shape.len()`).
    pub ndim: Option<i32>,
    values: Box<dyn std::any::Any>,
    deletes: Counter,
}

impl ForeignFixture {
    /// A 1-D CPU tensor over `values`, version 1.3, no flags.
    pub fn new<T: Native>(values: Vec<T>) -> (Self, Counter) {
        let deletes = Counter::default();
        let n = values.len() as i64;
        let data = values.as_ptr() as *mut c_void;
        let managed = DLManagedTensorVersioned {
            version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(fixture_deleter),
            flags: 0,
            dl_tensor: DLTensor {
                data,
                device: Device::Cpu.to_dlpack(),
                ndim: 1,
                dtype: T::DTYPE.to_dlpack(),
                shape: std::ptr::NonNull::dangling().as_ptr(),
                strides: std::ptr::NonNull::dangling().as_ptr(),
                byte_offset: 0,
            },
        };
        let f = ForeignFixture {
            managed,
            shape: vec![n],
            strides: vec![1],
            ndim: None,
            values: Box::new(values),
            deletes: deletes.clone(),
        };
        (f, deletes)
    }

    /// Changes the dtype the producer reports.
    pub fn set_dtype(&mut self, dtype: DType) {
        self.managed.dl_tensor.dtype = dtype.to_dlpack();
    }

    /// Hands the managed tensor over; its deleter frees everything and bumps the counter.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let ForeignFixture { mut managed, mut shape, mut strides, ndim, values, deletes } = self;
        let dl = &mut managed.dl_tensor;
        dl.ndim = ndim.unwrap_or(shape.len() as i32);
        if !dl.shape.is_null() {
            dl.shape = shape.as_mut_ptr();
        }
        if !dl.strides.is_null() {
            dl.strides = strides.as_mut_ptr();
        }
        let ctx = FixtureCtx { _values: values, _shape: shape, _strides: strides, deletes };
        managed.manager_ctx = Box::into_raw(Box::new(ctx)) as *mut c_void;
        Box::into_raw(Box::new(managed))
    }
}

/// The fixture's deleter: frees the managed tensor and its context, and counts the call.
///
/// # Safety
/// `managed` is NULL or a tensor made by `ForeignFixture::into_raw`, released once (the DLPack
/// deleter contract).
unsafe extern "C" fn fixture_deleter(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: installed only by ForeignFixture::into_raw, whose boxes are reclaimed once here.
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: manager_ctx is the FixtureCtx box made in into_raw.
    let ctx = unsafe { Box::from_raw(managed.manager_ctx as *mut FixtureCtx) };
    ctx.deletes.bump();
}

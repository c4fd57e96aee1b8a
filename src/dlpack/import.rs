//! Foreign `DLManagedTensor(Versioned)` -> [`ForeignTensor`] -> [`Tensor`] (without copying).

use std::ptr::NonNull;
use std::sync::Arc;

use super::export::{ExportCtx, ManagedTensor};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::dlpack::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION,
};
use crate::tensor::{MAX_NDIM, Tensor, c_strides, check_layout};

enum Raw {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

/// A validated foreign managed tensor. It owns the tensor: `Drop` calls the producer's
/// deleter exactly once, on whichever thread drops it.
pub struct ForeignTensor {
    raw: Raw,
    tensor: Option<Tensor>,
}

// SAFETY: DLPack lets the consumer call the deleter from any thread (producers that need the
// GIL take it inside their deleter), and the validated view is plain data.
unsafe impl Send for ForeignTensor {}
// SAFETY: shared access only reads the validated, immutable view.
unsafe impl Sync for ForeignTensor {}

impl ForeignTensor {
    /// Takes ownership of a `DLManagedTensorVersioned` and validates it.
    ///
    /// A major version other than ours is released through its deleter without reading any
    /// other field, as the ABI rule requires.
    ///
    /// # Errors
    /// [`Error::InvalidDlpack`], [`Error::InvalidLayout`], [`Error::UnsupportedDType`] or
    /// [`Error::UnsupportedDevice`]; the tensor has been released when an error returns.
    ///
    /// # Safety
    /// `ptr` is NULL or points to a live managed tensor that the caller owns and hands over:
    /// the caller must not use it or call its deleter afterwards. Its `dl_tensor` fields must be
    /// readable as the header describes (shape and strides of `ndim` elements, or NULL), and the
    /// data it describes must stay valid until the deleter runs.
    pub unsafe fn from_versioned(ptr: *mut DLManagedTensorVersioned) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::InvalidDlpack("NULL managed tensor".into()))?;
        // SAFETY: the caller hands over a live tensor; `version` and `flags` precede everything
        // an ABI change may move.
        let (version, flags) = unsafe { ((*ptr.as_ptr()).version, (*ptr.as_ptr()).flags) };
        if version.major != DLPACK_MAJOR_VERSION {
            // SAFETY: we own the tensor and release it once, touching only `deleter`.
            unsafe { DLManagedTensorVersioned::delete(ptr) };
            return Err(Error::InvalidDlpack(format!(
                "DLPack version {}.{} is not supported; dlframe reads major version \
                 {DLPACK_MAJOR_VERSION} (ask the producer for max_version=(1, 3))",
                version.major, version.minor
            )));
        }
        let readonly = flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
        let copied = flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0;
        let mut me = ForeignTensor { raw: Raw::Versioned(ptr), tensor: None };
        // SAFETY: the caller's contract covers the view; `me` now owns the tensor, so an error
        // below drops `me` and releases it.
        me.tensor = Some(unsafe { view(ptr, readonly, copied) }?);
        Ok(me)
    }

    /// Takes ownership of a legacy `DLManagedTensor` and validates it. Legacy tensors carry no
    /// flags: the result is treated as writable and not copied.
    ///
    /// # Errors
    /// As [`ForeignTensor::from_versioned`]; the tensor has been released when an error returns.
    ///
    /// # Safety
    /// As [`ForeignTensor::from_versioned`].
    pub unsafe fn from_legacy(ptr: *mut DLManagedTensor) -> Result<Self> {
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::InvalidDlpack("NULL managed tensor".into()))?;
        let mut me = ForeignTensor { raw: Raw::Legacy(ptr), tensor: None };
        // SAFETY: as in from_versioned.
        me.tensor = Some(unsafe { view(ptr, false, false) }?);
        Ok(me)
    }

    /// The validated view. Its owner is not this ForeignTensor: use [`Self::into_tensor`] to get
    /// a tensor that keeps the foreign memory alive.
    pub fn view(&self) -> &Tensor {
        self.tensor.as_ref().expect("a constructed ForeignTensor always has a view")
    }

    /// A tensor that keeps this foreign tensor (and so its memory) alive (without copying).
    /// The deleter runs when the last clone of the tensor, or of anything built from it such
    /// as an Arrow buffer, is dropped.
    pub fn into_tensor(mut self) -> Tensor {
        let view = self.tensor.take().expect("a constructed ForeignTensor always has a view");
        let owner = Arc::new(self);
        // SAFETY: the view was validated from the managed tensor that `owner` now keeps alive
        // until its last reference drops; flags and the logical field carry over.
        let t = unsafe {
            Tensor::from_raw_parts(
                view.data_ptr() as *mut u8,
                view.shape().to_vec(),
                Some(view.strides().to_vec()),
                view.dtype(),
                view.device(),
                view.readonly(),
                owner,
            )
        };
        t.expect("a validated view is a valid layout")
            .with_copied(view.copied())
            .with_readonly(view.readonly())
            .with_logical(view.logical().cloned())
    }
}

impl Drop for ForeignTensor {
    fn drop(&mut self) {
        self.tensor = None;
        // SAFETY: we own the managed tensor (taken over in the constructor) and drop once.
        unsafe {
            match self.raw {
                Raw::Legacy(p) => DLManagedTensor::delete(p),
                Raw::Versioned(p) => DLManagedTensorVersioned::delete(p),
            }
        }
    }
}

/// Validates the `DLTensor` of a managed tensor and builds a view with a dummy owner.
///
/// # Safety
/// As `ForeignTensor::from_versioned`; `ptr` stays live for the call.
unsafe fn view<M: ManagedTensor>(ptr: NonNull<M>, readonly: bool, copied: bool) -> Result<Tensor> {
    // SAFETY: the caller guarantees a live managed tensor.
    let managed = unsafe { ptr.as_ref() };
    let dl = managed.dl_tensor();
    let bad = |m: String| Err(Error::InvalidDlpack(m));
    if dl.ndim < 0 || dl.ndim as usize > MAX_NDIM {
        return bad(format!("ndim {} is outside 0..={MAX_NDIM}", dl.ndim));
    }
    let ndim = dl.ndim as usize;
    if ndim > 0 && dl.shape.is_null() {
        return bad(format!("NULL shape with ndim {ndim}"));
    }
    let dtype = DType::from_dlpack(dl.dtype)?;
    let device = Device::from_dlpack(dl.device)?;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: the header promises `ndim` readable extents behind a non-NULL shape.
        unsafe { std::slice::from_raw_parts(dl.shape, ndim) }.to_vec()
    };
    let strides = if dl.strides.is_null() || ndim == 0 {
        c_strides(&shape)
    } else {
        // SAFETY: as for shape.
        unsafe { std::slice::from_raw_parts(dl.strides, ndim) }.to_vec()
    };
    let extent = check_layout(&shape, &strides, dtype.itemsize())?;
    let offset = usize::try_from(dl.byte_offset)
        .ok()
        .filter(|&o| o <= isize::MAX as usize)
        .ok_or_else(|| Error::InvalidDlpack(format!("byte_offset {} overflows", dl.byte_offset)))?;
    let data = if extent.numel == 0 {
        std::ptr::null_mut()
    } else {
        if dl.data.is_null() {
            return bad(format!("NULL data for {} elements", extent.numel));
        }
        // The span of the layout around this address is checked by Tensor::from_raw_parts.
        (dl.data as usize).checked_add(offset).ok_or_else(|| {
            Error::InvalidDlpack(format!("data {:p} + byte_offset {offset} overflows", dl.data))
        })?;
        (dl.data as *mut u8).wrapping_add(offset)
    };
    let logical = if managed.is_ours() {
        // SAFETY: our deleter is installed only by our exporter, whose manager_ctx is an
        // ExportCtx that lives until the deleter runs.
        let ctx = unsafe { &*(managed.manager_ctx() as *const ExportCtx) };
        ctx.tensor.logical().cloned()
    } else {
        None
    };
    // SAFETY: the layout was checked above and the producer keeps the data alive until its
    // deleter runs; the view is only used while the ForeignTensor lives, and into_tensor
    // rebuilds it with the ForeignTensor as owner.
    let t =
        unsafe { Tensor::from_raw_parts(data, shape, Some(strides), dtype, device, readonly, Arc::new(())) }?;
    Ok(t.with_copied(copied).with_readonly(readonly && !copied).with_logical(logical))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{export_legacy, export_versioned};
    use crate::testing::{DropCounter, ForeignFixture};

    #[test]
    fn consumed_export_round_trips_and_frees_once() {
        let (owner, drops) = DropCounter::new(vec![1i32, 2, 3, 4, 5, 6]);
        let t = owner.tensor(vec![2, 3]);
        let ptr = t.data_ptr();
        let raw = export_versioned(t).into_raw();
        // SAFETY: raw is a fresh export whose ownership moves to the importer.
        let foreign = unsafe { ForeignTensor::from_versioned(raw) }.unwrap();
        let back = foreign.into_tensor();
        assert_eq!(back.data_ptr(), ptr);
        assert_eq!(back.shape(), &[2, 3]);
        assert_eq!(back.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
        let clone = back.clone();
        drop(back);
        assert_eq!(drops.get(), 0);
        drop(clone);
        assert_eq!(drops.get(), 1);

        let (owner, drops) = DropCounter::new(vec![1u16, 2]);
        let raw = export_legacy(owner.tensor(vec![2])).into_raw();
        // SAFETY: as above.
        let foreign = unsafe { ForeignTensor::from_legacy(raw) }.unwrap();
        assert!(!foreign.view().readonly());
        drop(foreign);
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn a_future_major_version_is_released_without_reading() {
        let (owner, drops) = DropCounter::new(vec![1.0f64]);
        let raw = export_versioned(owner.tensor(vec![1])).into_raw();
        // SAFETY: raw is live and ours until handed to the importer below.
        unsafe {
            (*raw).version.major = 2;
            (*raw).dl_tensor.ndim = -7; // must not be read
        }
        // SAFETY: ownership moves to the importer.
        let err = unsafe { ForeignTensor::from_versioned(raw) }.err().unwrap();
        assert!(err.to_string().contains("version 2"), "{err}");
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn rejected_tensors_are_released_once() {
        type Corrupt = Box<dyn Fn(&mut ForeignFixture)>;
        let cases: Vec<(&str, Corrupt)> = vec![
            ("negative extent", Box::new(|f| f.shape[0] = -1)),
            ("overflows", Box::new(|f| f.shape[0] = i64::MAX)),
            ("ndim", Box::new(|f| f.ndim = Some(65))),
            ("ndim", Box::new(|f| f.ndim = Some(-1))),
            ("code=5", Box::new(|f| f.managed.dl_tensor.dtype.code = 5)),
            ("lanes=4", Box::new(|f| f.managed.dl_tensor.dtype.lanes = 4)),
            ("device_type=99", Box::new(|f| f.managed.dl_tensor.device.device_type = 99)),
            ("NULL data", Box::new(|f| f.managed.dl_tensor.data = std::ptr::null_mut())),
            ("NULL shape", Box::new(|f| f.managed.dl_tensor.shape = std::ptr::null_mut())),
            ("byte_offset", Box::new(|f| f.managed.dl_tensor.byte_offset = u64::MAX)),
            ("overflows", Box::new(|f| f.strides[0] = i64::MAX / 2)),
        ];
        for (expect, mutate) in cases {
            let (mut fixture, deletes) = ForeignFixture::new(vec![1.0f32, 2.0, 3.0, 4.0]);
            mutate(&mut fixture);
            // SAFETY: the fixture hands over a live tensor with a counting deleter.
            let err = unsafe { ForeignTensor::from_versioned(fixture.into_raw()) }.err().unwrap();
            assert!(err.to_string().contains(expect), "{expect}: {err}");
            assert_eq!(deletes.get(), 1, "{expect}");
        }
    }

    #[test]
    fn null_strides_mean_compact_and_byte_offset_is_honoured() {
        let (mut fixture, deletes) = ForeignFixture::new(vec![1i32, 2, 3, 4, 5, 6]);
        fixture.set_dtype(DType::Int32);
        fixture.shape = vec![2, 2];
        fixture.managed.dl_tensor.strides = std::ptr::null_mut();
        fixture.managed.dl_tensor.byte_offset = 8;
        // SAFETY: as above.
        let t = unsafe { ForeignTensor::from_versioned(fixture.into_raw()) }.unwrap().into_tensor();
        assert_eq!(t.strides(), &[2, 1]);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[3, 4, 5, 6]);
        assert!(!t.readonly());
        drop(t);
        assert_eq!(deletes.get(), 1);
    }

    #[test]
    fn dropping_on_another_thread_calls_the_deleter_there() {
        let (fixture, deletes) = ForeignFixture::new(vec![1.0f32; 16]);
        // SAFETY: as above.
        let t = unsafe { ForeignTensor::from_versioned(fixture.into_raw()) }.unwrap().into_tensor();
        std::thread::spawn(move || drop(t)).join().unwrap();
        assert_eq!(deletes.get(), 1);
    }
}

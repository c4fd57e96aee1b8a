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
use crate::tensor::{Dims, MAX_NDIM, Tensor, c_strides_inline, check_layout};

enum Raw {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

/// The producer's managed tensor, released through its deleter exactly once: when the last
/// tensor (or Arrow buffer) over its memory drops, on whichever thread that is.
struct Managed(Raw);

// SAFETY: DLPack lets the consumer call the deleter from any thread (producers that need the
// GIL take it inside their deleter); nothing else is read through the pointer after import.
unsafe impl Send for Managed {}
// SAFETY: shared access never touches the pointer; only the single drop does.
unsafe impl Sync for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: we own the managed tensor (taken over by the importer) and drop once.
        unsafe {
            match self.0 {
                Raw::Legacy(p) => DLManagedTensor::delete(p),
                Raw::Versioned(p) => DLManagedTensorVersioned::delete(p),
            }
        }
    }
}

/// A validated foreign managed tensor. It owns the tensor: the producer's deleter runs exactly
/// once, when this and every tensor taken from it have dropped.
pub struct ForeignTensor {
    /// The validated view, already kept alive by the managed tensor: one allocation per import
    /// (the shared owner), none for up to two extents and strides.
    tensor: Tensor,
}

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
        // From here the owner releases the tensor, on an error below as well.
        let owner = Arc::new(Managed(Raw::Versioned(ptr)));
        // SAFETY: the caller's contract covers the view; `owner` keeps it alive.
        Ok(ForeignTensor { tensor: unsafe { view(ptr, readonly, copied, owner) }? })
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
        let owner = Arc::new(Managed(Raw::Legacy(ptr)));
        // SAFETY: as in from_versioned.
        Ok(ForeignTensor { tensor: unsafe { view(ptr, false, false, owner) }? })
    }

    /// The validated view, over the foreign memory.
    pub fn view(&self) -> &Tensor {
        &self.tensor
    }

    /// A tensor that keeps this foreign tensor (and so its memory) alive (without copying).
    /// The deleter runs when the last clone of the tensor, or of anything built from it such
    /// as an Arrow buffer, is dropped.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

/// Validates the `DLTensor` of a managed tensor and builds the tensor over it, kept alive by
/// `owner` (the managed tensor itself: dropping the last reference on an error releases it).
///
/// # Safety
/// As `ForeignTensor::from_versioned`; `ptr` stays live until `owner` drops.
unsafe fn view<M: ManagedTensor>(
    ptr: NonNull<M>,
    readonly: bool,
    copied: bool,
    owner: Arc<Managed>,
) -> Result<Tensor> {
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
    let shape: Dims = if ndim == 0 {
        Dims::new()
    } else {
        // SAFETY: the header promises `ndim` readable extents behind a non-NULL shape.
        Dims::from_slice(unsafe { std::slice::from_raw_parts(dl.shape, ndim) })
    };
    let strides = if dl.strides.is_null() || ndim == 0 {
        c_strides_inline(&shape)
    } else {
        // SAFETY: as for shape.
        Dims::from_slice(unsafe { std::slice::from_raw_parts(dl.strides, ndim) })
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
        // The span of the layout around this address is checked by Tensor::from_checked_dims.
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
    // SAFETY: `extent` is the layout's, checked above, and the producer keeps the data alive
    // until its deleter runs, which only the last reference to `owner` calls.
    let t =
        unsafe { Tensor::from_checked_dims(data, shape, strides, extent, dtype, device, readonly, owner) }?;
    Ok(t.with_copied(copied).with_readonly(readonly && !copied).with_logical(logical))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlpack::{export_legacy, export_versioned};
    use crate::testing::{DropCounter, ForeignFixture};

    /// A fixture's tensor handed to [`ForeignTensor::from_versioned`].
    fn take(fixture: ForeignFixture) -> Result<ForeignTensor> {
        // SAFETY: the fixture hands over a live tensor with a counting deleter, owned by the
        // importer from here; what a test corrupts (the version, extents, ndim, dtype, device,
        // byte offset, NULL pointers) is checked before anything is read through it.
        unsafe { ForeignTensor::from_versioned(fixture.into_raw()) }
    }

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
        let (mut fixture, deletes) = ForeignFixture::new(vec![1.0f64]);
        fixture.managed.version.major = 2;
        fixture.ndim = Some(-7); // must not be read
        let err = take(fixture).err().unwrap();
        assert!(err.to_string().contains("version 2"), "{err}");
        assert_eq!(deletes.get(), 1);
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
            let err = take(fixture).err().unwrap();
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
        let t = take(fixture).unwrap().into_tensor();
        assert_eq!(t.strides(), &[2, 1]);
        assert_eq!(t.as_slice::<i32>().unwrap(), &[3, 4, 5, 6]);
        assert!(!t.readonly());
        drop(t);
        assert_eq!(deletes.get(), 1);
    }

    #[test]
    fn dropping_on_another_thread_calls_the_deleter_there() {
        let (fixture, deletes) = ForeignFixture::new(vec![1.0f32; 16]);
        let t = take(fixture).unwrap().into_tensor();
        std::thread::spawn(move || drop(t)).join().unwrap();
        assert_eq!(deletes.get(), 1);
    }
}

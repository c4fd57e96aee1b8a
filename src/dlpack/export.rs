//! Tensor -> `DLManagedTensor` / `DLManagedTensorVersioned` (without copying).

use std::ffi::{CStr, c_void};
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{NonNull, addr_of_mut};

use crate::ffi::dlpack::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_IS_COPIED, DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTENSOR, DLTENSOR_VERSIONED, DLTensor,
};
use crate::tensor::Tensor;

/// Everything a managed tensor points to (the tensor, whose shape and strides the view borrows):
/// `manager_ctx` points to it, and our deleter frees it with the managed tensor.
pub(crate) struct ExportCtx {
    pub(crate) tensor: Tensor,
}

/// One export in one allocation: the managed tensor first (its address is the allocation's),
/// then what its `manager_ctx` and its view point into.
#[repr(C)]
struct Export<M> {
    managed: M,
    ctx: ExportCtx,
}

/// The two managed-tensor structs, seen through what import and export share.
pub trait ManagedTensor: Sized {
    /// The name of a capsule that holds one unconsumed (`dltensor`, `dltensor_versioned`).
    const CAPSULE: &'static CStr;
    /// The tensor view.
    fn dl_tensor(&self) -> &DLTensor;
    /// The `manager_ctx` field.
    fn manager_ctx(&self) -> *mut c_void;
    /// Calls the struct's deleter, if it has one.
    ///
    /// # Safety
    /// `ptr` must point to a live managed tensor that the caller owns; it is invalid afterwards.
    /// Call at most once per tensor.
    unsafe fn delete(ptr: NonNull<Self>);
    /// True when `deleter` is dlframe's own, so `manager_ctx` is an `ExportCtx` (the boxed shape, strides and tensor).
    fn is_ours(&self) -> bool;
}

/// The impl for each managed-tensor struct: they differ only in the struct, in which of
/// dlframe's deleters marks an export as its own, and in the capsule's name.
macro_rules! managed_tensor {
    ($managed:ty, $ours:ident, $capsule:expr) => {
        impl ManagedTensor for $managed {
            const CAPSULE: &'static CStr = $capsule;
            fn dl_tensor(&self) -> &DLTensor {
                &self.dl_tensor
            }
            fn manager_ctx(&self) -> *mut c_void {
                self.manager_ctx
            }
            /// # Safety
            /// As [`ManagedTensor::delete`].
            unsafe fn delete(ptr: NonNull<Self>) {
                // SAFETY: the caller guarantees ptr is live and owned; reading `deleter` is
                // allowed whatever the version (the ABI keeps it in place across majors).
                if let Some(deleter) = unsafe { (*ptr.as_ptr()).deleter } {
                    // SAFETY: the DLPack contract: the owner calls the deleter exactly once.
                    unsafe { deleter(ptr.as_ptr()) }
                }
            }
            fn is_ours(&self) -> bool {
                self.deleter.is_some_and(|d| std::ptr::fn_addr_eq(d, $ours as unsafe extern "C" fn(_)))
            }
        }
    };
}

managed_tensor!(DLManagedTensorVersioned, delete_versioned, DLTENSOR_VERSIONED);
managed_tensor!(DLManagedTensor, delete_legacy, DLTENSOR);

/// An exported managed tensor not yet handed to a consumer. Dropping it runs the deleter,
/// as a capsule destructor does for a capsule nobody consumed.
pub struct Exported<M: ManagedTensor>(NonNull<M>);

/// A `DLManagedTensorVersioned` awaiting its consumer.
pub type ExportedVersioned = Exported<DLManagedTensorVersioned>;
/// A legacy `DLManagedTensor` awaiting its consumer.
pub type ExportedLegacy = Exported<DLManagedTensor>;

// SAFETY: the managed tensor and its context are heap boxes owned by this guard alone, and the
// Tensor inside is Send + Sync.
unsafe impl<M: ManagedTensor> Send for Exported<M> {}

impl<M: ManagedTensor> Exported<M> {
    /// The managed tensor, still owned by the guard.
    pub fn as_ptr(&self) -> *mut M {
        self.0.as_ptr()
    }
    /// The managed tensor, still owned by the guard, as a non-null pointer.
    pub fn as_non_null(&self) -> NonNull<M> {
        self.0
    }
    /// The view, for inspection.
    pub fn dl_tensor(&self) -> &DLTensor {
        // SAFETY: the guard owns a live managed tensor.
        unsafe { self.0.as_ref() }.dl_tensor()
    }
    /// Hands ownership to a consumer, who must call the deleter exactly once.
    pub fn into_raw(self) -> *mut M {
        let ptr = self.0.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl<M: ManagedTensor> Drop for Exported<M> {
    fn drop(&mut self) {
        // SAFETY: the guard owns the tensor and drops once.
        unsafe { M::delete(self.0) }
    }
}

impl ExportedVersioned {
    /// The `flags` word.
    pub fn flags(&self) -> u64 {
        // SAFETY: the guard owns a live managed tensor.
        unsafe { self.0.as_ref() }.flags
    }
}

/// A non-owning view of `t` (no copy): `shape` and `strides` point into the tensor's own
/// arrays, which it may store inline, so the view is valid while `t` lives unchanged and does
/// not move. Strides are explicit for
/// `ndim >= 1`, `byte_offset` is 0, and an empty tensor has `data == NULL`. A view has no flags.
pub fn borrowed_view(t: &Tensor) -> DLTensor {
    let ndim = t.ndim();
    let (shape, strides) = if ndim == 0 {
        (std::ptr::null_mut(), std::ptr::null_mut())
    } else {
        (t.shape().as_ptr() as *mut i64, t.strides().as_ptr() as *mut i64)
    };
    let data = if t.numel() == 0 { std::ptr::null_mut() } else { t.data_ptr() as *mut c_void };
    DLTensor {
        data,
        device: t.device().to_dlpack(),
        ndim: ndim as i32,
        dtype: t.dtype().to_dlpack(),
        shape,
        strides,
        byte_offset: 0,
    }
}

/// Boxes `tensor` with the managed tensor that `make` builds from the view and the
/// `manager_ctx` (one allocation): both point into the box, where the tensor's shape and
/// strides (stored inline for up to 2 dimensions) no longer move.
fn boxed<M: ManagedTensor>(tensor: Tensor, make: impl FnOnce(DLTensor, *mut c_void) -> M) -> Exported<M> {
    let mut slot = Box::new(MaybeUninit::<Export<M>>::uninit());
    let export = slot.as_mut_ptr();
    // SAFETY: `export` points to the box's uninitialised Export; each field is written once
    // through a raw pointer, the context before the view that borrows it.
    unsafe {
        let ctx = addr_of_mut!((*export).ctx);
        ctx.write(ExportCtx { tensor });
        let view = borrowed_view(&(*ctx).tensor);
        addr_of_mut!((*export).managed).write(make(view, ctx.cast()));
    }
    let export = Box::into_raw(slot).cast::<Export<M>>();
    // SAFETY: Box::into_raw never returns NULL; both fields are initialised above; `managed` is
    // the first field of the repr(C) Export, at the allocation's address.
    Exported(unsafe { NonNull::new_unchecked(export.cast::<M>()) })
}

/// Exports a tensor as a DLPack 1.3 `DLManagedTensorVersioned` (without copying).
///
/// `flags`: `IS_COPIED` only for a copy that this export holds alone
/// ([`Tensor::is_sole_copy`]: the consumer becomes its sole owner and may write it);
/// otherwise `READ_ONLY` for memory that others share and must not see changed
/// ([`Tensor::shared_readonly`]: Arrow memory, read-only foreign memory, and a copy that the
/// tensor, an Arrow array or another consumer also holds). Strides are always explicit for
/// `ndim >= 1`, `byte_offset` is 0, and an empty tensor has `data == NULL`.
pub fn export_versioned(tensor: Tensor) -> ExportedVersioned {
    let flags = if tensor.is_sole_copy() {
        DLPACK_FLAG_BITMASK_IS_COPIED
    } else if tensor.shared_readonly() {
        DLPACK_FLAG_BITMASK_READ_ONLY
    } else {
        0
    };
    boxed(tensor, |dl_tensor, manager_ctx| DLManagedTensorVersioned {
        version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
        manager_ctx,
        deleter: Some(delete_versioned),
        flags,
        dl_tensor,
    })
}

/// Exports a tensor as a legacy `DLManagedTensor` (without copying).
///
/// The legacy struct cannot say "read-only": the caller decides whether sharing read-only
/// memory this way is acceptable (the Python layer copies, docs/conformance.md item 4).
pub fn export_legacy(tensor: Tensor) -> ExportedLegacy {
    boxed(tensor, |dl_tensor, manager_ctx| DLManagedTensor {
        dl_tensor,
        manager_ctx,
        deleter: Some(delete_legacy),
    })
}

/// Reclaims the one allocation of an export; never unwinds.
///
/// # Safety
/// `managed` came from [`boxed`] and has not been reclaimed.
unsafe fn reclaim<M: ManagedTensor>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: per the function contract, `managed` is the first field of an `Export<M>`
        // that `boxed` made with Box::into_raw, reclaimed once.
        drop(unsafe { Box::from_raw(managed as *mut Export<M>) });
    }));
}

/// The deleter of [`export_versioned`]'s tensors: frees the export's one allocation (the
/// managed tensor and the tensor it holds).
///
/// # Safety
/// `managed` is NULL or a tensor made by [`export_versioned`], not released before; DLPack's
/// owner calls the deleter once.
unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: only installed on structs made by export_versioned; DLPack calls it once.
    unsafe { reclaim(managed) }
}

/// [`delete_versioned`] for [`export_legacy`]'s tensors.
///
/// # Safety
/// As [`delete_versioned`], for a tensor made by [`export_legacy`].
unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    // SAFETY: only installed on structs made by export_legacy; DLPack calls it once.
    unsafe { reclaim(managed) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::DropCounter;

    #[test]
    fn unconsumed_export_runs_the_deleter_once() {
        let (owner, drops) = DropCounter::new(vec![1.0f32, 2.0, 3.0]);
        let t = owner.tensor(vec![3]);
        let exported = export_versioned(t);
        assert_eq!(drops.get(), 0);
        let dl = exported.dl_tensor();
        assert_eq!((dl.ndim, dl.byte_offset), (1, 0));
        // SAFETY: ndim is 1, so shape and strides each point to one element.
        unsafe { assert_eq!((*dl.shape, *dl.strides), (3, 1)) };
        drop(exported);
        assert_eq!(drops.get(), 1);

        let (owner, drops) = DropCounter::new(vec![7u8; 4]);
        drop(export_legacy(owner.tensor(vec![2, 2])));
        assert_eq!(drops.get(), 1);
    }

    #[test]
    fn is_copied_goes_only_to_an_export_that_holds_the_copy_alone() {
        let copy = || Tensor::from_vec(vec![1.0f64, 2.0], vec![2]).unwrap().with_copied(true);
        // Made for this one export: the consumer becomes the sole owner and may write.
        assert_eq!(export_versioned(copy()).flags(), DLPACK_FLAG_BITMASK_IS_COPIED);
        // The tensor (or an Arrow array made from it, which holds a clone) keeps the memory:
        // every export is shared, so read-only and never IS_COPIED.
        let kept = copy();
        for _ in 0..2 {
            assert_eq!(export_versioned(kept.clone()).flags(), DLPACK_FLAG_BITMASK_READ_ONLY);
        }
        // Once the other holders are gone, an export holds it alone again.
        assert_eq!(export_versioned(kept).flags(), DLPACK_FLAG_BITMASK_IS_COPIED);
        // Memory that is not a copy keeps its own flags.
        let writable = Tensor::from_vec(vec![1u8], vec![1]).unwrap();
        assert_eq!(export_versioned(writable.clone()).flags(), 0);
        assert_eq!(export_versioned(writable.with_readonly(true)).flags(), DLPACK_FLAG_BITMASK_READ_ONLY);
    }

    #[test]
    fn zero_dim_and_empty_exports_follow_the_spec() {
        let scalar = Tensor::from_vec(vec![5i64], vec![]).unwrap();
        let e = export_versioned(scalar);
        let dl = e.dl_tensor();
        assert!(dl.shape.is_null() && dl.strides.is_null() && !dl.data.is_null());
        let empty = Tensor::from_vec(Vec::<f64>::new(), vec![0]).unwrap();
        let e = export_versioned(empty);
        assert!(e.dl_tensor().data.is_null() && !e.dl_tensor().strides.is_null());
    }

    #[test]
    fn an_export_keeps_its_shape_and_strides_wherever_the_tensor_kept_them() {
        // Up to 2 dimensions the tensor stores them inline, so the export's view must point into
        // the export's own copy, not into the tensor it was made from; more spill to the heap.
        for shape in [vec![6], vec![2, 3], vec![1, 2, 3], vec![1, 2, 3, 1], vec![1, 2, 1, 1, 3, 1, 1]] {
            let t = Tensor::from_vec((0..6).collect::<Vec<i64>>(), shape.clone()).unwrap();
            let strides = t.strides().to_vec();
            let (versioned, legacy) = (export_versioned(t.clone()), export_legacy(t.clone()));
            // The source moves and goes away; the exports hold the memory.
            let moved = vec![t];
            drop(moved);
            for dl in [versioned.dl_tensor(), legacy.dl_tensor()] {
                let n = dl.ndim as usize;
                // SAFETY: ndim >= 1, so shape and strides point to ndim elements each; the data
                // is 6 contiguous i64 values; the export keeps all three alive.
                let (got_shape, got_strides, values) = unsafe {
                    (
                        std::slice::from_raw_parts(dl.shape, n),
                        std::slice::from_raw_parts(dl.strides, n),
                        std::slice::from_raw_parts(dl.data as *const i64, 6),
                    )
                };
                assert_eq!((got_shape, got_strides), (&shape[..], &strides[..]));
                assert_eq!(values, &[0, 1, 2, 3, 4, 5]);
            }
        }
    }
}

//! [`Tensor`]: a typed, shaped view of memory, with an owner that keeps the memory alive.
//!
//! A `Tensor` never owns memory by itself: it holds an `Arc` to whatever does (an Arrow
//! `Buffer`, a [`ForeignTensor`](crate::dlpack::ForeignTensor), a `Vec`). Cloning a tensor
//! clones that `Arc`; nothing here copies data. Shapes and strides are in elements, as in
//! DLPack, and are validated with checked arithmetic at construction.

mod layout;

use std::fmt;
use std::panic::RefUnwindSafe;
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_schema::FieldRef;
use smallvec::SmallVec;

pub(crate) use layout::c_strides_inline;
pub use layout::{
    Extent, MAX_NDIM, c_strides, check as check_layout, f_strides, is_c_contiguous, is_f_contiguous,
};

use crate::decide::Cause;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Anything that can keep a tensor's memory alive: dropped from any thread, exactly once.
pub trait Owner: Send + Sync + RefUnwindSafe + 'static {}
impl<T: Send + Sync + RefUnwindSafe + 'static> Owner for T {}

/// How a device tensor tells consumers when its data is ready (CUDA streams and events).
/// Host tensors have none: their data is ready when they exist.
pub trait DeviceSync: Send + Sync + RefUnwindSafe + 'static {
    /// Makes the consumer's stream (a raw handle; 1 = legacy default, 2 = per-thread default)
    /// wait until the data is ready, without blocking the host; the memory is then freed only
    /// after the work queued on that stream.
    ///
    /// # Errors
    /// A device error.
    fn wait_on(&self, stream: usize) -> Result<()>;
    /// Blocks the host until the data is ready.
    ///
    /// # Errors
    /// A device error.
    fn synchronize(&self) -> Result<()>;
    /// The producer's stream handle, never 0.
    fn producer_stream(&self) -> usize;
}

/// A Rust scalar with a tensor dtype.
pub trait Native: Copy + Send + Sync + RefUnwindSafe + 'static {
    /// Its dtype.
    const DTYPE: DType;
}
macro_rules! native {
    ($($V:ident($T:ty, $($row:tt)*))*) => { $(impl Native for $T { const DTYPE: DType = DType::$V; })* };
}
crate::dtype_table!(native);

/// Extents or strides: inline up to 2 dimensions (columns and tables), in the space of a Vec,
/// so that cloning such a tensor (each export does) allocates nothing. Their address moves with
/// the tensor.
pub(crate) type Dims = SmallVec<[i64; 2]>;

/// A strided, typed view of memory on some device, kept alive by its owner.
pub struct Tensor {
    data: *mut u8,
    shape: Dims,
    strides: Dims,
    dtype: DType,
    device: Device,
    readonly: bool,
    copied: bool,
    logical: Option<FieldRef>,
    sync: Option<Arc<dyn DeviceSync>>,
    owner: Arc<dyn Owner>,
}

// SAFETY: `data` points into memory kept alive by `owner`, which is `Send + Sync`. A Tensor
// only reads through `data`; writes happen only while building a fresh copy that no one else
// can see yet.
unsafe impl Send for Tensor {}
// SAFETY: as for Send: shared references only read.
unsafe impl Sync for Tensor {}

impl Tensor {
    /// Wraps memory that `owner` keeps alive (without copying).
    ///
    /// `strides: None` means C-contiguous. `data` is the address of element `[0, ..., 0]`
    /// (negative strides reach below it) and may be NULL only when the tensor is empty.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] for a negative or overflowing shape, a wrong number of strides,
    /// or a NULL pointer with elements.
    ///
    /// # Safety
    /// Every element reachable through `shape` and `strides` from `data` must lie in memory on
    /// `device` that stays valid (and, if `readonly`, unchanged) for as long as `owner` lives.
    pub unsafe fn from_raw_parts(
        data: *mut u8,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
        dtype: DType,
        device: Device,
        readonly: bool,
        owner: Arc<dyn Owner>,
    ) -> Result<Self> {
        // SAFETY: the caller's contract, passed on.
        unsafe { Self::from_raw_slices(data, &shape, strides.as_deref(), dtype, device, readonly, owner) }
    }

    /// [`Tensor::from_raw_parts`] with the extents and strides borrowed: they are copied into
    /// the tensor, inline for up to two dimensions, so a caller that reads them from a foreign
    /// description (a numpy array, a `Py_buffer`) allocates nothing for them.
    ///
    /// # Errors
    /// As [`Tensor::from_raw_parts`].
    ///
    /// # Safety
    /// As [`Tensor::from_raw_parts`].
    pub unsafe fn from_raw_slices(
        data: *mut u8,
        shape: &[i64],
        strides: Option<&[i64]>,
        dtype: DType,
        device: Device,
        readonly: bool,
        owner: Arc<dyn Owner>,
    ) -> Result<Self> {
        let strides = match strides {
            Some(s) => Dims::from_slice(s),
            None => c_strides_inline(shape),
        };
        let extent = check_layout(shape, &strides, dtype.itemsize())?;
        // SAFETY: the caller's contract, passed on; `extent` is the layout's, checked above.
        unsafe {
            Self::from_checked_dims(
                data,
                Dims::from_slice(shape),
                strides,
                extent,
                dtype,
                device,
                readonly,
                owner,
            )
        }
    }

    /// [`Tensor::from_raw_parts`] of a layout its caller has checked already (a DLPack import
    /// needs the extent before it builds the tensor), with extents and strides in their inline
    /// form: a tensor of up to two dimensions is built without allocating for them.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] for a NULL pointer with elements or a layout that reaches
    /// outside the address space.
    ///
    /// # Safety
    /// As [`Tensor::from_raw_parts`], and `extent` is what [`check_layout`] returned for
    /// `shape`, `strides` and `dtype`'s item size.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn from_checked_dims(
        data: *mut u8,
        shape: Dims,
        strides: Dims,
        extent: Extent,
        dtype: DType,
        device: Device,
        readonly: bool,
        owner: Arc<dyn Owner>,
    ) -> Result<Self> {
        if data.is_null() && extent.numel > 0 {
            return Err(Error::layout(format!("NULL data pointer for {} elements", extent.numel)));
        }
        if extent.numel > 0 {
            // Checked in i128: a descriptor whose strides walk from `data` past either end of
            // the address space would make every pointer computed from it wrap.
            let (low, high) = extent.byte_bounds(data as usize as i128, dtype.itemsize());
            if low < 0 || high > usize::MAX as i128 {
                return Err(Error::layout(format!(
                    "the tensor at {data:p} with shape {shape:?} and strides {strides:?} reaches outside \
                     the address space"
                )));
            }
        }
        Ok(Tensor {
            data,
            shape,
            strides,
            dtype,
            device,
            readonly,
            copied: false,
            logical: None,
            sync: None,
            owner,
        })
    }

    /// A CPU tensor over an Arrow buffer, starting `byte_offset` bytes in (without copying).
    /// The tensor is read-only: Arrow memory is shared and immutable.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when the layout is invalid or reaches outside the buffer.
    pub fn from_buffer(
        buffer: Buffer,
        byte_offset: usize,
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
        dtype: DType,
    ) -> Result<Self> {
        let strides = strides.unwrap_or_else(|| c_strides(&shape));
        let extent = check_layout(&shape, &strides, dtype.itemsize())?;
        let (low, high) = extent.byte_bounds(byte_offset as i128, dtype.itemsize());
        let inside = if extent.numel == 0 {
            byte_offset <= buffer.len()
        } else {
            low >= 0 && high <= buffer.len() as i128
        };
        if !inside {
            return Err(Error::layout(format!(
                "shape {shape:?} with strides {strides:?} at byte offset {byte_offset} reaches \
                 outside a buffer of {} bytes",
                buffer.len()
            )));
        }
        // SAFETY: byte_offset <= buffer.len() was checked above, so the pointer stays inside
        // (or one past) the allocation.
        let data = unsafe { buffer.as_ptr().add(byte_offset) } as *mut u8;
        // SAFETY: every reachable element lies in [lo, hi) within the buffer (checked above),
        // and the buffer, moved into the owner, keeps it alive and immutable.
        unsafe {
            Self::from_raw_parts(data, shape, Some(strides), dtype, Device::Cpu, true, Arc::new(buffer))
        }
    }

    /// A new writable, C-contiguous CPU tensor of zeros (allocates; 8-byte aligned).
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] for a negative or overflowing shape.
    pub fn zeros(dtype: DType, shape: Vec<i64>) -> Result<Self> {
        let extent = check_layout(&shape, &c_strides(&shape), dtype.itemsize())?;
        let words = vec![0u64; (extent.numel * dtype.itemsize()).div_ceil(8)];
        let data = if words.is_empty() { std::ptr::null_mut() } else { words.as_ptr() as *mut u8 };
        // SAFETY: the zeroed allocation holds numel elements of `dtype` (every bit pattern of
        // zeros is a valid value of each dtype), does not move when the Vec moves into the Arc,
        // and is written only by the one consumer it is handed to.
        unsafe { Self::from_raw_parts(data, shape, None, dtype, Device::Cpu, false, Arc::new(words)) }
    }

    /// A writable CPU tensor that owns `values` (without copying them).
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when `shape` does not hold `values.len()` elements.
    pub fn from_vec<T: Native>(values: Vec<T>, shape: Vec<i64>) -> Result<Self> {
        let extent = check_layout(&shape, &c_strides(&shape), T::DTYPE.itemsize())?;
        if extent.numel != values.len() {
            return Err(Error::LengthMismatch {
                what: format!("a tensor of shape {shape:?}"),
                expected: extent.numel,
                found: values.len(),
            });
        }
        let data = if values.is_empty() { std::ptr::null_mut() } else { values.as_ptr() as *mut u8 };
        // SAFETY: the Vec's heap allocation does not move when the Vec moves into the Arc, and
        // holds exactly numel contiguous elements.
        unsafe { Self::from_raw_parts(data, shape, None, T::DTYPE, Device::Cpu, false, Arc::new(values)) }
    }

    /// Address of element `[0, ..., 0]` (NULL or dangling for an empty tensor).
    pub fn data_ptr(&self) -> *const u8 {
        self.data
    }
    /// Extents, in elements.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// Strides, in elements (always explicit).
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }
    /// Bytes of the elements (not of the span).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.itemsize()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }
    /// True when consumers must not write (shared Arrow memory).
    pub fn readonly(&self) -> bool {
        self.readonly
    }
    /// True when dlframe made this memory as a copy (or it arrived with DLPack `IS_COPIED`):
    /// no one outside dlframe holds it.
    pub fn copied(&self) -> bool {
        self.copied
    }
    /// True when a consumer that shares this memory must not write it: shared Arrow memory,
    /// read-only foreign memory, and also a copy, since every view of a tensor's copy is shared
    /// with the tensor itself, with Arrow arrays made from it and with other consumers. Only an
    /// export that holds the memory alone may be written ([`Tensor::is_sole_copy`]).
    pub fn shared_readonly(&self) -> bool {
        self.readonly || self.copied
    }
    /// True when this tensor is a copy that nothing else holds: no clone of the tensor, no Arrow
    /// array made from it, no other export. Only then may an export carry DLPack `IS_COPIED`,
    /// which tells the consumer that it is the sole owner and may write.
    pub fn is_sole_copy(&self) -> bool {
        // A device tensor's readiness hook may be the owner itself: that is not another holder.
        let sync_is_owner =
            self.sync.as_ref().is_some_and(|s| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(&self.owner)));
        self.copied && Arc::strong_count(&self.owner) == 1 + usize::from(sync_is_owner)
    }
    /// True when the elements are C-contiguous.
    pub fn is_c_contiguous(&self) -> bool {
        is_c_contiguous(&self.shape, &self.strides)
    }
    /// The strides of a dense layout the elements are in, when they fill exactly the `nbytes`
    /// bytes from the data pointer: C order's canonical strides (also when they are in both),
    /// F order's (numpy's `asfortranarray`), or the tensor's own when they are another order of
    /// the dimensions (a permuted `fixed_shape_tensor`); None for gaps, overlaps, negative
    /// strides or an empty tensor in neither C nor F order.
    pub fn dense_strides(&self) -> Option<Vec<i64>> {
        if self.is_c_contiguous() {
            return Some(c_strides(&self.shape));
        }
        if is_f_contiguous(&self.shape, &self.strides) {
            return Some(f_strides(&self.shape));
        }
        // Another order: the dimensions, innermost first by stride, must each step over
        // exactly the ones inside them.
        let mut dims: Vec<(i64, i64)> = self
            .shape
            .iter()
            .zip(self.strides.iter())
            .filter(|(d, _)| **d != 1)
            .map(|(&d, &s)| (s, d))
            .collect();
        dims.sort_unstable();
        let mut inner = 1i64;
        for (stride, size) in dims {
            if size == 0 || stride != inner {
                return None;
            }
            inner = inner.checked_mul(size)?;
        }
        Some(self.strides.to_vec())
    }
    /// True when the data pointer is aligned to the element size.
    pub fn is_aligned(&self) -> bool {
        (self.data as usize) % self.dtype.itemsize() == 0
    }
    /// The Arrow field this tensor came from, used to restore logical types on the way back.
    pub fn logical(&self) -> Option<&FieldRef> {
        self.logical.as_ref()
    }
    /// How consumers wait for device data to be ready (`None` for host tensors).
    pub fn sync(&self) -> Option<&Arc<dyn DeviceSync>> {
        self.sync.as_ref()
    }
    /// Sets the device readiness hook.
    pub fn with_sync(mut self, sync: Option<Arc<dyn DeviceSync>>) -> Self {
        self.sync = sync;
        self
    }
    /// The owner that keeps the memory alive.
    pub fn owner(&self) -> &Arc<dyn Owner> {
        &self.owner
    }

    /// Sets the Arrow field to restore on the way back.
    pub fn with_logical(mut self, field: Option<FieldRef>) -> Self {
        self.logical = field;
        self
    }
    /// Marks the tensor as a fresh copy (DLPack `IS_COPIED`); also clears `readonly`. The
    /// memory must be reachable only through this tensor's owner.
    pub fn with_copied(mut self, copied: bool) -> Self {
        self.copied = copied;
        if copied {
            self.readonly = false;
        }
        self
    }
    /// Sets the read-only flag.
    pub fn with_readonly(mut self, readonly: bool) -> Self {
        self.readonly = readonly;
        self
    }

    /// The elements as a slice, when the tensor is CPU, C-contiguous, aligned and of type `T`
    /// (without copying).
    ///
    /// # Errors
    /// [`Error::UnsupportedDType`] for another dtype, [`Error::CopyRequired`] for memory that
    /// the CPU cannot read in place or that is strided, [`Error::Misaligned`].
    pub fn as_slice<T: Native>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::UnsupportedDType {
                what: format!("{} (asked for {})", self.dtype, T::DTYPE),
                remedy: "read the tensor with its own dtype".into(),
            });
        }
        self.check_host_contiguous()?;
        if self.numel() == 0 {
            return Ok(&[]);
        }
        // SAFETY: host-readable, C-contiguous, aligned (checked above) numel elements of T kept
        // alive by self.owner for the lifetime of &self.
        Ok(unsafe { std::slice::from_raw_parts(self.data as *const T, self.numel()) })
    }

    /// The raw bytes, when the tensor is CPU-readable and C-contiguous (without copying). Any
    /// alignment is fine: bytes have none.
    ///
    /// # Errors
    /// [`Error::CopyRequired`] for memory that the CPU cannot read in place or that is strided.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        match self.check_host_contiguous() {
            Ok(()) | Err(Error::Misaligned { .. }) => {}
            Err(e) => return Err(e),
        }
        if self.numel() == 0 {
            return Ok(&[]);
        }
        // SAFETY: host-readable, C-contiguous (checked above) nbytes bytes kept alive by
        // self.owner for the lifetime of &self; u8 needs no alignment.
        Ok(unsafe { std::slice::from_raw_parts(self.data as *const u8, self.nbytes()) })
    }

    /// The same elements under another C-order shape (without copying). The logical Arrow
    /// type is dropped, since it described the old shape.
    ///
    /// # Errors
    /// [`Error::CopyRequired`] when the tensor is not C-contiguous; [`Error::LengthMismatch`]
    /// when `shape` does not hold exactly [`Tensor::numel`] elements; [`Error::InvalidLayout`]
    /// for a negative or overflowing shape.
    pub fn reshape(&self, shape: Vec<i64>) -> Result<Tensor> {
        if !self.is_c_contiguous() {
            return Err(self.strided("C-contiguous"));
        }
        let strides = c_strides(&shape);
        let extent = check_layout(&shape, &strides, self.dtype.itemsize())?;
        if extent.numel != self.numel() {
            return Err(Error::LengthMismatch {
                what: format!("a reshape of {:?} to {shape:?}", self.shape),
                expected: self.numel(),
                found: extent.numel,
            });
        }
        Ok(Tensor {
            shape: Dims::from_vec(shape),
            strides: Dims::from_vec(strides),
            logical: None,
            ..self.clone()
        })
    }

    /// The same memory read as another dtype of the same size (without copying): bfloat16 as
    /// uint16 for consumers that have no bfloat16. The logical Arrow type is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the item sizes differ.
    pub fn view_as(&self, dtype: DType) -> Result<Tensor> {
        if dtype.itemsize() != self.dtype.itemsize() {
            return Err(Error::InvalidArgument(format!(
                "a {} tensor cannot be read as {dtype}: the item sizes differ",
                self.dtype
            )));
        }
        Ok(Tensor { dtype, logical: None, ..self.clone() })
    }

    /// The reason a zero-copy view as one contiguous host slice is impossible, if any.
    pub fn check_host_contiguous(&self) -> Result<()> {
        self.check_host_slice()?;
        if self.numel() > 0 && !self.is_c_contiguous() {
            return Err(self.strided("C-contiguous"));
        }
        Ok(())
    }

    /// As [`Tensor::check_host_contiguous`], in any dense order: the strides
    /// ([`Tensor::dense_strides`]) that a copy of the `nbytes` bytes at `data` keeps.
    ///
    /// # Errors
    /// As [`Tensor::check_host_contiguous`], for a tensor in neither order.
    pub fn check_host_dense(&self) -> Result<Vec<i64>> {
        self.check_host_slice()?;
        match self.dense_strides() {
            Some(strides) => Ok(strides),
            None if self.numel() == 0 => Ok(c_strides(&self.shape)),
            None => Err(self.strided("dense")),
        }
    }

    /// The refusal of a view that needs the layout `needs`.
    fn strided(&self, needs: &'static str) -> Error {
        Cause::Strided { shape: self.shape.to_vec(), strides: self.strides.to_vec(), needs }.refused()
    }

    /// Host memory, aligned unless empty.
    fn check_host_slice(&self) -> Result<()> {
        if !self.device.is_host_accessible() {
            return Err(Cause::OnDevice(self.device).refused());
        }
        if self.numel() > 0 && !self.is_aligned() {
            return Err(Error::Misaligned { ptr: self.data as usize, align: self.dtype.itemsize() });
        }
        Ok(())
    }
}

impl Clone for Tensor {
    /// Another handle on the same memory (no copy of the elements). The extents and strides
    /// are copied as slices: SmallVec's own clone goes element by element.
    fn clone(&self) -> Self {
        Tensor {
            shape: Dims::from_slice(&self.shape),
            strides: Dims::from_slice(&self.strides),
            logical: self.logical.clone(),
            sync: self.sync.clone(),
            owner: self.owner.clone(),
            ..*self
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("data", &self.data)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .field("readonly", &self.readonly)
            .field("copied", &self.copied)
            .field("logical", &self.logical.as_ref().map(|f| f.data_type()))
            .finish()
    }
}

#[cfg(test)]
mod tests;

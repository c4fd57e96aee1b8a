//! Fresh output buffers for the kernels: 64-byte aligned, zero-initialised, and for large
//! outputs on Linux backed by transparent huge pages (as numpy does for its own arrays), so a
//! new tensor costs a few faults per 2 MiB instead of one per 4 KiB.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::{ArrowNativeType, Buffer};

use crate::error::{Error, Result};

/// Outputs at least this large are mapped with `MADV_HUGEPAGE`.
pub const HUGE_PAGE_THRESHOLD: usize = 4 << 20;
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;
const ALIGN: usize = 64;

enum Backing {
    Heap(Layout),
    #[cfg(target_os = "linux")]
    Mapped {
        base: *mut libc::c_void,
        len: usize,
    },
}

/// A zeroed, aligned, uniquely owned host buffer that becomes an Arrow [`Buffer`] without
/// copying.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: the buffer owns its memory exclusively; nothing else points into it.
unsafe impl Send for HostBuffer {}
// SAFETY: shared references only read.
unsafe impl Sync for HostBuffer {}
impl std::panic::RefUnwindSafe for HostBuffer {}

impl HostBuffer {
    /// `len` zero bytes.
    ///
    /// # Errors
    /// [`Error::InvalidLayout`] when the size overflows or the allocation fails.
    pub fn zeroed(len: usize) -> Result<Self> {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE_THRESHOLD {
            return Self::mapped(len);
        }
        let layout = Layout::from_size_align(len.max(1), ALIGN).map_err(Error::layout)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::layout(format!("could not allocate {len} bytes")))?;
        Ok(HostBuffer { ptr, len, backing: Backing::Heap(layout) })
    }

    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Result<Self> {
        let map_len = len.checked_add(HUGE_PAGE).ok_or_else(|| Error::layout("allocation size overflows"))?;
        // SAFETY: an anonymous private mapping; the kernel zero-fills its pages.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::layout(format!("could not map {len} bytes")));
        }
        let start = (base as usize).next_multiple_of(HUGE_PAGE);
        // SAFETY: [start, start + len) lies inside the mapping (it has HUGE_PAGE bytes of slack).
        // The advice is a hint: failure (THP off) leaves ordinary pages, which is fine.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        let ptr = NonNull::new(start as *mut u8).expect("a mapping is never at address 0");
        Ok(HostBuffer { ptr, len, backing: Backing::Mapped { base, len: map_len } })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised (zeroed) bytes owned by self; &mut self makes them unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as whole elements of `T` (the buffer is 64-byte aligned).
    pub fn typed_mut<T: ArrowNativeType>(&mut self) -> &mut [T] {
        let n = self.len / std::mem::size_of::<T>();
        // SAFETY: aligned to 64 >= align_of::<T>(), initialised, unique; every bit pattern is
        // a valid T for Arrow's native types.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<T>(), n) }
    }

    /// An Arrow buffer that owns this memory (without copying).
    pub fn into_buffer(self) -> Buffer {
        let (ptr, len) = (self.ptr, self.len);
        // SAFETY: `len` initialised bytes at `ptr`, kept alive (and never written again) by the
        // owner, which frees them when the last Arrow buffer drops.
        unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(self)) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            #[cfg(target_os = "linux")]
            Backing::Mapped { base, len } => {
                // SAFETY: the mapping made in `mapped`, unmapped once.
                unsafe { libc::munmap(base, len) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_are_zeroed_aligned_and_become_arrow_buffers() {
        for len in [0, 1, 100, HUGE_PAGE_THRESHOLD + 3] {
            let mut b = HostBuffer::zeroed(len).unwrap();
            assert!(b.as_mut_slice().iter().all(|&x| x == 0));
            assert_eq!(b.as_mut_slice().as_ptr() as usize % ALIGN, 0);
            if len > 0 {
                b.as_mut_slice()[len - 1] = 7;
            }
            let buf = b.into_buffer();
            assert_eq!(buf.len(), len);
            if len > 0 {
                assert_eq!(buf.as_slice()[len - 1], 7);
            }
        }
    }
}

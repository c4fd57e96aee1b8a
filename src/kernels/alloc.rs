//! Fresh output buffers for the kernels: 64-byte aligned, and for large outputs on Linux
//! backed by transparent huge pages (as numpy does for its own arrays), so a new tensor costs a
//! few faults per 2 MiB instead of one per 4 KiB.
//!
//! Large mappings are recycled: when a buffer drops, its mapping goes to a small pool (at most
//! [`POOL_BUFFERS`] mappings and [`POOL_BYTES`] in all) instead of back to the kernel, and
//! [`HostBuffer::for_overwrite`] hands it out again without zeroing, as glibc does for numpy's
//! repeated allocations. Recycled bytes are initialised (they held an earlier tensor), and only
//! writers that overwrite every byte may ask for them.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;

use super::cast::Element;

use crate::error::{Error, Result};

/// Outputs at least this large are mapped with `MADV_HUGEPAGE`.
pub const HUGE_PAGE_THRESHOLD: usize = 4 << 20;
/// Most recycled mappings kept.
pub const POOL_BUFFERS: usize = 4;
/// Most bytes kept in recycled mappings.
pub const POOL_BYTES: usize = 1 << 30;
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

    /// `len` bytes for a writer that overwrites every one of them: a recycled mapping when one
    /// fits (its bytes are those of an earlier tensor), else a fresh zeroed buffer.
    ///
    /// # Errors
    /// As [`HostBuffer::zeroed`].
    pub fn for_overwrite(len: usize) -> Result<Self> {
        #[cfg(target_os = "linux")]
        if len >= HUGE_PAGE_THRESHOLD
            && let Some(b) = pool::take(len)
        {
            return Ok(b);
        }
        Self::zeroed(len)
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
    pub fn typed_mut<T: Element>(&mut self) -> &mut [T] {
        let n = self.len / std::mem::size_of::<T>();
        // SAFETY: aligned to 64 >= align_of::<T>(), initialised, unique; every bit pattern is
        // a valid T for the kernels' element types (integers and IEEE-style floats; sealed).
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
                let start = self.ptr.as_ptr() as usize - base as usize;
                if !pool::give(pool::Mapping { base: base as usize, len, start }) {
                    // SAFETY: the mapping made in `mapped`, unmapped once (not pooled).
                    unsafe { libc::munmap(base, len) };
                }
            }
        }
    }
}

/// Recycled huge-page mappings.
#[cfg(target_os = "linux")]
mod pool {
    use std::ptr::NonNull;
    use std::sync::Mutex;

    use super::{Backing, HUGE_PAGE, HostBuffer, POOL_BUFFERS, POOL_BYTES};

    /// A whole mapping (`base`, `len`) whose usable, aligned part starts `start` bytes in.
    pub(super) struct Mapping {
        pub(super) base: usize,
        pub(super) len: usize,
        pub(super) start: usize,
    }

    static POOL: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());

    /// Keeps a mapping for reuse; false when the pool is full (the caller unmaps it).
    pub(super) fn give(m: Mapping) -> bool {
        let Ok(mut pool) = POOL.lock() else { return false };
        let held: usize = pool.iter().map(|m| m.len).sum();
        if pool.len() >= POOL_BUFFERS || held + m.len > POOL_BYTES {
            return false;
        }
        pool.push(m);
        true
    }

    /// A pooled mapping that holds `len` bytes without wasting more than half of itself.
    pub(super) fn take(len: usize) -> Option<HostBuffer> {
        let mut pool = POOL.lock().ok()?;
        let fits = |m: &Mapping| {
            let usable = m.len - m.start;
            usable >= len && usable <= 2 * len + HUGE_PAGE
        };
        let i = pool.iter().position(fits)?;
        let m = pool.swap_remove(i);
        let ptr = NonNull::new((m.base + m.start) as *mut u8)?;
        Some(HostBuffer {
            ptr,
            len,
            backing: Backing::Mapped { base: m.base as *mut libc::c_void, len: m.len },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes every mapping out of the pool, which the tests running in parallel share, so that
    /// the next mapping given back is the next one taken. The result holds them until it drops.
    #[cfg(target_os = "linux")]
    fn drain_pool() -> Vec<HostBuffer> {
        // take(len) fits usable sizes from len to 2 len + HUGE_PAGE: doubling covers them all.
        let mut held = Vec::new();
        let mut len = HUGE_PAGE_THRESHOLD;
        while len <= 2 * POOL_BYTES {
            while let Some(b) = pool::take(len) {
                held.push(b);
            }
            len *= 2;
        }
        held
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn large_mappings_are_recycled_for_overwriting_writers_only() {
        // A size no other test asks for, so that no test running beside this one takes it.
        let len = (96 << 20) + 4096;
        let marks = [0, 7, len / 2, len - 1];
        let _held = drain_pool();
        let mut a = HostBuffer::zeroed(len).unwrap();
        let ptr = a.as_mut_slice().as_ptr() as usize;
        for at in marks {
            a.as_mut_slice()[at] = 42;
        }
        drop(a); // into the pool, which is empty
        let mut fresh = HostBuffer::zeroed(len).unwrap();
        assert_ne!(fresh.as_mut_slice().as_ptr() as usize, ptr, "zeroed never recycles");
        assert!(marks.iter().all(|&at| fresh.as_mut_slice()[at] == 0), "zeroed never recycles");
        let mut again = HostBuffer::for_overwrite(len).unwrap();
        assert_eq!(again.len(), len);
        assert_eq!(again.as_mut_slice().as_ptr() as usize, ptr, "for_overwrite takes the pooled mapping");
        // Recycled as it was, not zeroed again: the earlier tensor's bytes are still there.
        assert!(marks.iter().all(|&at| again.as_mut_slice()[at] == 42));
        drop(fresh);
    }

    /// The writers that ask for recycled memory must overwrite every byte of it: a null fill
    /// that left the slots of an all-null word untouched would pass on fresh (zeroed) memory
    /// with a fill of 0, and shows here.
    #[cfg(target_os = "linux")]
    #[test]
    fn outputs_written_into_dirty_recycled_memory_hold_exactly_their_values() {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Float64Array};
        use arrow_schema::{DataType, Field, FieldRef};

        use crate::arrow::to_tensor;
        use crate::options::{ExportOptions, NullPolicy, Scalar};

        // 40 MiB of f64 (a size no other test asks for): nulls in whole 64-bit validity words,
        // in sparse and in dense words, all filled with 0.
        let n = 5 << 20;
        let is_null = |i: usize| i % 200 < 70 || i % 97 == 5 || (i / 64) % 3 == 1 && i % 2 == 0;
        let column: ArrayRef =
            Arc::new((0..n).map(|i| (!is_null(i)).then_some(i as f64)).collect::<Float64Array>());
        let field: FieldRef = Arc::new(Field::new("x", DataType::Float64, true));
        let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..Default::default() };
        let _held = drain_pool();
        let mut dirty = HostBuffer::zeroed(n * 8).unwrap();
        dirty.as_mut_slice().fill(0xab);
        let ptr = dirty.as_mut_slice().as_ptr() as usize;
        drop(dirty);
        let out = to_tensor(&field, &[column], &opts).unwrap().values;
        assert_eq!(out.data_ptr() as usize, ptr, "the output was written into the dirty mapping");
        let got = out.as_slice::<f64>().unwrap();
        for (i, &v) in got.iter().enumerate() {
            let want = if is_null(i) { 0.0 } else { i as f64 };
            assert!(v.to_bits() == want.to_bits(), "row {i}: {v} != {want}");
        }
    }

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

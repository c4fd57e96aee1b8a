//! Fresh output buffers for the kernels: 64-byte aligned, and for large outputs on Linux
//! backed by transparent huge pages (as numpy does for its own arrays), so a new tensor costs a
//! few faults per 2 MiB instead of one per 4 KiB.
//!
//! Buffers of [`RECYCLE_THRESHOLD`] bytes or more are recycled: when one drops (that is, when
//! the last tensor over it is released), its memory goes to a small pool (at most
//! [`POOL_BUFFERS`] buffers and [`POOL_BYTES`] in all; the oldest leave first) instead of back
//! to the allocator, and [`HostBuffer::for_overwrite`] hands it out again without zeroing, as
//! glibc does for numpy's repeated allocations. A stream of equal-sized batches thus writes
//! into the same few warm buffers instead of zeroing a fresh one each time. Recycled bytes are
//! initialised (they held an earlier tensor), and only writers that overwrite every byte may
//! ask for them. Memory still held by a tensor is never in the pool.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_buffer::Buffer;

use super::cast::Element;

use crate::error::{Error, Result};

/// Outputs at least this large are mapped with `MADV_HUGEPAGE`.
pub const HUGE_PAGE_THRESHOLD: usize = 4 << 20;
/// Buffers at least this large are recycled when they drop.
pub const RECYCLE_THRESHOLD: usize = 64 << 10;
/// Most recycled buffers kept.
pub const POOL_BUFFERS: usize = 8;
/// Most bytes kept in recycled buffers.
pub const POOL_BYTES: usize = 1 << 30;
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;
const ALIGN: usize = 64;

/// Where a buffer's memory comes from, and how it goes back.
#[derive(Clone, Copy)]
enum Backing {
    Heap(Layout),
    /// A whole mapping: its address and length.
    #[cfg(target_os = "linux")]
    Mapped {
        base: usize,
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
        if len >= RECYCLE_THRESHOLD
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
        Ok(HostBuffer { ptr, len, backing: Backing::Mapped { base: base as usize, len: map_len } })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Usable bytes from the start of the buffer (at least `len`; more for a recycled one).
    fn capacity(&self) -> usize {
        match self.backing {
            Backing::Heap(layout) => layout.size(),
            #[cfg(target_os = "linux")]
            Backing::Mapped { base, len } => base + len - self.ptr.as_ptr() as usize,
        }
    }

    /// The bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised (zeroed) bytes owned by self; &mut self makes them unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as whole elements of `T` (the buffer is 64-byte aligned; a partial last
    /// element is left out). No copy.
    pub fn typed_mut<T: Element>(&mut self) -> &mut [T] {
        let whole = self.len / std::mem::size_of::<T>() * std::mem::size_of::<T>();
        super::elements_mut(&mut self.as_mut_slice()[..whole]).expect("64-byte aligned whole elements")
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
        let cap = self.capacity();
        let freed = if cap >= RECYCLE_THRESHOLD {
            pool::give(self.ptr, cap, self.backing)
        } else {
            Some(self.backing)
        };
        if let Some(backing) = freed {
            // SAFETY: this buffer's memory (or one the pool let go of), freed once.
            unsafe { free(self.ptr, backing) }
        }
    }
}

/// Returns memory to where it came from.
///
/// # Safety
/// `ptr` and `backing` must be a buffer's own (from `zeroed`), not used afterwards, and freed
/// only once.
unsafe fn free(ptr: NonNull<u8>, backing: Backing) {
    match backing {
        // SAFETY: allocated in `zeroed` with this layout (the caller's contract).
        Backing::Heap(layout) => unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) },
        #[cfg(target_os = "linux")]
        Backing::Mapped { base, len } => {
            // SAFETY: the mapping made in `mapped` (the caller's contract).
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
    }
}

/// Recycled buffers, most recently given back last.
mod pool {
    use std::ptr::NonNull;
    use std::sync::Mutex;

    use super::{Backing, HostBuffer, POOL_BUFFERS, POOL_BYTES, free};

    /// A buffer's memory, not in use: `cap` usable bytes at `ptr`.
    struct Idle {
        ptr: usize,
        cap: usize,
        backing: Backing,
    }

    static POOL: Mutex<Vec<Idle>> = Mutex::new(Vec::new());

    /// Keeps a dropped buffer's memory for reuse, letting the oldest ones go to stay within
    /// the pool's limits. Returns the backing for the caller to free when the pool does not
    /// take it (larger than the pool, or the pool poisoned).
    pub(super) fn give(ptr: NonNull<u8>, cap: usize, backing: Backing) -> Option<Backing> {
        if cap > POOL_BYTES {
            return Some(backing);
        }
        let Ok(mut pool) = POOL.lock() else { return Some(backing) };
        pool.push(Idle { ptr: ptr.as_ptr() as usize, cap, backing });
        let mut held: usize = pool.iter().map(|m| m.cap).sum();
        let mut evicted = 0;
        while pool.len() - evicted > POOL_BUFFERS || held > POOL_BYTES {
            held -= pool[evicted].cap;
            evicted += 1;
        }
        let gone: Vec<Idle> = pool.drain(..evicted).collect();
        drop(pool);
        for m in gone {
            let ptr = NonNull::new(m.ptr as *mut u8).expect("pooled memory is never at address 0");
            // SAFETY: pooled memory belongs to the pool alone, and leaves it here once.
            unsafe { free(ptr, m.backing) };
        }
        None
    }

    /// The most recently pooled buffer that holds `len` bytes without wasting more than half
    /// of itself (a mapping may also waste its huge-page slack).
    pub(super) fn take(len: usize) -> Option<HostBuffer> {
        let mut pool = POOL.lock().ok()?;
        let fits = |m: &Idle| {
            let slack = match m.backing {
                Backing::Heap(_) => 0,
                #[cfg(target_os = "linux")]
                Backing::Mapped { .. } => super::HUGE_PAGE,
            };
            m.cap >= len && m.cap <= 2 * len + slack
        };
        let i = pool.iter().rposition(fits)?;
        let m = pool.remove(i);
        let ptr = NonNull::new(m.ptr as *mut u8)?;
        Some(HostBuffer { ptr, len, backing: m.backing })
    }

    /// Whether the pool holds the buffer of `cap` bytes at `ptr`. Both, since tests running
    /// beside the asking one may free and map memory at an address that the pool let go of, and
    /// give it back in a size of their own.
    #[cfg(test)]
    pub(super) fn holds(ptr: usize, cap: usize) -> bool {
        POOL.lock().unwrap().iter().any(|m| m.ptr == ptr && m.cap == cap)
    }

    /// Buffers in the pool.
    #[cfg(test)]
    pub(super) fn count() -> usize {
        POOL.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes every buffer out of the pool, which the tests running in parallel share, so that
    /// the next buffer given back is the next one taken. The result holds them until it drops,
    /// and holds off the other tests that drain the pool until then: one draining in the middle
    /// of another's checks would take its buffers and give them back later.
    fn drain_pool() -> (std::sync::MutexGuard<'static, ()>, Vec<HostBuffer>) {
        static DRAINING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let turn = DRAINING.lock().unwrap_or_else(|e| e.into_inner());
        // take(len) fits usable sizes from len to 2 len (+ HUGE_PAGE): doubling covers them all.
        let mut held = Vec::new();
        let mut len = RECYCLE_THRESHOLD;
        while len <= 2 * POOL_BYTES {
            while let Some(b) = pool::take(len) {
                held.push(b);
            }
            len *= 2;
        }
        (turn, held)
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

    /// A batch-sized heap buffer comes back to the next writer of its size, dirty, once it has
    /// dropped; the pool lets its oldest buffer go when an extra one arrives.
    #[test]
    fn batch_sized_heap_buffers_are_recycled_and_the_pool_stays_bounded() {
        // Sizes no other test asks for, below the mapped size, so that these are heap buffers.
        let len = 3 * RECYCLE_THRESHOLD + 192;
        let _held = drain_pool();
        let mut a = HostBuffer::zeroed(len).unwrap();
        a.as_mut_slice()[len - 1] = 42;
        let ptr = a.as_mut_slice().as_ptr() as usize;
        drop(a);
        let mut again = HostBuffer::for_overwrite(len).unwrap();
        assert_eq!(again.as_mut_slice().as_ptr() as usize, ptr, "for_overwrite takes the pooled buffer");
        assert_eq!(again.as_mut_slice()[len - 1], 42, "recycled as it was");
        assert_eq!(again.as_mut_slice().as_ptr() as usize % ALIGN, 0);
        let small = HostBuffer::for_overwrite(len / 2 - 1).unwrap();
        assert!(small.len() == len / 2 - 1);
        drop(small);

        // POOL_BUFFERS + 1 buffers given back one after another: the first is no longer pooled
        // (freed), the last is, and the pool holds no more than its limit.
        let mut bufs: Vec<HostBuffer> = (0..=POOL_BUFFERS)
            .map(|i| HostBuffer::zeroed((5 + i) * RECYCLE_THRESHOLD + 64).unwrap())
            .collect();
        let first = (bufs[0].as_mut_slice().as_ptr() as usize, bufs[0].capacity());
        let last = (bufs[POOL_BUFFERS].as_mut_slice().as_ptr() as usize, bufs[POOL_BUFFERS].capacity());
        for b in bufs.drain(..) {
            drop(b);
        }
        assert!(!pool::holds(first.0, first.1), "the oldest buffer left the pool");
        assert!(pool::holds(last.0, last.1), "the newest buffer is pooled");
        assert!(pool::count() <= POOL_BUFFERS);
        drop(again);
    }

    /// The same for a batch-sized stacked matrix (a heap buffer): 4 columns, two of them with
    /// nulls, interleaved into a buffer that held 0xab bytes.
    #[test]
    fn stacked_batches_written_into_dirty_recycled_buffers_hold_exactly_their_values() {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Float64Array};
        use arrow_schema::{DataType, Field, FieldRef};

        use crate::device::Device;
        use crate::options::{ExportOptions, NullPolicy, Scalar};
        use crate::table::{Columns, TableTensors, table_on};

        let (n, k) = (10_007, 4);
        let is_null = |i: usize, j: usize| j % 2 == 1 && (i % 200 < 70 || (i / 64) % 3 == 1);
        let fields: Vec<FieldRef> =
            (0..k).map(|j| Arc::new(Field::new(format!("c{j}"), DataType::Float64, true))).collect();
        let columns: Vec<Vec<ArrayRef>> = (0..k)
            .map(|j| {
                let values = (0..n).map(|i| (!is_null(i, j)).then_some((i * k + j) as f64));
                vec![Arc::new(values.collect::<Float64Array>()) as ArrayRef]
            })
            .collect();
        let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..Default::default() };
        let _held = drain_pool();
        let mut dirty = HostBuffer::zeroed(n * k * 8).unwrap();
        dirty.as_mut_slice().fill(0xab);
        let ptr = dirty.as_mut_slice().as_ptr() as usize;
        drop(dirty);
        let TableTensors::One(out) = table_on(&fields, &columns, Columns::Stack, &opts, Device::Cpu).unwrap()
        else {
            panic!("stacked")
        };
        assert_eq!(out.values.data_ptr() as usize, ptr, "the matrix was written into the dirty buffer");
        for (at, &v) in out.values.as_slice::<f64>().unwrap().iter().enumerate() {
            let (i, j) = (at / k, at % k);
            let want = if is_null(i, j) { 0.0 } else { at as f64 };
            assert!(v.to_bits() == want.to_bits(), "row {i} column {j}: {v} != {want}");
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

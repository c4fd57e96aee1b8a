//! A copy for memory that a device reads next: non-temporal stores, which write whole cache
//! lines to memory without first reading them into the cache.

/// Copies `src` into `dst` (copies) with non-temporal stores on x86-64, and ends with a store
/// fence, so that a thread that synchronises with this one afterwards (and a DMA it queues)
/// sees every byte. An ordinary copy reads each destination line into the cache before writing
/// it: a third more memory traffic, which a page-locked staging buffer, read next by the GPU's
/// copy engine and not by the CPU, does not need. Elsewhere it is `copy_from_slice`.
///
/// # Panics
/// When the two lengths differ, as `copy_from_slice` does.
pub fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy between slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let n = src.len();
        let (to, from) = (dst.as_mut_ptr(), src.as_ptr());
        // Bytes before the first 16-byte boundary of dst, copied as they are.
        let head = to.align_offset(16).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let mut i = head;
        // SAFETY: SSE2, which these intrinsics need, is part of every x86-64 target. Each
        // 16-byte load reads bytes i..i + 16 <= n of src (unaligned loads allow any address);
        // each store writes bytes i..i + 16 <= n of dst at a 16-byte boundary (i - head is a
        // multiple of 16), as _mm_stream_si128 requires; dst and src are distinct slices.
        unsafe {
            while i + 64 <= n {
                let s = from.add(i).cast::<__m128i>();
                let v = [
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                ];
                let d = to.add(i).cast::<__m128i>();
                for (k, v) in v.into_iter().enumerate() {
                    _mm_stream_si128(d.add(k), v);
                }
                i += 64;
            }
            while i + 16 <= n {
                _mm_stream_si128(to.add(i).cast(), _mm_loadu_si128(from.add(i).cast()));
                i += 16;
            }
        }
        dst[i..].copy_from_slice(&src[i..]);
        // Non-temporal stores are weakly ordered: the fence puts them before any later store
        // (the lock release that tells another thread the bytes are there).
        // SAFETY: SSE, which the fence needs, is part of every x86-64 target.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_copy_copies_every_byte_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..(1 << 20) + 300).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut cases = 0;
        for off in 0..17 {
            for len in (0..200).chain([1 << 20, (1 << 20) + 13]) {
                for from in [0, 3, 16] {
                    let mut dst = vec![0xeeu8; off + len + 16];
                    stream_copy(&mut dst[off..off + len], &src[from..from + len]);
                    assert!(dst[off..off + len] == src[from..from + len], "off {off} len {len} from {from}");
                    // Nothing outside the destination is touched.
                    assert!(
                        dst[..off].iter().chain(&dst[off + len..]).all(|&b| b == 0xee),
                        "off {off} len {len}"
                    );
                    cases += 1;
                }
            }
        }
        eprintln!("stream_copy: {cases} cases");
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn stream_copy_refuses_slices_of_different_lengths() {
        stream_copy(&mut [0u8; 3], &[1u8; 4]);
    }
}

//! The device kernels built for the CPU, for the tests: `kernels.cu` compiled by the host's C++
//! compiler behind a shim that defines `__global__`, `__device__` and the thread indices, loaded,
//! and run one (block, thread) at a time over a real launch grid. This checks the kernels'
//! arithmetic, casts, bit offsets and index maths, and the plans that drive them, against the CPU
//! path on machines without a GPU. What it cannot check (NVRTC, the driver, streams, parallel
//! execution) is left to the GPU tests.
//!
//! The random inputs are in `emulate/inputs.rs`, the test cases in `emulate/tests.rs`.

use std::process::Command;
use std::sync::OnceLock;

use super::launch::kernel_source;
use super::plan::{Kernel, Plan};

/// Defines what NVRTC provides: the launch indices (per host thread, so tests can run in
/// parallel) and the function qualifiers.
const SHIM: &str = r#"
struct dlf_dim3 { unsigned int x, y, z; };
static thread_local dlf_dim3 blockIdx, threadIdx, blockDim, gridDim;
extern "C" void dlf_at(unsigned bx, unsigned by, unsigned tx, unsigned gx, unsigned gy, unsigned bd) {
    blockIdx.x = bx; blockIdx.y = by; blockIdx.z = 0;
    threadIdx.x = tx; threadIdx.y = 0; threadIdx.z = 0;
    gridDim.x = gx; gridDim.y = gy; gridDim.z = 1;
    blockDim.x = bd; blockDim.y = 1; blockDim.z = 1;
}
#define __global__
#define __device__
#define __forceinline__ inline
"#;

type At = unsafe extern "C" fn(u32, u32, u32, u32, u32, u32);
type Convert = unsafe extern "C" fn(*mut u8, *mut u8, *const u8, *const u8, u64, u64, u64, u64);
type Gather = unsafe extern "C" fn(*mut u8, *const u8, *const i64, u64, u64, u64);

/// The kernels, loaded.
pub(crate) struct Emulator {
    at: At,
    convert: Convert,
    unpack: Convert,
    gather: Gather,
    // Keeps the functions above loaded.
    _lib: libloading::Library,
}

/// Why the emulator is not there.
pub(crate) enum Missing {
    /// No C++ compiler on this machine: the tests skip, saying so.
    NoCompiler(String),
}

/// The emulator, built once per test process. A compiler that rejects the kernels is a test
/// failure (a panic), not a skip.
pub(crate) fn emulator() -> std::result::Result<&'static Emulator, &'static Missing> {
    static E: OnceLock<std::result::Result<Emulator, Missing>> = OnceLock::new();
    E.get_or_init(build).as_ref()
}

fn build() -> std::result::Result<Emulator, Missing> {
    let dir = std::env::temp_dir().join(format!("dlframe-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let src = dir.join("kernels.cpp");
    let lib = dir.join("libdlframe_kernels.so");
    std::fs::write(&src, format!("{SHIM}\n{}", kernel_source())).expect("writing the kernel source");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-std=c++14", "-O1", "-Wall", "-Werror", "-fno-strict-aliasing", "-fPIC", "-shared", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .map_err(|e| {
            Missing::NoCompiler(format!("no C++ compiler `{cxx}` to build the kernels for the CPU: {e}"))
        })?;
    assert!(
        out.status.success(),
        "kernels.cu does not build for the CPU:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: our own library, just built from the shim and kernels.cu; loading it runs no
    // initialisers besides the zeroing of the thread-local indices.
    let lib = unsafe { libloading::Library::new(&lib) }.expect("loading the kernels built for the CPU");
    // SAFETY: the symbols are the shim's dlf_at and kernels.cu's kernels, with these signatures.
    let (at, convert, unpack, gather) = unsafe {
        (
            *lib.get::<At>(b"dlf_at").expect("dlf_at"),
            *lib.get::<Convert>(b"convert").expect("convert"),
            *lib.get::<Convert>(b"unpack").expect("unpack"),
            *lib.get::<Gather>(b"gather").expect("gather"),
        )
    };
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Emulator { at, convert, unpack, gather, _lib: lib })
}

/// 16-byte aligned zeroed bytes, as device allocations are (at least) aligned.
fn aligned(len: usize, byte: u8) -> Vec<u128> {
    vec![u128::from_ne_bytes([byte; 16]); len.div_ceil(16).max(1)]
}

fn bytes(v: &mut [u128]) -> &mut [u8] {
    // SAFETY: u128 has no padding and any byte pattern is a valid u8; same allocation.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 16) }
}

impl Emulator {
    /// Carries out `plan` as `transfer::run` does on a device (the output copies, then the
    /// scratch uploads and one launch of the plan's kernel over a `grid` of blocks of `block`
    /// threads, when needed): the output bytes and the mask. The outputs start as 0xAB, so an
    /// element no thread writes shows.
    pub fn run(&self, plan: &Plan, grid: (u32, u32), block: u32) -> (Vec<u8>, Option<Vec<u8>>) {
        let n = plan.len * plan.made.storage.itemsize();
        let mut out = aligned(n, 0xab);
        let mut mask = plan.made.mask.then(|| aligned(plan.len, 0xab));
        for (at, b) in plan.output_copies() {
            bytes(&mut out)[at..at + b.len()].copy_from_slice(b);
        }
        if plan.needs_kernel() {
            let mut scratch = aligned(plan.scratch_len(), 0);
            for (at, b) in plan.uploads() {
                bytes(&mut scratch)[at..at + b.len()].copy_from_slice(b);
            }
            let (segs, table_at) = plan.segments();
            let scratch = bytes(&mut scratch);
            let mask_ptr = mask.as_mut().map_or(std::ptr::null_mut(), |m| bytes(m).as_mut_ptr());
            let out_ptr = bytes(&mut out).as_mut_ptr();
            let kernel = match plan.kernel() {
                Kernel::Convert => self.convert,
                Kernel::Unpack => self.unpack,
            };
            for by in 0..grid.1 {
                for bx in 0..grid.0 {
                    for tx in 0..block {
                        // SAFETY: the kernel writes elements below plan.len of `out` and `mask`
                        // (allocated for them) and reads the scratch bytes the plan placed.
                        unsafe {
                            (self.at)(bx, by, tx, grid.0, grid.1, block);
                            kernel(
                                out_ptr,
                                mask_ptr,
                                scratch.as_ptr(),
                                scratch.as_ptr().add(table_at),
                                segs.len() as u64,
                                super::plan::code(plan.made.storage),
                                plan.made.storage.itemsize() as u64,
                                plan.made.fill.unwrap_or(0),
                            )
                        }
                    }
                }
            }
        }
        let out = bytes(&mut out)[..n].to_vec();
        let mask = mask.map(|mut m| bytes(&mut m)[..plan.len].to_vec());
        (out, mask)
    }

    /// Runs `gather` over a host tensor's view (as `transfer::device_copy` does on a device) over a grid of
    /// `blocks` blocks of `block` threads: the elements in C order.
    pub fn gather(&self, t: &crate::tensor::Tensor, blocks: u32, block: u32) -> Vec<u8> {
        let n = t.numel();
        let item = t.dtype().itemsize();
        let mut out = aligned(n * item, 0xab);
        let dims: Vec<i64> = t.shape().iter().chain(t.strides()).copied().collect();
        let out_ptr = bytes(&mut out).as_mut_ptr();
        for bx in 0..blocks {
            for tx in 0..block {
                // SAFETY: the view's elements lie in the tensor's memory (its layout invariant),
                // and `out` holds n elements.
                unsafe {
                    (self.at)(bx, 0, tx, blocks, 1, block);
                    (self.gather)(
                        out_ptr,
                        t.data_ptr(),
                        dims.as_ptr(),
                        t.ndim() as u64,
                        n as u64,
                        item as u64,
                    )
                }
            }
        }
        bytes(&mut out)[..n * item].to_vec()
    }
}

mod inputs;
mod tests;

//! The device kernels: their source (`kernels.cu` behind the `DT_*` dtype codes generated from
//! [`DType`]), compiled with NVRTC once per device when a kernel is first launched there, and
//! the launches: a plan's kernel (`convert`, or `unpack` for bools alone: a plan's segments
//! into a tensor) and `gather` (a strided view into C order). Launches only queue work on the
//! producer stream: allocating, filling and owning the memory they touch is the caller's job.
//! Built on `driver.rs`.

use std::collections::HashMap;
use std::fmt::Write;
use std::panic::catch_unwind;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::driver::{Gpu, cuda_err};
use super::plan::{self, Kernel, Plan};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `kernels.cu` as it is in the tree; it uses the `DT_*` codes but does not define them.
const KERNELS: &str = include_str!("kernels.cu");

/// The kernels' name for a dtype's code: `DT_` and the dtype's name in capitals (`DT_FLOAT32`).
fn code_name(d: DType) -> String {
    format!("DT_{}", d.name().to_ascii_uppercase())
}

/// The source that NVRTC (and, in the tests, the host's C++ compiler) builds: a `#define` of
/// every dtype's code, from [`DType::ALL`] and [`plan::code`] (what the plans send), then
/// `kernels.cu`. So the codes have one source, and a dtype added to the table gets its code here.
pub(super) fn kernel_source() -> String {
    let mut src = String::from("// Generated from dlframe's DType table (src/cuda/launch.rs).\n");
    for d in DType::ALL {
        // Writing to a String cannot fail.
        let _ = writeln!(src, "#define {} {}", code_name(d), plan::code(d));
    }
    src + "#line 1 \"kernels.cu\"\n" + KERNELS
}

/// The kernels of one device, loaded from the compiled module.
struct Kernels {
    convert: CudaFunction,
    unpack: CudaFunction,
    gather: CudaFunction,
}

/// The kernels on `g`'s device, compiled with NVRTC and loaded on first use. A failure is not
/// remembered: the next launch tries again.
fn kernels(g: &Gpu) -> Result<Arc<Kernels>> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
    let mut loaded = LOADED
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| Error::Cuda("kernel table poisoned".into()))?;
    if let Some(k) = loaded.get(&g.ordinal) {
        return Ok(k.clone());
    }
    let k = catch_unwind(|| -> Result<Kernels> {
        let ptx = cudarc::nvrtc::compile_ptx(kernel_source()).map_err(cuda_err)?;
        let module = g.ctx.load_module(ptx).map_err(cuda_err)?;
        let f = |name: &str| module.load_function(name).map_err(cuda_err);
        Ok(Kernels { convert: f("convert")?, unpack: f("unpack")?, gather: f("gather")? })
    })
    .map_err(|_| Error::Cuda("the NVRTC library could not be loaded to compile the CUDA kernels".into()))??;
    let k = Arc::new(k);
    loaded.insert(g.ordinal, k.clone());
    Ok(k)
}

/// Queues one launch of the plan's kernel (`convert`, or `unpack` for bools only) over its
/// segments on the producer stream (no host copy): it writes `out` (and `mask`) from the bytes
/// the plan placed in `scratch`.
///
/// `out` must hold `plan.len` elements of the plan's storage dtype, `mask` (if any) `plan.len`
/// bytes, and `scratch` the plan's uploads, queued on the producer stream before this launch.
pub(super) fn convert(
    g: &Gpu,
    plan: &Plan,
    out: &mut CudaSlice<u8>,
    mask: Option<&mut CudaSlice<u8>>,
    scratch: &CudaSlice<u8>,
) -> Result<()> {
    let k = kernels(g)?;
    let (segs, table_at) = plan.segments();
    let (function, slots) = match plan.kernel() {
        Kernel::Convert => (&k.convert, segs.iter().map(|g| g.rows * g.group).max().unwrap_or(0)),
        // A thread of `unpack` takes 32 rows at a time.
        Kernel::Unpack => (&k.unpack, segs.iter().map(|g| g.rows.div_ceil(32)).max().unwrap_or(0)),
    };
    // Blocks along y take segments (groups), along x slots; both loops stride over the grid.
    // About 2^12 blocks of 256 threads in all (several times what a large GPU holds at once),
    // however skewed the segments are: each thread then writes several slots. The grid's width
    // is a multiple of every group's size, so that each thread stays on one segment of its
    // group (the kernel's fast case).
    let gy = segs.len().clamp(1, 65535) as u64;
    let gx = slots.div_ceil(256).clamp(1, ((1 << 12) / gy).max(1));
    let unit = segs.iter().filter(|g| g.group > 1).fold(1, |unit, g| {
        let need = g.group / gcd(g.group, 256);
        unit / gcd(unit, need) * need
    });
    let gx = if unit <= 65535 { gx.div_ceil(unit) * unit } else { gx };
    let cfg =
        LaunchConfig { grid_dim: (gx as u32, gy as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let table = scratch.slice(table_at..);
    let item = plan.made.storage.itemsize() as u64;
    let (nseg, out_dt, fill, no_mask) =
        (segs.len() as u64, plan::code(plan.made.storage), plan.made.fill.unwrap_or(0), 0u64);
    let mut b = g.stream.launch_builder(function);
    b.arg(out);
    match mask {
        Some(m) => b.arg(m),
        None => b.arg(&no_mask),
    };
    b.arg(scratch).arg(&table).arg(&nseg).arg(&out_dt).arg(&item).arg(&fill);
    // SAFETY: the arguments match the signature of convert and unpack in kernels.cu (four
    // pointers, a null mask as 0, then u64s). The plan's segments write elements
    // out + i * stride below plan.len, for which `out` (and `mask`) were allocated, and read
    // only bytes placed in `scratch`.
    unsafe { b.launch(cfg) }.map_err(cuda_err)?;
    Ok(())
}

/// The greatest common divisor.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Queues one launch of `gather` on the producer stream: the elements of the view `t` (any
/// strides, negative and zero included) into `out` in C order (a device-to-device copy). Its
/// shape and strides are copied to the device first.
///
/// `t` must be a non-empty CUDA tensor on `g`'s device whose memory stays alive until the
/// kernel has run, with its readiness already awaited on the producer stream; `out` must hold
/// its `numel` elements.
///
/// # Errors
/// [`Error::Misaligned`] for data not aligned to its element size; [`Error::Cuda`] from the
/// driver or NVRTC.
pub(super) fn gather(g: &Gpu, t: &Tensor, out: &mut CudaSlice<u8>) -> Result<()> {
    let item = t.dtype().itemsize();
    if t.data_ptr() as usize % item != 0 {
        return Err(Error::Misaligned { ptr: t.data_ptr() as usize, align: item });
    }
    let k = kernels(g)?;
    let s = &g.stream;
    let dims: Vec<i64> = t.shape().iter().chain(t.strides()).copied().collect();
    let dims = s.clone_htod(&dims).map_err(cuda_err)?;
    let (src, ndim, n, item) = (t.data_ptr() as u64, t.ndim() as u64, t.numel() as u64, item as u64);
    let mut b = s.launch_builder(&k.gather);
    b.arg(out).arg(&src).arg(&dims).arg(&ndim).arg(&n).arg(&item);
    let blocks = n.div_ceil(256).min(1 << 20) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match gather's signature in kernels.cu; `src` is the tensor's
    // element 0 on this device and every element the view reaches lies in its allocation (the
    // Tensor's layout invariant) and is aligned (checked above); `out` holds n elements; per
    // this function's contract the memory outlives the kernel.
    unsafe { b.launch(cfg) }.map_err(cuda_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// The `DT_*` identifiers a source mentions (defined or used).
    fn dt_names(src: &str) -> BTreeSet<&str> {
        let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        src.match_indices("DT_")
            .filter(|(at, _)| !src[..*at].ends_with(is_ident))
            .map(|(at, _)| {
                let rest = &src[at..];
                &rest[..rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len())]
            })
            .filter(|name| name.len() > "DT_".len())
            .collect()
    }

    #[test]
    fn the_kernels_take_their_dtype_codes_from_the_dtype_table() {
        // kernels.cu must not define a code of its own: the generated one is the only source.
        let own: Vec<&str> = KERNELS.lines().filter(|l| l.trim_start().starts_with("#define DT_")).collect();
        assert!(
            own.is_empty(),
            "kernels.cu defines dtype codes itself; they are generated from DType: {own:?}"
        );
        let src = kernel_source();
        let defined: BTreeMap<String, u64> = src
            .lines()
            .filter_map(|l| l.strip_prefix("#define "))
            .filter(|l| l.starts_with("DT_"))
            .map(|l| {
                let (name, value) = l.split_once(' ').expect("#define NAME VALUE");
                (name.to_string(), value.trim().parse().expect("a number"))
            })
            .collect();
        for d in DType::ALL {
            // What the plans send for `d` is what the kernels read as its name.
            assert_eq!(defined.get(&code_name(d)), Some(&plan::code(d)), "{d}");
            // Each dtype the plans may send is one the kernel loads and stores (without a case
            // it would fall through to another dtype's width).
            let cases = KERNELS.matches(&format!("case {}:", code_name(d))).count();
            assert!(cases >= 2, "kernels.cu has no load and store case for {} ({d})", code_name(d));
        }
        let codes: BTreeSet<u64> = defined.values().copied().collect();
        assert_eq!((defined.len(), codes.len()), (DType::ALL.len(), DType::ALL.len()), "{defined:?}");
        // Every code the kernels use is one of those.
        for name in dt_names(KERNELS) {
            assert!(defined.contains_key(name), "kernels.cu uses {name}, which no DType defines");
        }
    }

    #[test]
    fn nvrtc_compiles_the_kernels_without_a_device() {
        // Set to 1, lets this test skip without NVRTC; without it a missing NVRTC fails it, so
        // that a CI run that lost the library does not pass vacuously.
        const ALLOW_SKIP: &str = "DLFRAME_ALLOW_SKIP_NVRTC";
        // SAFETY: only checks whether the NVRTC library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            let why = "NVRTC (libnvrtc.so) is not on the library path; scripts/test.sh puts the one \
                       from PyPI's nvidia-cuda-nvrtc-cu12 there";
            assert!(
                std::env::var_os(ALLOW_SKIP).is_some_and(|v| v == "1"),
                "{why}; set {ALLOW_SKIP}=1 to skip this test"
            );
            eprintln!("skipped ({ALLOW_SKIP}=1): {why}");
            return;
        }
        // What `kernels` compiles when a kernel is first launched; NVRTC needs no device or driver.
        let ptx = cudarc::nvrtc::compile_ptx(kernel_source())
            .unwrap_or_else(|e| panic!("NVRTC rejects kernels.cu: {e:?}"));
        let src = ptx.to_src();
        for kernel in ["convert", "unpack", "gather"] {
            assert!(src.contains(&format!(".entry {kernel}(")), "no entry point {kernel} in the PTX");
        }
        eprintln!("nvrtc: 1 case ran: kernels.cu compiled to {} bytes of PTX, 3 entry points", src.len());
    }
}

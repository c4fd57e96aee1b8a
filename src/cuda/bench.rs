//! A device timing for the benchmarks only (feature `bench-internals`, not part of the public
//! API): the `convert` kernel in the cases of the kernel-bandwidth target against a plain
//! device-to-device copy, as `benches/gpu.py` reports it. Built on the transfers and launches.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, Float32Array, Int64Array};
use arrow_schema::{DataType, Field, FieldRef};
use cudarc::driver::sys;

use super::driver::{cuda_err, gpu, guarded};
use super::plan::{self, Plan};
use super::staging::Uploads;
use super::{launch, transfer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::Scalar;
use crate::options::{ExportOptions, NullPolicy};

/// Launches timed together, per case and repetition.
const BATCH: usize = 10;

/// One timed case: its name, the bytes the kernel reads and writes at the least, and its best
/// time in milliseconds.
pub type Timing = (String, f64, f64);

/// Device times (best of `reps`, each the mean of 10 launches queued back to back between CUDA
/// events on our stream, on `cuda:ordinal`) of the device kernels (`unpack` for the bools,
/// `convert` for the rest) over `n` elements, every tenth one null and filled with 0, in the
/// cases the kernel-bandwidth target names, then of a device-to-device copy of `4 n` bytes:
///
/// | case | reads | writes |
/// |---|---|---|
/// | `fill` | a float32 column's values and validity | float32, 0 in the null slots |
/// | `bool unpack` | `4 n` bit-packed bools and their validity | one byte per element |
/// | `cast` | int64 values and validity | float32 |
/// | `interleave` | 8 float32 columns of `n / 8` rows and validity | an `(n / 8, 8)` C-order matrix |
/// | `copy` | `4 n` bytes | `4 n` bytes |
///
/// The bytes of each are what it must read and write at the least. The bool case takes `4 n`
/// elements, so that it writes as many bytes as the copy it is compared with: at `n` its 1.25
/// bytes per element would make a launch short enough that its start and drain, not the
/// bandwidth, set its time. It allocates about `40 n` bytes of device memory and copies the
/// inputs to the device once.
///
/// # Errors
/// [`Error::Cuda`] without a device, or when `n` is below 8.
pub fn kernel_timing(ordinal: usize, n: usize, reps: usize) -> Result<Vec<Timing>> {
    if n < 8 {
        return Err(Error::Cuda("n must be at least 8".into()));
    }
    let n = n / 8 * 8;
    let valid = |i: usize| i % 10 != 0;
    let float = |rows: usize, from: usize| -> ArrayRef {
        Arc::new((from..from + rows).map(|i| valid(i).then_some(i as f32)).collect::<Float32Array>())
    };
    let field = |name: String, dt: DataType| -> FieldRef { Arc::new(Field::new(name, dt, true)) };
    let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..Default::default() };
    let (nf, bits) = (n as f64, n as f64 / 8.0);
    let fields: Vec<FieldRef> = (0..8).map(|j| field(format!("c{j}"), DataType::Float32)).collect();
    let columns: Vec<Vec<ArrayRef>> = (0..8).map(|j| vec![float(n / 8, j * n / 8)]).collect();
    let bools: ArrayRef =
        Arc::new((0..4 * n).map(|i| valid(i).then_some(i % 3 == 0)).collect::<BooleanArray>());
    let ints: ArrayRef = Arc::new((0..n).map(|i| valid(i).then_some(i as i64)).collect::<Int64Array>());
    // The kernel's cast is timed: rounding is allowed, so any n passes the host's check.
    let inexact = crate::options::Inexact::Round;
    let cast = ExportOptions { dtype: Some(DType::Float32), inexact, ..opts };
    let cases: Vec<(&str, Plan, f64)> = vec![
        (
            "fill",
            plan::column(&field("x".into(), DataType::Float32), &[float(n, 0)], &opts)?,
            8.0 * nf + bits,
        ),
        (
            "bool unpack",
            plan::column(&field("b".into(), DataType::Boolean), &[bools], &opts)?,
            4.0 * (2.0 * bits + nf),
        ),
        (
            "cast",
            plan::column(&field("i".into(), DataType::Int64), &[ints], &cast)?,
            8.0 * nf + bits + 4.0 * nf,
        ),
        ("interleave", plan::matrix(&fields, &columns, &opts)?, 4.0 * nf + bits + 4.0 * nf),
    ];
    let g = gpu(ordinal)?;
    guarded(|| -> Result<Vec<Timing>> {
        g.bind()?;
        let s = &g.stream;
        let mut up = Uploads::new(&g)?;
        let mut scratch = Vec::new();
        for (_, p, _) in &cases {
            let (buffer, pieces) = transfer::scratch(&g, p)?;
            // SAFETY: the plan's pieces lie apart within its scratch buffer, which lives to the
            // end of this function, after the stream has run the copies (the timings wait).
            unsafe { up.copy_all(&pieces) }?;
            scratch.push(buffer);
        }
        drop(up);
        let mut a = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let mut b = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut best = vec![f64::INFINITY; cases.len() + 1];
        for _ in 0..=reps {
            // BATCH launches back to back between two events: the device then runs them one
            // after another, and the host's time to queue each is not counted.
            let mut events = vec![s.record_event(timing).map_err(cuda_err)?];
            for ((_, p, _), scratch) in cases.iter().zip(&scratch) {
                for _ in 0..BATCH {
                    launch::convert(&g, p, &mut a, None, scratch)?;
                }
                events.push(s.record_event(timing).map_err(cuda_err)?);
            }
            for _ in 0..BATCH {
                s.memcpy_dtod(&a, &mut b).map_err(cuda_err)?;
            }
            events.push(s.record_event(timing).map_err(cuda_err)?);
            for (i, w) in events.windows(2).enumerate() {
                let ms = f64::from(w[0].elapsed_ms(&w[1]).map_err(cuda_err)?) / BATCH as f64;
                best[i] = best[i].min(ms);
            }
        }
        let names = cases.iter().map(|(name, _, bytes)| (name.to_string(), *bytes));
        Ok(names
            .chain(std::iter::once(("copy".to_string(), 8.0 * nf)))
            .zip(best)
            .map(|((name, bytes), ms)| (name, bytes, ms))
            .collect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_timing_says_why_it_cannot_measure() {
        assert!(matches!(kernel_timing(0, 7, 1), Err(Error::Cuda(m)) if m.contains("at least 8")));
        if super::super::device_count() == 0 {
            eprintln!("skipped (device half): no CUDA driver or device on this machine");
            assert!(matches!(kernel_timing(0, 1000, 1).unwrap_err(), Error::Cuda(_)));
            return;
        }
        let t = kernel_timing(0, 1 << 16, 2).unwrap();
        let names: Vec<&str> = t.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["fill", "bool unpack", "cast", "interleave", "copy"]);
        assert!(t.iter().all(|(_, bytes, ms)| *bytes > 0.0 && ms.is_finite() && *ms >= 0.0), "{t:?}");
    }
}

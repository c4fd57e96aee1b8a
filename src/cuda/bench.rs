//! A device timing for the benchmarks only (feature `bench-internals`, not part of the public
//! API): the `convert` kernel against a plain device-to-device copy, as `benches/gpu.py`
//! reports it for the kernel-bandwidth target. Built on the transfers and launches.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float32Array};
use arrow_schema::{DataType, Field, FieldRef};
use cudarc::driver::sys;

use super::driver::{cuda_err, gpu, guarded};
use super::{launch, plan, transfer};
use crate::error::{Error, Result};
use crate::options::Scalar;
use crate::options::{ExportOptions, NullPolicy};

/// Device times in milliseconds (best of `reps`, CUDA events on our stream, on `cuda:ordinal`)
/// of the `convert` kernel in its two modes over the same `4 n` bytes of f32, every tenth value
/// null and filled with 0, against a device-to-device copy of those bytes:
/// `(in_place, full, copy)`. `in_place` is what [`super::to_device`] runs after copying a
/// column's values into the tensor (reads the validity, writes the null slots); `full` reads
/// every value from the scratch buffer and writes every element, as for a cast or an
/// interleave (here 8 columns of `n / 8` rows into a C-order matrix). It allocates about
/// `12 n` bytes of device memory and copies the inputs to the device once.
///
/// # Errors
/// [`Error::Cuda`] without a device, or when `n` is below 8.
pub fn kernel_timing(ordinal: usize, n: usize, reps: usize) -> Result<(f64, f64, f64)> {
    if n < 8 {
        return Err(Error::Cuda("n must be at least 8".into()));
    }
    let n = n / 8 * 8;
    let column = |rows: usize, from: usize| -> ArrayRef {
        Arc::new((from..from + rows).map(|i| (i % 10 != 0).then_some(i as f32)).collect::<Float32Array>())
    };
    let field = |name: String| -> FieldRef { Arc::new(Field::new(name, DataType::Float32, true)) };
    let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..Default::default() };
    let in_place = plan::column(&field("x".into()), &[column(n, 0)], &opts)?;
    let rows = n / 8;
    let fields: Vec<FieldRef> = (0..8).map(|j| field(format!("c{j}"))).collect();
    let columns: Vec<Vec<ArrayRef>> = (0..8).map(|j| vec![column(rows, j * rows)]).collect();
    let full = plan::matrix(&fields, &columns, &opts)?;
    let g = gpu(ordinal)?;
    guarded(|| -> Result<(f64, f64, f64)> {
        g.bind()?;
        let s = &g.stream;
        let scratch_in_place = transfer::upload_scratch(&g, &in_place)?;
        let scratch_full = transfer::upload_scratch(&g, &full)?;
        let mut a = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let mut b = s.alloc_zeros::<u8>(n * 4).map_err(cuda_err)?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut best = [f64::INFINITY; 3];
        for _ in 0..=reps {
            let e0 = s.record_event(timing).map_err(cuda_err)?;
            launch::convert(&g, &in_place, &mut a, None, &scratch_in_place)?;
            let e1 = s.record_event(timing).map_err(cuda_err)?;
            launch::convert(&g, &full, &mut a, None, &scratch_full)?;
            let e2 = s.record_event(timing).map_err(cuda_err)?;
            s.memcpy_dtod(&a, &mut b).map_err(cuda_err)?;
            let e3 = s.record_event(timing).map_err(cuda_err)?;
            for (i, (x, y)) in [(&e0, &e1), (&e1, &e2), (&e2, &e3)].into_iter().enumerate() {
                best[i] = best[i].min(f64::from(x.elapsed_ms(y).map_err(cuda_err)?));
            }
        }
        Ok((best[0], best[1], best[2]))
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
        let (in_place, full, copy) = kernel_timing(0, 1 << 16, 2).unwrap();
        assert!(
            [in_place, full, copy].iter().all(|t| t.is_finite() && *t >= 0.0),
            "{in_place} {full} {copy}"
        );
    }
}

#!/usr/bin/env python3
"""dlframe on a CUDA device against torch, in one run; prints a markdown table of ratios.

Needs a CUDA device and torch with CUDA. Each figure is the best of several repetitions,
synchronised with the device before the clock stops. With `--uploads`, only the uploads from
pageable memory against page-locked copies, on one line (for comparing two builds quickly).
"""

import sys
import time

import numpy as np
import pyarrow as pa
import torch

import dlframe

assert dlframe.cuda_device_count() > 0 and torch.cuda.is_available(), "needs a CUDA device"


def best(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


N = 10_000_000
rng = np.random.default_rng(0)
values = rng.random(N, dtype=np.float32)
mask = rng.random(N) < 0.1
col = pa.array(values, mask=mask)
host = torch.from_numpy(values)
pinned = host.pin_memory()

t_ours = best(lambda: torch.from_dlpack(dlframe.to_dlpack(col, fill_value=0, device="cuda:0")))
t_h2d = best(lambda: host.to("cuda"))
t_h2d_pinned = best(lambda: pinned.to("cuda", non_blocking=True))
no_nulls = pa.array(values)
t_no_nulls = best(lambda: torch.from_dlpack(dlframe.to_dlpack(no_nulls, device="cuda:0")))
# A 400 MB column without nulls: the upload alone, long enough for the staging to reach its rate.
big = pa.array(rng.random(10 * N, dtype=np.float32))
big_pinned = torch.from_numpy(big.to_numpy()).pin_memory()
t_big = best(lambda: torch.from_dlpack(dlframe.to_dlpack(big, device="cuda:0")), 5)
t_big_pinned = best(lambda: big_pinned.to("cuda", non_blocking=True), 5)
del big_pinned, big

# dlframe.batches onto the GPU: 8 f32 columns x 8M rows (256 MB), 10% nulls, in batches of 256K
# rows ((256K, 8) f32, 8 MB each), each batch taken by torch; against one page-locked
# host-to-device copy of the same 256 MB (issue target: >= 80% of that bandwidth).
K, BR = 8, 8_000_000
stream_tbl = pa.table({f"c{j}": pa.array(rng.random(BR, dtype=np.float32), mask=rng.random(BR) < 0.1) for j in range(K)})


def all_batches():
    for b in dlframe.batches(stream_tbl, 262_144, fill_value=0, device="cuda:0"):
        torch.from_dlpack(b)


t_batches = best(all_batches, 5)
stream_pinned = torch.empty((BR, K), dtype=torch.float32).pin_memory()
t_batches_pinned = best(lambda: stream_pinned.to("cuda", non_blocking=True), 5)
del stream_pinned, stream_tbl
if "--uploads" in sys.argv[1:]:
    print(
        f"page-locked copy {40e6 / t_h2d_pinned / 1e9:.1f} GB/s; against it: 40 MB with nulls {t_ours / t_h2d_pinned:.2f}x, "
        f"without {t_no_nulls / t_h2d_pinned:.2f}x, 400 MB {t_big / t_big_pinned:.2f}x; "
        f"batches {t_batches_pinned / t_batches:.0%} of its bandwidth"
    )
    sys.exit()

t_peer = best(lambda: torch.from_numpy(col.fill_null(0).to_numpy()).cuda())
dev = torch.empty(N, dtype=torch.float32, device="cuda")
t_d2d = best(lambda: dev.clone(), 50)
t_cpu_fill = best(lambda: np.from_dlpack(dlframe.to_dlpack(col, fill_value=0)))
# The conversion kernel alone, timed with CUDA events on dlframe's stream, in the four cases of
# the kernel target (fill, bool unpack, cast, 8-column interleave: each at >= 70% of a
# device-to-device copy's bandwidth), each with the bytes it must read and write at the least.
if not hasattr(dlframe._native, "_cuda_kernel_timing"):
    sys.exit("this dlframe is built without the kernel timing: build it with `maturin build --release --features bench-internals`")
kernel = dlframe._native._cuda_kernel_timing(N, 50)
(_, copy_bytes, copy_ms) = kernel[-1]

# Several columns into one matrix on the device (interleave, cast, fill in the kernel) against
# Polars-style host stacking then one transfer: 8 f32 columns x 2M rows, 10% nulls.
R = 2_000_000
tbl = pa.table({f"c{j}": pa.array(rng.random(R, dtype=np.float32), mask=rng.random(R) < 0.1) for j in range(K)})
t_matrix = best(lambda: torch.from_dlpack(dlframe.to_dlpack(tbl, fill_value=0, device="cuda:0")))
t_matrix_peer = best(lambda: torch.from_numpy(np.column_stack([c.fill_null(0).to_numpy() for c in tbl.columns])).cuda())
t_matrix_h2d = best(lambda: torch.from_numpy(np.empty((R, K), np.float32)).cuda())
# A cast on the device: int64 column with 10% nulls -> float32 tensor.
icol = pa.array(rng.integers(0, 1000, N), mask=mask)
t_cast = best(lambda: torch.from_dlpack(dlframe.to_dlpack(icol, fill_value=0, dtype="float32", device="cuda:0")))
t_cast_peer = best(lambda: torch.from_numpy(icol.fill_null(0).to_numpy().astype(np.float32)).cuda())

import_x = torch.rand(N, device="cuda")
t_import = best(lambda: dlframe.tensor(import_x))
t_torch_import = best(lambda: torch.from_dlpack(import_x))


def per_call(fn, calls=2000, reps=5):
    """Seconds per call of a host-side exchange, over `calls` calls (the device is not involved)."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return min(out)


try:
    import cupy
except ImportError as e:  # an optional consumer
    cupy = None
    print(f"cupy is not installed ({e}): the torch -> dlframe -> cupy line is left out")
small = torch.rand(1000, device="cuda")
if cupy is not None:
    t_via_us = per_call(lambda: cupy.from_dlpack(dlframe.tensor(small)))
    t_cupy_direct = per_call(lambda: cupy.from_dlpack(small))

print(f"Measured on {torch.cuda.get_device_name(0)}, torch {torch.__version__}; 10M f32 rows, 10% nulls.\n")
print("| what | ratio |")
print("|---|---|")
print(f"| dlframe Arrow -> torch CUDA (fill fused on the GPU) / host-to-device copy of the 40 MB from pageable memory | {t_ours / t_h2d:.2f}x |")
print(f"| same / host-to-device copy from pinned memory | {t_ours / t_h2d_pinned:.2f}x |")
print(f"| the same column without nulls (no kernel) / host-to-device copy from pinned memory | {t_no_nulls / t_h2d_pinned:.2f}x |")
print(f"| same / torch.from_numpy(pa_col.fill_null(0).to_numpy()).cuda() | {t_ours / t_peer:.2f}x |")
print(f"| 400 MB f32 column without nulls -> torch CUDA / host-to-device copy from pinned memory | {t_big / t_big_pinned:.2f}x |")
print(f"| dlframe CPU fill (for reference) / raw pageable host-to-device copy | {t_cpu_fill / t_h2d:.2f}x |")
print(f"| device-to-device copy of 40 MB / raw pageable host-to-device copy (scale) | {t_d2d / t_h2d:.3f}x |")
for name, moved, ms in kernel[:-1]:
    share = (moved / ms) / (copy_bytes / copy_ms)
    which = "unpack" if name.startswith("bool") else "convert"
    print(f"| {which} kernel, {name} ({moved / 1e6:.0f} MB read and written): bandwidth / a device-to-device copy's | {share:.0%} |")
print(f"| table 8 f32 x 2M, 10% nulls -> (2M, 8) torch CUDA, interleaved on the GPU / np.column_stack(fill_null) then .cuda() | {t_matrix / t_matrix_peer:.2f}x |")
print(f"| same / raw pageable host-to-device copy of the 64 MB matrix | {t_matrix / t_matrix_h2d:.2f}x |")
print(f"| int64 10M, 10% nulls -> float32 torch CUDA (8-byte upload, cast on the GPU) / fill_null + astype(float32) + .cuda() | {t_cast / t_cast_peer:.2f}x |")
print(f"| dlframe.tensor(torch CUDA tensor), zero-copy with stream ordering / torch.from_dlpack of the same | {t_import / t_torch_import:.2f}x |")
if cupy is not None:
    print(f"| cupy.from_dlpack(dlframe.tensor(torch CUDA tensor)), per call / cupy.from_dlpack(torch CUDA tensor) | {t_via_us / t_cupy_direct:.2f}x |")
print(f"| dlframe.batches, 256 MB (8 f32 columns, 10% nulls) onto cuda:0 in 8 MB batches: share of a page-locked copy's bandwidth | {t_batches_pinned / t_batches:.0%} |")

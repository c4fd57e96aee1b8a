#!/usr/bin/env python
"""Soak test: export/import cycles over every dlframe path, watching the resident set size.

One cycle runs each path once (about twenty round trips):

  Arrow -> DLPack (np.from_dlpack), numpy -> Arrow (dlframe.from_dlpack, contiguous and strided),
  N-d both ways, chunked columns, Polars Series and DataFrame .to_dlpack(), nulls="fill" and
  nulls="mask", bool both ways, __array_interface__ and __array_struct__ imports, the Tensor's
  own __array_struct__, Tensor.__dlpack__ versioned and legacy (consumed and unconsumed), tensors
  back to Polars and Arrow, and fake ctypes DLPack producers whose deleters must run once.

RSS is the current resident set (/proc/self/statm), not the peak: read after a warm-up and at the
end, each after gc.collect(). Exit status 1 when it grew by 20 MB or more (or a value was wrong).

    .venv/bin/python scripts/soak.py --cycles 1000000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np
import polars as pl
import pyarrow as pa

import dlframe

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
import fakes  # noqa: E402  (the ctypes fake producers of the test suite)

PAGE = os.sysconf("SC_PAGE_SIZE")
LIMIT_MB = 20.0


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class Interface:
    def __init__(self, a):
        self.__array_interface__ = a.__array_interface__
        self.a = a


class Struct:
    def __init__(self, a):
        self.__array_struct__ = a.__array_struct__
        self.a = a


def make_paths():
    n = 256
    f64 = np.arange(n, dtype=np.float64)
    i32 = np.arange(n, dtype=np.int32)
    arrow_f64 = pa.array(f64)
    arrow_chunked = pa.chunked_array([pa.array(i32[:100]), pa.array(i32[100:])])
    arrow_nulls = pa.array(f64, mask=(np.arange(n) % 5 == 0))
    arrow_bool = pa.array(np.arange(n) % 3 == 0)
    np_bool = np.arange(n) % 3 == 0
    fsl = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4)
    nd = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    series = pl.Series("s", i32)
    frame = pl.DataFrame({"a": i32, "b": f64})
    frame_nulls = pl.DataFrame({"a": [1.0, None, 3.0] * 10, "b": list(range(30))})
    shared = dlframe.to_dlpack(arrow_f64)
    writable = dlframe.tensor(np.arange(n, dtype=np.int64))
    fake_buf = np.arange(64, dtype=np.uint8)

    def check(cond, what):
        if not cond:
            raise AssertionError(f"wrong values on the {what} path")

    def arrow_to_numpy():
        x = np.from_dlpack(dlframe.to_dlpack(arrow_f64))
        check(x[7] == 7.0 and len(x) == n, "Arrow -> DLPack")

    def numpy_to_arrow():
        a = dlframe.from_dlpack(f64)
        check(a[7].as_py() == 7.0, "numpy -> Arrow")
        s = dlframe.from_dlpack(f64[::3])
        check(s[2].as_py() == 6.0, "strided numpy -> Arrow")

    def nd_both_ways():
        x = np.from_dlpack(dlframe.to_dlpack(fsl))
        check(x.shape == (n, 4) and x[1, 2] == 6.0, "FixedSizeList -> DLPack")
        a = dlframe.from_dlpack(nd)
        check(len(a) == n and a.type.shape == [2, 3], "N-d numpy -> fixed_shape_tensor")

    def chunked():
        x = np.from_dlpack(dlframe.to_dlpack(arrow_chunked))
        check(x[150] == 150, "chunked Arrow -> DLPack")

    def polars_series():
        x = np.from_dlpack(series.to_dlpack())
        check(x[9] == 9, "Polars Series -> DLPack")

    def polars_frame():
        x = np.from_dlpack(frame.to_dlpack())
        check(x.shape == (n, 2) and x[5, 1] == 5.0, "Polars DataFrame -> DLPack")

    def nulls_fill():
        x = np.from_dlpack(dlframe.to_dlpack(arrow_nulls, nulls="fill", fill_value=-1.0))
        check(x[5] == -1.0 and x[6] == 6.0, "nulls='fill'")
        y = np.from_dlpack(frame_nulls.to_dlpack(nulls="nan"))
        check(np.isnan(y[1, 0]), "Polars nulls='nan'")

    def nulls_mask():
        values, mask = dlframe.to_dlpack(arrow_nulls, nulls="mask")
        m = np.from_dlpack(mask)
        check(not m[0] and m[1] and np.from_dlpack(values)[1] == 1.0, "nulls='mask'")

    def bools():
        x = np.from_dlpack(dlframe.to_dlpack(arrow_bool))
        check(x[3] and not x[4], "bool Arrow -> DLPack")
        a = dlframe.from_dlpack(np_bool)
        check(a[3].as_py() is True, "bool numpy -> Arrow")

    def array_interface():
        a = dlframe.from_dlpack(Interface(f64))
        check(a[11].as_py() == 11.0, "__array_interface__ import")

    def array_struct():
        a = dlframe.from_dlpack(Struct(i32))
        check(a[12].as_py() == 12, "__array_struct__ import")
        x = np.asarray(shared)  # the Tensor's own __array_struct__
        check(x[13] == 13.0, "Tensor.__array_struct__ export")

    def tensor_dlpack():
        a = dlframe.from_dlpack(shared.__dlpack__(max_version=(1, 3)))
        check(a[14].as_py() == 14.0, "Tensor.__dlpack__ versioned")
        b = dlframe.from_dlpack(shared.__dlpack__())  # legacy: a copy of read-only memory
        check(b[15].as_py() == 15.0, "Tensor.__dlpack__ legacy")
        c = np.from_dlpack(writable)
        check(c[16] == 16, "writable Tensor -> numpy")
        shared.__dlpack__(max_version=(1, 3))  # unconsumed: the capsule frees it
        shared.__dlpack__()

    def back_to_polars():
        s = dlframe.tensor(i32).to_polars()
        check(s[17] == 17, "Tensor -> Polars")
        a = shared.to_arrow()
        check(a[18].as_py() == 18.0, "Tensor -> Arrow")

    def fake_producer():
        f = fakes.dlpack_capsule(fake_buf.ctypes.data, [8], [1], dtype=(1, 64, 1), keep=fake_buf, versioned=True)
        a = dlframe.from_dlpack(f.capsule)
        check(a[0].as_py() == int(fake_buf[:8].view(np.uint64)[0]), "fake DLPack producer")
        del a
        f.drop()
        check(f.deletes == 1, "fake DLPack deleter (ran != once)")
        f.release()
        g = fakes.dlpack_capsule(fake_buf.ctypes.data, [8], [1], dtype=(1, 8, 1), keep=fake_buf, versioned=False)
        g.drop()  # unconsumed: the producer's capsule destructor releases it
        check(g.deletes == 1, "unconsumed fake capsule")
        g.release()

    return [
        arrow_to_numpy, numpy_to_arrow, nd_both_ways, chunked, polars_series, polars_frame, nulls_fill,
        nulls_mask, bools, array_interface, array_struct, tensor_dlpack, back_to_polars, fake_producer,
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=1_000_000, help="cycles (each runs every path once)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up cycles (default: 5%%, at most 20000)")
    ap.add_argument("--limit-mb", type=float, default=LIMIT_MB)
    args = ap.parse_args()
    warmup = args.warmup if args.warmup is not None else min(20_000, max(1, args.cycles // 20))
    paths = make_paths()
    print(f"dlframe {dlframe.__version__} ({dlframe._native.__file__}); {len(paths)} paths per cycle", flush=True)
    print(f"warm-up: {warmup} cycles; then {args.cycles} cycles", flush=True)

    for _ in range(warmup):
        for p in paths:
            p()
    gc.collect()
    start_rss = rss_mb()
    print(f"RSS after warm-up: {start_rss:.1f} MB", flush=True)

    t0 = time.perf_counter()
    report_every = max(1, args.cycles // 10)
    for i in range(1, args.cycles + 1):
        for p in paths:
            p()
        if i % report_every == 0:
            elapsed = time.perf_counter() - t0
            print(
                f"  {i:>9} cycles  {elapsed:7.1f}s  {i / elapsed:8.0f} cycles/s  RSS {rss_mb():.1f} MB",
                flush=True,
            )
    elapsed = time.perf_counter() - t0
    gc.collect()
    end_rss = rss_mb()
    growth = end_rss - start_rss
    leftover = sum(1 for v in fakes.DELETES.values() if v != 1)
    print(f"RSS at end: {end_rss:.1f} MB; growth {growth:+.2f} MB over {args.cycles} cycles "
          f"({args.cycles * len(paths)} path runs) in {elapsed:.1f}s")
    print(f"fake tensors still registered: {len(fakes.REGISTRY)}; with a deleter count other than 1: {leftover}")
    if growth >= args.limit_mb:
        print(f"FAIL: RSS grew by {growth:.2f} MB (limit {args.limit_mb} MB)")
        return 1
    if fakes.REGISTRY:
        print("FAIL: fake tensors whose deleter did not run exactly once")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

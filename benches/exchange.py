#!/usr/bin/env python3
"""Per-call costs of the DLPack exchange paths, dlframe against torch, numpy and pyarrow, in
one run; prints a markdown table of ratios (issue targets in the third column).

Run with the test virtualenv and a release build of the extension:
`.venv/bin/python benches/exchange.py`. torch and apache-tvm-ffi rows need those packages.
"""

import datetime
import platform
import timeit

import numpy as np
import polars as pl
import pyarrow as pa

import dlframe

try:
    import torch
except ImportError:  # opt-in extra
    torch = None
try:
    import tvm_ffi
except ImportError:
    tvm_ffi = None


def best(*stmts, n=20000, **names):
    """Seconds per call of each statement: the best of 7 runs of n calls, the statements run in
    turn within each round, so that a change in the machine's speed falls on all of them."""
    timers = [timeit.Timer(s, globals=names) for s in stmts]
    runs = [[t.timeit(n) for t in timers] for _ in range(7)]
    return [min(r[i] for r in runs) / n for i in range(len(stmts))]


rows = []


def row(what, ours, theirs, target):
    r = ours / theirs
    verdict = "" if target is None else ("meets" if r <= target else "misses")
    rows.append((what, f"{r:.2f}x", "-" if target is None else f"<= {target:g}x", verdict))


small = pa.array(np.arange(1000, dtype=np.float32))
a = np.arange(1000, dtype=np.float32)
s = pl.Series(a)
row(
    "np.from_dlpack(dlframe.to_dlpack(pa_array)) / np.from_dlpack(pa_array), 1K f32",
    *best("np.from_dlpack(dlframe.to_dlpack(small))", "np.from_dlpack(small)", np=np, dlframe=dlframe, small=small),
    2,
)
# What the row above cannot go below while to_dlpack returns a Tensor that numpy imports
# through __dlpack__: numpy's import of a ready Tensor, plus pyarrow's own export and its
# release, each timed alone: dlframe's call, its reading of pyarrow's capsule and the Tensor
# object cost nothing here.
ready = dlframe.to_dlpack(small)
imported, exported, theirs = best(
    "np.from_dlpack(ready)", "small.__dlpack__(max_version=(1, 3))", "np.from_dlpack(small)", np=np, ready=ready, small=small
)
row(
    "floor of the row above: np.from_dlpack(ready Tensor) + pa_array.__dlpack__() / np.from_dlpack(pa_array)",
    imported + exported,
    theirs,
    None,
)
# The producers alone: numpy's same import of a ready dlframe Tensor and of the pyarrow
# array, so the ratio is dlframe's __dlpack__ (and its release) against pyarrow's.
row(
    "np.from_dlpack(ready Tensor) / np.from_dlpack(pa_array): the producers' __dlpack__, 1K f32",
    *best("np.from_dlpack(ready)", "np.from_dlpack(small)", np=np, ready=ready, small=small),
    None,
)
row(
    "dlframe.from_dlpack(np_array) / pa.Array.from_dlpack(np_array), 1K f32",
    *best("dlframe.from_dlpack(a)", "pa.Array.from_dlpack(a)", dlframe=dlframe, pa=pa, a=a),
    1.5,
)
row(
    "series.to_dlpack() / series.to_numpy(), 1K f32",
    *best("s.to_dlpack()", "s.to_numpy()", s=s),
    1,
)
if torch is not None:
    x = torch.arange(1000, dtype=torch.float32)

    class ViaDlpack:
        """The same torch tensor offered through __dlpack__ only (no exchange table)."""

        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    v = ViaDlpack(x)
    row(
        "dlframe.tensor(torch_tensor): through torch's table / through __dlpack__",
        *best("dlframe.tensor(x)", "dlframe.tensor(v)", dlframe=dlframe, x=x, v=v),
        1 / 3,
    )
    row(
        "dlframe.tensor(torch_tensor) / np.from_dlpack(torch_tensor)",
        *best("dlframe.tensor(x)", "np.from_dlpack(x)", dlframe=dlframe, np=np, x=x),
        1,
    )
    if tvm_ffi is not None:
        nop = tvm_ffi.get_global_func("testing.nop")
        d = [dlframe.to_dlpack(pa.array(np.arange(1000, dtype=np.float32))) for _ in range(3)]
        tt = [torch.arange(1000, dtype=torch.float32) for _ in range(3)]
        row(
            "tvm-ffi f(x, y, z): 3 dlframe tensors / 3 torch CPU tensors",
            *best("nop(*d)", "nop(*tt)", nop=nop, d=d, tt=tt),
            1,
        )

print(
    f"Measured {datetime.date.today()} on {platform.machine()} {platform.system()}; numpy {np.__version__}, "
    f"pyarrow {pa.__version__}, polars {pl.__version__}, torch {torch.__version__ if torch else 'absent'}, "
    f"tvm-ffi {tvm_ffi.__version__ if tvm_ffi else 'absent'}.\n"
)
print("| what | ratio (lower is faster for dlframe) | target | |")
print("|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")

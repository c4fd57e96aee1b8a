#!/usr/bin/env python3
"""Instructions per call of the small exchange calls, dlframe's and the peers', under callgrind:
steady where wall-clock times of sub-microsecond calls move with the machine's load.

Each call is run N and 2N times in a fresh interpreter under `valgrind --tool=callgrind`; the
difference, divided by N, is the cost of one call with the loop around it. The loop and the
lambda that makes the call (measured the same way on `lambda: None`) are subtracted, so the
ratios compare the calls themselves. One thread each for OpenBLAS, Polars and rayon (idle pools
otherwise add instructions), and a fixed hash seed.

Run with the test virtualenv and a release build of the extension, valgrind on the PATH:
`.venv/bin/python benches/instructions.py [N]` (default N 2000; about four minutes).
"""

import os
import re
import subprocess
import sys

# (name, statement, setup); the setup runs before the timed loop, the statement inside it.
SETUP = """
import numpy as np, pyarrow as pa, polars as pl, dlframe
a = pa.array(np.arange(1000, dtype=np.float32))
x = np.arange(1000, dtype=np.float32)
s = pl.Series(x)
t = dlframe.to_dlpack(a)
"""
CALLS = {
    "nothing (the loop and the lambda)": "None",
    "np.from_dlpack(dlframe.to_dlpack(pa_array))": "np.from_dlpack(dlframe.to_dlpack(a))",
    "np.from_dlpack(pa_array)": "np.from_dlpack(a)",
    "dlframe.to_dlpack(pa_array)": "dlframe.to_dlpack(a)",
    "np.from_dlpack(ready Tensor)": "np.from_dlpack(t)",
    "pa_array.__dlpack__(max_version=(1, 3))": "a.__dlpack__(max_version=(1, 3))",
    "series.to_dlpack()": "s.to_dlpack()",
    "series.to_numpy()": "s.to_numpy()",
    "dlframe.from_dlpack(np_array)": "dlframe.from_dlpack(x)",
    "pa.Array.from_dlpack(np_array)": "pa.Array.from_dlpack(x)",
    "dlframe.tensor(np_array)": "dlframe.tensor(x)",
    "np.from_dlpack(np_array)": "np.from_dlpack(x)",
}
RATIOS = [
    ("np.from_dlpack(dlframe.to_dlpack(pa_array))", "np.from_dlpack(pa_array)", 2),
    ("series.to_dlpack()", "series.to_numpy()", 1),
    ("dlframe.from_dlpack(np_array)", "pa.Array.from_dlpack(np_array)", 1.5),
    ("dlframe.tensor(np_array)", "np.from_dlpack(np_array)", None),
]
ENV = dict(
    os.environ,
    PYTHONHASHSEED="0",
    OPENBLAS_NUM_THREADS="1",
    POLARS_MAX_THREADS="1",
    RAYON_NUM_THREADS="1",
    OMP_NUM_THREADS="1",
)


def child(stmt: str, n: int) -> None:
    """The measured process: the setup, 200 warm-up calls, then n calls."""
    names: dict = {}
    exec(SETUP, names)
    f = eval(f"lambda: {stmt}", names)
    for _ in range(200):
        f()
    for _ in range(n):
        f()


def total(stmt: str, n: int) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "--child", stmt, str(n)],
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    per = {name: (total(stmt, 2 * n) - total(stmt, n)) / n for name, stmt in CALLS.items()}
    loop = per.pop("nothing (the loop and the lambda)")
    print(f"Instructions per call, N={n}, the loop and lambda ({loop:,.0f}) subtracted:\n")
    print("| call | instructions |\n|---|---|")
    for name, v in per.items():
        print(f"| `{name}` | {v - loop:,.0f} |")
    print("\n| ratio | instructions | target |\n|---|---|---|")
    for ours, theirs, target in RATIOS:
        r = (per[ours] - loop) / (per[theirs] - loop)
        print(f"| `{ours}` / `{theirs}` | {r:.2f}x | {'-' if target is None else f'<= {target:g}x'} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()

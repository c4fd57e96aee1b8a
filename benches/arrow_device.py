#!/usr/bin/env python3
"""The Arrow C Device data interface on the CPU: dlframe against pyarrow and nanoarrow, the two
other readers and writers of `__arrow_c_device_array__`, measured in one run; prints a markdown
table of ratios.

Each producer is wrapped so that it offers only `__arrow_c_device_array__` (pyarrow and
nanoarrow offer `__arrow_c_array__` too): every consumer then takes the device route, and the
wrapper's Python call is in every figure. Each figure is the best of several repetitions; only
ratios are reported. Needs a release build of the package (`maturin develop --release`); run
with the test virtualenv: `.venv/bin/python benches/arrow_device.py`.
"""

import datetime
import platform

import nanoarrow
import nanoarrow.device as nd
import numpy as np
import pyarrow as pa

import dlframe
from ratio_table import Table, best


class DeviceOnly:
    def __init__(self, inner):
        self.inner = inner

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        return self.inner.__arrow_c_device_array__(requested_schema, **kwargs)


def per_call(fn):
    """The best of 2,000 calls: each call here costs microseconds."""
    return best(fn, 2000)


table = Table()
row = table.row


N = 10_000_000
values = np.arange(N, dtype=np.float32)
col = pa.array(values)
small = pa.array(values[:1000])
tensor = dlframe.tensor(values)

# 1. Reading a producer's device array in place (all zero-copy: the cost is per call).
t_ours = per_call(lambda: dlframe.to_dlpack(DeviceOnly(col)))
t_small = per_call(lambda: dlframe.to_dlpack(DeviceOnly(small)))
t_pa = per_call(lambda: pa.array(DeviceOnly(col)))
t_na = per_call(lambda: nd.c_device_array(DeviceOnly(col)))
row("read a device array, 10M f32: dlframe.to_dlpack / the same at 1K rows", t_ours, t_small, 1.5)
row("read a device array, 10M f32: dlframe.to_dlpack / pyarrow pa.array", t_ours, t_pa)
row("read a device array, 10M f32: dlframe.to_dlpack / nanoarrow c_device_array", t_ours, t_na)
t_ours_np = per_call(lambda: np.from_dlpack(dlframe.to_dlpack(DeviceOnly(col))))
t_pa_np = per_call(lambda: pa.array(DeviceOnly(col)).to_numpy())
row("to numpy, in place: np.from_dlpack(dlframe.to_dlpack(x)) / pa.array(x).to_numpy()", t_ours_np, t_pa_np)

# 2. Writing one: dlframe's Tensor as the producer, against pyarrow's own array.
t_ours = per_call(lambda: pa.array(DeviceOnly(tensor)))
t_pa = per_call(lambda: pa.array(DeviceOnly(col)))
row("pyarrow reads a device array: of a dlframe Tensor / of a pyarrow array", t_ours, t_pa)
t_ours = per_call(lambda: nd.c_device_array(tensor))
t_pa = per_call(lambda: nd.c_device_array(col))
row("nanoarrow reads a device array: of a dlframe Tensor / of a pyarrow array", t_ours, t_pa)

# 3. A column with nulls, filled in one pass, against pyarrow's fill and numpy's copy.
rng = np.random.default_rng(0)
nulls = pa.array(rng.random(N, dtype=np.float32), mask=rng.random(N) < 0.1)
t_ours = best(lambda: dlframe.to_dlpack(DeviceOnly(nulls), nulls="fill", fill_value=0), 15)
t_pa = best(lambda: pa.array(DeviceOnly(nulls)).fill_null(0).to_numpy(), 15)
t_copy = best(lambda: values.copy(), 15)
row("10M f32, 10% nulls, filled: dlframe / pyarrow fill_null(0).to_numpy()", t_ours, t_pa, 1 / 3)
row("10M f32, 10% nulls, filled: dlframe / numpy copy of the 40 MB", t_ours, t_copy)

table.print(f"Measured {datetime.date.today()} on {platform.machine()} {platform.system()}, "
            f"{__import__('os').cpu_count()} cores; numpy {np.__version__}, pyarrow {pa.__version__}, "
            f"nanoarrow {nanoarrow.__version__}.")

"""Refcounts and memory over many export/import cycles."""

import gc
import resource

import numpy as np
import pyarrow as pa

import dlframe


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_100k_export_import_cycles_do_not_grow_memory():
    arr = pa.array(np.arange(1000, dtype=np.float64))
    src = np.arange(1000, dtype=np.float32)
    for _ in range(2000):  # warm up allocators
        np.from_dlpack(dlframe.to_dlpack(arr))
        dlframe.from_dlpack(src)
    gc.collect()
    before = rss_mb()
    for _ in range(100_000):
        np.from_dlpack(dlframe.to_dlpack(arr))
        dlframe.from_dlpack(src)
    gc.collect()
    grown = rss_mb() - before
    assert grown < 20, f"max RSS grew by {grown:.1f} MB over 100k cycles"


def test_unconsumed_capsules_free_their_tensor():
    # Each legacy export of read-only Arrow memory is an 8 MB copy: 300 leaked ones would
    # add 2.4 GB of RSS.
    t = dlframe.to_dlpack(pa.array(np.arange(1_000_000, dtype=np.int64)))
    for _ in range(20):
        t.__dlpack__(copy=True)
    gc.collect()
    before = rss_mb()
    for _ in range(300):
        t.__dlpack__(max_version=(1, 3))
        t.__dlpack__(copy=True)
    gc.collect()
    grown = rss_mb() - before
    assert grown < 50, f"max RSS grew by {grown:.1f} MB"

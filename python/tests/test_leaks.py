"""Refcounts and memory over many export/import cycles."""

import gc
import resource

import numpy as np
import pyarrow as pa
import pytest

import dlframe
import fakes


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


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_unconsumed_capsules_free_their_tensor(max_version):
    # Each capsule is the last owner of a tensor over a fake producer's memory: the producer's
    # deleter runs exactly once when the capsule dies unconsumed, and not before.
    made = []
    for i in range(300):
        buf = np.full(16, i, dtype=np.int64)
        fake = fakes.dlpack_capsule(buf.ctypes.data, [16], [1], dtype=(0, 64, 1), keep=buf)
        made.append(fake)
        cap = dlframe.tensor(fake.capsule).__dlpack__(max_version=max_version)
        fake.drop()
        assert fakes.capsule_name(cap) == (b"dltensor" if max_version is None else b"dltensor_versioned")
        assert fake.deletes == 0, "released while its capsule lives"
        del cap
    gc.collect()
    assert [f.deletes for f in made] == [1] * len(made)
    for f in made:
        f.release()

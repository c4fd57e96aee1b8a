"""dlframe.batches against the real producers: exact batch sizes across random input batch
boundaries, every dtype, nulls, casts and several columns, equal to a collect-then-slice
reference; held batches never overwritten; DataLoader with worker processes."""

import gc
import os
import pickle
import threading
import time
import random

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import polars as pl
import pytest

import dlframe
from conftest import optional

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]


def random_table(rows, dtypes, seed, null_rate=0.0, bools=False):
    """A table of `rows` rows cut into input batches of random sizes (empty ones too)."""
    rng = np.random.default_rng(seed)
    cols = {}
    for j, dt in enumerate(dtypes):
        v = rng.integers(0, 100, rows).astype(dt)
        mask = rng.random(rows) < null_rate if null_rate else None
        cols[f"c{j}_{dt}"] = pa.array(v, mask=mask)
    if bools:
        cols["flag"] = pa.array(rng.random(rows) < 0.5, mask=rng.random(rows) < null_rate if null_rate else None)
    t = pa.table(cols)
    cuts = sorted(rng.integers(0, rows + 1, rng.integers(0, 12)).tolist())
    pieces = [t.slice(a, b - a) for a, b in zip([0] + cuts, cuts + [rows])]
    return pa.Table.from_batches([b for p in pieces for b in p.to_batches()] or t.to_batches(), schema=t.schema)


def reference(table, **options):
    """The whole table at once, as numpy (and its mask under nulls='mask')."""
    out = dlframe.to_dlpack(table.combine_chunks(), **options)
    return out


def as_np(x):
    if isinstance(x, tuple):
        return tuple(np.from_dlpack(t) for t in x)
    if isinstance(x, dict):
        return {k: as_np(v) for k, v in x.items()}
    return np.from_dlpack(x)


def check_batches(got, want, rows, batch_size, drop_last=False):
    """Every batch has exactly batch_size rows (the last one fewer unless dropped) and the
    reference's values, in order."""
    expected_n = rows // batch_size + (0 if drop_last or rows % batch_size == 0 else 1)
    assert len(got) == expected_n
    for i, b in enumerate(got):
        lo, hi = i * batch_size, min((i + 1) * batch_size, rows)
        if isinstance(want, dict):
            assert list(b) == list(want)
            for k in want:
                check_batches([b[k]], sliced(want[k], lo, hi), hi - lo, hi - lo)
            continue
        w = sliced(want, lo, hi)
        if isinstance(w, tuple):
            # (values, mask): the slots of nulls hold unspecified values, so only valid ones count.
            for x, y in zip(b, w):
                assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_array_equal(b[1], w[1])
            np.testing.assert_array_equal(b[0][w[1]], w[0][w[1]])
        else:
            assert b.shape == w.shape and b.dtype == w.dtype, (b.shape, w.shape, b.dtype, w.dtype)
            np.testing.assert_array_equal(b, w)


def sliced(x, lo, hi):
    return tuple(v[lo:hi] for v in x) if isinstance(x, tuple) else x[lo:hi]


@pytest.mark.parametrize("seed", range(12))
def test_random_boundaries_dtypes_nulls_and_casts_equal_the_reference(seed):
    rng = random.Random(seed)
    dtypes = rng.sample(DTYPES, rng.randint(1, 4))
    nulls = rng.choice(["fill", "mask", "nan", "error"])
    null_rate = 0.0 if nulls == "error" else 0.2
    table = random_table(rng.randint(0, 400), dtypes, seed, null_rate, bools=nulls in ("fill", "mask") and seed % 2 == 0)
    options = {"nulls": nulls}
    if nulls == "fill":
        options["fill_value"] = 1
    if nulls == "nan" or rng.random() < 0.3:
        options["dtype"] = "float64"
    if "flag" in table.column_names and "dtype" in options:
        del options["dtype"]  # a bool column does not cast to numbers
    options["columns"] = rng.choice(["stack", "dict"])
    options["order"] = rng.choice(["C", "F"])
    batch_size = rng.randint(1, 90)
    drop_last = rng.random() < 0.3
    want = as_np(reference(table, **options))
    got = [as_np(b) for b in dlframe.batches(table, batch_size, drop_last=drop_last, prefetch=rng.randint(0, 3), **options)]
    check_batches(got, want, table.num_rows, batch_size, drop_last)


def test_one_column_batches_are_its_own_tensors_and_share_memory_inside_an_input_batch():
    values = np.arange(1000, dtype=np.float32)
    arr = pa.chunked_array([values[:600], values[600:]])
    got = list(dlframe.batches(arr, 250))
    assert [b.shape for b in got] == [(250,), (250,), (250,), (250,)]
    # 0..250 and 250..500 lie inside the first chunk: views of its memory, read-only.
    base = arr.chunk(0).buffers()[1].address
    assert np.from_dlpack(got[0]).ctypes.data == base
    assert np.from_dlpack(got[1]).ctypes.data == base + 250 * 4
    assert not np.from_dlpack(got[0]).flags.writeable
    assert "copied=False" in repr(got[0])
    # 500..750 spans both chunks: one copy.
    assert "copied=True" in repr(got[2])
    np.testing.assert_array_equal(np.concatenate([np.from_dlpack(b) for b in got]), values)


def test_held_batches_are_never_overwritten():
    # Batches of 8 f32 columns x 70,000 rows are 2.2 MB copies: the allocator recycles the
    # memory of released batches, and must never reuse one that is held.
    table = random_table(700_000, ["float32"] * 8, seed=7)
    held = []
    for b in dlframe.batches(table, 70_000, prefetch=2):
        held.append((b, np.from_dlpack(b).copy()))
    assert len(held) == 10
    gc.collect()
    assert len({np.from_dlpack(b).ctypes.data for b, _ in held}) == 10
    for b, snapshot in held:
        np.testing.assert_array_equal(np.from_dlpack(b), snapshot)
    want = np.from_dlpack(dlframe.to_dlpack(table))
    np.testing.assert_array_equal(np.concatenate([s for _, s in held]), want)


def test_a_pyarrow_reader_and_dataset_scanner_stream_through():
    table = random_table(5000, ["int32", "float64"], seed=3)
    want = np.from_dlpack(dlframe.to_dlpack(table))
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    got = [np.from_dlpack(b) for b in dlframe.batches(reader, 777)]
    check_batches(got, want, 5000, 777)
    scanner = pads.dataset(table).scanner(batch_size=300)
    got = [np.from_dlpack(b) for b in dlframe.batches(scanner, 1000)]
    check_batches(got, want, 5000, 1000)


def test_a_datafusion_query_streams_without_being_collected():
    datafusion = pytest.importorskip("datafusion")
    ctx = datafusion.SessionContext()
    df = ctx.sql(
        "SELECT value AS a, CAST(value AS DOUBLE) / 4 AS b, "
        "CASE WHEN value % 5 = 0 THEN NULL ELSE value END AS c FROM generate_series(1, 30000)"
    )
    want = np.from_dlpack(dlframe.to_dlpack(df, nulls="fill", fill_value=-1, dtype="float64"))
    got = [np.from_dlpack(b) for b in dlframe.batches(df, 4096, nulls="fill", fill_value=-1, dtype="float64")]
    check_batches(got, want, 30000, 4096)
    # The DataFrame is read again at each pass.
    assert sum(len(b) for b in dlframe.batches(df, 10000, nulls="fill", fill_value=0)) == 30000
    # A failing query reaches the consumer as an exception, not as a short result.
    bad = ctx.sql("SELECT 1 / (value - value) AS x FROM generate_series(1, 10)")
    with pytest.raises(Exception, match="(?i)divide by zero"):
        list(dlframe.batches(bad, 3))


def test_polars_frames_and_lazy_frames():
    df = pl.DataFrame({"a": np.arange(3000, dtype=np.int64), "b": np.arange(3000, dtype=np.float32) / 2})
    df = pl.concat([df[:1000], df[1000:]], rechunk=False)
    want = np.from_dlpack(dlframe.to_dlpack(df.to_arrow()))
    check_batches([np.from_dlpack(b) for b in dlframe.batches(df, 512)], want, 3000, 512)
    lf = df.lazy().filter(pl.col("a") % 3 != 0).with_columns(c=pl.col("a") * 2)
    want = np.from_dlpack(dlframe.to_dlpack(lf.collect()))
    got = [np.from_dlpack(b) for b in dlframe.batches(lf, 256)]
    check_batches(got, want, 2000, 256)


def test_a_duckdb_result():
    duckdb = optional("duckdb")
    con = duckdb.connect()
    rel = con.sql("SELECT i::INTEGER AS a, (i * 0.5)::DOUBLE AS b FROM range(10000) t(i)")
    got = [np.from_dlpack(b) for b in dlframe.batches(rel, 3000)]
    want = np.stack([np.arange(10000), np.arange(10000) * 0.5], axis=1)
    check_batches(got, want, 10000, 3000)


def test_dicts_masks_and_an_iterable_of_tables():
    parts = [pa.table({"x": pa.array([1, None, 3], pa.int32()), "y": pa.array([0.5, 1.5, None])})] * 3
    got = list(dlframe.batches(parts, 4, columns="dict", nulls="mask"))
    assert [list(b) for b in got] == [["x", "y"]] * 3
    x_values, x_mask = (np.from_dlpack(t) for t in got[0]["x"])
    np.testing.assert_array_equal(x_mask, [True, False, True, True])
    np.testing.assert_array_equal(x_values[x_mask], [1, 3, 1])
    assert [len(b["y"][0]) for b in got] == [4, 4, 1]


def test_errors_are_clear_and_end_the_stream():
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        dlframe.batches(pa.table({"a": [1]}), 0)
    with pytest.raises(TypeError, match="takes an object with __arrow_c_stream__"):
        iter(dlframe.batches(42, 3))
    with pytest.raises(ValueError, match="columns="):
        iter(dlframe.batches(pa.table({"a": [1]}), 1, columns="rows"))
    table = pa.table({"a": pa.array([1, 2, None, 4, 5], pa.int64())})
    it = iter(dlframe.batches(table, 2))
    assert np.from_dlpack(next(it)).tolist() == [[1], [2]]  # a table stacks to (n, k)
    with pytest.raises(BufferError, match="column 'a' has 1 null"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert len(dlframe.batches(table, 2)) == 3  # a table's length is known ahead
    with pytest.raises(TypeError, match="has no length"):
        len(dlframe.batches(table.to_reader(), 2))
    strings = pa.table({"s": ["a", "b"]})
    with pytest.raises(BufferError, match="cannot become a tensor"):
        list(dlframe.batches(strings, 1))


def test_batches_before_an_error_come_first_and_in_order():
    # Several batches are converted at once: the ones before a failing source, or before a
    # batch that fails, still come out in order, then the error, then the end.
    def parts():
        for i in range(5):
            yield pa.table({"x": pa.array(np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64))})
        raise RuntimeError("the source broke")

    it = iter(dlframe.batches(parts(), 300))
    got = [np.from_dlpack(next(it)) for _ in range(16)]  # 4,800 of the 5,000 rows read
    np.testing.assert_array_equal(np.concatenate(got)[:, 0], np.arange(4800))
    with pytest.raises(RuntimeError, match="the source broke"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)

    values = pa.array([None if i == 7 * 100 + 42 else i for i in range(2000)], pa.int64())
    for prefetch in (0, 1, 2, 5):
        it = iter(dlframe.batches(pa.table({"x": values}), 100, prefetch=prefetch))
        got = [np.from_dlpack(next(it)) for _ in range(7)]
        np.testing.assert_array_equal(np.concatenate(got)[:, 0], np.arange(700))
        with pytest.raises(BufferError, match="column 'x' has 1 null"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)


def batch_threads():
    """The live OS threads named dlframe-batches (Python's threading module does not see them)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names.count("dlframe-batches")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_an_abandoned_stream_ends_its_work_and_its_reader_serves_the_next():
    table = random_table(100_000, ["float32"] * 4, seed=1)
    it = iter(dlframe.batches(table, 1000, prefetch=4))
    next(it)
    # Readers are kept for the process (at most 8): earlier tests may have left idle ones.
    kept = batch_threads()
    assert 1 <= kept <= 8
    del it
    for _ in range(20):
        it = iter(dlframe.batches(table, 1000, prefetch=4))
        next(it)
        del it
        gc.collect()
    it = iter(dlframe.batches(table, 1000))
    it.close()
    # Each pass ended (and its reader was idle again) before the next began, so one reader
    # served them all; a pass still running would have taken a thread more.
    assert batch_threads() == kept


def test_a_source_that_takes_the_gil_per_batch_sees_one_thread_state_for_the_whole_pass():
    # pyarrow's reader over a Python generator takes the GIL for every batch, as DataFusion's
    # stream does. The reader keeps one Python thread state, so the generator's thread-local data
    # lives from batch to batch; a thread without one would get a new thread state (with empty
    # thread-locals) for each batch, which was most of the time of a pass over DataFusion.
    local = threading.local()
    counts = []

    def gen():
        for i in range(50):
            local.n = getattr(local, "n", 0) + 1
            counts.append(local.n)
            yield pa.record_batch({"x": pa.array(np.arange(i * 100, (i + 1) * 100, dtype=np.float32))})

    reader = pa.RecordBatchReader.from_batches(pa.schema({"x": pa.float32()}), gen())
    got = [np.from_dlpack(b) for b in dlframe.batches(reader, 64)]
    np.testing.assert_array_equal(np.concatenate(got)[:, 0], np.arange(5000, dtype=np.float32))
    assert counts == list(range(1, 51))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_a_forked_child_makes_batches_on_readers_of_its_own():
    # The parent's readers (idle now) are not threads of the child; handing the child's pass to
    # one of them would hang it.
    table = random_table(10_000, ["float32", "int32"], seed=9)
    want = np.from_dlpack(dlframe.to_dlpack(table, dtype="float64"))
    for b in dlframe.batches(table, 1000):
        pass
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            got = np.concatenate([np.from_dlpack(b) for b in dlframe.batches(table, 999, dtype="float64")])
            code = 0 if np.array_equal(got, want) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's pass did not end within 60 s")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


def test_tensors_pickle_as_their_values():
    t = dlframe.to_dlpack(pa.table({"a": [1.0, 2.0], "b": [3.0, 4.0]}))
    back = pickle.loads(pickle.dumps(t))
    assert isinstance(back, dlframe.Tensor)
    np.testing.assert_array_equal(np.from_dlpack(back), [[1.0, 3.0], [2.0, 4.0]])


class _CountsPickles:
    """A picklable source (a pyarrow table inside) that counts how often it is pickled."""

    pickled = 0

    def __init__(self, table):
        self.table = table

    def __reduce__(self):
        type(self).pickled += 1
        return (_CountsPickles, (self.table,))

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)


def test_batches_pickle_for_spawned_workers_with_the_source_pickled_once():
    table = random_table(1000, ["float32", "int64"], seed=5)
    want = np.from_dlpack(dlframe.to_dlpack(table, dtype="float64"))
    _CountsPickles.pickled = 0
    back = pickle.loads(pickle.dumps(dlframe.batches(_CountsPickles(table), 300, dtype="float64")))
    assert _CountsPickles.pickled == 1
    check_batches([np.from_dlpack(b) for b in back], want, 1000, 300)
    # A source that cannot be pickled is refused, saying what to pass instead.
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    with pytest.raises(TypeError, match="RecordBatchReader cannot be pickled.*pass a function"):
        pickle.dumps(dlframe.batches(reader, 300))


def test_dataloader_with_two_workers_yields_every_batch_once_in_order():
    torch = optional("torch")
    from torch.utils.data import DataLoader

    table = random_table(10_000, ["float32", "int64"], seed=11)
    want = np.from_dlpack(dlframe.to_dlpack(table, dtype="float64"))
    loader = DataLoader(dlframe.batches(table, 999, dtype="float64"), batch_size=None, num_workers=2)
    got = [torch.from_dlpack(b).numpy() for b in loader]
    check_batches(got, want, 10_000, 999)
    # A source that worker processes cannot share is refused, saying what to pass instead.
    datafusion = pytest.importorskip("datafusion")
    df = datafusion.SessionContext().sql("SELECT value FROM generate_series(1, 10)")
    with pytest.raises(Exception, match="pass a function that makes it there"):
        list(DataLoader(dlframe.batches(df, 3), batch_size=None, num_workers=2))
    # A function that makes the source runs in each worker.
    loader = DataLoader(dlframe.batches(lambda: table, 999, dtype="float64"), batch_size=None, num_workers=2)
    check_batches([torch.from_dlpack(b).numpy() for b in loader], want, 10_000, 999)


def test_a_query_larger_than_its_batches_streams_in_bounded_memory():
    # The 4 GB run of scripts/stream_memory.py, made smaller (384 MB) for the test suite: the
    # process's peak RSS may grow by at most 10% of the result. One DataFusion partition: with
    # more, DataFusion repartitions generate_series and buffers ahead by itself, by an amount
    # that depends on timing (12-19% here, the same when pyarrow reads the stream without
    # dlframe: `stream_memory.py --source-only`), which would make this test measure DataFusion.
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "stream_memory.py")
    out = subprocess.run(
        [sys.executable, script, "--rows", "12000000", "--max-growth", "0.1", "--partitions", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "values match" in out.stdout

"""Paths that once changed data without a word (issue 17's first list).

- A finite value that overflows a narrower float target became inf: now an error naming the row
  and the column, on the CPU path, the Polars plugin and SQL. inf and NaN stay as they are.
- A tensor that is a copy was exported with IS_COPIED ("the consumer is the sole owner") to
  every consumer at once, so numpy handed out writable views of one buffer that Arrow also
  held. Now IS_COPIED goes only with a buffer made for that one export, and shared exports of a
  copy are read-only.
- Duplicate column names under columns="dict" kept one key.
"""

import ctypes
import gc

import numpy as np
import pyarrow as pa
import pytest

import dlframe
import fakes

# ---------------------------------------------------------------------------------------------
# Float narrowing


@pytest.mark.parametrize(
    ("values", "dtype", "bad"),
    [
        ([1.0, 1e300], "float32", "1e300"),
        ([70000.0], "float16", "70000"),
        ([-1e39], "float32", "-1e39"),
    ],
)
def test_a_finite_float_that_overflows_the_target_is_an_error_naming_row_and_column(values, dtype, bad):
    table = pa.table({"x": pa.array(values, pa.float64())})
    with pytest.raises(ValueError, match=rf"{bad}.*row {len(values) - 1} of column 'x'.*{dtype}"):
        dlframe.to_dlpack(table, dtype=dtype)
    with pytest.raises(ValueError, match=rf"row {len(values) - 1}.*{dtype}"):
        dlframe.to_dlpack(pa.array(values, pa.float64()), dtype=dtype)


def test_integers_that_overflow_float16_are_an_error():
    with pytest.raises(ValueError, match=r"70000.*row 1.*float16"):
        dlframe.to_dlpack(pa.array([1, 70000], pa.int32()), dtype="float16")
    # uint16's largest value is above float16's largest finite value too.
    with pytest.raises(ValueError, match=r"65535.*float16"):
        dlframe.to_dlpack(pa.array([65535], pa.uint16()), dtype="float16")
    # int16's extremes lie within float16's range; 32767 rounds (to 32768), so it needs the
    # opt-in, and -32768 is exact.
    with pytest.raises(ValueError, match=r"32767 at row 1.*no exact float16.*inexact='round'"):
        dlframe.to_dlpack(pa.array([-32768, 32767], pa.int16()), dtype="float16")
    ok = np.from_dlpack(
        dlframe.to_dlpack(pa.array([-32768, 32767], pa.int16()), dtype="float16", inexact="round")
    )
    np.testing.assert_array_equal(ok, np.array([-32768, 32767], np.float16))


def test_inf_nan_and_values_that_round_into_range_stay_as_they_are():
    src = np.array([np.inf, -np.inf, np.nan, 3.4028235e38, 65504.0, 1e-300], np.float64)
    got = np.from_dlpack(dlframe.to_dlpack(pa.array(src), dtype="float32"))
    np.testing.assert_array_equal(got, src.astype(np.float32))
    got16 = np.from_dlpack(dlframe.to_dlpack(pa.array(src[[0, 1, 2, 4]]), dtype="float16"))
    np.testing.assert_array_equal(got16, src[[0, 1, 2, 4]].astype(np.float16))


def test_float_overflow_under_a_fill_and_in_a_matrix():
    table = pa.table({"a": pa.array([1.0, None]), "b": pa.array([None, 1e40])})
    with pytest.raises(ValueError, match=r"1e40.*row 1 of column 'b'.*float32"):
        dlframe.to_dlpack(table, dtype="float32", fill_value=0)
    # Nulls are not values: a null slot under the overflowing value's column passes.
    table = pa.table({"a": pa.array([1.0, None]), "b": pa.array([2.0, None])})
    got = np.from_dlpack(dlframe.to_dlpack(table, dtype="float16", fill_value=0))
    np.testing.assert_array_equal(got, np.array([[1, 2], [0, 0]], np.float16))


def test_float_overflow_in_the_polars_plugin():
    pl = pytest.importorskip("polars", reason="polars is not installed")
    df = pl.DataFrame({"a": [1.0, 70000.0], "b": [2.0, 3.0]})
    with pytest.raises(pl.exceptions.ComputeError, match=r"70000.*row 1.*float16"):
        df.select(dlframe.polars.to_tensor("a", "b", dtype="float16"))


def test_float_overflow_in_sql():
    datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
    import dlframe.datafusion

    ctx = datafusion.SessionContext()
    dlframe.datafusion.register(ctx)
    ctx.from_pydict({"a": [1.0, 70000.0]}, name="t")
    with pytest.raises(Exception, match=r"70000.*float16"):
        ctx.sql("SELECT to_tensor_as('float16', a) FROM t").collect()
    got = ctx.sql("SELECT to_tensor_as('float16', a) AS x FROM t WHERE a < 10").to_arrow_table()
    assert got.column("x").to_pylist() == [[1.0]]


# ---------------------------------------------------------------------------------------------
# IS_COPIED: the consumer is the sole owner

_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _flags(t, **kwargs) -> int:
    """The flags of one versioned export (the capsule is dropped unconsumed afterwards)."""
    cap = t.__dlpack__(max_version=(1, 3), **kwargs)
    flags = fakes.DLManagedTensorVersioned.from_address(_GetPointer(cap, b"dltensor_versioned")).flags
    del cap
    return flags


def _copies():
    """Every way a dlframe Tensor comes to hold a copy."""
    fill = dlframe.to_dlpack(pa.array([1.0, None, 3.0]), fill_value=0)
    concat = dlframe.to_dlpack(pa.chunked_array([[1.0, 2.0], [3.0]]))
    unpack = dlframe.to_dlpack(pa.array([True, False, True]))
    forced = dlframe.to_dlpack(pa.array([1.0, 2.0, 3.0]), copy=True)
    # An import that arrived with IS_COPIED: the Tensor is now the buffer's only holder.
    source = np.array([1.0, 2.0, 3.0])
    imported = dlframe.tensor(dlframe.tensor(source).__dlpack__(max_version=(1, 3), copy=True))
    assert imported.copied
    return {"fill": fill, "concat": concat, "unpack": unpack, "copy=True": forced, "import": imported}


@pytest.mark.parametrize("path", ["fill", "concat", "unpack", "copy=True", "import"])
def test_a_copy_is_never_exported_as_solely_owned_to_several_consumers(path):
    t = _copies()[path]
    assert t.copied
    # Every export of the Tensor's own buffer is shared: read-only, never IS_COPIED.
    for _ in range(2):
        flags = _flags(t)
        assert flags & fakes.IS_COPIED == 0, path
        assert flags & fakes.READ_ONLY, path
    before = np.from_dlpack(t).copy()
    a, b = np.from_dlpack(t), np.from_dlpack(t)
    arr = t.to_arrow()
    assert not a.flags.writeable and not b.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    np.testing.assert_array_equal(b, before)
    np.testing.assert_array_equal(np.asarray(arr.to_numpy(zero_copy_only=False)).reshape(before.shape), before)
    # The array interfaces share the buffer too, so they are read-only as well.
    assert not np.asarray(t).flags.writeable


@pytest.mark.parametrize("path", ["fill", "concat", "unpack", "copy=True", "import"])
def test_a_copy_for_one_export_is_solely_owned_and_writable(path):
    t = _copies()[path]
    assert _flags(t, copy=True) & (fakes.IS_COPIED | fakes.READ_ONLY) == fakes.IS_COPIED
    before = np.from_dlpack(t).copy()
    mine = np.from_dlpack(t, copy=True)
    assert mine.flags.writeable
    assert mine.ctypes.data != np.from_dlpack(t).ctypes.data
    mine[...] = 0
    np.testing.assert_array_equal(np.from_dlpack(t), before)
    np.testing.assert_array_equal(t.to_arrow().to_numpy(zero_copy_only=False).reshape(before.shape), before)


def test_pyarrow_as_the_consumer_of_a_copy_never_sees_a_numpy_write():
    t = dlframe.to_dlpack(pa.array([1.0, None, 3.0]), fill_value=0)
    arr = pa.array(np.from_dlpack(t))  # pyarrow reads numpy's read-only view
    a = np.from_dlpack(t)
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 42.0
    assert arr.to_pylist() == [1.0, 0.0, 3.0]
    assert t.to_arrow().to_pylist() == [1.0, 0.0, 3.0]


def test_torch_as_the_consumer_of_a_copy():
    torch = pytest.importorskip("torch", reason="torch is an opt-in extra (DLFRAME_TORCH=1 installs it)")
    t = dlframe.to_dlpack(pa.array([1.0, None, 3.0]), fill_value=0)
    arr = t.to_arrow()
    # torch cannot mark a tensor read-only, so it is given a buffer of its own only on request.
    mine = torch.from_dlpack(t.__dlpack__(max_version=(1, 3), copy=True))
    mine[0] = 42.0
    assert arr.to_pylist() == [1.0, 0.0, 3.0]
    assert np.from_dlpack(t)[0] == 1.0
    shared = torch.from_dlpack(t)
    assert shared.data_ptr() == np.from_dlpack(t).ctypes.data


def test_a_fresh_export_with_nothing_else_holding_it_keeps_is_copied():
    # Polars' series.to_dlpack() and dlframe.to_dlpack(..., ) results are Tensors; a Tensor
    # dropped right after its one export leaves the capsule as the only holder, but the export
    # was made while the Tensor held the buffer: it is shared at that moment, so no IS_COPIED.
    t = dlframe.to_dlpack(pa.array([1.0, None]), fill_value=0)
    cap = t.__dlpack__(max_version=(1, 3))
    del t
    gc.collect()
    flags = fakes.DLManagedTensorVersioned.from_address(_GetPointer(cap, b"dltensor_versioned")).flags
    assert flags & fakes.IS_COPIED == 0
    np.testing.assert_array_equal(np.from_dlpack(_Holder(cap)), [1.0, 0.0])


class _Holder:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        return self.cap


# ---------------------------------------------------------------------------------------------
# Duplicate column names


def test_duplicate_column_names_are_refused_under_columns_dict():
    table = pa.table([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"])
    with pytest.raises(ValueError, match=r"'a'.*twice|duplicate.*'a'"):
        dlframe.to_dlpack(table, columns="dict")
    # The matrix keeps both columns, in order.
    got = np.from_dlpack(dlframe.to_dlpack(table))
    np.testing.assert_array_equal(got, [[1, 3], [2, 4]])


# ---------------------------------------------------------------------------------------------
# Row order of a query result (docs/cli.md, "Row order")


def _ordered_file(tmp_path, n=200_000):
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": np.arange(n, dtype=np.int64), "x": np.arange(n) * 0.5}), path, row_group_size=n // 20)
    return path, n


def test_to_dlpack_of_a_query_keeps_file_order_with_the_documented_settings(tmp_path):
    datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
    path, n = _ordered_file(tmp_path)
    config = (
        datafusion.SessionConfig()
        .with_target_partitions(8)
        .set("datafusion.optimizer.enable_round_robin_repartition", "false")
        .set("datafusion.execution.enable_file_stream_work_stealing", "false")
    )
    ctx = datafusion.SessionContext(config)
    ctx.register_parquet("t", str(path))
    for _ in range(3):
        got = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT id FROM t WHERE id % 3 <> 1")))
        np.testing.assert_array_equal(got[:, 0], np.arange(n)[np.arange(n) % 3 != 1])


def test_to_dlpack_of_a_query_keeps_order_by(tmp_path):
    datafusion = pytest.importorskip("datafusion", reason="datafusion is not installed")
    path, n = _ordered_file(tmp_path)
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(8))
    ctx.register_parquet("t", str(path))
    got = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT id, x FROM t ORDER BY id DESC")))
    np.testing.assert_array_equal(got[:, 0], np.arange(n)[::-1])

"""Ragged list columns: ragged="pad" (with pad_value and max_len) and ragged="jagged", with
nulls at both levels, against a reference built row by row from to_pylist(); the zero-copy
case; torch's nested_tensor_from_jagged; dlframe.batches; SQL to_tensor_padded; and the Polars
plugin expression."""

import datafusion
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from conftest import optional

import dlframe
import dlframe.datafusion as dldf
from dlframe.polars import to_tensor_padded

ROWS = [[1, 2, 3], [4], None, [], [5, None, 7, 8, 9], [None]]


def column(large=False, chunked=False):
    t = pa.large_list(pa.int32()) if large else pa.list_(pa.int32())
    if chunked:
        return pa.chunked_array([pa.array(ROWS[:2], t), pa.array(ROWS[2:], t)])
    # A slice, so the offsets do not start at 0.
    return pa.array([[0, 0]] + ROWS, t).slice(1)


def reference_pad(rows, width, pad, fill):
    values = np.full((len(rows), width), pad, np.int64)
    mask = np.zeros((len(rows), width), bool)
    lengths = np.zeros(len(rows), np.int64)
    for i, r in enumerate(rows):
        kept = (r or [])[:width]
        lengths[i] = len(kept)
        for j, v in enumerate(kept):
            values[i, j] = fill if v is None else v
            mask[i, j] = v is not None
    return values, mask, lengths


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("max_len", [None, 2, 7])
def test_pad_and_truncate_with_nulls_at_both_levels(large, chunked, max_len):
    col = column(large, chunked)
    width = max_len if max_len is not None else 5
    want, want_mask, want_len = reference_pad(col.to_pylist(), width, -1, 0)
    v, n = dlframe.to_dlpack(col, ragged="pad", pad_value=-1, max_len=max_len, nulls="fill", fill_value=0)
    np.testing.assert_array_equal(np.from_dlpack(v), want)
    np.testing.assert_array_equal(np.from_dlpack(n), want_len)
    assert np.from_dlpack(v).dtype == np.int32 and np.from_dlpack(n).dtype == np.int64
    v, m, n = dlframe.to_dlpack(col, ragged="pad", pad_value=-1, max_len=max_len, nulls="mask", dtype="float32")
    np.testing.assert_array_equal(np.from_dlpack(m), want_mask)
    vals = np.from_dlpack(v)
    assert vals.dtype == np.float32
    np.testing.assert_array_equal(vals[want_mask], want[want_mask])
    np.testing.assert_array_equal(vals[~want_mask & (want == -1)], -1)
    np.testing.assert_array_equal(np.from_dlpack(n), want_len)


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_jagged_values_and_offsets_with_nulls_at_both_levels(large, chunked):
    col = column(large, chunked)
    rows = [r or [] for r in col.to_pylist()]
    v, o = dlframe.to_dlpack(col, ragged="jagged", nulls="fill", fill_value=-9)
    np.testing.assert_array_equal(np.from_dlpack(o), np.cumsum([0] + [len(r) for r in rows]))
    np.testing.assert_array_equal(np.from_dlpack(v), [-9 if x is None else x for r in rows for x in r])
    v, m, o = dlframe.to_dlpack(col, ragged="jagged", nulls="mask")
    np.testing.assert_array_equal(np.from_dlpack(m), [x is not None for r in rows for x in r])


def test_jagged_shares_a_large_lists_buffers():
    col = pa.array([[1.0, 2.0], [], [3.0, 4.0, 5.0]], pa.large_list(pa.float64()))
    v, o = dlframe.to_dlpack(col, ragged="jagged", copy=False)
    offsets_buf, values_buf = col.buffers()[1], col.buffers()[3]
    assert np.from_dlpack(v).ctypes.data == values_buf.address
    assert np.from_dlpack(o).ctypes.data == offsets_buf.address
    np.testing.assert_array_equal(np.from_dlpack(o), [0, 2, 2, 5])
    # An int32 List's offsets are rebased to int64: copy=False says so.
    with pytest.raises(BufferError, match="the offsets of column .* are rebased to int64"):
        dlframe.to_dlpack(pa.array([[1.0]], pa.list_(pa.float64())), ragged="jagged", copy=False)
    with pytest.raises(BufferError, match="padding the ragged rows of column"):
        dlframe.to_dlpack(col, ragged="pad", copy=False)


def test_torch_accepts_the_jagged_tensors():
    torch = optional("torch")
    col = column(large=False)
    v, o = dlframe.to_dlpack(col, ragged="jagged", nulls="fill", fill_value=0, dtype="float32")
    nt = torch.nested.nested_tensor_from_jagged(torch.from_dlpack(v), torch.from_dlpack(o))
    rows = [[0 if x is None else x for x in (r or [])] for r in col.to_pylist()]
    assert [t.tolist() for t in nt.unbind()] == rows
    v, n = dlframe.to_dlpack(col, ragged="pad", nulls="fill", fill_value=0, max_len=3)
    assert torch.from_dlpack(n).tolist() == [min(len(r), 3) for r in rows]


def test_polars_series_and_tables_by_name():
    s = pl.Series("tok", ROWS, dtype=pl.List(pl.Int64))
    v, n = s.to_dlpack(ragged="pad", nulls="fill", fill_value=0)
    want, _, want_len = reference_pad(ROWS, 5, 0, 0)
    np.testing.assert_array_equal(np.from_dlpack(v), want)
    np.testing.assert_array_equal(np.from_dlpack(n), want_len)
    df = pl.DataFrame({"id": range(len(ROWS)), "tok": s})
    d = dlframe.to_dlpack(df, columns="dict", ragged="jagged", nulls="fill", fill_value=0)
    assert set(d) == {"id", "tok"}
    np.testing.assert_array_equal(np.from_dlpack(d["id"]), range(len(ROWS)))
    values, offsets = d["tok"]
    np.testing.assert_array_equal(np.from_dlpack(offsets), [0, 3, 4, 4, 4, 9, 10])
    np.testing.assert_array_equal(np.from_dlpack(values)[4:9], [5, 0, 7, 8, 9])


def test_bad_arguments_and_null_rows_under_error_are_refused_with_the_remedy():
    col = column()
    with pytest.raises(ValueError, match="length mismatch: row 1 of list column"):
        dlframe.to_dlpack(col)
    with pytest.raises(BufferError, match=r"\(null list rows\) has 1 null"):
        dlframe.to_dlpack(col, ragged="pad")
    with pytest.raises(ValueError, match="expected 'error', 'pad' or 'jagged'"):
        dlframe.to_dlpack(col, ragged="nested")
    with pytest.raises(ValueError, match="apply to ragged='pad'"):
        dlframe.to_dlpack(col, ragged="jagged", max_len=3)
    with pytest.raises(ValueError, match=r"300 \(pad_value\) does not fit int8"):
        dlframe.to_dlpack(col, ragged="pad", pad_value=300, dtype="int8", nulls="fill", fill_value=0)
    with pytest.raises(TypeError, match="pad_value must be a bool, int or float"):
        dlframe.to_dlpack(col, ragged="pad", pad_value="x")


@pytest.mark.parametrize("batch_size", [1, 4, 7])
def test_batches_pad_each_batch_and_keep_exact_sizes(batch_size):
    rows = [[i] * (i % 5) if i % 7 else None for i in range(40)]
    t = pa.table({"tok": pa.array(rows, pa.list_(pa.int16()))})
    reader_batches = t.to_batches(max_chunksize=3)
    got = list(
        dlframe.batches(reader_batches, batch_size, ragged="pad", max_len=3, pad_value=-1, nulls="fill", fill_value=0)
    )
    sizes = [np.from_dlpack(n).shape[0] for _, n in got]
    assert sizes == [min(batch_size, 40 - s) for s in range(0, 40, batch_size)]
    values = np.concatenate([np.from_dlpack(v) for v, _ in got])
    lengths = np.concatenate([np.from_dlpack(n) for _, n in got])
    want, _, want_len = reference_pad(rows, 3, -1, 0)
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(lengths, want_len)
    # Jagged batches: each batch's offsets start at 0.
    got = list(dlframe.batches(reader_batches, batch_size, ragged="jagged", nulls="fill", fill_value=0))
    flat = [x for r in rows for x in (r or [])]
    np.testing.assert_array_equal(np.concatenate([np.from_dlpack(v) for v, _ in got]), flat)
    assert all(np.from_dlpack(o)[0] == 0 for _, o in got)


def test_sql_to_tensor_padded():
    ctx = datafusion.SessionContext()
    dldf.register(ctx)
    ctx.register_record_batches("t", [[pa.record_batch({"tok": column()})]])
    x = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT to_tensor_padded(tok, 4, -1) AS x FROM t")))
    want, _, _ = reference_pad(column().to_pylist(), 4, -1, -1)
    np.testing.assert_array_equal(x, want)
    lengths = ctx.sql("SELECT least(cardinality(tok), 4) AS n FROM t").to_arrow_table().column(0).to_pylist()
    assert lengths[:2] == [3, 1]
    with pytest.raises(Exception, match="max_len must be >= 0"):
        ctx.sql("SELECT to_tensor_padded(tok, -2, 0) FROM t").collect()


def test_polars_plugin_pads_in_eager_lazy_and_streaming_queries():
    df = pl.DataFrame({"tok": pl.Series(ROWS, dtype=pl.List(pl.Int32)), "g": [1, 1, 2, 2, 3, 3]})
    out = df.select(to_tensor_padded("tok", 3, -1))
    assert out.schema["tok"] == pl.Array(pl.Int32, 3)
    want, _, _ = reference_pad(ROWS, 3, -1, -1)
    np.testing.assert_array_equal(out["tok"].to_numpy(), want)
    lazy = df.lazy().select(to_tensor_padded(pl.col("tok"), 2, 0, dtype="float32")).collect(engine="streaming")
    assert lazy.schema["tok"] == pl.Array(pl.Float32, 2)
    np.testing.assert_array_equal(lazy["tok"].to_numpy(), reference_pad(ROWS, 2, 0, 0)[0])
    with pytest.raises((pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError), match="takes a List column"):
        df.select(to_tensor_padded("g", 2))
    with pytest.raises(TypeError, match="max_len must be an int >= 0"):
        to_tensor_padded("tok", -1)


def test_list_views_are_read_like_lists():
    # ListView and LargeListView rows are windows into their values, in any order; they are
    # laid end to end once (a copy) and then read as List is: equal lengths as a tensor,
    # ragged rows under ragged=. Before, they were refused with "cast to FixedSizeList".
    equal = pa.array([[1, 2], [3, 4], [5, 6]], pa.list_view(pa.int32()))
    t = dlframe.to_dlpack(equal)
    assert np.from_dlpack(t).tolist() == [[1, 2], [3, 4], [5, 6]] and t.copied
    with pytest.raises(BufferError, match="list view column"):
        dlframe.to_dlpack(equal, copy=False)
    ragged = pa.array([[1.0], [], [2.0, 3.0]], pa.large_list_view(pa.float32()))
    values, lengths = dlframe.to_dlpack(ragged, ragged="pad", pad_value=-1)
    assert np.from_dlpack(values).tolist() == [[1.0, -1.0], [-1.0, -1.0], [2.0, 3.0]]
    assert np.from_dlpack(lengths).tolist() == [1, 0, 2]
    values, offsets = dlframe.to_dlpack(ragged, ragged="jagged")
    assert np.from_dlpack(values).tolist() == [1.0, 2.0, 3.0]
    assert np.from_dlpack(offsets).tolist() == [0, 1, 1, 3]
    with pytest.raises(ValueError, match="row 1"):
        dlframe.to_dlpack(ragged)

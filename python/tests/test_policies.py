"""Null and copy policies, chunks, tables and every Arrow producer, value by value."""

import datafusion
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import dlframe

VALUES = [1.5, None, 3.0, None, 5.0]


def test_nulls_error_names_column_count_and_remedy():
    with pytest.raises(BufferError, match=r"2 null\(s\).*nulls='fill'"):
        dlframe.to_dlpack(pa.array(VALUES))


def test_nulls_fill_nan_and_mask():
    arr = pa.array(VALUES, pa.float32())
    filled = np.from_dlpack(dlframe.to_dlpack(arr, nulls="fill", fill_value=-1))
    np.testing.assert_array_equal(filled, [1.5, -1, 3.0, -1, 5.0])
    assert filled.dtype == np.float32
    nan = np.from_dlpack(dlframe.to_dlpack(arr, nulls="nan"))
    assert np.isnan(nan[[1, 3]]).all() and nan[0] == 1.5
    values, mask = dlframe.to_dlpack(arr, nulls="mask")
    assert not values.copied  # values are shared, only the mask is new
    np.testing.assert_array_equal(np.from_dlpack(mask), [True, False, True, False, True])
    np.testing.assert_array_equal(np.from_dlpack(values)[[0, 2, 4]], [1.5, 3.0, 5.0])
    ints = pa.array([1, None, 3], pa.int16())
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(ints, fill_value=7)), [1, 7, 3])
    with pytest.raises(ValueError, match="float dtype"):
        dlframe.to_dlpack(ints, nulls="nan")
    with pytest.raises(ValueError, match="fill_value"):
        dlframe.to_dlpack(pa.array([1, None], pa.uint8()), fill_value=300)
    with pytest.raises(BufferError, match="copy=False"):
        dlframe.to_dlpack(arr, fill_value=0, copy=False)


def test_sliced_nulls_with_unaligned_bit_offsets():
    data = [None if i % 7 == 3 else i for i in range(200)]
    arr = pa.array(data, pa.int64())
    for off in range(0, 20):
        part = arr.slice(off, 150)
        got = np.from_dlpack(dlframe.to_dlpack(part, fill_value=-9))
        want = [-9 if v is None else v for v in data[off : off + 150]]
        np.testing.assert_array_equal(got, want)


def test_bool_with_nulls():
    arr = pa.array([True, None, False, True])
    got = np.from_dlpack(dlframe.to_dlpack(arr, fill_value=False))
    np.testing.assert_array_equal(got, [True, False, False, True])


def test_chunked_arrays_concatenate_in_one_pass():
    ch = pa.chunked_array([[1.0, 2.0], [3.0], [None, 5.0]])
    got = np.from_dlpack(dlframe.to_dlpack(ch, nulls="fill", fill_value=0))
    np.testing.assert_array_equal(got, [1, 2, 3, 0, 5])
    one = pa.chunked_array([pa.array(np.arange(4, dtype=np.int32))])
    t = dlframe.to_dlpack(one)
    assert not t.copied


def test_fixed_shape_tensor_column_from_pyarrow():
    ty = pa.fixed_shape_tensor(pa.float32(), [2, 3])
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 6)
    col = pa.ExtensionArray.from_storage(ty, storage)
    got = np.from_dlpack(dlframe.to_dlpack(col))
    np.testing.assert_array_equal(got, col.to_numpy_ndarray())
    perm = pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0])
    pcol = pa.ExtensionArray.from_storage(perm, storage)
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(pcol)), pcol.to_numpy_ndarray())
    back = dlframe.from_dlpack(dlframe.to_dlpack(pcol))
    assert back.type.permutation == [1, 0]
    np.testing.assert_array_equal(back.to_numpy_ndarray(), pcol.to_numpy_ndarray())
    # nulls="mask" without nulls: the all-true mask is laid out like the permuted values.
    values, mask = dlframe.to_dlpack(pcol, nulls="mask")
    assert mask.strides == values.strides and not np.from_dlpack(values).flags.c_contiguous
    assert np.from_dlpack(mask).all()


def test_order_f_lays_out_tensor_columns_as_numpy_asfortranarray():
    # (4, 2, 3) cells from nested FixedSizeLists, a permuted fixed_shape_tensor, a Polars
    # Array column: order="F" gives numpy's F layout of the same values, as one copy.
    leaf = pa.array(np.arange(24, dtype=np.int32))
    nested = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(leaf, 3), 2)
    perm = pa.ExtensionArray.from_storage(
        pa.fixed_shape_tensor(pa.int32(), [2, 3], permutation=[1, 0]),
        pa.FixedSizeListArray.from_arrays(leaf, 6),
    )
    series = pl.Series("a", np.arange(24, dtype=np.int32).reshape(4, 2, 3))
    for col in (nested, perm, series):
        want = np.from_dlpack(dlframe.to_dlpack(col))
        t = dlframe.to_dlpack(col, order="F")
        got = np.from_dlpack(t)
        assert got.flags.f_contiguous and t.copied, type(col)
        np.testing.assert_array_equal(got, want)
        assert np.shares_memory(got, np.from_dlpack(dlframe.to_dlpack(col, order="F"))) is False
        with pytest.raises(BufferError, match="order='F'"):
            dlframe.to_dlpack(col, order="F", copy=False)
    # Nulls filled or masked, chunks and a cast: the mask is laid out like the values.
    ty = pa.list_(pa.list_(pa.float64(), 3), 2)
    chunked = pa.chunked_array([[[[1, None, 3], [4, 5, 6]]], [[[7, 8, 9], [10, 11, None]]]], ty)
    filled = np.from_dlpack(dlframe.to_dlpack(chunked, nulls="fill", fill_value=-1, dtype="float32", order="F"))
    assert filled.flags.f_contiguous and filled.dtype == np.float32
    np.testing.assert_array_equal(filled, [[[1, -1, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, -1]]])
    values, mask = dlframe.to_dlpack(chunked, nulls="mask", order="F")
    assert np.from_dlpack(mask).flags.f_contiguous and np.from_dlpack(values).flags.f_contiguous
    np.testing.assert_array_equal(np.from_dlpack(mask).sum(), 10)
    assert not np.from_dlpack(mask)[0, 0, 1] and not np.from_dlpack(mask)[1, 1, 2]
    _, no_nulls_mask = dlframe.to_dlpack(nested, nulls="mask", order="F")
    assert np.from_dlpack(no_nulls_mask).flags.f_contiguous and np.from_dlpack(no_nulls_mask).all()
    # A table with columns="dict": each tensor column in F order, scalars shared as they are.
    tbl = pa.table({"m": nested, "s": pa.array(np.arange(4.0))})
    d = dlframe.to_dlpack(tbl, columns="dict", order="F")
    assert np.from_dlpack(d["m"]).flags.f_contiguous and not d["s"].copied
    # Ragged rows padded (a null row is empty), then laid out in F order.
    ragged = pa.array([[1, 2, 3], [4], None, [5, 6]], pa.list_(pa.int64()))
    padded, lengths = dlframe.to_dlpack(ragged, ragged="pad", pad_value=0, nulls="fill", fill_value=0, order="F")
    p = np.from_dlpack(padded)
    assert p.flags.f_contiguous
    np.testing.assert_array_equal(p, [[1, 2, 3], [4, 0, 0], [0, 0, 0], [5, 6, 0]])
    np.testing.assert_array_equal(np.from_dlpack(lengths), [3, 1, 0, 2])
    # Batches of a tensor column: every batch in F order, the same values as C.
    for b_c, b_f in zip(dlframe.batches(nested, 3), dlframe.batches(nested, 3, order="F")):
        assert np.from_dlpack(b_f).flags.f_contiguous
        np.testing.assert_array_equal(np.from_dlpack(b_f), np.from_dlpack(b_c))


def test_table_stacks_into_a_matrix_with_promotion():
    tbl = pa.table({"a": pa.array([1, 2, 3], pa.int32()), "b": pa.array([0.5, 1.5, 2.5], pa.float32())})
    m = np.from_dlpack(dlframe.to_dlpack(tbl))
    assert m.dtype == np.float64 and m.shape == (3, 2)
    np.testing.assert_array_equal(m, [[1, 0.5], [2, 1.5], [3, 2.5]])
    f = np.from_dlpack(dlframe.to_dlpack(tbl, order="F", dtype="float32"))
    assert f.flags.f_contiguous and f.dtype == np.float32
    np.testing.assert_array_equal(f, m)
    d = dlframe.to_dlpack(tbl, columns="dict")
    assert set(d) == {"a", "b"} and not d["a"].copied
    with pytest.raises(BufferError, match="copy=False"):
        dlframe.to_dlpack(tbl, copy=False)


def test_table_errors():
    with pytest.raises(BufferError, match="'b'"):
        dlframe.to_dlpack(pa.table({"a": [1, 2], "b": [1.0, None]}))
    with pytest.raises(BufferError, match="encode"):
        dlframe.to_dlpack(pa.table({"a": [1, 2], "s": ["x", "y"]}))
    with pytest.raises(ValueError, match="does not fit"):
        dlframe.to_dlpack(pa.table({"a": [1, 300]}), dtype="uint8")


def test_table_with_misaligned_chunks_and_mask():
    t1 = pa.table({"a": [1.0, 2.0, 3.0, 4.0]})
    b = pa.chunked_array([[1.0, None], [3.0, 4.0]])
    tbl = pa.table({"a": t1["a"], "b": b})
    vals, mask = dlframe.to_dlpack(tbl, nulls="mask")
    np.testing.assert_array_equal(np.from_dlpack(mask), [[1, 1], [1, 0], [1, 1], [1, 1]])
    got = np.from_dlpack(vals)
    np.testing.assert_array_equal(got[:, 0], [1, 2, 3, 4])
    # b's chunks break at row 2, a's do not: b's values land in their rows (its null's slot is
    # whatever the mask hides).
    np.testing.assert_array_equal(got[[0, 2, 3], 1], [1, 3, 4])
    filled = np.from_dlpack(dlframe.to_dlpack(tbl, fill_value=-1))
    np.testing.assert_array_equal(filled, [[1, 1], [2, -1], [3, 3], [4, 4]])
    for order in ("C", "F"):
        chunked = pa.table({"a": pa.chunked_array([[1.0], [2.0, 3.0, 4.0]]), "b": b})
        np.testing.assert_array_equal(
            np.from_dlpack(dlframe.to_dlpack(chunked, fill_value=-1, order=order)), [[1, 1], [2, -1], [3, 3], [4, 4]]
        )


def test_polars_series_and_frames():
    s = pl.Series("x", [1.0, 2.0, 3.0], dtype=pl.Float32)
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(s)), [1, 2, 3])
    df = pl.DataFrame({"a": [1, 2], "b": [3.0, 4.0]})
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(df)), [[1, 3], [2, 4]])
    arr = pl.Series("v", [[1, 2], [3, 4]], dtype=pl.Array(pl.Int64, 2))
    assert np.from_dlpack(dlframe.to_dlpack(arr)).shape == (2, 2)


def test_datafusion_dataframe_through_the_stream_interface():
    ctx = datafusion.SessionContext()
    df = ctx.sql("SELECT CAST(column1 AS DOUBLE) AS a, CAST(column2 AS DOUBLE) AS b FROM (VALUES (1, 2), (3, 4))")
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(df)), [[1, 2], [3, 4]])


def test_tensor_exports_back_to_arrow_and_polars():
    t = dlframe.to_dlpack(pa.array(np.arange(3, dtype=np.int32)))
    assert pa.array(t).to_pylist() == [0, 1, 2]
    assert t.to_arrow().to_pylist() == [0, 1, 2]
    assert t.to_polars().to_list() == [0, 1, 2]
    assert "shape=[3]" in repr(t) and "readonly=True" in repr(t)


def test_equal_length_lists_and_ragged_lists():
    lists = pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.int32()))
    got = np.from_dlpack(dlframe.to_dlpack(lists))
    np.testing.assert_array_equal(got, [[1, 2, 3], [4, 5, 6]])
    assert not dlframe.to_dlpack(lists).copied  # equal lengths: a view of the child values
    large = pa.array([[1.0], [2.0]], pa.large_list(pa.float64()))
    assert np.from_dlpack(dlframe.to_dlpack(large)).shape == (2, 1)
    with pytest.raises(ValueError, match="row 1"):
        dlframe.to_dlpack(pa.array([[1, 2], [3]]))
    s = pl.Series("l", [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(s)), [[1, 2], [3, 4]])
    with_nulls = pa.array([[1.0, None], [3.0, 4.0]], pa.list_(pa.float64()))
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(with_nulls, fill_value=0)), [[1, 0], [3, 4]])

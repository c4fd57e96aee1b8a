"""Polars objects through dlframe: df/series/lazyframe .to_dlpack(), the dlframe namespace, and
tensors back to Series, consumed by numpy, jax and (when installed) torch."""

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from conftest import optional

import dlframe
import dlframe.polars as dlpl

NUMERIC = [pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64, pl.Float32, pl.Float64]


def test_namespaces_are_registered_and_polars_methods_are_never_replaced():
    df = pl.DataFrame({"a": [1.0, 2.0]})
    for obj in (df, df["a"], df.lazy()):
        assert hasattr(obj, "dlframe") and hasattr(obj, "to_dlpack")
        np.testing.assert_array_equal(np.from_dlpack(obj.dlframe.to_dlpack()).ravel(), [1.0, 2.0])
    # Attached only where Polars has no such method: what Polars defines stays Polars'.
    assert pl.DataFrame.to_numpy.__module__.startswith("polars")
    for cls in (pl.DataFrame, pl.Series, pl.LazyFrame):
        own = cls.__dict__.get("to_dlpack")
        ours = own in (dlpl.to_dlpack, dlpl._series_to_dlpack) or (
            type(own).__name__ == "method_descriptor" and own.__objclass__ is pl.Series and own.__name__ == "to_dlpack"
        )
        assert own is None or ours or own.__module__.startswith("polars"), own


def test_dataframe_is_a_c_order_matrix_like_to_torch():
    df = pl.DataFrame({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5], "c": [7, 8, 9]}, schema_overrides={"a": pl.Int32})
    x = np.from_dlpack(df.to_dlpack())
    assert x.flags.c_contiguous and x.dtype == np.float64
    np.testing.assert_array_equal(x, df.to_numpy())
    f = np.from_dlpack(df.to_dlpack(order="F", dtype="float32"))
    assert f.flags.f_contiguous and f.dtype == np.float32
    d = df.to_dlpack(columns="dict")
    assert set(d) == {"a", "b", "c"}
    np.testing.assert_array_equal(np.from_dlpack(d["c"]), [7, 8, 9])


@pytest.mark.parametrize("dtype", NUMERIC, ids=str)
def test_series_of_each_dtype_shares_memory(dtype):
    s = pl.Series("x", [1, 2, 3], dtype=dtype)
    x = np.from_dlpack(s.to_dlpack())
    assert x.dtype == s.to_numpy().dtype
    np.testing.assert_array_equal(x, [1, 2, 3])
    assert x.ctypes.data == s.to_numpy().ctypes.data, "one chunk without nulls is shared"
    # The Series' own view (the fast path) and the Arrow stream agree on everything but speed.
    fast, arrow = s.to_dlpack(), dlframe._native.to_dlpack(s)
    for attr in ("dtype", "shape", "strides", "readonly", "copied"):
        assert getattr(fast, attr) == getattr(arrow, attr), attr
    assert fast.readonly and not fast.copied


def test_the_shared_view_is_taken_where_it_applies_and_declined_elsewhere():
    # series.to_dlpack() asks the Series for its own view first and falls back to the Arrow
    # stream, which gives the same tensor more slowly: a view path that stopped answering would
    # pass every other test. It answers for one chunk of numbers without nulls, and only there.
    view = dlframe.polars._series_view
    s = pl.Series("x", [1.0, 2.0, 3.0], dtype=pl.Float32)
    t = view(s)
    assert t is not None and t.shape == (3,) and t.readonly
    assert np.from_dlpack(t).ctypes.data == s.to_numpy().ctypes.data
    two_chunks = pl.concat([pl.Series([1.0]), pl.Series([2.0])], rechunk=False)
    assert two_chunks.n_chunks() == 2
    for declined in (pl.Series([1.0, None]), pl.Series([True, False]), pl.Series(["a"]), two_chunks):
        assert view(declined) is None, declined.dtype


def test_series_to_dlpack_is_a_method_of_series_only_and_passes_its_options_on():
    # series.to_dlpack may be a native method of the Series type: it must still refuse other
    # objects, refuse positional options, and hand every option to to_dlpack.
    with pytest.raises(TypeError):
        pl.Series.to_dlpack(np.arange(3))
    s = pl.Series("x", [1.0, None, 3.0])
    with pytest.raises(TypeError):
        s.to_dlpack("fill")
    with pytest.raises(TypeError, match="unexpected keyword argument 'null'"):
        s.to_dlpack(null="fill")
    with pytest.raises(BufferError, match="null"):
        s.to_dlpack()
    np.testing.assert_array_equal(np.from_dlpack(s.to_dlpack(nulls="fill", fill_value=0)), [1.0, 0.0, 3.0])


def test_a_series_changed_after_export_leaves_the_tensor_as_it_was():
    # The shared view holds its own reference to Polars' buffer, so a later in-place write to
    # the Series copies first: the tensor keeps the values it was exported with.
    s = pl.Series("x", [1.0, 2.0, 3.0])
    t = s.to_dlpack()
    before = np.from_dlpack(t).ctypes.data
    s.scatter(0, 99.0)
    s[1] = -5.0
    assert s.to_list() == [99.0, -5.0, 3.0]
    x = np.from_dlpack(t)
    assert x.ctypes.data == before
    np.testing.assert_array_equal(x, [1.0, 2.0, 3.0])


def test_series_options_skip_the_shared_view_only_when_they_change_the_result():
    s = pl.Series("x", [1, 2, 3], dtype=pl.Int32)
    shared = np.from_dlpack(s.to_dlpack()).ctypes.data
    assert np.from_dlpack(s.to_dlpack(nulls="error")).ctypes.data == shared
    cast = s.to_dlpack(dtype="float64")
    assert cast.copied and np.from_dlpack(cast).dtype == np.float64
    assert s.to_dlpack(copy=True).copied


def test_temporal_series_keep_their_arrow_meaning():
    import datetime

    s = pl.Series("t", [datetime.datetime(2020, 1, 1)])  # microseconds since the epoch
    np.testing.assert_array_equal(np.from_dlpack(s.to_dlpack()), [1_577_836_800_000_000])


def test_nulls_under_each_policy():
    s = pl.Series("x", [1.0, None, 3.0])
    with pytest.raises(BufferError, match=r"'x'.*1 null"):
        s.to_dlpack()
    np.testing.assert_array_equal(np.from_dlpack(s.to_dlpack(nulls="fill", fill_value=-1)), [1, -1, 3])
    np.testing.assert_array_equal(np.from_dlpack(s.to_dlpack(nulls="nan")), [1, np.nan, 3])
    values, mask = s.to_dlpack(nulls="mask")
    np.testing.assert_array_equal(np.from_dlpack(mask), [True, False, True])
    df = pl.DataFrame({"a": [1, None], "b": [None, 2.5]})
    np.testing.assert_array_equal(np.from_dlpack(df.to_dlpack(nulls="fill", fill_value=0)), [[1, 0], [0, 2.5]])


def test_bool_and_multi_chunk_series():
    b = pl.Series([True, False, True])
    np.testing.assert_array_equal(np.from_dlpack(b.to_dlpack()), [True, False, True])
    s = pl.concat([pl.Series("x", [1.0, 2.0]), pl.Series("x", [3.0])], rechunk=False)
    assert s.n_chunks() == 2
    t = s.to_dlpack()
    assert t.copied
    np.testing.assert_array_equal(np.from_dlpack(t), [1, 2, 3])


def test_array_columns_and_pyarrow_tensor_columns():
    s = pl.Series("a", np.arange(12, dtype=np.float32).reshape(2, 2, 3), dtype=pl.Array(pl.Float32, (2, 3)))
    x = np.from_dlpack(s.to_dlpack())
    assert x.shape == (2, 2, 3)
    np.testing.assert_array_equal(x, np.arange(12).reshape(2, 2, 3))
    ty = pa.fixed_shape_tensor(pa.float32(), [2, 3])
    ext = pa.ExtensionArray.from_storage(ty, pa.array([list(range(6)), list(range(6, 12))], pa.list_(pa.float32(), 6)))
    ps = pl.from_arrow(ext)
    x = np.from_dlpack(ps.to_dlpack())
    assert x.shape == (2, 2, 3)
    np.testing.assert_array_equal(x, np.arange(12).reshape(2, 2, 3))


def test_lazy_queries_collect_into_a_tensor():
    lf = pl.LazyFrame({"a": [1.0, 2.0, 3.0, 4.0], "b": [5.0, 6.0, 7.0, 8.0]})
    x = np.from_dlpack(lf.filter(pl.col("a") > 1).with_columns(c=pl.col("a") * 2).to_dlpack())
    np.testing.assert_array_equal(x, [[2, 6, 4], [3, 7, 6], [4, 8, 8]])
    x = np.from_dlpack(lf.select("a").dlframe.to_dlpack(engine="streaming"))
    np.testing.assert_array_equal(x.ravel(), [1, 2, 3, 4])


def test_tensors_back_to_series():
    v = np.arange(5, dtype=np.int64)
    s = dlpl.from_dlpack(v, name="v")
    assert s.name == "v" and s.dtype == pl.Int64 and s.to_list() == [0, 1, 2, 3, 4]
    m = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    s = dlpl.from_dlpack(m)
    assert s.dtype == pl.Array(pl.Float32, (3, 2))
    np.testing.assert_array_equal(s.to_numpy(), m)
    t = m.transpose(0, 2, 1)
    s = dlframe.tensor(t).to_polars()
    assert s.dtype == pl.Array(pl.Float32, (2, 3))
    np.testing.assert_array_equal(s.to_numpy(), t)
    with pytest.raises(BufferError, match="copy=False"):
        dlpl.from_dlpack(t, copy=False)
    del m
    np.testing.assert_array_equal(s.to_numpy()[1], np.arange(6, 12, dtype=np.float32).reshape(3, 2).T)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(BufferError, match="cannot become a tensor"):
        pl.Series(["a", "b"]).to_dlpack()
    with pytest.raises(Exception, match="row 1"):
        pl.Series([[1, 2], [3]]).to_dlpack()
    with pytest.raises(Exception, match="'s'"):
        pl.DataFrame({"a": [1, 2], "s": ["x", "y"]}).to_dlpack()


def test_jax_and_torch_consume_polars_tensors():
    jnp = optional("jax.numpy")
    df = pl.DataFrame({"a": [1.0, None, 3.0], "b": [4.0, 5.0, 6.0]})
    x = jnp.from_dlpack(df.to_dlpack(nulls="fill", fill_value=0.0))
    np.testing.assert_array_equal(np.asarray(x), [[1, 4], [0, 5], [3, 6]])
    torch = optional("torch")
    y = torch.from_dlpack(df.to_dlpack(nulls="fill", fill_value=0.0))
    assert y.shape == (3, 2) and float(y[1, 0]) == 0.0

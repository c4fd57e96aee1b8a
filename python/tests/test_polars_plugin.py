"""The ``dlframe.polars.to_tensor`` expression plugin, run by Python Polars itself: stacking,
dtypes, null policies, lists, lazy, streaming, group_by, and the errors of bad input."""

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from conftest import optional

import dlframe.polars as dlpl
from dlframe.polars import to_tensor


@pytest.fixture
def df():
    return pl.DataFrame(
        {
            "g": ["x", "y", "x", "y", "x"],
            "a": [1.0, 2.0, 3.0, 4.0, 5.0],
            "b": [10, 20, 30, 40, 50],
            "c": [0.5, None, 2.5, None, 4.5],
        },
        schema_overrides={"a": pl.Float32, "b": pl.Int16},
    )


def stacked(frame, *cols):
    return np.column_stack([frame[c].to_numpy() for c in cols])


def test_columns_stack_into_an_array_column_of_the_common_dtype(df):
    out = df.select(t=to_tensor("a", "b"))["t"]
    # float32 + int16 -> float32, numpy's promotion.
    assert out.dtype == pl.Array(pl.Float32, 2)
    np.testing.assert_array_equal(out.to_numpy(), stacked(df, "a", "b"))
    for dtype in ("float64", pl.Float64, np.float64):
        assert df.select(to_tensor("a", "b", dtype=dtype)).to_series().dtype == pl.Array(pl.Float64, 2)
    assert df.select(to_tensor(pl.col("b") * 2, "a", dtype="int64")).to_series().to_list()[1] == [40, 2]


def test_result_leaves_through_dlpack_without_a_copy(df):
    out = df.select(t=to_tensor("a", "b"))["t"]
    x = out.to_dlpack(copy=False)
    assert (x.shape, x.copied) == ((5, 2), False)
    np.testing.assert_array_equal(np.from_dlpack(x), stacked(df, "a", "b"))
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(out.to_dlpack())), stacked(df, "a", "b"))


def test_torch_consumes_the_stacked_column(df):
    torch = optional("torch")
    out = df.select(to_tensor("a", "b", dtype="float32")).to_series()
    np.testing.assert_array_equal(torch.from_dlpack(out.to_dlpack()).numpy(), stacked(df, "a", "b"))


def test_null_policies(df):
    with pytest.raises(pl.exceptions.ComputeError, match=r"'c' has 2 null"):
        df.select(to_tensor("a", "c"))
    filled = df.select(to_tensor("a", "c", fill_value=-1)).to_series().to_numpy()
    np.testing.assert_array_equal(filled[:, 1], [0.5, -1, 2.5, -1, 4.5])
    nan = df.select(to_tensor("a", "c", nulls="nan")).to_series().to_numpy()
    assert np.isnan(nan[[1, 3], 1]).all() and nan[2, 1] == 2.5
    with pytest.raises(pl.exceptions.ComputeError, match="fill_value"):
        df.select(to_tensor("a", "c", nulls="fill"))
    with pytest.raises(pl.exceptions.ComputeError, match="mask"):
        df.select(to_tensor("a", "c", nulls="mask"))
    with pytest.raises(pl.exceptions.ComputeError, match="does not fit"):
        df.select(to_tensor("b", "c", dtype="int8", fill_value=1000))


def test_bool_and_temporal_columns():
    import datetime as dt

    df = pl.DataFrame({"p": [True, False, True], "q": [False, False, True]})
    out = df.select(to_tensor("p", "q")).to_series()
    assert out.dtype == pl.Array(pl.Boolean, 2)
    assert out.to_list() == [[True, False], [False, False], [True, True]]
    dates = pl.DataFrame({"d": [dt.date(1970, 1, 2), dt.date(1970, 1, 3)], "e": [dt.date(2000, 1, 1)] * 2})
    days = dates.select(to_tensor("d", "e")).to_series()
    assert days.dtype == pl.Array(pl.Int32, 2) and days.to_list()[1] == [2, 10957]


def test_with_columns_group_by_lazy_and_streaming(df):
    with_t = df.with_columns(t=to_tensor("a", "b", dtype="float64"))
    assert with_t.columns == ["g", "a", "b", "c", "t"]
    lazy = df.lazy().filter(pl.col("a") > 1).select(to_tensor("a", "b", dtype="float64"))
    assert lazy.collect_schema().dtypes() == [pl.Array(pl.Float64, 2)]
    expected = stacked(df.filter(pl.col("a") > 1), "a", "b").astype(np.float64)
    np.testing.assert_array_equal(lazy.collect().to_series().to_numpy(), expected)
    np.testing.assert_array_equal(lazy.collect(engine="streaming").to_series().to_numpy(), expected)
    grouped = df.group_by("g", maintain_order=True).agg(t=to_tensor("a", "b", dtype="float64")).sort("g")
    assert grouped["t"].to_list()[0] == [[1.0, 10.0], [3.0, 30.0], [5.0, 50.0]]
    assert grouped["t"].to_list()[1] == [[2.0, 20.0], [4.0, 40.0]]


def test_streaming_over_many_batches_keeps_every_row():
    n = 300_000
    lf = pl.LazyFrame({"a": np.arange(n, dtype=np.float32), "b": np.arange(n, dtype=np.float32) * 2})
    out = lf.select(to_tensor("a", "b")).collect(engine="streaming").to_series().to_numpy()
    assert out.shape == (n, 2)
    np.testing.assert_array_equal(out[:, 1], np.arange(n, dtype=np.float32) * 2)


def test_multi_chunk_columns():
    parts = [pl.DataFrame({"a": [1.0, 2.0], "b": [3, 4]}), pl.DataFrame({"a": [5.0], "b": [6]})]
    df = pl.concat(parts, rechunk=False)
    assert df.n_chunks() == 2
    np.testing.assert_array_equal(df.select(to_tensor("a", "b")).to_series().to_numpy(), [[1, 3], [2, 4], [5, 6]])


def test_lists_become_array_columns():
    df = pl.DataFrame({"l": [[1, 2, 3], [4, None, 6]]})
    out = df.select(to_tensor("l", width=3, fill_value=0)).to_series()
    assert out.dtype == pl.Array(pl.Int64, 3)
    assert out.to_list() == [[1, 2, 3], [4, 0, 6]]
    x = np.from_dlpack(df.select(to_tensor("l", width=3, fill_value=0, dtype="float32")).to_series().to_dlpack())
    assert x.dtype == np.float32 and x.shape == (2, 3)
    arr = pl.DataFrame({"m": [[[1, 2], [3, 4]]]}, schema={"m": pl.Array(pl.Int32, (2, 2))})
    assert arr.select(to_tensor("m", dtype="float64")).to_series().dtype == pl.Array(pl.Float64, (2, 2))


def test_pyarrow_tensor_columns_keep_their_logical_shape():
    import pyarrow as pa

    cube = np.arange(48, dtype=np.float32).reshape(4, 2, 3, 2)
    # The second is stored permuted: its logical cells are (3, 2, 2), copied into C order.
    for cells in (cube, np.transpose(cube, (0, 2, 1, 3))):
        tensors = pa.FixedShapeTensorArray.from_numpy_ndarray(cells)
        lf = pl.from_arrow(pa.table({"t": tensors})).lazy()
        out = lf.select(to_tensor("t"), f64=to_tensor("t", dtype="float64")).collect(engine="streaming")
        assert out.schema["t"] == pl.Array(pl.Float32, cells.shape[1:])
        assert out.schema["f64"] == pl.Array(pl.Float64, cells.shape[1:])
        np.testing.assert_array_equal(np.from_dlpack(out["t"].to_dlpack()), cells)
        np.testing.assert_array_equal(np.from_dlpack(out["f64"].to_dlpack()), cells)


# Polars reports every error a plugin returns as a ComputeError ("the plugin failed with
# message: ..."); the Rust side's error kinds do not cross the plugin boundary, the messages do.
def test_bad_input_is_a_polars_error_not_a_crash(df):
    with pytest.raises(pl.exceptions.ComputeError, match="numeric, boolean or temporal"):
        df.select(to_tensor("a", "g"))
    ragged = pl.DataFrame({"l": [[1, 2], [3]]})
    with pytest.raises(pl.exceptions.ComputeError, match=r"row 1 of list column 'l' has length 1"):
        ragged.select(to_tensor("l", width=2))
    with pytest.raises(pl.exceptions.ComputeError, match="width=3"):
        pl.DataFrame({"l": [[1, 2], [3, 4]]}).select(to_tensor("l", width=3))
    with pytest.raises(pl.exceptions.ComputeError, match="needs width="):
        ragged.select(to_tensor("l"))
    with pytest.raises(
        pl.exceptions.ComputeError,
        match="lengths don't match: to_tensor: column 'a' has length 2, another column has 5",
    ):
        df.select(to_tensor(pl.col("a").head(2), "b"))
    # dtype= is parsed when the expression is built, by the parser dlframe.to_dlpack uses.
    with pytest.raises(TypeError, match="complex64"):
        df.select(to_tensor("a", dtype="complex64"))
    with pytest.raises(TypeError, match="at least one"):
        to_tensor()
    with pytest.raises(TypeError, match="fill_value"):
        to_tensor("a", fill_value="zero")
    # pyo3-polars imports the inputs with polars-arrow 0.55, which panics on zero-width Array
    # columns with rows (before dlframe's code runs); the panic is caught, the process lives.
    zero = pl.Series("z", [[], []], dtype=pl.Array(pl.Float64, 0)).to_frame()
    with pytest.raises(pl.exceptions.ComputeError, match="panicked"):
        zero.select(to_tensor("z"))
    assert zero["z"].to_dlpack().shape == (2, 0)
    # The process is still healthy afterwards.
    assert df.select(to_tensor("a")).height == 5


def series_values_address(s):
    arr = s.to_arrow()
    while pa.types.is_fixed_size_list(arr.type):
        arr = arr.flatten()
    return arr.buffers()[1].address


@pytest.mark.parametrize("shape", [(6,), (3, 2), (2, 1, 3)])
def test_from_dlpack_copy_true_owns_its_values(shape):
    src = np.arange(6, dtype=np.float64).reshape(shape)
    shared = dlpl.from_dlpack(src)
    copied = dlpl.from_dlpack(src, copy=True)
    assert series_values_address(shared) == src.ctypes.data  # copy=None shares C-contiguous memory
    assert series_values_address(copied) != src.ctypes.data
    src[...] = -1
    want = np.arange(6, dtype=np.float64).reshape(shape).tolist()
    assert copied.to_list() == want
    assert shared.to_numpy().ravel().tolist() == [-1] * 6


def test_plugin_symbols_live_in_the_extension():
    import ctypes

    lib = ctypes.CDLL(dlpl._native.__file__)
    for sym in ("_polars_plugin_get_version", "_polars_plugin_to_tensor", "_polars_plugin_field_to_tensor"):
        assert hasattr(lib, sym), sym

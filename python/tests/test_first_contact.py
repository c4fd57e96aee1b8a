"""What a new user meets in the first hour (issue 17, "The Python API"): dtype-likes, numpy's
view of a Tensor, reachable submodules, LazyFrames, error types and remedies, signatures and
stubs, and Polars selectors and literals."""

import inspect
import os
import subprocess
import sys
import textwrap

import numpy as np
import polars as pl
import polars.selectors as cs
import pyarrow as pa
import pytest

import dlframe
from conftest import optional
from dlframe.polars import to_tensor

NAMES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
NAMES += ["float16", "float32", "float64"]
POLARS = {
    "bool": pl.Boolean, "int8": pl.Int8, "int16": pl.Int16, "int32": pl.Int32, "int64": pl.Int64,
    "uint8": pl.UInt8, "uint16": pl.UInt16, "uint32": pl.UInt32, "uint64": pl.UInt64,
    "float16": pl.Float16, "float32": pl.Float32, "float64": pl.Float64,
}  # fmt: skip


def dtype_likes(name: str) -> list:
    """Every spelling of one dtype a numpy, pyarrow or Polars user would write."""
    d = np.dtype(name)
    return [name, d, d.type, d.str, d.str[1:], d.char, pa.from_numpy_dtype(d), POLARS[name], POLARS[name]()]


@pytest.mark.parametrize("name", NAMES)
def test_every_dtype_like_means_the_same_dtype_in_to_dlpack_and_the_plugin(name):
    values = [True, False] if name == "bool" else [1, 0]  # ints never become bool silently
    df = pl.DataFrame({"a": values})
    for like in dtype_likes(name):
        assert dlframe._native._dtype_name(like) == name, like
        t = dlframe.to_dlpack(pa.array(values), dtype=like)
        assert t.dtype == name, like
        out = df.select(to_tensor("a", dtype=like)).to_series()
        assert out.dtype == pl.Array(POLARS[name], 1), like
        assert out.to_list() == [[1], [0]], like


def test_torch_dtypes_are_dtype_likes():
    torch = optional("torch")
    for name in NAMES:
        like = getattr(torch, name, None)
        if like is None:  # torch has no uint16..uint64 before 2.3
            continue
        values = [True, False] if name == "bool" else [1, 0]
        assert dlframe.to_dlpack(pa.array(values), dtype=like).dtype == name
        assert dlframe._native._dtype_name(like) == name
    # bfloat16 is a dtype dlframe has (as torch does); complex64 is not.
    assert torch.from_dlpack(dlframe.to_dlpack(pa.array([1.0]), dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="complex64"):
        dlframe.to_dlpack(pa.array([1.0]), dtype=torch.complex64)


@pytest.mark.parametrize(
    "like, named",
    [
        (object(), "object"),
        ("complex64", "complex64"),
        (np.complex128, "complex128"),
        (">f4", "big-endian"),
        (pa.string(), "string"),
        (pl.Int128, "Int128"),
        (pl.Datetime("ns"), "Datetime"),
        ("float33", "float33"),
    ],
)
def test_an_unknown_dtype_like_names_itself_and_the_accepted_forms(like, named):
    for call in (
        lambda: dlframe.to_dlpack(pa.array([1.0]), dtype=like),
        lambda: dlframe._native._dtype_name(like),
        lambda: to_tensor("a", dtype=like),
    ):
        with pytest.raises(TypeError, match=named) as e:
            call()
        assert "np.float32" in str(e.value) and "pl.Float32" in str(e.value), e.value


def test_the_null_policy_is_read_by_one_parser():
    with pytest.raises(ValueError, match="expected 'error', 'fill', 'nan' or 'mask'"):
        dlframe.to_dlpack(pa.array([1.0]), nulls="zero")
    with pytest.raises(ValueError, match="needs fill_value"):
        dlframe.to_dlpack(pa.array([1.0]), nulls="fill")
    df = pl.DataFrame({"a": [1.0]})
    # Polars reports every plugin error as ComputeError.
    with pytest.raises(pl.exceptions.ComputeError, match="expected 'error', 'fill' or 'nan'"):
        df.select(to_tensor("a", nulls="zero"))
    with pytest.raises(pl.exceptions.ComputeError, match="needs fill_value"):
        df.select(to_tensor("a", nulls="fill"))


def test_tensor_dtype_is_a_numpy_dtype_that_still_equals_its_name():
    t = dlframe.to_dlpack(pa.array([1.0, 2.0], pa.float32()))
    assert isinstance(t.dtype, np.dtype) and t.dtype == np.float32 and t.dtype == "float32"
    assert np.result_type(t) == np.float32
    assert np.result_type(t, np.float64) == np.float64
    b = dlframe.to_dlpack(pa.array([True, False]))
    assert b.dtype == np.bool_ and np.result_type(b) == np.bool_


def test_jax_reads_a_tensor_by_its_dtype():
    jnp = optional("jax.numpy")
    t = dlframe.to_dlpack(pa.array([1.0, 2.5, -3.0], pa.float32()))
    x = jnp.asarray(t)
    assert x.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(x), [1.0, 2.5, -3.0])


def test_to_numpy_is_a_view_or_with_copy_a_writable_copy():
    col = pa.array([1.0, 2.0, 3.0])
    t = dlframe.to_dlpack(col)
    view = t.to_numpy()
    assert view.__array_interface__["data"][0] == col.buffers()[1].address
    assert not view.flags.writeable
    np.testing.assert_array_equal(view, [1.0, 2.0, 3.0])
    copy = t.to_numpy(copy=True)
    assert copy.flags.writeable and not np.shares_memory(copy, view)
    copy[0] = 42.0
    assert view[0] == 1.0 and col[0].as_py() == 1.0
    m = dlframe.to_dlpack(pa.table({"a": [1, 2], "b": [3, 4]})).to_numpy()
    np.testing.assert_array_equal(m, [[1, 3], [2, 4]])
    ts = dlframe.to_dlpack(pa.array([1, 2], pa.timestamp("ns"))).to_numpy()
    assert ts.dtype == np.dtype("datetime64[ns]") and ts[1] == np.datetime64(2, "ns")


def run_python(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (nothing imported yet), bounded in time."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_dlframe_datafusion_is_reachable_without_importing_it_at_import_time():
    optional("datafusion")
    r = run_python(
        """
        import sys
        import dlframe
        assert "datafusion" not in sys.modules, "import dlframe imported datafusion"
        import datafusion
        ctx = datafusion.SessionContext()
        dlframe.datafusion.register(ctx)
        print(ctx.sql("SELECT tensor_ndim(to_tensor(1.0, 2.0)) AS n").to_pydict()["n"])
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[1]"
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        dlframe.nonsense  # noqa: B018


def test_to_dlpack_collects_a_lazyframe():
    lf = pl.LazyFrame({"a": [1.0, 2.0, 3.0], "b": [4, 5, 6]}).filter(pl.col("b") > 4)
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(lf)), [[2.0, 5.0], [3.0, 6.0]])
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(lf.select("a"), columns="dict")["a"]), [2, 3])


@pytest.mark.parametrize("dtype", [pl.Int128, pl.UInt128])
def test_a_column_polars_cannot_export_is_named_with_a_cast(dtype):
    if not hasattr(pl, dtype.__name__):
        pytest.skip(f"this Polars has no {dtype.__name__}")
    df = pl.DataFrame({"ok": [1, 2], "big": pl.Series([1, 2], dtype=dtype)})
    for obj in (df, df["big"], df.lazy()):
        with pytest.raises(BufferError, match=f"column 'big' is {dtype.__name__}.*cast"):
            dlframe.to_dlpack(obj)


def test_an_all_null_polars_column_fails_as_the_same_pyarrow_column_does():
    for series, arrow in [
        (pl.Series("x", [None, None], dtype=pl.Float64), pa.chunked_array([pa.nulls(2, pa.float64())])),
        (pl.Series("x", [None, None]), pa.chunked_array([pa.nulls(2)])),
    ]:
        with pytest.raises(BufferError) as expected:
            dlframe.to_dlpack(arrow)
        for obj in (series, series.to_frame()):
            with pytest.raises(BufferError) as got:
                dlframe.to_dlpack(obj)
            # The same words, whatever name the column has.
            assert str(got.value).replace("'x'", "") == str(expected.value).replace("''", ""), obj
    filled = dlframe.to_dlpack(pl.Series("x", [None, None], dtype=pl.Float64), fill_value=0)
    np.testing.assert_array_equal(np.from_dlpack(filled), [0.0, 0.0])


def test_numpy_datetimes_import_through_the_array_interface_with_their_unit():
    for unit in ("s", "ms", "us", "ns"):
        a = np.array([0, 1, 1_700_000_000], f"datetime64[{unit}]")
        out = dlframe.from_dlpack(a)
        assert out.type == pa.timestamp(unit)
        assert out.cast(pa.int64()).to_pylist() == a.astype("int64").tolist()
    d = np.array([5, -3], "timedelta64[ms]")
    assert dlframe.from_dlpack(d).type == pa.duration("ms")


@pytest.mark.parametrize(
    "values, options, remedy",
    [
        ([float("nan")], {"dtype": "int64"}, "choose a float dtype"),
        ([1.5], {"dtype": "int32"}, "choose a float dtype"),
        ([float("inf")], {"dtype": "int16"}, "choose a float dtype"),
        ([1.0, None], {"dtype": "int64", "fill_value": 1.5}, "fill with an integer"),
        ([1, None], {"fill_value": float("nan")}, "fill with an integer"),
        ([300], {"dtype": "int8"}, "choose a wider dtype"),
        ([-1], {"dtype": "uint64"}, "choose a signed dtype"),
    ],
)
def test_out_of_range_remedies_fit_the_case(values, options, remedy):
    with pytest.raises(ValueError) as e:
        dlframe.to_dlpack(pa.array(values), **options)
    assert remedy in str(e.value), e.value
    if remedy != "choose a wider dtype":
        assert "wider" not in str(e.value), e.value


def test_the_plugins_null_error_offers_only_what_the_plugin_accepts():
    with pytest.raises(pl.exceptions.ComputeError) as e:
        pl.DataFrame({"a": [1.0, None]}).select(to_tensor("a"))
    assert "nulls='fill'" in str(e.value) and "mask" not in str(e.value), e.value


def test_runtime_objects_have_real_docs_and_signatures():
    # to_dlpack's keywords are the binding's own; test_keywords.py holds the rest to them.
    for f, params in [
        (dlframe.to_dlpack, list(inspect.signature(dlframe.to_dlpack).parameters)),
        (dlframe.from_dlpack, ["x", "copy", "device"]),
        (dlframe.tensor, ["x"]),
        (dlframe.Tensor.to_numpy, ["self", "copy"]),
    ]:
        assert list(inspect.signature(f).parameters) == params, f
        assert f.__doc__ and "see the stub" not in f.__doc__ and len(f.__doc__) > 80, f
    assert "nulls" in dlframe.to_dlpack.__doc__ and "dtype" in dlframe.to_dlpack.__doc__
    df = pl.DataFrame({"a": [1.0]})
    for method in (df.to_dlpack, df["a"].to_dlpack, df.lazy().to_dlpack, df.dlframe.to_dlpack):
        assert "**options" not in str(inspect.signature(method)) and method.__doc__
    with pytest.raises(TypeError, match="unexpected keyword argument 'null'"):
        df.to_dlpack(null="fill")


def test_the_stubs_let_mypy_type_the_usual_calls(tmp_path):
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (pip install -r python/requirements-test.txt)")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import pyarrow as pa
            import dlframe

            x = pa.array([1.0, None])
            a: np.ndarray = np.from_dlpack(dlframe.to_dlpack(x, fill_value=0))
            values, mask = dlframe.to_dlpack(x, nulls="mask")
            b = np.from_dlpack(values).sum() + np.from_dlpack(mask).all()
            cols = dlframe.to_dlpack(pa.table({"a": x}), columns="dict", nulls="nan")
            c = cols["a"]
            t = dlframe.to_dlpack(x, nulls="fill", fill_value=0, dtype=np.float32)
            d: np.dtype = t.dtype
            e: np.ndarray = t.to_numpy(copy=True)
            """
        )
    )
    package_dir = os.path.dirname(os.path.dirname(dlframe.__file__))
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, "--ignore-missing-imports", str(snippet)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MYPYPATH": package_dir},
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_to_tensor_takes_selectors_and_broadcasts_literals():
    df = pl.DataFrame({"a": [1.0, 2.0], "b": [3, 4], "y": ["p", "q"]})
    expected = [[1.0, 3.0], [2.0, 4.0]]
    for selection in (cs.numeric(), pl.exclude("y"), pl.col(pl.Float64, pl.Int64)):
        out = df.select(to_tensor(selection)).to_series()
        assert out.dtype == pl.Array(pl.Float64, 2) and out.to_list() == expected, selection
    lazy = df.lazy().select(to_tensor(cs.numeric(), dtype="f4").alias("x")).collect()["x"]
    assert lazy.dtype == pl.Array(pl.Float32, 2) and lazy.to_list() == expected
    out = df.select(to_tensor("a", pl.lit(1.0))).to_series()
    assert out.to_list() == [[1.0, 1.0], [2.0, 1.0]]
    out = df.select(to_tensor(pl.lit(0), "b", "a")).to_series()
    assert out.to_list() == [[0.0, 3.0, 1.0], [0.0, 4.0, 2.0]]


def test_a_datafusion_query_that_fails_while_dlframe_reads_it_raises_runtime_error():
    datafusion = optional("datafusion")
    import dlframe.datafusion

    ctx = datafusion.SessionContext()
    dlframe.datafusion.register(ctx)
    ctx.from_arrow(pa.table({"a": [1.0, None], "b": [1, 0]}), name="t")
    for query, message in [
        ("SELECT to_tensor(a) FROM t", "column 'a' has 1 null"),
        ("SELECT 1 / b FROM t", "Divide by zero"),
    ]:
        with pytest.raises(RuntimeError, match=message) as e:
            dlframe.to_dlpack(ctx.sql(query))
        assert str(e.value).startswith("reading the Arrow data of a DataFrame failed: "), e.value
        assert e.value.__cause__ is not None

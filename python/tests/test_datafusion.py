"""dlframe's SQL functions inside datafusion-python 55 (through datafusion-ffi), query results
as tensors, tensors as tables, and the `dlframe` CLI's output files."""

import os
import pathlib
import subprocess

import datafusion
import numpy as np
import pyarrow as pa
import pytest
from conftest import optional

import dlframe
import dlframe.datafusion as dldf

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx():
    c = datafusion.SessionContext()
    dldf.register(c)
    t = pa.table(
        {
            "a": pa.array([1, 2, 3, 4], pa.int32()),
            "b": pa.array([0.5, 1.5, 2.5, 3.5], pa.float32()),
            "c": pa.array([10, 20, 30, 40], pa.int16()),
            "n": pa.array([1.0, None, 3.0, None], pa.float64()),
            "l": pa.array([[1, 2], [3, 4], [5, 6], [7, 8]], pa.list_(pa.float32())),
            "r": pa.array([[1], [3, 4], [5, 6], [7, 8]], pa.list_(pa.float32())),
            "g": pa.array([1, 2, 1, 2], pa.int64()),
        }
    )
    c.register_record_batches("t", [t.to_batches()])
    return c


def test_every_udf_registers_through_ffi(ctx):
    names = {u.name for u in dlframe._native.datafusion_udfs()}
    assert names == {
        "to_tensor", "to_tensor_fill", "to_tensor_as", "to_tensor_padded", "tensor_shape",
        "tensor_ndim", "tensor_dtype", "tensor_reshape", "tensor_element",
    }
    assert dldf.built_against().split(".")[0] == datafusion.__version__.split(".")[0]


def test_pyarrow_reads_the_result_as_a_fixed_shape_tensor(ctx):
    table = ctx.sql("SELECT to_tensor(a, b, c) AS x FROM t").to_arrow_table()
    col = table.column("x").combine_chunks()
    assert isinstance(col.type, pa.FixedShapeTensorType), col.type
    assert col.type.shape == [3]
    assert col.type.value_type == pa.float64()  # int32 + float32 + int16 -> float64, as numpy
    expected = np.array([[1, 0.5, 10], [2, 1.5, 20], [3, 2.5, 30], [4, 3.5, 40]])
    np.testing.assert_array_equal(col.to_numpy_ndarray(), expected)


def test_query_results_are_tensors_through_the_arrow_stream(ctx):
    t = dlframe.to_dlpack(ctx.sql("SELECT to_tensor_as('float32', a, b) AS x FROM t"))
    x = np.from_dlpack(t)
    assert x.dtype == np.float32 and x.shape == (4, 2)
    np.testing.assert_array_equal(x, [[1, 0.5], [2, 1.5], [3, 2.5], [4, 3.5]])
    m = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT a, c FROM t ORDER BY a")))
    np.testing.assert_array_equal(m, [[1, 10], [2, 20], [3, 30], [4, 40]])


def test_nulls_error_names_the_column_and_fill_fixes_it(ctx):
    with pytest.raises(Exception, match=r"'n'.*2 null.*to_tensor_fill"):
        ctx.sql("SELECT to_tensor(a, n) FROM t").collect()
    x = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT to_tensor_fill(-1, a, n) AS x FROM t")))
    np.testing.assert_array_equal(x, [[1, 1], [2, -1], [3, 3], [4, -1]])


def test_lists_and_ragged_rows(ctx):
    x = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT to_tensor(l, 2) AS x FROM t")))
    np.testing.assert_array_equal(x, [[1, 2], [3, 4], [5, 6], [7, 8]])
    x = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT to_tensor(l, 2, 1) AS x FROM t")))
    assert x.shape == (4, 2, 1)
    with pytest.raises(Exception, match=r"row 0 of list column .r. \(in a batch of \d+ rows, counted from its start\) has 1 elements"):
        ctx.sql("SELECT to_tensor(r, 2) FROM t").collect()
    with pytest.raises(Exception, match=r"to_tensor\(l, d\)"):
        ctx.sql("SELECT to_tensor(l) FROM t").collect()


def test_inspection_functions_take_literal_arguments_over_ffi(ctx):
    df = ctx.sql(
        "SELECT tensor_shape(x) AS s, tensor_ndim(x) AS n, tensor_dtype(x) AS d, "
        "tensor_element(x, 1, 0) AS e FROM (SELECT tensor_reshape(to_tensor(l, 2), 2, 1) AS x FROM t) s"
    ).to_pydict()
    assert df["s"][0] == [2, 1] and df["n"][0] == 2 and df["d"][0] == "float32"
    assert df["e"] == [2.0, 4.0, 6.0, 8.0]
    out = ctx.sql(
        "SELECT g, sum(tensor_element(to_tensor(a, b), 0)) AS s FROM t "
        "WHERE tensor_element(to_tensor(a, b), 1) > 1 GROUP BY g ORDER BY g"
    ).to_pydict()
    assert out == {"g": [1, 2], "s": [3.0, 6.0]}


def test_a_strange_datafusion_major_version_is_refused_before_any_capsule(monkeypatch):
    monkeypatch.setattr(datafusion, "__version__", "54.1.0")
    with pytest.raises(RuntimeError, match="54.1.0.*stable ABI"):
        dldf.register(datafusion.SessionContext())


def test_numpy_arrays_are_queried_as_tables():
    ctx = datafusion.SessionContext()
    dldf.register(ctx)
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    y = np.arange(8, dtype=np.int64) * 10
    dldf.register_tensors(ctx, "m", {"x": x, "y": y}, partitions=3)
    out = ctx.sql("SELECT sum(tensor_element(x, 2)) AS s, sum(y) AS t FROM m WHERE y >= 40").to_pydict()
    assert out == {"s": [float(x[4:, 2].sum())], "t": [int(y[4:].sum())]}
    back = np.from_dlpack(dlframe.to_dlpack(ctx.sql("SELECT x FROM m ORDER BY y")))
    np.testing.assert_array_equal(back, x)
    dldf.register_tensors(ctx, "single", np.ones((2, 2, 2), np.float64))
    assert ctx.sql("SELECT tensor_shape(tensor) AS s FROM single").to_pydict()["s"] == [[2, 2], [2, 2]]


def _cli():
    path = pathlib.Path(os.environ.get("DLFRAME_CLI", ROOT / "target" / "debug" / "dlframe"))
    if not path.exists():
        pytest.skip(f"the dlframe CLI is not built at {path}: run `cargo build -p dlframe-cli`")
    return path


def test_cli_demo_runs_with_no_arguments():
    out = subprocess.run([_cli()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "shape: [9000, 3]" in out.stdout and "dtype: float64" in out.stdout


def test_cli_writes_npy_and_safetensors_that_numpy_and_safetensors_read(tmp_path):
    st = optional("safetensors.numpy")
    pq = optional("pyarrow.parquet")
    pacsv = optional("pyarrow.csv")
    rng = np.random.default_rng(1)
    a = rng.normal(size=1000).astype(np.float32)
    b = rng.integers(0, 100, size=1000).astype(np.int64)
    pq.write_table(pa.table({"a": a, "b": b}), tmp_path / "d.parquet")
    pacsv.write_csv(pa.table({"a": a.astype(np.float64), "b": b}), tmp_path / "d.csv")
    sql = "SELECT to_tensor_as('float32', p.a, c.b) AS x FROM p JOIN c ON p.b = c.b AND p.a = CAST(c.a AS REAL)"
    args = ["--table", f"p={tmp_path / 'd.parquet'}", "--table", f"c={tmp_path / 'd.csv'}", sql]
    for out in ("x.npy", "x.safetensors"):
        r = subprocess.run([_cli(), *args, "--out", tmp_path / out], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "dtype: float32" in r.stdout
    x = np.load(tmp_path / "x.npy")
    assert x.dtype == np.float32 and x.shape[1] == 2 and x.shape[0] >= 1000
    y = st.load_file(str(tmp_path / "x.safetensors"))["x"]
    np.testing.assert_array_equal(x, y)
    ref = sorted(zip(a.tolist(), b.astype(np.float32).tolist()))
    got = sorted(map(tuple, x.tolist()))
    assert set(ref) <= set(got)
    r = subprocess.run([_cli(), "--table", "bad", "SELECT 1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "NAME=PATH" in r.stderr
    r = subprocess.run([_cli(), "SELECT to_tensor('x')"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot become a tensor" in r.stderr

"""The new types on every route, checked against numpy, pyarrow and Polars (issue 53).

- numpy's NaT is a null in Arrow, as pyarrow makes it, with the values still shared.
- An N-d datetime keeps its type: never bare integers.
- An integer fill value obeys the cast rule that the same value in the data obeys.
- bfloat16 and float8 columns that Polars stores over variable-width binary, or that pyarrow
  read before dlframe was imported, convert with the same bits.
- ``dlframe.tensor`` of Arrow data answers as ``to_dlpack`` does.
"""

import inspect
import subprocess
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dlframe

# ---------------------------------------------------------------------------------------------
# NaT


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("kind", ["M8", "m8"])
def test_nat_is_a_null_and_the_values_stay_shared(kind, unit):
    a = np.array([5, np.iinfo(np.int64).min, 7], dtype=f"{kind}[{unit}]")
    got = dlframe.from_dlpack(a, copy=False)
    want = pa.array(a)
    assert got.type == want.type
    assert got.null_count == 1 and got.is_valid().to_pylist() == [True, False, True]
    assert got.equals(want)
    # The values are numpy's memory.
    assert got.buffers()[1].address == a.ctypes.data


@pytest.mark.parametrize(
    ("dtype", "arrow", "numpy_unit"),
    [("M8[D]", pa.date32(), "M8[D]"), ("M8[h]", pa.timestamp("s"), "M8[s]"), ("m8[m]", pa.duration("s"), "m8[s]")],
)
def test_nat_in_the_units_that_copy_is_a_null_too(dtype, arrow, numpy_unit):
    a = np.array(["NaT", 3], dtype=dtype) if dtype.startswith("M8") else np.array([np.iinfo(np.int64).min, 3], dtype=dtype)
    got = dlframe.from_dlpack(a)
    assert got.type == arrow
    assert got.is_valid().to_pylist() == [False, True]
    assert got[1].as_py() == pa.array(a[1:].astype(numpy_unit)).cast(arrow)[0].as_py()


def test_nd_datetimes_keep_their_type():
    m = np.arange(4).view("m8[m]").reshape(2, 2)
    col = dlframe.from_dlpack(m)
    assert col.type.value_type == pa.duration("s"), col.type
    assert col.storage.flatten().to_pylist() == [np.timedelta64(v, "m").astype("m8[s]").item() for v in range(4)]
    h = np.arange(6).view("M8[h]").reshape(2, 3)
    back = dlframe.tensor(h).to_numpy()
    assert back.dtype == np.dtype("M8[s]"), back.dtype
    assert (back == h.astype("M8[s]")).all()
    # Arrow units share the memory and keep their own unit.
    us = np.arange(4).view("M8[us]").reshape(2, 2)
    assert dlframe.tensor(us).to_numpy().dtype == np.dtype("M8[us]")


# ---------------------------------------------------------------------------------------------
# A fill value obeys the data's cast rule


@pytest.mark.parametrize(("dtype", "fill", "rounded"), [("float8_e5m2", 1000, 1024.0), ("bfloat16", 1001, 1000.0), ("float32", 2**24 + 1, 2.0**24)])
def test_an_integer_fill_the_dtype_holds_only_rounded_is_refused_unless_round(dtype, fill, rounded):
    col = pa.array([1, None], pa.int64())
    with pytest.raises(ValueError, match=rf"{fill} \(fill_value\).*inexact='round'|{fill}.*fill_value"):
        dlframe.to_dlpack(col, nulls="fill", fill_value=fill, dtype=dtype)
    # The same value in the data is refused the same way.
    with pytest.raises(ValueError):
        dlframe.to_dlpack(pa.array([fill], pa.int64()), dtype=dtype)
    t = dlframe.to_dlpack(col, nulls="fill", fill_value=fill, dtype=dtype, inexact="round")
    as_f32 = dlframe.to_dlpack(pa.array(dlframe.from_dlpack(t)), dtype="float32")
    assert np.asarray(dlframe.tensor(as_f32)).tolist() == [1.0, rounded]


def test_a_fill_the_dtype_holds_exactly_passes():
    t = dlframe.to_dlpack(pa.array([1, None]), nulls="fill", fill_value=1024, dtype="float8_e5m2")
    back = dlframe.to_dlpack(pa.array(dlframe.from_dlpack(t)), dtype="float32")
    assert np.asarray(dlframe.tensor(back)).tolist() == [1.0, 1024.0]


# ---------------------------------------------------------------------------------------------
# bfloat16 and float8 through Polars and Parquet

EXTENSIONS = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
VALUES = [1.5, -2.0, 0.25, 448.0]


def _tensor(dtype):
    return dlframe.to_dlpack(pa.array(VALUES, pa.float32()), dtype=dtype)


def _floats(obj):
    """The values of a dlframe column (or a one-column table's matrix) as float32, through dlframe."""
    return np.asarray(dlframe.tensor(dlframe.to_dlpack(obj, dtype="float32"))).ravel().tolist()


@pytest.mark.parametrize("dtype", EXTENSIONS)
def test_a_polars_series_of_an_extension_dtype_round_trips(dtype, tmp_path):
    pl = pytest.importorskip("polars", reason="Polars is not installed")
    s = dlframe.polars.from_dlpack(_tensor(dtype), name="x")
    # Polars stores it over variable-width binary; it still comes back as a tensor of its dtype.
    assert str(dlframe.to_dlpack(s).dtype) == dtype
    assert _floats(s.to_arrow()) == VALUES
    f = tmp_path / "polars.parquet"
    pl.DataFrame({"x": s}).write_parquet(f)
    table = pq.read_table(f)
    assert _floats(table) == VALUES
    assert _floats(table["x"]) == VALUES
    assert _floats(pl.read_parquet(f)["x"]) == VALUES


@pytest.mark.parametrize("dtype", EXTENSIONS)
@pytest.mark.parametrize("writer", ["pyarrow", "polars"])
def test_a_file_read_before_import_dlframe_gives_the_same_bits(dtype, writer, tmp_path):
    pl = pytest.importorskip("polars", reason="Polars is not installed")
    f = tmp_path / "x.parquet"
    if writer == "pyarrow":
        pq.write_table(pa.table({"x": pa.array(dlframe.from_dlpack(_tensor(dtype)))}), f)
    else:
        pl.DataFrame({"x": dlframe.polars.from_dlpack(_tensor(dtype), name="x")}).write_parquet(f)
    script = f"""
import pyarrow.parquet as pq
table = pq.read_table({str(f)!r})
import dlframe, numpy as np
print(np.asarray(dlframe.tensor(dlframe.to_dlpack(table, dtype="float32"))).ravel().tolist())
try:
    dlframe.to_dlpack(table["x"])
    print("column ok")
except Exception as e:
    print(type(e).__name__, e)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()
    assert first == str(VALUES)
    # A bare column (no schema) has lost the type when pyarrow read it first: it says so.
    assert second == "column ok" or "after importing dlframe" in second, second


# ---------------------------------------------------------------------------------------------
# dlframe.tensor of Arrow data, and the signature


@pytest.mark.parametrize(
    "array",
    [pa.array([1, None]), pa.array([True, False]), pa.array([1, 2], pa.timestamp("s")).take([0]), pa.array([[1, 2]], pa.list_(pa.int64(), 2))],
    ids=["nulls", "bool", "timestamp", "fixed_size_list"],
)
def test_tensor_of_arrow_data_answers_as_to_dlpack_does(array):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            want = dlframe.to_dlpack(array)
        except Exception as e:  # noqa: BLE001 - the same error, whatever it is
            with pytest.raises(type(e)):
                dlframe.tensor(array)
            assert not type(e).__module__.startswith("pyarrow")
            return
        got = dlframe.tensor(array)
    assert np.asarray(got).tolist() == np.asarray(dlframe.tensor(want)).tolist()


def test_a_null_in_arrow_data_is_a_buffer_error_from_tensor():
    with pytest.raises(BufferError, match="null"):
        dlframe.tensor(pa.array([1, None]))


def test_to_dlpack_shows_its_real_defaults():
    params = inspect.signature(dlframe.to_dlpack).parameters
    assert params["order"].default == "C"
    assert params["columns"].default == "stack"
    assert params["inexact"].default == "error"


def test_a_list_view_column_in_a_table_converts_as_it_does_alone():
    if not hasattr(pa, "list_view"):
        pytest.skip("this pyarrow has no list_view (pyarrow 16 added it)")
    lv = pa.array([[1, 2], [3, 4]], pa.list_view(pa.int64()))
    alone = np.asarray(dlframe.tensor(dlframe.to_dlpack(lv)))
    in_table = np.asarray(dlframe.tensor(dlframe.to_dlpack(pa.table({"x": lv}))))
    assert alone.tolist() == in_table.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize("dtype", EXTENSIONS)
def test_a_requested_float32_schema_casts_an_extension_tensor(dtype):
    t = _tensor(dtype)
    got = pa.array(t, type=pa.float32())
    assert got.type == pa.float32()
    assert got.to_pylist() == VALUES


# ---------------------------------------------------------------------------------------------
# Advice that applies to the route it is given on


def test_a_timedelta_unit_arrow_lacks_is_told_of_a_timedelta_unit():
    with pytest.raises(BufferError) as e:
        dlframe.from_dlpack(np.array([1], "m8[W]"))
    assert "timedelta64[s]" in str(e.value) and "datetime64[s]" not in str(e.value)


def test_from_dlpack_does_not_advise_a_dtype_it_does_not_take():
    with pytest.raises(ValueError) as e:
        dlframe.from_dlpack(np.array([0, 2**40], dtype="datetime64[D]"))
    assert "dtype" not in str(e.value).split(";")[1] and "astype" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------
# Errors name the source's row wherever it is known, and say so where it is not

BIG_ROW = 3001


def _big_table(n=5000):
    x = np.arange(n, dtype=np.int64)
    x[BIG_ROW] = 2**53 + 1
    return pa.table({"x": x, "y": np.ones(n)})


def _refusal(run):
    with pytest.raises(Exception) as e:
        run()
    assert "9007199254740993" in str(e.value) and "has no exact float64" in str(e.value), e.value
    return str(e.value)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"shuffle": True, "seed": 3},
        {"shuffle": True, "seed": 3, "shard": (1, 2)},
        {"shuffle": True, "seed": 3, "shard": (0, 2)},
        {"shuffle": True, "seed": 5, "splits": 5, "shuffle_buffer": 2000},
    ],
)
def test_a_batch_names_the_source_row_even_when_shuffled_and_sharded(options, tmp_path):
    t = _big_table()
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=300)
    sources = [t, pa.Table.from_batches(t.to_batches(max_chunksize=700)), str(tmp_path / "a.parquet")]
    # Only the rank that reads row 3001 meets it; the other makes its batches.
    if BIG_ROW not in _rows_of(options):
        for source in sources:
            list(dlframe.batches(source, 1000, dtype="float64", **options))
        return
    for source in sources:
        msg = _refusal(lambda: list(dlframe.batches(source, 1000, dtype="float64", **options)))
        assert f"at row {BIG_ROW} of column 'x'" in msg, (source, msg)


def _rows_of(options):
    """The source rows a rank reads, from its int64 batches of the row ids."""
    ids = pa.table({"x": np.arange(5000, dtype=np.int64), "y": np.ones(5000)})
    return {int(r) for b in dlframe.batches(ids, 1000, **options) for r in np.from_dlpack(b)[:, 0]}


def test_a_stream_names_its_row_in_the_stream():
    t = _big_table()
    reader = pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=333))
    msg = _refusal(lambda: list(dlframe.batches(reader, 1000, dtype="float64")))
    assert f"at row {BIG_ROW} of column 'x'" in msg, msg


def test_a_sql_function_says_its_row_counts_in_a_batch_and_its_advice_works():
    datafusion = pytest.importorskip("datafusion", reason="datafusion is in the test requirements")
    t = _big_table()
    query = "SELECT to_tensor_as('float64', x, y) AS m FROM t"

    def context(config=None):
        ctx = datafusion.SessionContext(config) if config is not None else datafusion.SessionContext()
        dlframe.datafusion.register(ctx)
        ctx.register_record_batches("t", [t.to_batches(max_chunksize=1000)])
        return ctx

    plain = context()
    msg = _refusal(lambda: plain.sql(query).collect())
    assert "at row 1 of a batch of 1000 rows, column 'x'" in msg, msg
    # Without dlframe's options the session has no dlframe namespace: DataFusion says so.
    with pytest.raises(Exception, match="dlframe"):
        plain.sql("SET dlframe.inexact = 'round'").collect()
    # The two remedies the message names: a cast in the query, and the option in a session made
    # with dlframe's options.
    cast = plain.sql("SELECT to_tensor_as('float64', CAST(x AS DOUBLE), y) AS m FROM t")
    assert _row(cast, BIG_ROW)[0] == float(2**53)
    with_options = context(datafusion.SessionConfig().with_extension(dlframe.datafusion.options()))
    _refusal(lambda: with_options.sql(query).collect())
    with_options.sql("SET dlframe.inexact = 'round'").collect()
    assert _row(with_options.sql(query), BIG_ROW)[0] == float(2**53)
    with_options.sql("SET dlframe.inexact = 'error'").collect()
    _refusal(lambda: with_options.sql(query).collect())


def _row(df, i):
    return np.from_dlpack(dlframe.to_dlpack(df))[i]


def test_polars_says_its_row_counts_in_the_batch_it_passed_and_raises_compute_error():
    pl = pytest.importorskip("polars", reason="polars is in the test requirements")
    t = _big_table()
    lf = pl.from_arrow(t).lazy().select(dlframe.polars.to_tensor("x", "y", dtype="float64"))
    for engine in ["in-memory", "streaming"]:
        with pytest.raises(pl.exceptions.ComputeError) as e:
            lf.collect(engine=engine)
        msg = str(e.value)
        assert "has no exact float64" in msg and " of a batch of " in msg, (engine, msg)
        # The batch's own row, counted from its start: never passed off as the frame's row.
        row, rows = (int(w) for w in msg.split("at row ")[1].split(" rows")[0].split(" of a batch of "))
        assert row < rows <= t.num_rows and (row == BIG_ROW) == (rows == t.num_rows), msg


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_batches_of_a_polars_file_of_an_extension_dtype_shuffle_too(dtype, tmp_path):
    pl = pytest.importorskip("polars", reason="polars is in the test requirements")
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes comes with jax in the test requirements")
    values = np.arange(40, dtype=np.float32).astype(getattr(ml_dtypes, dtype))
    s = dlframe.polars.from_dlpack(dlframe.tensor(values))
    # y holds x's values as float32 (float8 rounds 17 to 16), and the row ids' order in z.
    y = values.astype(np.float32)
    frame = {"x": s, "y": y, "z": np.arange(40, dtype=np.float32)}
    pl.DataFrame(frame).write_parquet(tmp_path / "f.parquet")
    for source in [str(tmp_path / "f.parquet"), pq.read_table(tmp_path / "f.parquet")]:
        rows = []
        for b in dlframe.batches(source, 8, shuffle=True, seed=4, dtype="float32"):
            rows.extend(np.from_dlpack(b).tolist())
        # Every row once, and x beside its own y.
        assert sorted(rows) == sorted([[float(v), float(v), float(i)] for i, v in enumerate(y)]), rows
        assert [r[2] for r in rows] != list(range(40))

"""Integers that a float dtype cannot hold exactly are refused, naming the row and column, on
every path (dlframe.to_dlpack, batches, the Polars plugin, SQL, the CLI), as pyarrow's safe
cast refuses them; ``inexact="round"`` opts into numpy's rounding. Before, they rounded
without a word: int64 2**53 + 1 as float64 was ...992."""

import subprocess

import numpy as np
import pyarrow as pa
import pytest
from conftest import optional

import dlframe

BIG = 2**53 + 1


def as_numpy(t):
    return np.from_dlpack(t)


def test_int64_into_float64_is_refused_naming_row_and_column_and_rounds_when_asked():
    col = pa.array([1, BIG], pa.int64())
    with pytest.raises(ValueError, match=r"9007199254740993.*row 1.*float64"):
        dlframe.to_dlpack(col, dtype="float64")
    table = pa.table({"a": [0, 1], "big": col})
    with pytest.raises(ValueError, match=r"row 1 of column 'big'.*float64"):
        dlframe.to_dlpack(table, dtype="float64")
    got = as_numpy(dlframe.to_dlpack(col, dtype="float64", inexact="round"))
    assert got.tolist() == [1.0, 9007199254740992.0] == np.array([1, BIG]).astype(np.float64).tolist()
    # Integers the float holds exactly pass, however large.
    exact = [2**53, -(2**53), 2**62, -(2**63)]
    got = as_numpy(dlframe.to_dlpack(pa.array(exact, pa.int64()), dtype="float64"))
    assert got.tolist() == [float(v) for v in exact]


def test_int32_above_2_24_into_float32_is_refused():
    with pytest.raises(ValueError, match=r"16777217.*row 2.*float32"):
        dlframe.to_dlpack(pa.array([0, 16_777_216, 16_777_217], pa.int32()), dtype="float32")
    got = as_numpy(dlframe.to_dlpack(pa.array([16_777_217], pa.int32()), dtype="float32", inexact="round"))
    assert got.tolist() == [16_777_216.0]


def test_uint64_max_stacked_with_an_int_column_is_refused():
    # int64 + uint64 stack as float64 (numpy's promotion), which has no 2**64 - 1.
    table = pa.table({"i": pa.array([1, 2], pa.int64()), "u": pa.array([3, 2**64 - 1], pa.uint64())})
    with pytest.raises(ValueError, match=r"18446744073709551615.*row 1 of column 'u'"):
        dlframe.to_dlpack(table)
    got = as_numpy(dlframe.to_dlpack(table, inexact="round"))
    assert got[1, 1] == 1.8446744073709552e19


def test_float_narrowing_still_rounds_and_underflows_to_zero():
    # IEEE rounding, as numpy's astype: only overflow to infinity is refused.
    got = as_numpy(dlframe.to_dlpack(pa.array([0.1, 1e-300]), dtype="float32"))
    assert got.tolist() == [np.float32(0.1), 0.0]


def test_the_mode_is_checked():
    with pytest.raises(ValueError, match="inexact=.nearest.: expected 'error' or 'round'"):
        dlframe.to_dlpack(pa.array([1]), dtype="float64", inexact="nearest")


def test_batches_refuse_the_same_way():
    table = pa.table({"big": pa.array([1, 2, BIG, 4], pa.int64())})
    with pytest.raises(ValueError, match=r"9007199254740993.*column 'big'"):
        list(dlframe.batches(table, 2, dtype="float64"))
    got = [as_numpy(b) for b in dlframe.batches(table, 2, dtype="float64", inexact="round")]
    assert np.concatenate(got).ravel().tolist() == [1.0, 2.0, 9007199254740992.0, 4.0]


def test_the_polars_plugin_refuses_the_same_way():
    pl = optional("polars")
    import dlframe.polars as dlpl

    df = pl.DataFrame({"a": [1, 2], "big": [3, BIG]})
    # The plugin sees the batch Polars passes it: its row counts from that batch's start.
    with pytest.raises(Exception, match=r"row 1 of a batch of 2 rows, column 'big'"):
        df.select(dlpl.to_tensor("a", "big", dtype="float64"))
    out = df.select(dlpl.to_tensor("a", "big", dtype="float64", inexact="round"))
    assert out.to_series().to_list()[1] == [2.0, 9007199254740992.0]
    with pytest.raises(ValueError, match=r"row 1 of column 'big'"):
        df.to_dlpack(dtype="float64")
    assert as_numpy(df.to_dlpack(dtype="float64", inexact="round"))[1, 1] == 9007199254740992.0


def test_sql_refuses_the_same_way():
    datafusion = optional("datafusion")
    import dlframe.datafusion as dldf

    ctx = datafusion.SessionContext()
    dldf.register(ctx)
    ctx.register_record_batches("t", [pa.table({"a": [1, 2], "big": [3, BIG]}).to_batches()])
    with pytest.raises(Exception, match=r"row 1 of a batch of 2 rows, column 'big'"):
        ctx.sql("SELECT to_tensor_as('float64', a, big) AS x FROM t").collect()


def test_the_cli_refuses_and_rounds_with_inexact_round(tmp_path):
    from test_datafusion import _cli

    pq = optional("pyarrow.parquet")
    pq.write_table(pa.table({"a": [1, 2], "big": [3, BIG]}), tmp_path / "t.parquet")
    base = [_cli(), "--table", f"t={tmp_path / 't.parquet'}"]
    for sql in ("SELECT to_tensor_as('float64', a, big) AS x FROM t", "SELECT CAST(a AS DOUBLE) AS a, big FROM t"):
        r = subprocess.run([*base, sql], capture_output=True, text=True, timeout=120)
        # A SQL function sees a batch at a time; the CLI's own conversion, the result's rows.
        place = "row 1 of a batch of 2 rows, column 'big'" if "to_tensor" in sql else "row 1 of column 'big'"
        assert r.returncode == 1 and place in r.stderr, (sql, r.stderr)
        out = tmp_path / "x.npy"
        r = subprocess.run([*base, "--inexact", "round", "--out", out, sql], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert np.load(out)[1].tolist() == [2.0, 9007199254740992.0]
    r = subprocess.run([*base, "--inexact", "bogus", "SELECT 1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "inexact" in r.stderr

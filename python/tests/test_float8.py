"""float8 (e4m3fn, e5m2) end to end, with the real consumers: torch and ml_dtypes float8 tensors
<-> Arrow ``dlframe.float8_*`` columns (fixed_size_binary(1)) <-> tensors, without copying
where the memory allows; pa.table and Parquet round trips; checked casts that name the row and
column of a value out of range; and safetensors files from the CLI that safetensors.torch
loads. Arrow, numpy and Polars have no float8 of their own."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dlframe

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (installed with jax) gives numpy its float8 types")

FORMATS = ["float8_e4m3fn", "float8_e5m2"]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def ml(name):
    return np.dtype(getattr(ml_dtypes, name))


def column(name, values):
    """A dlframe float8 pyarrow array of these values, made from ml_dtypes' rounding."""
    bits = np.array(values, np.float64).astype(ml(name)).view(np.uint8)
    return dlframe.from_dlpack(dlframe.tensor(bits.view(ml(name))))


def is_float8(ty, name):
    return isinstance(ty, pa.ExtensionType) and ty.extension_name == f"dlframe.{name}" and ty.storage_type == pa.binary(1)


@pytest.mark.parametrize("name", FORMATS)
def test_ml_dtypes_arrays_round_trip_without_copying(name):
    x = np.array([1.0, -2.5, 448.0, 0.1, 0.0], np.float32).astype(ml(name))
    t = dlframe.tensor(x)
    assert t.dtype == ml(name) and t.shape == (5,)
    back = t.to_numpy()
    assert back.dtype == ml(name)
    np.testing.assert_array_equal(back.view(np.uint8), x.view(np.uint8))
    arr = dlframe.from_dlpack(x)
    assert is_float8(arr.type, name)
    assert arr.buffers()[1].address == x.ctypes.data, "from_dlpack copied"
    again = dlframe.to_dlpack(arr).to_numpy()
    np.testing.assert_array_equal(again.view(np.uint8), x.view(np.uint8))
    # copy=True gives its own memory.
    assert dlframe.from_dlpack(x, copy=True).buffers()[1].address != x.ctypes.data


def test_the_float8_types_are_registered_when_pyarrow_comes_after_dlframe():
    code = """
import sys
import numpy as np, ml_dtypes
import dlframe
assert "pyarrow" not in sys.modules, "import dlframe imported pyarrow"
import pyarrow as pa
for name in ("float8_e4m3fn", "float8_e5m2"):
    col = dlframe.from_dlpack(np.array([1.5, -2.0], np.float32).astype(getattr(ml_dtypes, name)))
    print(col.type.extension_name, type(col.type).__module__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["dlframe.float8_e4m3fn", "dlframe._extension_dtypes"] + [
        "dlframe.float8_e5m2", "dlframe._extension_dtypes"]


@pytest.mark.parametrize("name", FORMATS)
def test_torch_float8_round_trips_without_copying(name):
    torch = pytest.importorskip("torch", reason="torch is in the opt-in torch extra")
    dt = getattr(torch, name)
    x = torch.tensor([1.0, -2.5, 448.0, 0.1]).to(dt)
    arr = dlframe.from_dlpack(x)
    assert is_float8(arr.type, name)
    assert arr.buffers()[1].address == x.data_ptr()
    back = torch.from_dlpack(dlframe.to_dlpack(arr))
    assert back.dtype == dt and back.data_ptr() == x.data_ptr()
    assert torch.equal(back.view(torch.uint8), x.view(torch.uint8))
    # torch and ml_dtypes agree on every bit pattern's value.
    every = torch.arange(256, dtype=torch.uint8).view(dt)
    mine = dlframe.tensor(every).to_numpy().astype(np.float32)
    theirs = every.float().numpy()
    np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("name", FORMATS)
def test_float8_survives_pa_table_and_parquet(name, tmp_path):
    arr = column(name, [0.5, -1.0, 3.0, 2.0**-6])
    table = pa.table({"w": arr, "i": pa.array([1, 2, 3, 4], pa.int8())})
    assert is_float8(table.schema.field("w").type, name)
    pq.write_table(table, tmp_path / "f8.parquet")
    read = pq.read_table(tmp_path / "f8.parquet")
    assert is_float8(read.schema.field("w").type, name)
    t = dlframe.to_dlpack(read["w"])
    assert t.dtype == ml(name)
    np.testing.assert_array_equal(t.to_numpy().astype(np.float32), [0.5, -1.0, 3.0, 2.0**-6])
    # Stacked with int8: float16 holds both (int8 into float8 would round).
    m = dlframe.to_dlpack(read)
    assert m.dtype == np.float16
    np.testing.assert_array_equal(m.to_numpy(), [[0.5, 1], [-1, 2], [3, 3], [2.0**-6, 4]])


def test_casts_into_float8_name_what_does_not_fit():
    x = pa.array([1.0, 1.0625, 448.0, 500.0], pa.float32())
    with pytest.raises(ValueError, match=r"500.* row 3 .*float8_e4m3fn"):
        dlframe.to_dlpack(x, dtype="float8_e4m3fn")
    got = dlframe.to_dlpack(x[:3], dtype="float8_e4m3fn").to_numpy()
    # Rounded once, ties to even, as ml_dtypes rounds.
    np.testing.assert_array_equal(got.view(np.uint8), np.array([1.0, 1.0625, 448.0]).astype(ml("float8_e4m3fn")).view(np.uint8))
    # e4m3fn has no infinity; e5m2 keeps it and refuses finite values beyond 57344.
    inf = pa.array([1.0, float("inf")], pa.float32())
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        dlframe.to_dlpack(inf, dtype="float8_e4m3fn")
    assert np.isinf(dlframe.to_dlpack(inf, dtype="float8_e5m2").to_numpy().astype(np.float32)[1])
    table = pa.table({"a": [1.0, 2.0], "b": [3.0, 7e4]})
    with pytest.raises(ValueError, match=r"row 1 of column 'b'.*float8_e5m2"):
        dlframe.to_dlpack(table, dtype="float8_e5m2")
    # Integers that float8 rounds are refused unless rounding is asked for.
    ints = pa.array([16, 17], pa.int8())
    with pytest.raises(ValueError, match="inexact"):
        dlframe.to_dlpack(ints, dtype="float8_e4m3fn")
    rounded = dlframe.to_dlpack(ints, dtype="float8_e4m3fn", inexact="round").to_numpy().astype(np.float32)
    np.testing.assert_array_equal(rounded, [16, 16])


def test_dtype_spellings_name_float8():
    x = pa.array([1.0, 2.0], pa.float32())
    for spelling in ("float8_e5m2", ml("float8_e5m2"), ml_dtypes.float8_e5m2):
        assert dlframe.to_dlpack(x, dtype=spelling).dtype == ml("float8_e5m2")
    torch = pytest.importorskip("torch", reason="torch is in the opt-in torch extra")
    assert dlframe.to_dlpack(x, dtype=torch.float8_e4m3fn).dtype == ml("float8_e4m3fn")


def test_polars_has_no_float8_and_says_so():
    pl = pytest.importorskip("polars", reason="polars is in the test requirements")
    from dlframe.polars import to_tensor

    df = pl.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    with pytest.raises(pl.exceptions.ComputeError, match="Polars has no float8_e4m3fn"):
        df.select(to_tensor("a", "b", dtype="float8_e4m3fn"))
    assert dlframe.to_dlpack(df, dtype="float8_e4m3fn").dtype == ml("float8_e4m3fn")


def _cli():
    path = pathlib.Path(os.environ.get("DLFRAME_CLI", ROOT / "target" / "debug" / "dlframe"))
    if not path.exists():
        pytest.skip(f"the dlframe CLI is not built at {path}: run `cargo build -p dlframe-cli`")
    return path


@pytest.mark.parametrize("name, tag", [("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")])
def test_cli_writes_float8_safetensors_that_safetensors_torch_loads(name, tag, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is in the opt-in torch extra")
    st = pytest.importorskip("safetensors.torch", reason="safetensors is in the test requirements")
    pq.write_table(pa.table({"a": [0.5, -2.0, 3.0], "b": [1.0, 2.0, 448.0]}), tmp_path / "d.parquet")
    sql = f"SELECT to_tensor_as('{name}', a, b) AS x FROM d"
    out = tmp_path / "x.safetensors"
    r = subprocess.run([_cli(), "--table", f"d={tmp_path / 'd.parquet'}", sql, "--out", out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f'"dtype":"{tag}"' in out.read_bytes()[8:200].decode(errors="replace")
    x = st.load_file(str(out))["x"]
    assert x.dtype == getattr(torch, name) and tuple(x.shape) == (3, 2)
    assert x.float().tolist() == [[0.5, 1.0], [-2.0, 2.0], [3.0, 448.0]]
    # .npy has no float8 typestr: refused, with the remedy.
    r = subprocess.run([_cli(), "--table", f"d={tmp_path / 'd.parquet'}", sql, "--out", tmp_path / "x.npy"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "safetensors" in r.stderr

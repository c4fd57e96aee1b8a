"""bfloat16 end to end, with the real consumers: jax and torch bfloat16 tensors <-> Arrow
``lance.bfloat16`` columns (FixedSizeBinary(2), as Lance writes them) <-> tensors, without
copying where the memory allows; nulls; casts that round once to nearest even; stacks; and
numpy through ml_dtypes. Arrow and numpy have no bfloat16 of their own."""

import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import dlframe

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (installed with jax) gives numpy a bfloat16")
BF16 = np.dtype(ml_dtypes.bfloat16)


class BFloat16Type(pa.ExtensionType):
    """The extension type as Lance registers it: bfloat16 bits in FixedSizeBinary(2)."""

    def __init__(self):
        super().__init__(pa.binary(2), "lance.bfloat16")

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        return cls()


def is_bfloat16(ty):
    """Whether a pyarrow type is the registered lance.bfloat16 extension (dlframe's class, or
    Lance's where Lance was imported first)."""
    return isinstance(ty, pa.ExtensionType) and ty.extension_name == "lance.bfloat16" and ty.storage_type == pa.binary(2)


def lance_column(values):
    """A lance.bfloat16 array of these values (None is a null), made in pyarrow."""
    bits = np.array([0.0 if v is None else v for v in values], dtype=BF16).view(np.uint16)
    valid = pa.array([v is not None for v in values]).buffers()[1] if None in values else None
    storage = pa.Array.from_buffers(pa.binary(2), len(values), [valid, pa.py_buffer(bits.tobytes())])
    return pa.ExtensionArray.from_storage(BFloat16Type(), storage)


def values_of(column):
    """The bfloat16 values of a lance.bfloat16 array, as float32."""
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    bits = np.frombuffer(storage.buffers()[1], dtype=np.uint16, count=len(storage), offset=storage.offset * 2)
    return bits.view(BF16).astype(np.float32)


def test_a_lance_column_is_a_bfloat16_tensor_without_copying():
    col = lance_column([1.5, -2.0, 3.140625])
    t = dlframe.to_dlpack(col)
    assert (t.dtype, t.shape, t.copied) == (BF16, (3,), False)
    assert t.__dlpack__().__class__.__name__ == "PyCapsule"
    got = t.to_numpy()
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.astype(np.float32), [1.5, -2.0, 3.140625])
    # numpy reads memory through the array interface, which has no bfloat16: a clear error
    # (BufferError, as for every type dlframe cannot hand over).
    with pytest.raises(BufferError, match="DLPack"):
        np.asarray(t)


def test_jax_bfloat16_round_trips_through_arrow():
    jax = pytest.importorskip("jax", reason="jax is in the test requirements")
    jnp = jax.numpy
    # On jax's CPU device: on a GPU machine jax puts arrays on the GPU unless told, and dlframe
    # then refuses to copy them to Arrow unless asked (test_cuda.py checks that).
    jax.config.update("jax_default_device", jax.devices("cpu")[0])
    try:
        jax_round_trips(jax, jnp)
    finally:
        jax.config.update("jax_default_device", None)


def jax_round_trips(jax, jnp):
    x = jnp.array([0.5, -1.25, 3.0e38, -0.0], dtype=jnp.bfloat16)
    col = dlframe.from_dlpack(x)
    assert is_bfloat16(col.type)
    np.testing.assert_array_equal(values_of(col), np.asarray(x, dtype=np.float32))
    back = jax.dlpack.from_dlpack(dlframe.to_dlpack(col))
    assert back.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(back).view(np.uint16), np.asarray(x).view(np.uint16))
    # N-d: a tensor column of lance.bfloat16 items, and back to jax with its shape.
    m = jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3)
    back = jax.dlpack.from_dlpack(dlframe.to_dlpack(dlframe.from_dlpack(m)))
    assert (back.shape, back.dtype) == ((2, 3), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(back, dtype=np.float32), np.asarray(m, dtype=np.float32))


def test_torch_bfloat16_round_trips_without_copying():
    torch = pytest.importorskip("torch", reason="torch is an opt-in extra (DLFRAME_TORCH=1 installs it)")
    x = torch.tensor([0.5, -1.25, 3.0e38, 7.0], dtype=torch.bfloat16)
    col = dlframe.from_dlpack(x)
    assert is_bfloat16(col.type)
    np.testing.assert_array_equal(values_of(col), x.float().numpy())
    t = dlframe.to_dlpack(col)
    back = torch.from_dlpack(t)
    assert back.dtype == torch.bfloat16
    assert back.data_ptr() == x.data_ptr()
    assert torch.equal(back, x)


def test_nulls_are_filled_or_refused():
    col = lance_column([1.0, None, 3.0])
    with pytest.raises(BufferError, match="1 null"):
        dlframe.to_dlpack(col)
    filled = dlframe.to_dlpack(col, fill_value=-1.5).to_numpy()
    np.testing.assert_array_equal(filled.astype(np.float32), [1.0, -1.5, 3.0])
    nan = dlframe.to_dlpack(col, nulls="nan").to_numpy().astype(np.float32)
    assert np.isnan(nan[1]) and nan[0] == 1.0
    with pytest.raises(ValueError, match="fill_value"):
        dlframe.to_dlpack(col, fill_value=1e39)


def test_casts_round_once_to_nearest_even_and_refuse_overflow():
    # 1 + 2^-8 ties between 1 and 1 + 2^-7 (even: 1); 1 + 3 * 2^-8 ties up to 1 + 2^-6.
    x = pa.array([1 + 2**-8, 1 + 3 * 2**-8, 2.0], pa.float32())
    got = dlframe.to_dlpack(x, dtype="bfloat16").to_numpy().astype(np.float32)
    np.testing.assert_array_equal(got, [1.0, 1 + 2**-6, 2.0])
    assert dlframe.to_dlpack(x, dtype=BF16).dtype == BF16
    # Just above a tie in float64 (below float32's precision): rounds up, once.
    y = pa.array([1 + 2**-8 + 2**-40], pa.float64())
    assert dlframe.to_dlpack(y, dtype="bfloat16").to_numpy().astype(np.float32)[0] == 1 + 2**-7
    with pytest.raises(ValueError, match="does not fit bfloat16"):
        dlframe.to_dlpack(pa.array([1.0, 3.4e38], pa.float32()), dtype="bfloat16")
    back = dlframe.to_dlpack(lance_column([3.140625, -1e30]), dtype="float32")
    np.testing.assert_array_equal(np.from_dlpack(back), np.array([3.140625, -1e30], BF16).astype(np.float32))


def test_stacks_promote_like_torch_and_jax():
    table = pa.table({"w": lance_column([1.0, 2.0]), "i": pa.array([-3, 4], pa.int8())})
    m = dlframe.to_dlpack(table)
    assert (m.dtype, m.shape) == (BF16, (2, 2))
    np.testing.assert_array_equal(m.to_numpy().astype(np.float32), [[1.0, -3.0], [2.0, 4.0]])
    halves = pa.table({"w": lance_column([1.0, 2.0]), "h": pa.array(np.array([0.5, 1.5], np.float16))})
    assert dlframe.to_dlpack(halves).dtype == np.float32


def test_bytes_without_the_extension_are_not_bfloat16():
    with pytest.raises(BufferError, match="binary"):
        dlframe.to_dlpack(pa.array([b"ab", b"cd"], pa.binary(2)))


def test_sql_casts_to_bfloat16_through_datafusion_python():
    datafusion = pytest.importorskip("datafusion", reason="datafusion is in the test requirements")
    import dlframe.datafusion as dldf

    ctx = datafusion.SessionContext()
    dldf.register(ctx)
    t = pa.table({"a": pa.array([1 + 2**-8, 2.5], pa.float32()), "b": pa.array([-3, None], pa.int8())})
    ctx.register_record_batches("t", [t.to_batches()])
    out = ctx.sql("SELECT to_tensor_as('bfloat16', a, coalesce(b, 7)) AS x FROM t").to_arrow_table()
    m = dlframe.to_dlpack(out["x"])
    assert (m.dtype, m.shape) == (BF16, (2, 2))
    np.testing.assert_array_equal(m.to_numpy().astype(np.float32), [[1.0, -3.0], [2.5, 7.0]])


def test_polars_has_no_bfloat16_and_says_so():
    pl = pytest.importorskip("polars", reason="polars is in the test requirements")
    from dlframe.polars import to_tensor

    df = pl.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    with pytest.raises(pl.exceptions.ComputeError, match="Polars has no bfloat16"):
        df.select(to_tensor("a", "b", dtype="bfloat16"))
    # Into a tensor (not a Polars column), a Polars frame converts to bfloat16 like any other.
    t = dlframe.to_dlpack(df, dtype="bfloat16")
    assert t.dtype == BF16


def test_from_dlpack_gives_a_typed_array_without_lance_even_when_pyarrow_comes_later():
    # A fresh process where Lance cannot be imported and pyarrow is imported after dlframe:
    # dlframe registers the type once pyarrow's import finishes.
    code = """
import sys
sys.modules["lance"] = None
import dlframe
assert "pyarrow" not in sys.modules, "import dlframe imported pyarrow"
import pyarrow as pa
t = dlframe.to_dlpack(pa.array([1.5, -2.0]), dtype="bfloat16")
col = dlframe.from_dlpack(t)
print(col.type.extension_name, type(col.type).__module__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["lance.bfloat16", "dlframe._extension_dtypes"]


def test_a_bfloat16_column_survives_a_table_and_a_parquet_file(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is in the test requirements")
    col = dlframe.from_dlpack(dlframe.to_dlpack(pa.array([0.5, -1.25, 3.0e38]), dtype="bfloat16"))
    assert is_bfloat16(col.type)
    pq.write_table(pa.table({"x": col}), tmp_path / "bf16.parquet")
    back = pq.read_table(tmp_path / "bf16.parquet")
    assert is_bfloat16(back["x"].type)
    t = dlframe.to_dlpack(back["x"])
    assert t.dtype == BF16
    np.testing.assert_array_equal(t.to_numpy().astype(np.float32), values_of(col))
    # The type pickles (multiprocessing and Ray send schemas that way).
    assert pickle.loads(pickle.dumps(col.type)) == col.type


def test_lance_imported_after_dlframe_takes_the_name_over():
    pytest.importorskip("lance", reason="pylance is in the bench extra, not the test requirements")
    code = """
import dlframe, pyarrow as pa
before = type(dlframe.from_dlpack(dlframe.to_dlpack(pa.array([1.0]), dtype="bfloat16")).type).__module__
import lance.arrow
after = dlframe.from_dlpack(dlframe.to_dlpack(pa.array([1.0]), dtype="bfloat16"))
print(before, type(after.type).__module__, dlframe.to_dlpack(after).dtype)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["dlframe._extension_dtypes", "lance._arrow.bf16", "bfloat16"]

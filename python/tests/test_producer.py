"""docs/conformance.md, producer items 1-15, checked with real consumers."""

import ctypes
import gc
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest

import dlframe
from conftest import optional
import fakes
from fakes import DLManagedTensor, DLManagedTensorVersioned

INT_FLOAT = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]


def column(dtype, n=50):
    return pa.array(np.arange(n).astype(dtype))


def test_signature_is_keyword_only():  # item 1
    t = dlframe.to_dlpack(column("int32"))
    with pytest.raises(TypeError):
        t.__dlpack__(None)
    for kw in ({"stream": None}, {"max_version": (1, 0)}, {"dl_device": (1, 0)}, {"copy": None}):
        assert t.__dlpack__(**kw) is not None


def test_dlpack_reads_its_keywords_and_refuses_the_rest():  # item 1
    # The keyword contract: four keyword-only parameters, refusals that name the argument, ints
    # that do not fit refused rather than wrapped, and no reference kept to what was passed.
    import inspect

    t = dlframe.to_dlpack(column("int32"))
    params = inspect.signature(dlframe.Tensor.__dlpack__).parameters
    assert [(n, p.kind, p.default) for n, p in list(params.items())[1:]] == [
        (n, inspect.Parameter.KEYWORD_ONLY, None) for n in ("dl_device", "copy", "max_version", "stream")
    ]
    assert "DLPack capsule" in dlframe.Tensor.__dlpack__.__doc__
    for kw, where in [
        ({"max_version": 3}, "max_version"),
        ({"max_version": (1,)}, "max_version"),
        ({"max_version": (-1, 0)}, "max_version"),
        ({"max_version": (2**70, 0)}, "max_version"),
        ({"max_version": (1.0, 0)}, "max_version"),
        ({"dl_device": (1,)}, "dl_device"),
        ({"copy": 1}, "copy"),
        ({"stream": "0"}, "stream"),
    ]:
        with pytest.raises(TypeError, match=where):
            t.__dlpack__(**kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'maxversion'"):
        t.__dlpack__(maxversion=(1, 0))
    with pytest.raises(TypeError, match="positional"):
        t.__dlpack__(None, max_version=(1, 0))
    with pytest.raises(TypeError, match="doesn't apply"):
        dlframe.Tensor.__dlpack__(np.zeros(3), max_version=(1, 0))
    # A tuple subclass and a bool are read as ints; a version before 1.0 gets a legacy capsule.
    class Version(tuple):
        pass

    assert fakes.capsule_name(t.__dlpack__(max_version=Version((1, 3)))) == b"dltensor_versioned"
    assert fakes.capsule_name(t.__dlpack__(max_version=(True, 0))) == b"dltensor_versioned"
    assert fakes.capsule_name(t.__dlpack__(max_version=(0, 8))) == b"dltensor"
    mv, dev = (1, 3), (1, 0)
    before = sys.getrefcount(mv), sys.getrefcount(dev), sys.getrefcount(t)
    for _ in range(10_000):
        t.__dlpack__(dl_device=dev, copy=None, max_version=mv)
        with pytest.raises(TypeError):
            t.__dlpack__(max_version=mv, copy=mv)
    assert (sys.getrefcount(mv), sys.getrefcount(dev), sys.getrefcount(t)) == before


def test_dlpack_reads_keywords_by_their_text_and_numpy_bools():
    # Names are matched by address when interned (any Python call site, numpy) and otherwise by
    # their text: a name built at run time is another object. copy= takes numpy's bool as well.
    t = dlframe.to_dlpack(column("float32"))
    name = "".join(["max_", "version"])
    assert name is not sys.intern(name)
    assert fakes.capsule_name(t.__dlpack__(**{name: (1, 0)})) == b"dltensor_versioned"
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_versio'"):
        t.__dlpack__(**{name[:-1]: (1, 0)})
    # A name that is no UTF-8 is refused as unknown too: a TypeError, which numpy's retry
    # without keywords catches.
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        t.__dlpack__(**{"\udc80": (1, 0)})
    shared = t.__array_interface__["data"][0]
    copied = dlframe.tensor(t.__dlpack__(max_version=(1, 0), copy=np.True_))
    assert copied.__array_interface__["data"][0] != shared
    assert np.array_equal(np.asarray(copied), np.asarray(t))
    same = dlframe.tensor(t.__dlpack__(max_version=(1, 0), copy=np.False_))
    assert same.__array_interface__["data"][0] == shared


@pytest.mark.parametrize("dtype", INT_FLOAT)
def test_a_pyarrow_array_makes_the_tensor_the_arrow_path_makes(dtype):
    # A pyarrow array of numbers without nulls is read through pyarrow's own DLPack export, a
    # one-chunk ChunkedArray of it through the Arrow C stream: the same tensor either way,
    # read-only over the same memory, offset included.
    arr = column(dtype, 10).slice(3)
    fast, arrow = dlframe.to_dlpack(arr), dlframe.to_dlpack(pa.chunked_array([arr]))
    for attr in ("dtype", "shape", "strides", "readonly", "copied", "device"):
        assert getattr(fast, attr) == getattr(arrow, attr), attr
    assert fast.readonly and not fast.copied
    assert fast.__array_interface__ == arrow.__array_interface__
    assert fast.__array_interface__["data"][0] == arr.buffers()[1].address + 3 * arr.type.byte_width
    assert fast.to_arrow().equals(arr) and pa.array(fast).equals(arr)
    np.testing.assert_array_equal(np.from_dlpack(fast), np.arange(3, 10).astype(dtype))


def test_pyarrow_is_asked_for_a_versioned_capsule():
    # dlframe calls pyarrow's __dlpack__ with max_version=(1, 3) as a vectorcall keyword; were
    # the keyword lost or wrong, pyarrow would hand a legacy capsule (which dlframe also reads)
    # with a DeprecationWarning.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = dlframe.to_dlpack(column("float32", 10))
    assert [str(w.message) for w in caught] == []
    assert t.readonly and np.from_dlpack(t).tolist() == list(range(10))


def test_pyarrow_arrays_pyarrow_cannot_export_keep_their_arrow_path():
    # pyarrow's own export refuses these; dlframe's answers are unchanged by trying it first.
    with pytest.raises(BufferError, match="null"):
        dlframe.to_dlpack(pa.array([1.0, None]))
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(pa.array([1.0, None]), nulls="fill", fill_value=0)), [1, 0])
    b = dlframe.to_dlpack(pa.array([True, False]))
    assert b.copied and np.from_dlpack(b).tolist() == [True, False]
    ts = dlframe.to_dlpack(pa.array([1, 2], pa.timestamp("ms")))
    assert ts.to_arrow().type == pa.timestamp("ms")


def test_extension_arrays_of_numbers_take_the_arrow_path():
    # An extension class holds many types (a fixed_shape_tensor's __dlpack__ even succeeds):
    # dlframe reads each through its Arrow type, whichever came first.
    cells = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 3)
    tensors = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [3]), cells)
    flags = pa.ExtensionArray.from_storage(pa.bool8(), pa.array([1, 0], pa.int8()))
    for _ in range(2):
        assert np.from_dlpack(dlframe.to_dlpack(tensors)).shape == (2, 3)
        assert np.from_dlpack(dlframe.to_dlpack(flags)).tolist() == [1, 0]


def test_dlpack_device_is_cpu():  # item 2
    t = dlframe.to_dlpack(column("float32"))
    assert t.__dlpack_device__() == (1, 0)
    assert t.device == "cpu"


capsule_name = ctypes.pythonapi.PyCapsule_GetName
capsule_name.restype = ctypes.c_char_p
capsule_name.argtypes = [ctypes.py_object]
capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
capsule_ptr.restype = ctypes.c_void_p
capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]


def ints(ptr):
    """An int64 array behind a void pointer of the DLPack structs."""
    return ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int64))


def peek(cap):
    """The capsule's name and managed struct; the caller keeps `cap` alive while reading."""
    name = capsule_name(cap)
    ptr = capsule_ptr(cap, name)
    struct = DLManagedTensorVersioned if name == b"dltensor_versioned" else DLManagedTensor
    return name, struct.from_address(ptr)


@pytest.mark.parametrize("mv", [(1, 0), (1, 3), (2, 0), (100, 3)])
def test_versioned_capsule_for_major_at_least_one(mv):  # item 3
    cap = dlframe.to_dlpack(column("int64")).__dlpack__(max_version=mv)
    name, m = peek(cap)
    assert name == b"dltensor_versioned"
    assert (m.version.major, m.version.minor) == (1, 3)


@pytest.mark.parametrize("mv", [None, (0, 8)])
def test_legacy_capsule_for_none_or_major_zero(mv):  # item 3
    cap = dlframe.to_dlpack(column("int64")).__dlpack__(max_version=mv)
    name, _ = peek(cap)
    assert name == b"dltensor"


def test_legacy_path_never_shares_readonly_memory():  # item 4
    arr = column("float64")
    t = dlframe.to_dlpack(arr)
    assert t.readonly
    with pytest.raises(BufferError, match="legacy"):
        t.__dlpack__(copy=False)
    cap = t.__dlpack__()
    _, m = peek(cap)
    shared = np.frombuffer(arr.buffers()[1], dtype=np.float64)
    assert m.dl_tensor.data != shared.ctypes.data  # a copy, not the Arrow buffer


def test_versioned_shared_export_is_readonly_and_copy_is_writable():  # item 5
    arr = column("int32")
    t = dlframe.to_dlpack(arr)
    cap = t.__dlpack__(max_version=(1, 3))
    _, m = peek(cap)
    assert m.flags == 1  # READ_ONLY only
    view = np.from_dlpack(t)
    assert not view.flags.writeable
    assert view.ctypes.data == np.frombuffer(arr.buffers()[1], dtype=np.int32).ctypes.data
    cap = t.__dlpack__(max_version=(1, 3), copy=True)
    _, m = peek(cap)
    assert m.flags == 2  # IS_COPIED only
    fresh = np.from_dlpack(t, copy=True)
    assert fresh.flags.writeable
    fresh[0] = 99
    assert arr[0].as_py() == 0


def test_strides_explicit_offset_folded():  # items 6, 7
    arr = column("int16", 100).slice(7, 20)
    cap = dlframe.to_dlpack(arr).__dlpack__(max_version=(1, 3))
    _, m = peek(cap)
    assert m.dl_tensor.ndim == 1 and m.dl_tensor.byte_offset == 0
    assert ints(m.dl_tensor.strides)[0] == 1 and ints(m.dl_tensor.shape)[0] == 20
    assert np.from_dlpack(dlframe.to_dlpack(arr))[0] == 7
    empty = dlframe.to_dlpack(pa.array([], pa.float32()))
    cap = empty.__dlpack__(max_version=(1, 3))
    _, m = peek(cap)
    assert m.dl_tensor.data is None and ints(m.dl_tensor.shape)[0] == 0 and bool(m.dl_tensor.strides)
    assert np.from_dlpack(empty).shape == (0,)
    assert jax.dlpack.from_dlpack(empty).shape == (0,)


@pytest.mark.parametrize("dtype", INT_FLOAT)
def test_dtype_map_and_values_numpy(dtype):  # items 8, 14
    arr = column(dtype)
    got = np.from_dlpack(dlframe.to_dlpack(arr))
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, arr.to_numpy())


@pytest.mark.parametrize("dtype", [d for d in INT_FLOAT if d not in ("uint16", "uint32", "uint64")])
def test_values_through_jax_legacy_path(dtype):  # item 14
    arr = column(dtype)
    got = jax.dlpack.from_dlpack(dlframe.to_dlpack(arr))
    np.testing.assert_array_equal(np.asarray(got), arr.to_numpy())


def test_pyarrow_consumes_versioned():  # item 14
    if not hasattr(pa.Array, "from_dlpack"):
        pytest.skip(f"pyarrow {pa.__version__} has no Array.from_dlpack")
    arr = column("float32")
    back = pa.Array.from_dlpack(dlframe.to_dlpack(arr))
    assert back.equals(arr)


def test_bool_unpacks_with_is_copied():  # item 8
    arr = pa.array([True, False, True, True, False])
    t = dlframe.to_dlpack(arr)
    assert t.dtype == "bool" and t.copied
    # The Tensor keeps its unpacked bytes, so its own exports are shared (READ_ONLY); only an
    # export with a buffer of its own is IS_COPIED (the consumer is the sole owner).
    cap = t.__dlpack__(max_version=(1, 3))
    _, m = peek(cap)
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.flags) == (6, 8, 1)
    own = t.__dlpack__(max_version=(1, 3), copy=True)
    _, m = peek(own)
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.flags) == (6, 8, 2)
    np.testing.assert_array_equal(np.from_dlpack(t), [True, False, True, True, False])
    with pytest.raises(BufferError, match="bit-pack"):
        dlframe.to_dlpack(arr, copy=False)


def test_unrepresentable_data_raises_buffer_error_with_remedy():  # item 9
    with pytest.raises(BufferError, match="nulls='fill'"):
        dlframe.to_dlpack(pa.array([1.0, None]))
    with pytest.raises(BufferError, match="encode"):
        dlframe.to_dlpack(pa.array(["a"]))
    with pytest.raises(BufferError, match="chunks"):
        dlframe.to_dlpack(pa.chunked_array([[1, 2], [3]]), copy=False)


def test_dl_device_and_stream_rules():  # items 10, 11
    t = dlframe.to_dlpack(column("int8"))
    for dev in (None, (1, 0)):
        assert t.__dlpack__(max_version=(1, 3), dl_device=dev) is not None
    if dlframe.cuda_device_count() == 0:  # with a GPU, (2, 0) copies there (tests/test_cuda.py)
        with pytest.raises(BufferError, match="0 CUDA device"):
            t.__dlpack__(max_version=(1, 3), dl_device=(2, 0))
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 3), dl_device=(4, 0))
    assert t.__dlpack__(max_version=(1, 3), stream=-1) is not None
    with pytest.raises(ValueError, match="stream"):
        t.__dlpack__(max_version=(1, 3), stream=1)


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_capsule_destructor_keeps_in_flight_exception(max_version):  # item 12
    # The capsule is the last owner of a tensor over a fake producer's memory, whose deleter is
    # Python code (a ctypes callback). It dies while a TypeError is set: int() fails on it, and
    # the call's argument (the map holding the capsule) is released before the error unwinds.
    # Python code run with the error indicator set would turn it into a SystemError.
    buf = np.arange(4, dtype=np.float64)
    fake = fakes.dlpack_capsule(buf.ctypes.data, [4], [1], dtype=(2, 64, 1), keep=buf)
    with pytest.raises(TypeError) as info:
        list(map(int, [dlframe.tensor(fake.capsule).__dlpack__(max_version=max_version)]))
    assert info.type is TypeError and "PyCapsule" in str(info.value), info.value
    fake.drop()
    assert fake.deletes == 1, "the producer's deleter ran when the capsule died"
    fake.release()


def test_refcount_returns_to_baseline():  # item 13
    arr = column("float32", 1000)
    t = dlframe.to_dlpack(arr)
    before = sys.getrefcount(t)
    caps = [t.__dlpack__(max_version=(1, 3)) for _ in range(10)]
    arrays = [np.from_dlpack(t) for _ in range(10)]
    del caps, arrays
    gc.collect()
    assert sys.getrefcount(t) == before


def test_nd_exports_c_order():  # item 15
    flat = pa.array(np.arange(24, dtype=np.float32))
    fsl = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, 3), 4)
    got = np.from_dlpack(dlframe.to_dlpack(fsl))
    assert got.shape == (2, 4, 3) and got.strides == (48, 12, 4)
    np.testing.assert_array_equal(got.ravel(), np.arange(24))


def test_torch_consumes_when_installed():  # item 14
    torch = optional("torch")
    arr = column("float32")
    got = torch.from_dlpack(dlframe.to_dlpack(arr))
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), arr.to_numpy())
    nd = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int64)), 3)
    assert tuple(torch.from_dlpack(dlframe.to_dlpack(nd)).shape) == (4, 3)


def test_jax_array_is_a_copy_of_readonly_memory():  # item 4 via jax
    arr = column("float32")
    x = jax.dlpack.from_dlpack(dlframe.to_dlpack(arr))
    assert isinstance(x, jnp.ndarray)
    assert x.unsafe_buffer_pointer() != arr.buffers()[1].address, "jax got the Arrow buffer itself"
    np.testing.assert_array_equal(np.asarray(x), arr.to_numpy())
    # jax does share writable, 64-byte aligned memory: so the address above tells a copy.
    buf = np.zeros(64 + 16, np.float32)
    src = buf[(-buf.ctypes.data % 64) // 4 :][:64]
    src[:] = np.arange(64)
    assert jax.dlpack.from_dlpack(dlframe.tensor(src)).unsafe_buffer_pointer() == src.ctypes.data


def test_cupy_refuses_cpu_tensors_when_installed():  # item 14: cupy on a CPU tensor
    cupy = optional("cupy")
    t = dlframe.to_dlpack(column("float32"))
    with pytest.raises((TypeError, BufferError, RuntimeError, ValueError)):
        cupy.from_dlpack(t)


def test_torch_moves_a_filled_column_to_cuda_when_available():
    torch = optional("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    arr = pa.array([1.0, None, 3.0], pa.float32())
    x = torch.from_dlpack(dlframe.to_dlpack(arr, fill_value=0)).cuda()
    assert x.device.type == "cuda" and x.cpu().tolist() == [1.0, 0.0, 3.0]

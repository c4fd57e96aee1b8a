"""The DLPack C exchange API: dlframe.Tensor's table of C functions (producer), and the tables
other types publish (consumer), against torch and tvm-ffi where they are installed.

The table is read with ctypes exactly as a C consumer reads it.
"""

import ctypes
import gc
import sys

import numpy as np
import pyarrow as pa
import pytest

import dlframe
from fakes import (
    IS_COPIED,
    READ_ONLY,
    DLDataType,
    DLDevice,
    DLManagedTensorVersioned,
    DLPackVersion,
    DLTensor,
)

MANAGED_P = ctypes.POINTER(DLManagedTensorVersioned)
DELETER = ctypes.CFUNCTYPE(None, MANAGED_P)
I64_P = ctypes.POINTER(ctypes.c_int64)


def ints(ptr, n):
    """The n int64s a DLTensor's shape or strides field points to."""
    return [ctypes.cast(ptr, I64_P)[i] for i in range(n)]


def release(managed):
    """Calls a managed tensor's deleter, as its owner does once."""
    DELETER(managed.contents.deleter)(managed)


SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
# Functions that take Python objects hold the GIL and raise the exception they set: PYFUNCTYPE.
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(MANAGED_P))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, MANAGED_P, ctypes.POINTER(ctypes.py_object))
VIEW = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
STREAM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))
ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(MANAGED_P), ctypes.c_void_p, SET_ERROR)


class Header(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p)]


class ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("header", Header),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def table_of(cls):
    """The exchange table a type publishes, read as a C consumer reads it."""
    return ExchangeAPI.from_address(_get_pointer(cls.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))


API = table_of(dlframe.Tensor)


def export(obj, api=API):
    out = MANAGED_P()
    assert FROM_PY(api.managed_tensor_from_py_object_no_sync)(obj, ctypes.byref(out)) == 0
    return out


def arrow_tensor(n=5):
    arr = pa.array(np.arange(n, dtype=np.float32))
    return arr, dlframe.to_dlpack(arr)


def test_the_tensor_type_publishes_one_table_under_both_names():
    cap = dlframe.Tensor.__dlpack_c_exchange_api__
    assert "dlpack_exchange_api" in repr(cap)
    address = _get_pointer(cap, b"dlpack_exchange_api")
    assert dlframe.Tensor.__c_dlpack_exchange_api__ == address
    assert (API.header.major, API.header.minor, API.header.prev_api) == (1, 3, None)
    for name, _ in ExchangeAPI._fields_[1:]:
        assert getattr(API, name), f"{name} is NULL"
    # One table for the process: instances see the type's.
    _, t = arrow_tensor()
    assert type(t).__c_dlpack_exchange_api__ == address


def test_export_shares_arrow_memory_and_keeps_it_read_only():
    arr, t = arrow_tensor()
    managed = export(t)
    m = managed.contents
    assert (m.version.major, m.version.minor) == (1, 3)
    assert m.flags & READ_ONLY and not m.flags & IS_COPIED
    dl = m.dl_tensor
    assert dl.data == arr.buffers()[1].address
    assert (dl.ndim, ints(dl.shape, 1), ints(dl.strides, 1), dl.byte_offset) == (1, [5], [1], 0)
    assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (2, 32, 1)
    assert (dl.device.device_type, dl.device.device_id) == (1, 0)
    release(managed)


def test_export_refuses_objects_that_are_not_dlframe_tensors():
    out = MANAGED_P()
    with pytest.raises(TypeError, match="dlframe.Tensor objects, not list"):
        FROM_PY(API.managed_tensor_from_py_object_no_sync)([1.0], ctypes.byref(out))
    assert not out


def test_the_view_borrows_the_tensor_without_owning_it():
    t = dlframe.tensor(np.arange(12.0).reshape(3, 4)[:, ::2])
    dl = DLTensor()
    assert VIEW(API.dltensor_from_py_object_no_sync)(t, ctypes.byref(dl)) == 0
    view = np.from_dlpack(t)
    assert dl.data == view.ctypes.data
    assert (ints(dl.shape, dl.ndim), ints(dl.strides, dl.ndim)) == ([3, 2], [4, 2])


def test_current_work_stream_is_null_on_the_cpu_and_refuses_unknown_devices():
    stream = ctypes.c_void_p(1234)
    assert STREAM(API.current_work_stream)(1, 0, ctypes.byref(stream)) == 0
    assert stream.value is None
    with pytest.raises(Exception, match="device"):
        STREAM(API.current_work_stream)(999, 0, ctypes.byref(stream))


def _prototype(shape, code, bits, device_type=1):
    dims = (ctypes.c_int64 * len(shape))(*shape)
    dtype = DLDataType(code, bits, 1)
    proto = DLTensor(None, DLDevice(device_type, 0), len(shape), dtype, ctypes.addressof(dims), None, 0)
    return proto, dims


def test_the_allocator_makes_a_writable_zeroed_tensor_that_to_py_object_wraps():
    proto, _dims = _prototype([2, 3], 2, 32)
    out = MANAGED_P()
    errors = []
    set_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    assert ALLOC(API.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, set_error) == 0
    assert errors == []
    m = out.contents
    assert m.flags & READ_ONLY == 0
    assert ints(m.dl_tensor.shape, 2) == [2, 3]
    obj = ctypes.py_object()
    assert TO_PY(API.managed_tensor_to_py_object_no_sync)(out, ctypes.byref(obj)) == 0
    t = obj.value
    assert isinstance(t, dlframe.Tensor)
    a = np.from_dlpack(t)
    assert a.dtype == np.float32 and a.shape == (2, 3) and not a.any()


def test_the_allocator_reports_errors_by_exception_name():
    proto, _dims = _prototype([2], 5, 64)  # complex64: no dlframe dtype
    out = MANAGED_P()
    errors = []
    set_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind.decode(), msg.decode())))
    assert ALLOC(API.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, set_error) == -1
    assert not out
    [(kind, msg)] = errors
    assert kind in ("TypeError", "BufferError", "ValueError") and msg
    proto, _dims = _prototype([-1], 2, 32)
    errors.clear()
    assert ALLOC(API.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, set_error) == -1
    assert errors and errors[0][1]


def test_to_py_object_refuses_null_and_an_unknown_major():
    obj = ctypes.py_object()
    with pytest.raises(Exception, match="NULL"):
        TO_PY(API.managed_tensor_to_py_object_no_sync)(MANAGED_P(), ctypes.byref(obj))
    deleted = []
    deleter = DELETER(lambda p: deleted.append(1))
    m = DLManagedTensorVersioned(DLPackVersion(2, 0), None, ctypes.cast(deleter, ctypes.c_void_p), 0, DLTensor())
    with pytest.raises(BufferError, match="version 2.0"):
        TO_PY(API.managed_tensor_to_py_object_no_sync)(ctypes.pointer(m), ctypes.byref(obj))
    assert deleted == [1], "the refused tensor is released once: the call took it"


def test_100k_exchanges_return_memory_and_references_to_baseline():
    arr = pa.array(np.arange(1000, dtype=np.float32))
    t = dlframe.to_dlpack(arr)
    gc.collect()
    bytes0, refs0 = pa.total_allocated_bytes(), sys.getrefcount(t)
    from_py = FROM_PY(API.managed_tensor_from_py_object_no_sync)
    to_py = TO_PY(API.managed_tensor_to_py_object_no_sync)
    out, obj = MANAGED_P(), ctypes.py_object()
    for i in range(100_000):
        assert from_py(t, ctypes.byref(out)) == 0
        if i % 2:
            release(out)
        else:
            assert to_py(out, ctypes.byref(obj)) == 0
            obj.value = None
    gc.collect()
    assert (pa.total_allocated_bytes(), sys.getrefcount(t)) == (bytes0, refs0)


# --- dlframe as a consumer of other types' tables ---


def _hostile(**attrs):
    """A type with a `__dlpack__` that works (numpy's) and the given exchange attributes."""
    base = np.arange(3.0)

    def dlpack(self, **kw):
        return base.__dlpack__(**kw)

    return type("Hostile", (), {"__dlpack__": dlpack, **attrs})()


def test_a_table_with_the_wrong_capsule_name_is_refused():
    cap = _new_capsule(ctypes.addressof(API), b"not_the_api", None)
    with pytest.raises(ValueError, match="Hostile's DLPack exchange table is refused: the capsule is named"):
        dlframe.tensor(_hostile(__dlpack_c_exchange_api__=cap))


def test_a_null_table_and_a_null_export_function_are_refused():
    with pytest.raises(ValueError, match="the table pointer is NULL"):
        dlframe.tensor(_hostile(__c_dlpack_exchange_api__=0))
    with pytest.raises(ValueError, match="not a capsule"):
        dlframe.tensor(_hostile(__dlpack_c_exchange_api__="api"))
    empty = ExchangeAPI(Header(1, 3, None))
    cap = _new_capsule(ctypes.addressof(empty), b"dlpack_exchange_api", None)
    with pytest.raises(ValueError, match="managed_tensor_from_py_object_no_sync is NULL"):
        dlframe.from_dlpack(_hostile(__dlpack_c_exchange_api__=cap))


def test_a_table_of_another_major_version_is_not_used():
    newer = ExchangeAPI(Header(2, 0, None), 1, 1, 1, 1, 1)  # its functions must never be called
    cap = _new_capsule(ctypes.addressof(newer), b"dlpack_exchange_api", None)
    t = dlframe.tensor(_hostile(__dlpack_c_exchange_api__=cap))
    assert np.from_dlpack(t).tolist() == [0.0, 1.0, 2.0]  # through __dlpack__
    # ... unless it links to a 1.x table, which is then used.
    chained = ExchangeAPI(Header(2, 0, ctypes.addressof(API)), 1, 1, 1, 1, 1)
    cap = _new_capsule(ctypes.addressof(chained), b"dlpack_exchange_api", None)
    with pytest.raises(TypeError, match="dlframe.Tensor objects, not Hostile"):
        dlframe.tensor(_hostile(__dlpack_c_exchange_api__=cap))


def test_torch_tensors_come_through_torchs_table_not_dlpack():
    torch = pytest.importorskip("torch", reason="torch is an opt-in extra (pip install './python[torch]')")

    class NoDlpack(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise AssertionError("__dlpack__ was called; the exchange table should have been used")

    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).as_subclass(NoDlpack)
    t = dlframe.tensor(x)
    a = np.from_dlpack(t)
    assert a.ctypes.data == x.data_ptr() and a.tolist() == [[0, 1, 2], [3, 4, 5]]
    col = dlframe.from_dlpack(x[0])
    assert col.to_pylist() == [0.0, 1.0, 2.0] and col.buffers()[1].address == x.data_ptr()
    # torch reads dlframe tensors through dlframe's table, and the references go back.
    refs = sys.getrefcount(x)
    for _ in range(100_000):
        dlframe.tensor(x)
    gc.collect()
    assert sys.getrefcount(x) == refs
    y = torch.from_dlpack(dlframe.to_dlpack(pa.array(np.arange(4, dtype=np.int64))))
    assert y.tolist() == [0, 1, 2, 3]


def test_tvm_ffi_exchanges_dlframe_tensors_through_the_table(monkeypatch):
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    arr, t = arrow_tensor(1000)

    def refuse(self, *args, **kwargs):
        raise AssertionError("__dlpack__ was called; tvm-ffi should use the exchange table")

    monkeypatch.setattr(dlframe.Tensor, "__dlpack__", refuse)
    echo = tvm_ffi.get_global_func("testing.echo")
    back = echo(t)
    # tvm-ffi took the tensor through from_py_object and made its result with to_py_object:
    # only dlframe's table makes a dlframe.Tensor, over the same Arrow memory.
    assert isinstance(back, dlframe.Tensor)
    monkeypatch.undo()
    out = np.from_dlpack(back)
    assert out.ctypes.data == arr.buffers()[1].address
    assert out.tolist() == arr.to_pylist()
    nop = tvm_ffi.get_global_func("testing.nop")
    bytes0 = pa.total_allocated_bytes()
    for _ in range(10_000):
        nop(t, t, t)
    gc.collect()
    assert pa.total_allocated_bytes() == bytes0

"""docs/conformance.md, array-interface items 24-27, and the fallbacks of item 16."""

import array
import gc

import numpy as np
import pyarrow as pa
import pytest

import dlframe
import fakes


def test_array_interface_dict():  # item 24
    arr = pa.array(np.arange(5, dtype=np.float32))
    ai = dlframe.to_dlpack(arr).__array_interface__
    assert ai["version"] == 3 and ai["typestr"] == "<f4" and ai["shape"] == (5,)
    assert ai["descr"] == [("", "<f4")] and ai["strides"] is None
    assert ai["data"][1] is True
    assert "mask" not in ai  # item 26
    empty = dlframe.to_dlpack(pa.array([], pa.int64())).__array_interface__
    assert empty["data"] == (0, True)


def test_asarray_base_keeps_the_exporter_alive():  # item 25
    t = dlframe.to_dlpack(pa.array(np.arange(100, dtype=np.int64)))
    a = np.asarray(t)  # numpy prefers __array_struct__: base is (exporter, capsule)
    assert isinstance(a.base, tuple) and a.base[0] is t and not a.flags.writeable

    class OnlyInterface:
        def __init__(self, t):
            self.t = t
            self.__array_interface__ = t.__array_interface__

    wrapper = OnlyInterface(t)
    b = np.asarray(wrapper)
    assert b.base is wrapper and not b.flags.writeable
    del t, wrapper
    gc.collect()
    assert a.sum() == b.sum() == sum(range(100))


def test_timestamps_keep_their_unit_in_the_array_interface():
    arr = pa.array(np.array(["2024-01-01", "2024-06-01"], dtype="datetime64[ns]"))
    t = dlframe.to_dlpack(arr)
    assert t.__array_interface__["typestr"] == "<M8[ns]"
    assert np.asarray(t).dtype == np.dtype("datetime64[ns]")
    assert np.from_dlpack(t).dtype == np.int64


def test_array_struct_capsule():  # item 27
    t = dlframe.to_dlpack(pa.array(np.arange(6, dtype=np.int32)))
    cap = t.__array_struct__
    assert type(cap).__name__ == "PyCapsule"

    class OnlyStruct:
        def __init__(self, t):
            self.__array_struct__ = t.__array_struct__

    a = np.asarray(OnlyStruct(t))
    np.testing.assert_array_equal(a, np.arange(6))
    assert not a.flags.writeable


def test_from_array_interface_and_struct_and_buffer():  # item 16 fallbacks
    src = np.arange(8, dtype=np.uint16)

    class OnlyInterface:
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__
            self._keep = a

    class OnlyStruct:
        def __init__(self, a):
            self.__array_struct__ = a.__array_struct__
            self._keep = a

    for obj in (OnlyInterface(src), OnlyStruct(src)):
        arr = dlframe.from_dlpack(obj)
        assert arr.type == pa.uint16() and arr.to_pylist() == list(range(8))
        assert arr.buffers()[1].address == src.ctypes.data
    buf = array.array("d", [1.5, 2.5])
    assert dlframe.from_dlpack(memoryview(buf)).to_pylist() == [1.5, 2.5]
    with pytest.raises(BufferError):
        dlframe.from_dlpack(np.zeros(2, dtype=">f4"))


def test_the_buffer_protocol_keeps_shape_strides_and_the_exporter_alive():
    buf = array.array("i", range(6))
    strided = dlframe.tensor(memoryview(buf)[::2])
    assert np.from_dlpack(strided).tolist() == [0, 2, 4]
    assert np.from_dlpack(strided).strides == (8,)
    square = dlframe.tensor(memoryview(buf).cast("B").cast("i", (2, 3)))
    del buf
    assert np.from_dlpack(square).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TypeError, match="has no tensor dtype"):
        dlframe.tensor(memoryview(b"ab").cast("c"))


def test_interface_without_data_reads_the_objects_buffer_as_described():
    raw = np.arange(4, dtype=np.float32).tobytes()
    obj = fakes.OwnBuffer(raw, {"shape": (2,), "typestr": "<f4", "offset": 4, "version": 3})
    arr = dlframe.from_dlpack(obj)
    # The dict's shape, typestr and offset apply, not the buffer's 16 unsigned bytes.
    assert arr.type == pa.float32()
    assert arr.to_pylist() == [1.0, 2.0]
    strided = fakes.OwnBuffer(raw, {"shape": (2,), "typestr": "<f4", "strides": (8,), "version": 3})
    assert dlframe.from_dlpack(strided).to_pylist() == [0.0, 2.0]
    with pytest.raises(BufferError, match="reaches bytes 0..20"):
        dlframe.from_dlpack(fakes.OwnBuffer(raw, {"shape": (5,), "typestr": "<f4", "version": 3}))


def test_datetime_interfaces_keep_their_unit():
    for unit in ("s", "ms", "us", "ns"):
        src = np.array([1, 2], dtype=f"M8[{unit}]")
        arr = dlframe.from_dlpack(fakes.Interface(src.__array_interface__, src))
        assert arr.type == pa.timestamp(unit)
        assert arr.cast(pa.int64()).to_pylist() == [1, 2]
    # Days become date32 (a copy; they were bare int64 counts before, test_import_ladder.py has
    # the other units).
    days = np.array([1, 2], dtype="M8[D]")
    assert dlframe.from_dlpack(fakes.Interface(days.__array_interface__, days)).type == pa.date32()

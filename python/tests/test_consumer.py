"""docs/conformance.md, consumer items 16-23: dlframe.from_dlpack into Arrow."""

import gc
import threading

import numpy as np
import pyarrow as pa
import pytest

import dlframe
import fakes
from conftest import optional


def test_numpy_round_trip_is_zero_copy_and_keeps_producer_alive():  # items 16, 23
    src = np.arange(10, dtype=np.float64)
    ptr = src.ctypes.data
    arr = dlframe.from_dlpack(src)
    assert arr.type == pa.float64()
    assert arr.buffers()[1].address == ptr
    del src
    gc.collect()
    assert arr.to_pylist() == list(map(float, range(10)))


NUMERIC = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]


@pytest.mark.parametrize("dtype", NUMERIC)
def test_a_plain_tensor_reaches_arrow_as_the_arrow_path_makes_it(dtype):
    # A writable, contiguous 1-D tensor is handed to pyarrow's DLPack importer; a read-only one
    # takes the Arrow C interface. Both share the producer's memory and make the same array,
    # which keeps the producer alive.
    src = np.arange(3, 13).astype(dtype)
    ro = src.copy()
    ro.flags.writeable = False
    fast, arrow = dlframe.from_dlpack(src), dlframe.from_dlpack(ro)
    assert fast.type == arrow.type and fast.equals(arrow)
    assert fast.buffers()[1].address == src.ctypes.data and arrow.buffers()[1].address == ro.ctypes.data
    assert fast.offset == 0 and fast.null_count == 0
    sliced = dlframe.from_dlpack(src[2:])
    assert sliced.buffers()[1].address == src[2:].ctypes.data
    del src, ro
    gc.collect()
    assert fast.to_pylist() == arrow.to_pylist() == np.arange(3, 13).astype(dtype).tolist()
    assert sliced.to_pylist() == np.arange(5, 13).astype(dtype).tolist()


def _numpy_says_plain(x):
    return (
        type(x) is np.ndarray
        and x.ndim == 1
        and x.size > 0
        and x.flags.c_contiguous
        and x.flags.aligned
        and x.flags.writeable
        and x.dtype.kind in "iuf"
        and x.dtype.isnative
        and x.dtype != np.longdouble
    )


def test_numpy_arrays_handed_to_pyarrow_as_they_are_are_the_ones_numpy_calls_plain():
    # dlframe reads an ndarray's struct (numpy's C API layout) to decide whether pyarrow's own
    # DLPack import takes it as it is; the answers must be numpy's own, and every array must
    # come out with the same values whichever way it went.
    base = np.arange(64, dtype=np.float64)
    ro = base.copy()
    ro.flags.writeable = False
    raw = np.zeros(8 * 9 + 1, dtype=np.uint8)
    cases = [np.arange(5).astype(d) for d in NUMERIC] + [
        base[::2],  # strided
        base[::-1],  # reversed
        base.reshape(8, 8),  # 2-D
        base.reshape(8, 8)[:, 0],  # a column, strided
        base[:0],  # empty
        np.array(3.0),  # 0-d
        ro,  # read-only
        raw[1:].view(np.float64),  # misaligned
        np.arange(5, dtype=">i4"),  # byte-swapped
        np.arange(5, dtype=np.longdouble),
        np.array([True, False]),
        np.arange(3).astype("datetime64[s]"),
        np.arange(3, dtype=np.complex64),
        np.ma.masked_array(np.arange(3.0)),  # a subclass
        np.asfortranarray(np.arange(3.0)),
    ]
    for x in cases:
        assert dlframe._native._plain_ndarray(x) == _numpy_says_plain(x), (x.dtype, x.shape, x.strides)
    assert sum(map(_numpy_says_plain, cases)) == len(NUMERIC) + 1
    for x in cases:
        try:
            got = dlframe.from_dlpack(x)
        except (BufferError, TypeError, ValueError):
            assert not _numpy_says_plain(x)
            continue
        want = np.asarray(x)
        if x.ndim == 1:
            np.testing.assert_array_equal(np.asarray(got.to_pylist(), dtype=want.dtype), want)
        if _numpy_says_plain(x):
            assert got.buffers()[1].address == x.ctypes.data
    assert not dlframe._native._plain_ndarray([1.0, 2.0]) and not dlframe._native._plain_ndarray(pa.array([1.0]))


def _np_cases():
    base = np.arange(64, dtype=np.float64)
    ro = base.copy()
    ro.flags.writeable = False
    raw = np.zeros(8 * 9 + 1, dtype=np.uint8)
    cube = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    return [np.arange(5).astype(d) for d in NUMERIC] + [
        np.array([True, False, True]),
        np.arange(6, dtype=np.intc),
        np.arange(6, dtype=np.int_),
        np.arange(6, dtype=np.uint),
        np.arange(6, dtype=np.longlong),
        base[::3],
        base[::-2],
        base.reshape(8, 8).T,
        cube,
        cube[:, ::-1, 1:3],
        np.asfortranarray(cube),
        base[:0],
        base.reshape(8, 8)[:0],
        np.array(3.5),
        ro,
        ro[5:],
        raw[1:].view(np.float64),
        np.lib.stride_tricks.as_strided(base, (4, 3), (8, 0)),  # broadcast
        np.lib.stride_tricks.as_strided(raw, (3,), (3,)),
        np.ndarray((3,), dtype=np.float32, buffer=raw, offset=2, strides=(6,)),  # stride not a whole element
        np.arange(5, dtype=">i4"),
        np.arange(5, dtype=np.longdouble),
        np.arange(3).astype("datetime64[s]"),
        np.arange(3, dtype=np.complex64),
    ]


def test_numpy_arrays_read_from_their_struct_are_what_their_dlpack_export_gives():
    # dlframe.tensor(ndarray) reads the array's struct instead of asking numpy for a capsule;
    # it must give what the capsule gives: dtype, shape, strides, read-only flag, the same
    # memory and values, and the array kept alive. What numpy refuses to export keeps the
    # answer it had (the array interface, or the same error).
    for x in _np_cases():
        try:
            want = dlframe.tensor(x.__dlpack__(max_version=(1, 3)))
        except (BufferError, TypeError, ValueError) as e:
            want = e
        what = (x.dtype, x.shape, x.strides)
        if isinstance(want, Exception):
            # numpy refuses DLPack (byte-swapped, datetime, complex, long double, a stride that
            # is not a whole element): dlframe answers through the array interface or refuses.
            try:
                got = dlframe.tensor(x)
            except (BufferError, TypeError, ValueError):
                continue
            assert got.to_numpy().tobytes() == np.ascontiguousarray(x).tobytes(), what
            continue
        got = dlframe.tensor(x)
        assert (got.dtype, got.shape, got.strides) == (want.dtype, want.shape, want.strides), what
        assert got.readonly == want.readonly == (not x.flags.writeable), what
        assert not got.copied, what
        if x.size:
            assert got.__array_interface__["data"][0] == want.__array_interface__["data"][0], what
        np.testing.assert_array_equal(got.to_numpy(), x)
    # The tensor keeps the array alive; a Series' view goes the same way.
    x = np.arange(1000, dtype=np.float32) * 2
    t = dlframe.tensor(x)
    del x
    gc.collect()
    np.testing.assert_array_equal(t.to_numpy(), np.arange(1000, dtype=np.float32) * 2)


def test_copy_true_still_copies_a_plain_tensor():
    src = np.arange(4, dtype=np.int32)
    out = dlframe.from_dlpack(src, copy=True)
    assert out.buffers()[1].address != src.ctypes.data
    src[0] = 99
    assert out.to_pylist() == [0, 1, 2, 3]


class OldProducer:
    """A producer from before DLPack 1.0: __dlpack__ takes no keywords."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_ladder_retries_without_keywords():  # item 16
    src = np.arange(5, dtype=np.int32)
    assert dlframe.from_dlpack(OldProducer(src)).to_pylist() == [0, 1, 2, 3, 4]


def test_raw_capsules_of_both_versions_and_second_use():  # item 17
    src = np.arange(4, dtype=np.int16)
    for cap in (src.__dlpack__(), src.__dlpack__(max_version=(1, 0))):
        assert dlframe.from_dlpack(cap).to_pylist() == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="already consumed"):
            dlframe.from_dlpack(cap)


def test_strided_and_negative_inputs_are_copied_or_refused():  # item 19
    src = np.arange(20, dtype=np.int64)
    assert dlframe.from_dlpack(src[::2]).to_pylist() == list(range(0, 20, 2))
    assert dlframe.from_dlpack(src[::-1]).to_pylist() == list(range(19, -1, -1))
    with pytest.raises(BufferError):
        dlframe.from_dlpack(src[::2], copy=False)
    b = np.broadcast_to(np.float32(3), (4,))
    assert dlframe.from_dlpack(b).to_pylist() == [3.0] * 4


def test_nd_becomes_fixed_shape_tensor_and_transposes_stay_zero_copy():  # item 19
    src = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    arr = dlframe.from_dlpack(src)
    assert isinstance(arr.type, pa.FixedShapeTensorType)
    assert arr.type.shape == [3, 4]
    np.testing.assert_array_equal(arr.to_numpy_ndarray(), src)
    t = src.transpose(0, 2, 1)
    arr = dlframe.from_dlpack(t)
    assert arr.type.permutation == [1, 0]
    np.testing.assert_array_equal(arr.to_numpy_ndarray(), t)


def test_unsupported_dtype_is_buffer_error():  # item 20
    with pytest.raises(BufferError, match="code=5"):
        dlframe.from_dlpack(np.zeros(3, dtype=np.complex64))


def test_bool_packs_into_a_bitmap():  # item 21
    src = np.array([True, False, True])
    arr = dlframe.from_dlpack(src)
    assert arr.type == pa.bool_() and arr.to_pylist() == [True, False, True]
    with pytest.raises(BufferError):
        dlframe.from_dlpack(src, copy=False)


def test_zero_size_imports():  # item 22
    for shape in [(0,), (0, 3)]:
        arr = dlframe.from_dlpack(np.zeros(shape, dtype=np.float64))
        assert len(arr) == 0


def test_memory_freed_from_another_thread():  # item 23
    src = np.arange(1000, dtype=np.float64)
    arr = dlframe.from_dlpack(src)
    del src
    out = []
    th = threading.Thread(target=lambda: out.append(arr.sum().as_py()))
    th.start()
    th.join()
    del arr
    gc.collect()
    assert out == [sum(range(1000))]


def test_torch_tensors_when_installed():  # items 16, 18
    torch = optional("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    arr = dlframe.from_dlpack(t)
    np.testing.assert_array_equal(arr.to_numpy_ndarray(), t.numpy())


def test_device_other_than_cpu_is_refused():
    with pytest.raises(ValueError, match="device"):
        dlframe.from_dlpack(np.zeros(2), device="cuda:0")


def _host_capsule_producer(device):
    """A producer that claims ``device`` but hands over host memory (what a producer's own
    host copy looks like); it records how it was asked."""
    data = np.arange(4, dtype=np.float32)
    return data, fakes.DLPackProducer(lambda: fakes.dlpack_capsule(data.ctypes.data, [4], None, keep=data), device=device)


def test_device_tensors_reach_arrow_only_by_an_explicit_copy():
    data, producer = _host_capsule_producer((2, 0))
    for copy in (None, False):
        with pytest.raises(BufferError, match="copy=True"):
            dlframe.from_dlpack(producer, copy=copy)
    assert producer.calls == [], "the producer is not asked for anything it would have to copy unasked"
    arr = dlframe.from_dlpack(producer, copy=True)
    assert producer.calls == [{"max_version": (1, 3), "dl_device": (1, 0), "copy": True, "_args": ()}]
    np.testing.assert_array_equal(arr.to_numpy(), data)
    del arr
    gc.collect()
    producer.drop()
    assert [f.deletes for f in producer.made] == [1]


def test_tensor_keeps_cuda_tensors_on_their_device_or_refuses():
    data, producer = _host_capsule_producer((2, 0))
    if dlframe.cuda_device_count() == 0:
        # No device (or no CUDA in the build): refused before the producer is asked, since the
        # stream to hand it is ours on that device.
        with pytest.raises(BufferError, match="cuda:0 is not available"):
            dlframe.tensor(producer)
        assert producer.calls == []
    else:
        # A producer that says cuda:0 but returns host memory is caught (and released).
        with pytest.raises(BufferError, match="said cuda:0"):
            dlframe.tensor(producer)
        (call,) = producer.calls
        assert call["max_version"] == (1, 3) and call["stream"] not in (None, 0, -1)
        producer.drop()
        assert [f.deletes for f in producer.made] == [1]
    # A raw capsule of CUDA memory is adopted on its device; with no device it is refused and
    # still released exactly once (its memory is never touched).
    if dlframe.cuda_device_count() == 0:
        fake = fakes.dlpack_capsule(0x1000, [4], None, device=(2, 0))
        with pytest.raises(BufferError, match="cuda:0 is not available"):
            dlframe.tensor(fake.capsule)
        assert fake.consumed()
        fake.drop()
        gc.collect()
        assert fake.deletes == 1
    # Devices other than CUDA are never kept: BufferError, and nothing is asked.
    data, opencl = _host_capsule_producer((4, 0))
    with pytest.raises(BufferError, match="only CUDA"):
        dlframe.tensor(opencl)
    assert opencl.calls == []


def test_objects_without_protocols_get_attribute_error():
    with pytest.raises(AttributeError, match="__dlpack__"):
        dlframe.from_dlpack(object())

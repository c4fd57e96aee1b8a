"""The Arrow C Device data interface on the CPU: pyarrow's and nanoarrow's
`__arrow_c_device_array__` as the producers dlframe reads, and dlframe's Tensor as the producer
pyarrow and nanoarrow read, with no copy; and device arrays dlframe cannot read (another device,
hostile structs, broken capsules) refused without a leak."""

import ctypes
import gc

import numpy as np
import pyarrow as pa
import pytest

import dlframe

try:
    import nanoarrow as na
    import nanoarrow.device as nd
except ImportError:  # in python/requirements-test.txt; the GPU machine has none
    na = nd = None

needs_nanoarrow = pytest.mark.skipif(na is None, reason="nanoarrow is not installed (python/requirements-test.txt)")


class DeviceOnly:
    """Offers only the device interface of `inner` (pyarrow offers both), so that a consumer
    must take that route."""

    def __init__(self, inner):
        self.inner = inner

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        return self.inner.__arrow_c_device_array__(requested_schema, **kwargs)


class Exported:
    """An Arrow array already exported (a schema and array capsule pair), for pyarrow's public
    import of the PyCapsule interface, `pa.array`."""

    def __init__(self, schema, array):
        self.pair = (schema, array)

    def __arrow_c_array__(self, requested_schema=None):
        return self.pair


def data_address(t) -> int:
    return t.__array_interface__["data"][0]


def test_a_pyarrow_device_array_on_the_cpu_is_shared_without_a_copy():
    a = pa.array(np.arange(6, dtype=np.float32))
    t = dlframe.to_dlpack(DeviceOnly(a))
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(6, dtype=np.float32))
    assert data_address(t) == a.buffers()[1].address
    assert t.readonly and not t.copied


def test_nulls_casts_and_tables_take_the_usual_path():
    a = pa.array([1, None, 3], pa.int32())
    with pytest.raises(BufferError, match="null"):
        dlframe.to_dlpack(DeviceOnly(a))
    filled = dlframe.to_dlpack(DeviceOnly(a), nulls="fill", fill_value=-1, dtype="float64")
    np.testing.assert_array_equal(np.from_dlpack(filled), [1.0, -1.0, 3.0])
    batch = pa.record_batch({"x": pa.array([1.0, 2.0]), "y": pa.array([3.0, 4.0])})
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(DeviceOnly(batch))), [[1, 3], [2, 4]])
    got = [np.from_dlpack(b).tolist() for b in dlframe.batches(DeviceOnly(batch), 1)]
    assert got == [[[1.0, 3.0]], [[2.0, 4.0]]]


def test_a_dlframe_tensor_is_a_cpu_device_array_that_pyarrow_reads_in_place():
    t = dlframe.tensor(np.arange(4, dtype=np.int64))
    schema, array = t.__arrow_c_device_array__()
    assert (type(schema).__name__, type(array).__name__) == ("PyCapsule", "PyCapsule")
    del schema, array
    a = pa.array(DeviceOnly(t))
    assert a.to_pylist() == [0, 1, 2, 3]
    assert a.buffers()[1].address == data_address(t)
    # And back: dlframe reads its own device array.
    assert data_address(dlframe.to_dlpack(DeviceOnly(t))) == data_address(t)


def test_keywords_of_a_later_version_raise_not_implemented():
    t = dlframe.tensor(np.arange(3, dtype=np.float32))
    t.__arrow_c_device_array__(None, future=None)
    with pytest.raises(NotImplementedError, match="future"):
        t.__arrow_c_device_array__(None, future=1)


def capsule_pointer(capsule, name: bytes) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, name)


class OnDevice:
    """pyarrow's CPU device array, relabelled as living on another device (its struct's
    `device_type` at byte 88, `device_id` at 80)."""

    def __init__(self, inner, device_type, device_id=0):
        self.inner, self.device_type, self.device_id = inner, device_type, device_id

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        schema, array = self.inner.__arrow_c_device_array__(requested_schema, **kwargs)
        p = capsule_pointer(array, b"arrow_device_array")
        ctypes.c_int64.from_address(p + 80).value = self.device_id
        ctypes.c_int32.from_address(p + 88).value = self.device_type
        return schema, array


def test_a_device_dlframe_cannot_read_is_refused_naming_it_and_released():
    gc.collect()
    before = pa.total_allocated_bytes()
    a = pa.array(np.arange(1 << 16, dtype=np.float64))
    with pytest.raises(BufferError, match=r"an Arrow device array on cuda:0"):
        dlframe.to_dlpack(OnDevice(a, 2))
    with pytest.raises(BufferError, match=r"device_type=99"):
        dlframe.to_dlpack(OnDevice(a, 99))
    del a
    gc.collect()
    # Every refused array was released once (pyarrow's pool is back where it was).
    assert pa.total_allocated_bytes() == before


class Returns:
    def __init__(self, value):
        self.value = value

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        return self.value


def test_broken_device_capsules_are_clear_errors():
    a = pa.array([1.0, 2.0])
    schema, array = a.__arrow_c_device_array__()
    with pytest.raises(ValueError, match=r"Returns.__arrow_c_device_array__\(\) returned a int, not a \(schema, array\) pair"):
        dlframe.to_dlpack(Returns(42))
    with pytest.raises(ValueError, match='pair of PyCapsules named "arrow_schema" and "arrow_device_array"'):
        dlframe.to_dlpack(Returns((schema, a.__arrow_c_array__()[1])))
    # A device array already moved from is refused, not read twice.
    pa.array(Returns((schema, array)))
    with pytest.raises(ValueError, match="already released or moved"):
        dlframe.to_dlpack(Returns((a.type.__arrow_c_schema__(), array)))


GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)
RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CStream(ctypes.Structure):
    """The C stream interface's ArrowArrayStream."""

    _fields_ = [("get_schema", ctypes.c_void_p), ("get_next", ctypes.c_void_p), ("get_last_error", ctypes.c_void_p),
                ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]


class CDeviceStream(ctypes.Structure):
    """The C Device data interface's ArrowDeviceArrayStream."""

    _fields_ = [("device_type", ctypes.c_int32), ("get_schema", GET), ("get_next", GET), ("get_last_error", LAST_ERROR),
                ("release", RELEASE), ("private_data", ctypes.c_void_p)]


class DeviceStreamOf:
    """pyarrow's C stream of `source`, offered as a device stream on `device_type`: each array
    pyarrow writes gets the device fields (id -1, no event). Counts the releases."""

    def __init__(self, source, device_type=1):
        self.source, self.device_type, self.released = source, device_type, 0

    def __arrow_c_device_stream__(self, requested_schema=None, **kwargs):
        def on_cpu(out):
            ctypes.c_int64.from_address(out + 80).value = -1
            ctypes.c_int32.from_address(out + 88).value = 1
            ctypes.c_void_p.from_address(out + 96).value = None

        return relay(self, self.source, on_cpu, lambda *f: CDeviceStream(self.device_type, *f, None),
                     b"arrow_device_array_stream")


def relay(owner, source, on_array, make_struct, name: bytes):
    """A capsule named `name` over a C stream struct (`make_struct(*callbacks)`) that relays
    pyarrow's C stream of `source`, with `on_array(address)` applied to each array it hands
    over; the callbacks live on `owner`, which counts the releases."""
    owner.inner_capsule = source.__arrow_c_stream__()
    inner = capsule_pointer(owner.inner_capsule, b"arrow_array_stream")
    c = CStream.from_address(inner)
    get_schema, get_next, release = GET(c.get_schema), GET(c.get_next), RELEASE(c.release)

    def next_array(_, out):
        rc = get_next(inner, out)
        if rc == 0 and ctypes.c_void_p.from_address(out + 64).value:
            on_array(out)
        return rc

    def release_inner(_):
        owner.released += 1
        release(inner)

    owner.callbacks = (GET(lambda _, out: get_schema(inner, out)), GET(next_array), LAST_ERROR(lambda _: b"?"),
                       RELEASE(release_inner))
    owner.struct = make_struct(*owner.callbacks)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(owner.struct), name, None)


def test_a_cpu_device_stream_is_read_batch_by_batch_and_released_once():
    table = pa.table({"x": pa.array([1.0, 2.0, 3.0]), "y": pa.array([4.0, 5.0, 6.0])}).combine_chunks()
    source = DeviceStreamOf(table)
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(source)), [[1, 4], [2, 5], [3, 6]])
    assert source.released == 1
    got = [np.from_dlpack(b).tolist() for b in dlframe.batches(DeviceStreamOf(table), 2)]
    assert got == [[[1.0, 4.0], [2.0, 5.0]], [[3.0, 6.0]]]


class EditedStream:
    """pyarrow's C stream of `source` (`__arrow_c_stream__`), with `edit(address of the
    ArrowArray)` applied to each array it hands over. Counts the releases."""

    def __init__(self, source, edit):
        self.source, self.edit, self.released = source, edit, 0

    def __arrow_c_stream__(self, requested_schema=None):
        as_pointers = lambda *f: CStream(*[ctypes.cast(g, ctypes.c_void_p) for g in f], None)  # noqa: E731
        return relay(self, self.source, self.edit, as_pointers, b"arrow_array_stream")


def test_a_c_stream_is_checked_array_by_array_and_released_once():
    table = pa.table({"x": pa.array([1.0, 2.0, 3.0])})
    plain = EditedStream(table, lambda p: None)
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(plain)), [[1.0], [2.0], [3.0]])
    assert plain.released == 1
    gc.collect()
    before = pa.total_allocated_bytes()
    for edit, message in [(poke(0, -5), "a negative length"), (poke(16, 1), "child 0 has 3 rows")]:
        source = EditedStream(pa.table({"x": pa.array(np.arange(3.0))}), edit)
        with pytest.raises(ValueError, match=message):
            dlframe.to_dlpack(source)
        assert source.released == 1
        del source
    gc.collect()
    assert pa.total_allocated_bytes() == before


def test_a_device_stream_on_a_gpu_is_refused_naming_it_and_released():
    source = DeviceStreamOf(pa.table({"x": [1.0]}), device_type=2)
    with pytest.raises(BufferError, match="an Arrow device array stream on cuda:0"):
        dlframe.to_dlpack(source)
    assert source.released == 1


def test_dlframe_tensor_takes_a_device_array_as_to_dlpack_does_by_default():
    a = pa.array(np.arange(5, dtype=np.int16))
    t = dlframe.tensor(DeviceOnly(a))
    assert data_address(t) == a.buffers()[1].address and not t.copied
    flags = dlframe.tensor(DeviceOnly(pa.array([True, False, True])))
    assert flags.copied and np.from_dlpack(flags).tolist() == [True, False, True]
    with pytest.raises(BufferError, match="null"):
        dlframe.tensor(DeviceOnly(pa.array([1.0, None])))
    with pytest.raises(BufferError, match="an Arrow device array on cuda:0"):
        dlframe.tensor(OnDevice(a, 2))
    table = pa.table({"x": [1.0, 2.0], "y": [3.0, 4.0]})
    np.testing.assert_array_equal(np.from_dlpack(dlframe.tensor(DeviceStreamOf(table))), [[1, 3], [2, 4]])
    with pytest.raises(AttributeError, match="__arrow_c_stream__/__arrow_c_device_array__/__arrow_c_device_stream__"):
        dlframe.tensor(object())
    # Arrow data without a device method is taken the same way: a table, a chunked column.
    np.testing.assert_array_equal(np.from_dlpack(dlframe.tensor(table)), [[1, 3], [2, 4]])
    chunked = dlframe.tensor(pa.chunked_array([[1.0], [2.0, 3.0]]))
    assert chunked.copied and np.from_dlpack(chunked).tolist() == [1.0, 2.0, 3.0]


@needs_nanoarrow
def test_nanoarrow_device_arrays_are_read_in_place():
    values = np.arange(4, dtype=np.float64)
    device_array = nd.c_device_array(pa.array(values))
    assert device_array.device_type == nd.DeviceType.CPU
    for source in (device_array, DeviceOnly(device_array)):
        t = dlframe.to_dlpack(source)
        np.testing.assert_array_equal(np.from_dlpack(t), values)
        assert data_address(t) == device_array.array.buffers[1] and not t.copied
        assert data_address(dlframe.tensor(source)) == device_array.array.buffers[1]
    with_nulls = nd.c_device_array(na.c_array([1, None, 3], na.int32()))
    filled = dlframe.to_dlpack(DeviceOnly(with_nulls), nulls="fill", fill_value=0)
    assert np.from_dlpack(filled).tolist() == [1, 0, 3]
    got = [np.from_dlpack(b).tolist() for b in dlframe.batches(DeviceOnly(with_nulls), 2, nulls="fill", fill_value=-1)]
    assert got == [[1, -1], [3]]


@needs_nanoarrow
def test_nanoarrow_reads_dlframe_tensors_in_place():
    column = dlframe.tensor(np.arange(3, dtype=np.int64))
    device_array = nd.c_device_array(column)
    assert (device_array.device_type, device_array.device_id) == (nd.DeviceType.CPU, -1)
    assert device_array.array.buffers[1] == data_address(column)
    assert na.Array(device_array).to_pylist() == [0, 1, 2]
    matrix = dlframe.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    device_array = nd.c_device_array(matrix)
    assert device_array.schema.metadata[b"ARROW:extension:name"] == b"arrow.fixed_shape_tensor"
    assert device_array.array.child(0).buffers[1] == data_address(matrix)
    with pytest.warns(UserWarning, match="fixed_shape_tensor"):
        assert na.Array(device_array).to_pylist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


class Edited:
    """pyarrow's CPU device array with `edit(address of its ArrowArray)` applied first: the C
    ArrowArray's int64 `length` is at byte 0, `offset` 16, `n_buffers` 24; `buffers` at 40."""

    def __init__(self, inner, edit):
        self.inner, self.edit = inner, edit

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        schema, array = self.inner.__arrow_c_device_array__(requested_schema, **kwargs)
        self.edit(capsule_pointer(array, b"arrow_device_array"))
        return schema, array


def poke(at: int, value: int):
    return lambda p: setattr(ctypes.c_int64.from_address(p + at), "value", value)


def null_values_buffer(p: int):
    buffers = ctypes.c_void_p.from_address(p + 40).value
    ctypes.c_void_p.from_address(buffers + 8).value = None


@pytest.mark.parametrize(
    "edit, message",
    [
        (poke(0, -5), "a negative length"),
        (poke(16, -1), "a negative offset"),
        (poke(16, 1 << 62), "overflows its buffers' sizes"),
        (poke(24, 1), "1 buffers for a Float64 column, which has 2"),
        (poke(40, 0), "a NULL buffers or children array"),
        (null_values_buffer, "null"),
    ],
    ids=["negative-length", "negative-offset", "overflowing-offset", "too-few-buffers", "null-buffers", "null-values"],
)
def test_hostile_device_structs_are_clear_errors_and_released(edit, message):
    gc.collect()
    before = pa.total_allocated_bytes()
    a = pa.array(np.arange(1 << 10, dtype=np.float64))
    for convert in (dlframe.to_dlpack, dlframe.tensor):
        with pytest.raises(ValueError, match=message):
            convert(Edited(a, edit))
    del a
    gc.collect()
    assert pa.total_allocated_bytes() == before


def test_a_length_whose_cells_overflow_is_refused_not_a_panic():
    # arrow-rs multiplies a fixed-size list's rows by its list size and panics on overflow
    # (release builds too): 2**57 rows of 256 values.
    cells = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(512, dtype=np.float32)), 256)
    for convert in (dlframe.to_dlpack, dlframe.tensor):
        with pytest.raises(ValueError, match="overflows its buffers' sizes"):
            convert(Edited(cells, poke(0, 1 << 57)))


class ArrayOnly:
    """pyarrow's C data interface array (`__arrow_c_array__`), with `edit(address of its
    ArrowArray)` applied first: the checks are the device route's."""

    def __init__(self, inner, edit):
        self.inner, self.edit = inner, edit

    def __arrow_c_array__(self, requested_schema=None):
        schema, array = self.inner.__arrow_c_array__(requested_schema)
        self.edit(capsule_pointer(array, b"arrow_array"))
        return schema, array


class Relabelled:
    """pyarrow's C data interface array whose schema's format (the ArrowSchema's first field) is
    replaced by `format_`. A class of the module: dlframe keeps the types it has seen (at most
    64), so a class made per call would keep its closure alive."""

    def __init__(self, inner, format_: bytes):
        self.inner, self.format = inner, ctypes.create_string_buffer(format_)

    def __arrow_c_array__(self, requested_schema=None):
        schema, array = self.inner.__arrow_c_array__(requested_schema)
        ctypes.c_void_p.from_address(capsule_pointer(schema, b"arrow_schema")).value = ctypes.addressof(self.format)
        return schema, array


def test_the_c_data_interface_route_is_checked_as_the_device_route_is():
    gc.collect()
    before = pa.total_allocated_bytes()
    floats = pa.array(np.arange(1 << 10, dtype=np.float64))
    cells = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(512, dtype=np.float32)), 256)
    pairs = pa.StructArray.from_arrays([pa.array([1.0, 2.0]), pa.array([3.0, 4.0])], names=["a", "b"])
    views = pa.array(["a", "b" * 20], pa.string_view())
    cases = [
        (ArrayOnly(floats, poke(0, -5)), ValueError, "a negative length"),
        (ArrayOnly(floats, poke(16, 1 << 62)), ValueError, "overflows its buffers' sizes"),
        (ArrayOnly(floats, poke(24, 1)), ValueError, "1 buffers for a Float64 column, which has 2"),
        (ArrayOnly(cells, poke(0, 1 << 57)), ValueError, "overflows its buffers' sizes"),
        (ArrayOnly(pairs, poke(16, 1)), ValueError, "child 0 has 2 rows; the Struct.* column reaches 3"),
        (ArrayOnly(cells, poke(16, 1)), ValueError, "child 0 has 512 rows; the FixedSizeList.* column reaches 768"),
        (ArrayOnly(views, poke(24, 2)), ValueError, "2 buffers for a Utf8View column, which has more than 2"),
        (Relabelled(pa.array([b"ab"], pa.binary(2)), b"w:-2"), ValueError, "a negative or overflowing width"),
    ]
    for source, kind, message in cases:
        for convert in (dlframe.to_dlpack, dlframe.tensor):
            with pytest.raises(kind, match=message):
                convert(source)
    del floats, cells, pairs, views, cases, source
    gc.collect()
    assert pa.total_allocated_bytes() == before


def test_a_schema_nested_past_the_bound_or_a_non_nullable_null_field_is_refused():
    # A requested schema 200 lists deep: arrow-rs would recurse until the stack overflows.
    deep = pa.float64()
    for _ in range(200):
        deep = pa.list_(deep)
    t = dlframe.tensor(np.arange(3.0))
    for method in (t.__arrow_c_array__, t.__arrow_c_device_array__):
        with pytest.raises(ValueError, match="nests deeper than 64"):
            method(pa.field("x", deep).__arrow_c_schema__())
    # A Null child that claims to be non-nullable (pyarrow will not make one: its schema's child
    # flags, at byte 24 of the child ArrowSchema, are edited): the parent's nulls would be
    # expanded over rows that no buffer bounds.
    nulls = pa.FixedSizeListArray.from_arrays(pa.nulls(4), 2)
    with pytest.raises(ValueError, match="a non-nullable field of the Null type"):
        dlframe.to_dlpack(NonNullableChild(nulls))


class NonNullableChild:
    """pyarrow's device array whose schema's first child is marked non-nullable."""

    def __init__(self, inner):
        self.inner = inner

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        schema, array = self.inner.__arrow_c_device_array__(requested_schema, **kwargs)
        children = ctypes.c_void_p.from_address(capsule_pointer(schema, b"arrow_schema") + 40).value
        flags = ctypes.c_int64.from_address(ctypes.c_void_p.from_address(children).value + 24)
        flags.value &= ~2
        return schema, array


def test_a_requested_number_type_is_cast_as_to_dlpack_casts_through_either_interface():
    t = dlframe.tensor(np.array([1, 300], dtype=np.int32))
    # pyarrow asks through __arrow_c_device_array__ first when given a type.
    assert pa.array(t, type=pa.float64()).to_pylist() == [1.0, 300.0]
    for method in (t.__arrow_c_array__, t.__arrow_c_device_array__):
        with pytest.raises(ValueError, match="300 at row 1 .* does not fit int8"):
            method(pa.int8().__arrow_c_schema__())
    # What an arrow cast would change silently is refused, as to_dlpack(dtype=...) refuses it.
    for values, to, message in [
        ([1.5, -2.7], pa.int32(), "1.5 at row 0 .* does not fit int32"),
        ([1e300], pa.float32(), "does not fit float32"),
        ([70000.0], pa.float16(), "does not fit float16"),
    ]:
        with pytest.raises(ValueError, match=message):
            dlframe.tensor(np.array(values)).__arrow_c_array__(to.__arrow_c_schema__())
    big = dlframe.tensor(np.array([2**53 + 1]))
    with pytest.raises(ValueError, match="has no exact float64"):
        big.__arrow_c_array__(pa.float64().__arrow_c_schema__())
    # A type that is no number (or another layout) is not honoured: the tensor's own comes
    # back, shared.
    for to in (pa.bool_(), pa.decimal128(5, 0), pa.struct([("a", pa.int8())])):
        schema, array = t.__arrow_c_array__(to.__arrow_c_schema__())
        own = pa.array(Exported(schema, array))
        assert own.type == pa.int32() and own.buffers()[1].address == data_address(t)
    # A tensor column's cells are cast and its shape kept. Given an extension type, pyarrow asks
    # for its storage and returns that (it raised AttributeError in pyarrow 26 when the type
    # that came back was not the one it asked for).
    cells = dlframe.tensor(np.arange(12, dtype=np.float32).reshape(2, 2, 3))
    wanted = pa.fixed_shape_tensor(pa.float64(), [2, 3])
    storage = pa.array(cells, type=wanted)
    assert storage.type == wanted.storage_type
    assert storage.to_pylist() == np.arange(12.0).reshape(2, 6).tolist()
    schema, array = cells.__arrow_c_array__(pa.field("x", wanted).__arrow_c_schema__())
    labelled = pa.array(Exported(schema, array))
    assert labelled.type == wanted
    np.testing.assert_array_equal(labelled.to_numpy_ndarray(), np.arange(12).reshape(2, 2, 3))


def test_a_tensor_column_crosses_both_ways_with_its_extension_and_its_memory():
    t = dlframe.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
    column = pa.array(DeviceOnly(t))
    assert isinstance(column.type, pa.FixedShapeTensorType) and column.type.shape == [3]
    back = dlframe.to_dlpack(DeviceOnly(column))
    assert back.shape == (4, 3) and data_address(back) == data_address(t)
    np.testing.assert_array_equal(np.from_dlpack(back), np.arange(12).reshape(4, 3))

"""Fake producers built with ctypes, for the fuzz, thread and soak tests.

- DLPack capsules, legacy ``"dltensor"`` (DLManagedTensor) and versioned ``"dltensor_versioned"``
  (DLManagedTensorVersioned), made with ``PyCapsule_New``. Their deleter is a ctypes callback that
  counts its calls; their capsule destructor calls it only while the capsule keeps its
  unconsumed name, as the DLPack Python spec asks of producers.
- Objects exposing ``__array_interface__`` dicts (any keys and values).
- Objects exposing ``__array_struct__`` capsules (numpy's ``PyArrayInterface``).
- Objects with ``__dlpack__`` / ``__dlpack_device__`` returning fake capsules.

Every ctypes object a fake hands to dlframe (structs, shape and stride arrays, the data buffer,
the callbacks) lives in ``REGISTRY`` until the test has seen the deleter run exactly once, and
stays there for good otherwise, so a late deleter call never touches freed memory.

Layouts are 64-bit (docs/conformance.md, "The C structs"); the structs are checked against those offsets below.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------
# DLPack ABI


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


assert ctypes.sizeof(DLTensor) == 48 and DLTensor.shape.offset == 24 and DLTensor.byte_offset.offset == 40
assert ctypes.sizeof(DLManagedTensor) == 64 and DLManagedTensor.deleter.offset == 56
assert ctypes.sizeof(DLManagedTensorVersioned) == 80 and DLManagedTensorVersioned.dl_tensor.offset == 32

READ_ONLY = 1 << 0
IS_COPIED = 1 << 1
IS_SUBBYTE_TYPE_PADDED = 1 << 2

#: (code, bits) -> numpy dtype, for the DLPack dtypes dlframe reads (lanes=1).
_DL_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}
DL_DTYPES = {
    (_DL_CODES[d.kind], d.itemsize * 8): d
    for d in map(np.dtype, ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                            "float16", "float32", "float64", "bool"])
}

# ---------------------------------------------------------------------------------------------
# C API through ctypes. Private prototypes, so that nothing here changes the shared
# ctypes.pythonapi function objects other tests configure.

_api = ctypes.pythonapi
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", _api)
)
_GetName = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", _api))

# ctypes runs a callback even when the interpreter has an exception set (a capsule or array
# dying while an exception unwinds), and the callback's own calls then turn that exception into
# a SystemError. So the callbacks below stay minimal, and the tests drop capsules and arrays in
# normal control flow (FakeTensor holds its capsule until drop()).
DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DELETER_LEGACY = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# Capsule names must outlive every capsule: module-level buffers, never freed.
_NAMES = {n: ctypes.create_string_buffer(n) for n in (b"dltensor", b"dltensor_versioned", b"not_dltensor")}
_UNCONSUMED = {ctypes.addressof(_NAMES[b"dltensor"]), ctypes.addressof(_NAMES[b"dltensor_versioned"])}

#: id -> everything one fake needs alive. Entries leave only through FakeTensor.release().
REGISTRY: dict[int, Any] = {}
#: id -> deleter calls (keyed by manager_ctx, which holds the id).
DELETES: dict[int, int] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def capsule_name(cap) -> bytes | None:
    return _GetName(cap)


#: Opt-in (TRACK_THREADS[0] = True): id -> threading.get_ident() of the thread that ran the
#: deleter. Off by default, as it adds a call to the callback (see above); the thread tests,
#: whose drops never race an exception, turn it on.
TRACK_THREADS = [False]
DELETE_THREADS: dict[int, int] = {}


# Callbacks bind what they use as defaults: a capsule that outlives the test can die at
# interpreter exit, after this module's globals are gone. A deleter that runs after its fake
# was released (a second call) finds no key and is reported by Python as an ignored KeyError.


def _delete_versioned(p, _deletes=DELETES, _track=TRACK_THREADS, _threads=DELETE_THREADS, _ident=threading.get_ident):
    key = p[0].manager_ctx
    _deletes[key] += 1
    if _track[0]:
        _threads[key] = _ident()


def _delete_legacy(p, _deletes=DELETES, _track=TRACK_THREADS, _threads=DELETE_THREADS, _ident=threading.get_ident):
    key = p[0].manager_ctx
    _deletes[key] += 1
    if _track[0]:
        _threads[key] = _ident()


# CPython PyCapsule (non-debug build): PyObject_HEAD (16 bytes), then pointer@16, name@24,
# context, destructor.
_VERSIONED_NAME = ctypes.addressof(_NAMES[b"dltensor_versioned"])


def _capsule_destructor(
    cap,
    _at=ctypes.c_void_p.from_address,
    _unconsumed=frozenset(_UNCONSUMED),
    _deletes=DELETES,
    _versioned=_VERSIONED_NAME,
):
    # The producer's destructor: releases the tensor only while the capsule keeps its
    # unconsumed name (a consumer renames it to used_* and calls the deleter itself). Reads the
    # capsule's fields from memory rather than through the C API on a dying object.
    name = _at(cap + 24).value
    if name in _unconsumed:
        managed = _at(cap + 16).value
        # manager_ctx (our key): offset 8 in the versioned struct, 48 in the legacy one
        _deletes[_at(managed + (8 if name == _versioned else 48)).value] += 1


_DELETER_V = DELETER_VERSIONED(_delete_versioned)
_DELETER_L = DELETER_LEGACY(_delete_legacy)
_DELETER_V_ADDR = ctypes.cast(_DELETER_V, ctypes.c_void_p).value
_DELETER_L_ADDR = ctypes.cast(_DELETER_L, ctypes.c_void_p).value
_DESTRUCTOR_FN = CAPSULE_DESTRUCTOR(_capsule_destructor)
_DESTRUCTOR_ADDR = ctypes.cast(_DESTRUCTOR_FN, ctypes.c_void_p).value


@dataclass(eq=False)
class FakeTensor:
    """One fake managed tensor and its capsule. The fake holds the capsule (``capsule``) until
    ``drop()``, so that the capsule never dies inside a consumer or while an exception unwinds."""

    key: int
    versioned: bool
    managed: ctypes.Structure
    keep: list = field(default_factory=list)
    capsule: Any = None

    @property
    def deletes(self) -> int:
        return DELETES[self.key]

    @property
    def address(self) -> int:
        return ctypes.addressof(self.managed)

    def consumed(self) -> bool:
        return self.capsule is not None and capsule_name(self.capsule).startswith(b"used_")

    def drop(self) -> None:
        """Drops the fake's reference to its capsule (its destructor runs if it was the last)."""
        self.capsule = None

    def release(self) -> None:
        """Forgets the fake once its deleter ran exactly once (otherwise it is kept for good)."""
        if self.deletes == 1 and self.capsule is None:
            with _lock:
                REGISTRY.pop(self.key, None)
                DELETES.pop(self.key, None)
                DELETE_THREADS.pop(self.key, None)


def _int64_array(values):
    if values is None:
        return None, None
    arr = (ctypes.c_int64 * max(len(values), 1))(*[int(v) for v in values])
    return arr, ctypes.addressof(arr)


def dlpack_capsule(
    data: int | None,
    shape: list[int] | None,
    strides: list[int] | None,
    *,
    dtype: tuple[int, int, int] = (2, 32, 1),
    device: tuple[int, int] = (1, 0),
    ndim: int | None = None,
    byte_offset: int = 0,
    versioned: bool = True,
    version: tuple[int, int] = (1, 3),
    flags: int = 0,
    name: bytes | None = None,
    keep: Any = None,
) -> FakeTensor:
    """A fake managed tensor in a fresh capsule. ``shape``/``strides`` None give NULL pointers;
    ``ndim`` defaults to ``len(shape)``; ``keep`` is whatever owns ``data`` (kept alive)."""
    key = next(_ids)
    shape_arr, shape_ptr = _int64_array(shape)
    strides_arr, strides_ptr = _int64_array(strides)
    if ndim is None:
        ndim = len(shape) if shape is not None else 0
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    t = managed.dl_tensor
    t.data = data or None
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(*dtype)
    t.shape = shape_ptr
    t.strides = strides_ptr
    t.byte_offset = byte_offset
    managed.manager_ctx = key
    managed.deleter = _DELETER_V_ADDR if versioned else _DELETER_L_ADDR
    if versioned:
        managed.version = DLPackVersion(*version)
        managed.flags = flags
    fake = FakeTensor(key=key, versioned=versioned, managed=managed, keep=[shape_arr, strides_arr, keep])
    if name is None:
        name = b"dltensor_versioned" if versioned else b"dltensor"
    with _lock:
        REGISTRY[key] = fake
        DELETES[key] = 0
    fake.capsule = _PyCapsule_New(fake.address, ctypes.addressof(_NAMES[name]), _DESTRUCTOR_ADDR)
    return fake


class DLPackProducer:
    """An object with ``__dlpack__``/``__dlpack_device__``; each ``__dlpack__`` call makes a fresh
    fake capsule from ``make()`` (recorded in ``made``). ``style`` picks how it behaves:

    - ``"modern"``: accepts every keyword;
    - ``"old"``: ``__dlpack__(stream=None)`` only (TypeError on newer keywords);
    - ``"raises"``: raises ``exc`` (an exception, or a callable that makes a fresh one);
    - ``"returns"``: returns ``value`` instead of a capsule.
    """

    def __init__(self, make, *, device=(1, 0), style="modern", exc=None, value=None):
        self._make = make
        self._device = device
        self.style = style
        self.exc = exc
        self.value = value
        self.made: list[FakeTensor] = []
        self.calls: list[dict] = []

    def __dlpack_device__(self):
        if isinstance(self._device, BaseException):
            raise self._device
        return self._device

    def __dlpack__(self, *args, **kwargs):
        self.calls.append(dict(kwargs, _args=args))
        if self.style == "old" and (args or set(kwargs) - {"stream"}):
            raise TypeError(f"__dlpack__() got an unexpected keyword argument {sorted(kwargs)}")
        if self.style == "raises":
            raise self.exc if isinstance(self.exc, BaseException) else self.exc()
        if self.style == "returns":
            return self.value
        fake = self._make()
        self.made.append(fake)
        return fake.capsule

    def drop(self) -> None:
        for fake in self.made:
            fake.drop()


# ---------------------------------------------------------------------------------------------
# __array_interface__ and __array_struct__


class Interface:
    """An object whose ``__array_interface__`` is the given value (on the instance, as numpy
    looks it up); ``keep`` owns the memory the dict points at."""

    def __init__(self, value, keep=None):
        self.__array_interface__ = value
        self._keep = keep


class OwnBuffer(bytearray):
    """Bytes whose ``__array_interface__`` has no ``data`` key: by the spec, the memory is the
    object's own buffer, described by the dict's shape, typestr, strides and offset."""

    def __init__(self, data, interface):
        super().__init__(data)
        self.__array_interface__ = interface


class PyArrayInterface(ctypes.Structure):
    _fields_ = [
        ("two", ctypes.c_int),
        ("nd", ctypes.c_int),
        ("typekind", ctypes.c_char),
        ("itemsize", ctypes.c_int),
        ("flags", ctypes.c_int),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("descr", ctypes.c_void_p),
    ]


assert ctypes.sizeof(PyArrayInterface) == 56 and PyArrayInterface.shape.offset == 24

NPY_C_CONTIGUOUS = 0x1
NPY_F_CONTIGUOUS = 0x2
NPY_ALIGNED = 0x100
NPY_NOTSWAPPED = 0x200
NPY_WRITEABLE = 0x400
NPY_ARR_HAS_DESCR = 0x800


class ArrayStruct:
    """An object whose ``__array_struct__`` is an (unnamed unless ``name``) capsule over a
    ``PyArrayInterface``; the struct, shape/strides arrays and data owner live in REGISTRY."""

    def __init__(
        self,
        data: int | None,
        shape: list[int] | None,
        strides: list[int] | None,
        *,
        typekind: bytes = b"f",
        itemsize: int = 4,
        nd: int | None = None,
        flags: int = NPY_NOTSWAPPED | NPY_ALIGNED,
        two: int = 2,
        named: bool = False,
        keep: Any = None,
    ):
        shape_arr, shape_ptr = _ssize_array(shape)
        strides_arr, strides_ptr = _ssize_array(strides)
        s = PyArrayInterface()
        s.two = two
        s.nd = len(shape) if nd is None and shape is not None else (nd or 0)
        s.typekind = typekind
        s.itemsize = itemsize
        s.flags = flags
        s.shape = shape_ptr
        s.strides = strides_ptr
        s.data = data or None
        s.descr = None
        self.key = next(_ids)
        with _lock:
            REGISTRY[self.key] = (s, shape_arr, strides_arr, keep)
        name = ctypes.addressof(_NAMES[b"not_dltensor"]) if named else None
        self.__array_struct__ = _PyCapsule_New(ctypes.addressof(s), name, None)


def _ssize_array(values):
    if values is None:
        return None, None
    arr = (ctypes.c_ssize_t * max(len(values), 1))(*[int(v) for v in values])
    return arr, ctypes.addressof(arr)


# ---------------------------------------------------------------------------------------------
# Memory that a layout really lies in


def strided_layout(shape, elem_strides, itemsize, pad=0, rng=None):
    """A byte buffer (numpy uint8, filled with random bytes) that holds every element of
    ``shape``/``elem_strides`` (strides in elements, any sign), and the byte offset of element
    zero inside it. Returns (buffer, offset_of_element_zero)."""
    numel = int(np.prod(shape, dtype=object)) if len(shape) else 1
    lo = hi = 0
    if numel:
        for d, s in zip(shape, elem_strides):
            reach = (d - 1) * s
            if reach < 0:
                lo += reach
            else:
                hi += reach
    nbytes = ((hi - lo + 1) * itemsize if numel else 0) + 2 * pad
    rng = rng or np.random.default_rng(nbytes)
    buf = rng.integers(0, 256, size=max(nbytes, 1), dtype=np.uint8)
    return buf, pad + (-lo) * itemsize


def expected_view(buf, offset, shape, elem_strides, dtype):
    """numpy's reading of the same bytes: what dlframe must return (bool: byte != 0)."""
    dtype = np.dtype(dtype)
    numel = int(np.prod(shape, dtype=object)) if len(shape) else 1
    if numel == 0:
        return np.zeros(shape, dtype)
    store = np.dtype(np.uint8) if dtype == np.bool_ else dtype
    byte_strides = tuple(s * dtype.itemsize for s in elem_strides)
    arr = np.ndarray(shape=tuple(shape), dtype=store, buffer=buf, offset=offset, strides=byte_strides)
    return (arr != 0) if dtype == np.bool_ else arr.copy()

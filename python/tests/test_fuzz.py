"""Property tests (hypothesis) over fake producers: DLPack capsules, __dlpack__ objects,
__array_interface__ dicts, typestrs, __array_struct__ capsules, arrow.fixed_shape_tensor metadata
and the Tensor's own __dlpack__ keywords.

Invariants: every call either succeeds with the values numpy reads from the same bytes, or
raises an ordinary exception with a message; never a crash or a panic; a DLPack deleter runs
exactly once, whether the import succeeds or fails; a consumed capsule cannot be consumed again.

A producer that lies about its memory is undefined behaviour, so every descriptor here either
describes memory inside a buffer the test allocated, or is invalid in a way dlframe must refuse
before it touches memory (negative or overflowing extents, ndim out of range, NULL data or shape,
bad dtypes or devices, a foreign major version, offsets or strides that leave the address space).

Profiles: the default ("ci") runs 200 derandomized examples per test (tests parametrized over
kinds of invalid input: a sixth of that, at least 25, per kind), no deadline, no example
database. DLFRAME_FUZZ=long runs DLFRAME_FUZZ_EXAMPLES (default 20000) random examples per test
(a sixth per kind) with no deadline; a failure prints the reproduction blob.

What these tests found is kept as regression tests (section 9 and the @example lines): the
inputs that crashed the interpreter run again in subprocesses, so a regression fails one test
instead of killing the run. A bug not fixed yet is listed in KNOWN_BUG with a strict xfail test
that reproduces it: flip its flag when the fix lands.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, event, example, given, note, settings
from hypothesis import strategies as st

import dlframe
import fakes

# ---------------------------------------------------------------------------------------------
# Profiles

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "dlframe-ci", max_examples=200, derandomize=True, deadline=None, database=None, suppress_health_check=_HEALTH
)
settings.register_profile(
    "dlframe-long",
    max_examples=int(os.environ.get("DLFRAME_FUZZ_EXAMPLES", "20000")),
    derandomize=False,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=_HEALTH,
)
PROFILE = "dlframe-long" if os.environ.get("DLFRAME_FUZZ") == "long" else "dlframe-ci"
fuzz = settings(settings.get_profile(PROFILE))
# For tests parametrized over many kinds: a share of the budget per kind.
fuzz_each = settings(fuzz, max_examples=max(25, fuzz.max_examples // 6))

KNOWN_BUG = {
    # arrow.fixed_shape_tensor metadata given as a JSON array is read positionally (serde's
    # sequence form of a struct: '[[2, 3], null, [1, 0]]' as shape/dim_names/permutation);
    # Arrow C++ (pyarrow) refuses anything but an object (test_tensor_metadata_must_be_an_object).
    "metadata_json_array": False,
}

ORDINARY = (BufferError, ValueError, TypeError, OverflowError, AttributeError, KeyError, IndexError, NotImplementedError)
I64_MAX = 2**63 - 1


def check_error(e: BaseException, allowed=ORDINARY) -> None:
    """An ordinary exception with a message: not a panic (pyo3 PanicException is a
    BaseException), a SystemError (a broken C-API contract) or a MemoryError."""
    assert isinstance(e, allowed) and not isinstance(e, (SystemError, MemoryError, RecursionError)), (
        f"{type(e).__module__}.{type(e).__qualname__}: {e}"
    )
    assert str(e).strip(), f"{type(e).__name__} with an empty message"


_LOG = os.environ.get("DLFRAME_FUZZ_LOG")


def trace(what) -> None:
    """With DLFRAME_FUZZ_LOG=path, appends the input about to be tried (written before the call,
    so that the last line names the input of a crash that kills the process)."""
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}: {what!r}\n")


def describe(msg) -> None:
    note(msg)
    trace(msg)


def attempt(fn, allowed=ORDINARY):
    """(True, result) or (False, exception) for an ordinary exception; anything else fails."""
    try:
        out = fn()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - panics are BaseExceptions: check them too
        check_error(e, allowed)
        note(f"raised {type(e).__name__}: {e}")
        event(f"raised {type(e).__name__}")
        # Without its traceback: the frames would keep the inputs (and their memory) alive.
        return False, e.with_traceback(None)
    event("succeeded")
    return True, out


def bits(x, dtype) -> np.ndarray:
    """Values as comparable bit patterns (NaN payloads and -0.0 included; bool as byte != 0)."""
    dtype = np.dtype(dtype)
    x = np.ascontiguousarray(x)
    if dtype == np.bool_:
        return x.view(np.uint8) != 0 if x.dtype == np.bool_ else x != 0
    return x.view(f"u{dtype.itemsize}")


def assert_same(got, expected, dtype) -> None:
    got = np.asarray(got)
    assert got.shape == expected.shape, f"shape {got.shape} != {expected.shape}"
    np.testing.assert_array_equal(bits(got, dtype), bits(expected, dtype))


def arrow_values(arr: pa.Array) -> np.ndarray:
    """A dlframe result as numpy: fixed_shape_tensor decoded from its storage and metadata."""
    if isinstance(arr.type, pa.FixedShapeTensorType):
        shape = list(arr.type.shape)
        perm = arr.type.permutation or list(range(len(shape)))
        flat = arr.storage.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape([len(arr), *shape]).transpose([0, *[1 + p for p in perm]])
    return arr.to_numpy(zero_copy_only=False)


def c_strides(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return out[::-1]


def f_strides(shape):
    out, acc = [], 1
    for d in shape:
        out.append(acc)
        acc *= max(d, 1)
    return out


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


def settle(done) -> bool:
    """True once ``done()`` holds: at once when reference counting suffices, else after a full
    gc.collect() (a full collection per example would dominate the run time)."""
    if done():
        return True
    gc.collect()
    return done()


# ---------------------------------------------------------------------------------------------
# Memory and layouts


@st.composite
def layouts(draw, max_ndim=4, max_dim=5):
    """(shape, element strides, null_strides): strides of any sign, zero included."""
    ndim = draw(st.integers(0, max_ndim))
    shape = draw(st.lists(st.integers(0, max_dim), min_size=ndim, max_size=ndim))
    mode = draw(st.sampled_from(["c", "f", "random", "null"]))
    if mode in ("c", "null"):
        strides = c_strides(shape)
    elif mode == "f":
        strides = f_strides(shape)
    else:
        strides = draw(st.lists(st.integers(-6, 6), min_size=ndim, max_size=ndim))
    return shape, strides, mode == "null"


@st.composite
def memory(draw, shape, strides, itemsize):
    """A buffer holding every element of the layout and the byte offset of element zero, which
    may be misaligned."""
    seed = draw(st.integers(0, 2**32 - 1))
    pad = draw(st.integers(0, 16)) + itemsize
    buf, off = fakes.strided_layout(shape, strides, itemsize, pad=pad, rng=np.random.default_rng(seed))
    off += draw(st.integers(0, itemsize - 1))
    return buf, off


DEVICES_HOST = [(1, 0), (1, 0), (1, 0), (1, 3), (3, 0), (11, 0), (13, 0)]


@st.composite
def valid_dlpack(draw):
    (code, nbits), np_dtype = draw(st.sampled_from(sorted(fakes.DL_DTYPES.items())))
    shape, strides, null_strides = draw(layouts())
    buf, off = draw(memory(shape, strides, np_dtype.itemsize))
    byte_offset = draw(st.one_of(st.just(0), st.integers(0, off)))
    flags = draw(
        st.one_of(st.integers(0, 7), st.integers(0, 2**64 - 1), st.sampled_from([0, fakes.READ_ONLY, fakes.IS_COPIED]))
    )
    return dict(
        buf=buf,
        off=off,
        shape=shape,
        strides=strides,
        null_strides=null_strides,
        dtype=(code, nbits, 1),
        np_dtype=np_dtype,
        byte_offset=byte_offset,
        versioned=draw(st.booleans()),
        version=(1, draw(st.sampled_from([0, 1, 2, 3, 4, 255]))),
        flags=flags,
        device=draw(st.sampled_from(DEVICES_HOST)),
    )


def make_fake(case) -> fakes.FakeTensor:
    buf = case["buf"]
    data = buf.ctypes.data + case["off"] - case["byte_offset"] if case.get("data") is None else case["data"]
    return fakes.dlpack_capsule(
        data,
        case["shape"],
        None if case["null_strides"] else case["strides"],
        dtype=case["dtype"],
        device=case["device"],
        ndim=case.get("ndim"),
        byte_offset=case["byte_offset"],
        versioned=case["versioned"],
        version=case["version"],
        flags=case["flags"],
        name=case.get("name"),
        keep=buf,
    )


def expected_of(case):
    return fakes.expected_view(case["buf"], case["off"], case["shape"], case["strides"], case["np_dtype"])


def finish(fakes_made, expected_deletes=1):
    """Drops the fakes' own references (the caller dropped its results) and checks that each
    deleter ran exactly once, after a gc.collect() when it has not yet."""
    for f in fakes_made:
        f.drop()
    settle(lambda: all(f.deletes == expected_deletes for f in fakes_made))
    for f in fakes_made:
        assert f.deletes == expected_deletes, f"deleter ran {f.deletes} times, expected {expected_deletes}"
        f.release()


def check_arrow_result(arr, case):
    expected = expected_of(case)
    got = arrow_values(arr)
    if len(case["shape"]) == 0:
        expected = expected.reshape(1)
    assert_same(got, expected, case["np_dtype"])


def check_tensor_result(t, case, copy):
    shape = tuple(case["shape"])
    assert t.shape == shape and t.ndim == len(shape)
    if "versioned" in case:  # a DLPack capsule
        # A versioned capsule's flags say how the memory may be used (legacy ones carry none):
        # IS_COPIED memory is the consumer's own, so writable even if READ_ONLY is also set.
        flags = case["flags"] if case["versioned"] else 0
        copied = bool(flags & fakes.IS_COPIED)
        # An IS_COPIED import is the Tensor's own copy: every view of it is shared, so read-only.
        assert (t.copied, t.readonly) == (copied, bool(flags & fakes.READ_ONLY) or copied), hex(flags)
    expected = expected_of(case)
    ok, got = attempt(lambda: np.from_dlpack(t))
    if case["device"][0] == 1:
        assert ok, got
    if ok:
        assert_same(got, expected, case["np_dtype"])
    del got
    ok, got = attempt(lambda: np.asarray(t))
    if ok:
        assert_same(got, expected, case["np_dtype"])
    del got
    ok, arr = attempt(lambda: t.to_arrow(copy=copy))
    if not ok:
        assert copy is False and isinstance(arr, BufferError), arr
    else:
        check_arrow_result(arr, case)


# ---------------------------------------------------------------------------------------------
# 1. DLPack capsules that describe real memory


@fuzz
@given(
    case=valid_dlpack(),
    entry=st.sampled_from(["capsule", "producer", "old_producer", "tensor"]),
    copy=st.sampled_from([None, True, False]),
)
@example(  # 0-d legacy tensor with NULL shape and strides, through dlframe.tensor
    case=dict(
        buf=np.arange(8, dtype=np.uint8), off=0, shape=[], strides=[], null_strides=True, dtype=(1, 8, 1),
        np_dtype=np.dtype("uint8"), byte_offset=0, versioned=False, version=(1, 0), flags=0, device=(1, 0),
    ),
    entry="tensor", copy=None,
)
def test_dlpack_capsules_over_real_memory(case, entry, copy):
    describe(f"shape={case['shape']} strides={case['strides']} dtype={case['dtype']} off={case['off']}")
    made = []
    if entry in ("capsule", "tensor"):
        fake = make_fake(case)
        made.append(fake)
        if entry == "capsule":
            ok, out = attempt(lambda: dlframe.from_dlpack(fake.capsule, copy=copy))
        else:
            ok, out = attempt(lambda: dlframe.tensor(fake.capsule))
        assert fake.consumed(), "a valid capsule is consumed (renamed used_*)"
        for consume in (dlframe.from_dlpack, dlframe.tensor):
            with pytest.raises(ValueError, match="consumed"):
                consume(fake.capsule)
    else:
        producer = fakes.DLPackProducer(
            lambda: make_fake(case), device=case["device"], style="modern" if entry == "producer" else "old"
        )
        ok, out = attempt(lambda: dlframe.from_dlpack(producer, copy=copy))
        made = producer.made
        assert len(made) == 1, f"__dlpack__ made {len(made)} capsules"
    if entry == "tensor":
        assert ok, out
        check_tensor_result(out, case, copy)
    elif ok:
        check_arrow_result(out, case)
        if copy is False and numel(case["shape"]):
            lo, hi = buffer_range(case["buf"])
            assert any(b is not None and lo <= b.address < hi for b in out.buffers()), "copy=False copied"
            event("copy=False shared")
    else:
        assert copy is False and isinstance(out, BufferError), f"{type(out).__name__}: {out}"
        assert not arrow_can_share(case), f"copy=False refused memory Arrow can share: {out}"
    del out
    finish(made)


def arrow_can_share(case) -> bool:
    """Whether an Arrow array can be a view of the case's memory: CPU, C order, elements aligned
    to their size, and not bool (which Arrow bit-packs)."""
    item = case["np_dtype"].itemsize
    return (
        case["device"] == (1, 0)
        and case["np_dtype"] != np.bool_
        and (case["null_strides"] or case["strides"] == c_strides(case["shape"]))
        and (case["buf"].ctypes.data + case["off"]) % item == 0
    )


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 2)])
def test_copy_false_shares_contiguous_aligned_memory(dtype, shape):
    src = np.arange(math.prod(shape)).astype(dtype).reshape(shape)
    fake = fakes.dlpack_capsule(src.ctypes.data, list(shape), c_strides(shape), dtype=(*next(
        k for k, v in fakes.DL_DTYPES.items() if v == src.dtype), 1), keep=src)
    for x in (src, fake.capsule):
        arr = dlframe.from_dlpack(x, copy=False)
        values = arr if len(shape) == 1 else arr.storage.flatten()
        assert values.buffers()[1].address == src.ctypes.data, "copy=False shares the producer's memory"
        assert_same(arrow_values(arr), src, src.dtype)
        del arr, values
    finish([fake])


def test_read_only_flags_of_a_real_producer_are_kept():
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    t = dlframe.tensor(ro)
    assert t.readonly and not t.copied
    assert not np.from_dlpack(t).flags.writeable
    w = dlframe.tensor(np.arange(6, dtype=np.float32))
    assert not w.readonly and not w.copied


# ---------------------------------------------------------------------------------------------
# 2. DLPack capsules dlframe must refuse before touching memory

INVALID_KINDS = [
    "negative_extent",
    "ndim_too_big",
    "ndim_huge_short_arrays",
    "ndim_negative",
    "overflow_numel",
    "overflow_span",
    "null_data",
    "null_shape",
    "bad_dtype",
    "unknown_device",
    "non_host_device",
    "major_version",
    "byte_offset_overflow",
    "address_wrap",
    "stride_below_zero",
    "bad_name",
]
KNOWN_DEVICES = {1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}
OUTSIDE = "reaches outside the address space"
#: What the refusal of each kind of invalid capsule must say (a regex searched in the message).
INVALID_SAYS = {
    "negative_extent": "negative extent",
    "ndim_too_big": r"ndim \d+ is outside",
    "ndim_huge_short_arrays": r"ndim \d+ is outside",
    "ndim_negative": r"ndim -\d+ is outside",
    "overflow_numel": "overflows",
    "overflow_span": "overflows",
    "null_data": "NULL data",
    "null_shape": "NULL shape",
    "bad_dtype": r"unsupported dtype \(code=",
    # A producer's __dlpack_device__ is asked first: its device is refused as not the host.
    "unknown_device": r"unsupported device \(device_type=|DLPack device \(.*Arrow needs host memory",
    "non_host_device": "Arrow needs host memory",
    "major_version": r"DLPack version \d+\.\d+ is not supported",
    "byte_offset_overflow": r"byte_offset \d+ overflows",
    "address_wrap": OUTSIDE,
    "stride_below_zero": OUTSIDE,
    "bad_name": "not a DLPack capsule",
}
assert set(INVALID_SAYS) == set(INVALID_KINDS)


def assert_refused(kind, ok, out, says):
    assert not ok, f"{kind}: accepted {out!r}"
    assert re.search(says[kind], str(out)), f"{kind}: refused for another reason: {type(out).__name__}: {out}"


@st.composite
def invalid_dlpack(draw, kind):
    case = draw(valid_dlpack())
    case["null_strides"] = False
    itemsize = case["np_dtype"].itemsize
    shape, strides = list(case["shape"]), list(case["strides"])

    def nonempty(min_ndim=1):
        n = draw(st.integers(min_ndim, 4))
        return draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))

    if kind == "negative_extent":
        shape = nonempty()
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.integers(-(2**63), -1))
        strides = c_strides([max(d, 1) for d in shape])
    elif kind == "ndim_too_big":
        n = draw(st.integers(65, 200))
        shape, strides = [1] * n, [1] * n
    elif kind == "ndim_huge_short_arrays":
        case["ndim"] = draw(st.integers(65, 2**31 - 1))
        shape, strides = [1] * 70, [1] * 70
    elif kind == "ndim_negative":
        case["ndim"] = draw(st.integers(-(2**31), -1))
    elif kind == "overflow_numel":
        shape = nonempty()
        k = draw(st.integers(0, len(shape) - 1))
        # big * itemsize > I64_MAX / 2, times an extent >= 2: more bytes than isize::MAX
        shape[k] = draw(st.integers(I64_MAX // itemsize // 2 + 1, I64_MAX // itemsize))
        shape.insert(draw(st.integers(0, len(shape))), draw(st.integers(2, 9)))
        strides = draw(st.lists(st.integers(-3, 3), min_size=len(shape), max_size=len(shape)))
    elif kind == "overflow_span":
        shape = nonempty()
        k = draw(st.integers(0, len(shape) - 1))
        shape[k] = max(shape[k], 2)
        need = -(-(2**63) // ((shape[k] - 1) * itemsize))
        strides = c_strides(shape)
        strides[k] = draw(st.integers(min(need, I64_MAX), I64_MAX)) * draw(st.sampled_from([1, -1]))
    elif kind == "null_data":
        shape = nonempty()
        strides = c_strides(shape)
        case["data"] = 0
        case["byte_offset"] = draw(st.sampled_from([0, 0, 8, 2**40]))
    elif kind == "null_shape":
        shape = None
        case["ndim"] = draw(st.integers(1, 64))
        strides = [1] * case["ndim"]
    elif kind == "bad_dtype":
        code, nbits, lanes = draw(
            st.one_of(
                st.tuples(st.integers(18, 255), st.sampled_from([8, 16, 32, 64]), st.just(1)),
                st.tuples(st.integers(0, 17), st.just(0), st.just(1)),
                st.tuples(st.integers(0, 17), st.sampled_from([8, 16, 32, 64]), st.just(0)),
                st.tuples(st.just(3), st.sampled_from([8, 16, 32, 64]), st.just(1)),
            )
        )
        case["dtype"] = (code, nbits, lanes)
    elif kind == "unknown_device":
        dev_type = draw(st.integers(-(2**31), 2**31 - 1).filter(lambda d: d not in KNOWN_DEVICES))
        case["device"] = draw(
            st.sampled_from([(dev_type, 0), (1, draw(st.integers(-(2**31), -1))), (3, -1)])
        )
    elif kind == "non_host_device":
        case["device"] = (draw(st.sampled_from(sorted(KNOWN_DEVICES - {1, 3, 11, 13}))), draw(st.integers(0, 7)))
    elif kind == "major_version":
        case["versioned"] = True
        case["version"] = (draw(st.sampled_from([0, 2, 3, 255, 2**32 - 1])), draw(st.integers(0, 2**32 - 1)))
        # Garbage everywhere past `flags`: the ABI rule forbids reading it.
        case["ndim"] = draw(st.integers(-(2**31), 2**31 - 1))
        case["data"] = draw(st.sampled_from([0, 8, 2**64 - 8]))
        case["dtype"] = (draw(st.integers(0, 255)), draw(st.integers(0, 255)), draw(st.integers(0, 2**16 - 1)))
        case["garbage_pointers"] = True
    elif kind == "byte_offset_overflow":
        shape = nonempty()
        strides = c_strides(shape)
        case["data"] = case["buf"].ctypes.data
        # Past isize::MAX, or wrapping data + byte_offset past 2**64 (data is above 4096).
        # (The draw must not depend on the buffer's address: hypothesis replays draws.)
        case["byte_offset"] = draw(st.one_of(st.integers(2**63, 2**64 - 1), st.integers(2**64 - 4096, 2**64 - 1)))
    elif kind == "address_wrap":  # the last element lies past 2**64 - 1
        shape = nonempty() + [2]
        strides = c_strides(shape)
        span = numel(shape) * itemsize
        case["data"] = 2**64 - draw(st.integers(1, span - 1))
        case["byte_offset"] = 0
    elif kind == "stride_below_zero":
        shape = nonempty()
        k = draw(st.integers(0, len(shape) - 1))
        shape[k] = max(shape[k], 2)
        strides = c_strides(shape)
        # Reach 2**48 bytes or more below element zero, which lies in user space (< 2**47 on
        # x86-64 and arm64), without overflowing the span (< 2**61 bytes).
        step = (shape[k] - 1) * itemsize
        strides[k] = -draw(st.integers(2**48 // step + 1, 2**58 // step))
        case["byte_offset"] = 0
    elif kind == "bad_name":
        case["name"] = b"not_dltensor"
    case["shape"], case["strides"] = shape, strides
    case["kind"] = kind
    return case


def make_invalid_fake(case):
    fake = make_fake(case)
    if case.get("garbage_pointers"):
        t = fake.managed.dl_tensor
        t.shape = 16  # never readable: a read would crash
        t.strides = 24
    return fake


@pytest.mark.parametrize("kind", INVALID_KINDS)
@fuzz_each
@given(
    data=st.data(),
    entry=st.sampled_from(["capsule", "producer", "tensor"]),
    copy=st.sampled_from([None, True, False]),
)
def test_invalid_dlpack_capsules_are_refused(data, kind, entry, copy):
    if kind == "non_host_device" and entry == "tensor":
        entry = "capsule"  # a Tensor may hold device memory: only the Arrow import must refuse it
    case = data.draw(invalid_dlpack(kind))
    describe(f"kind={kind} shape={case['shape']} strides={case['strides']} ndim={case.get('ndim')}")
    if entry == "producer":
        producer = fakes.DLPackProducer(lambda: make_invalid_fake(case), device=case["device"])
        ok, out = attempt(lambda: dlframe.from_dlpack(producer, copy=copy))
        made = producer.made
    else:
        fake = make_invalid_fake(case)
        made = [fake]
        call = (lambda: dlframe.from_dlpack(fake.capsule, copy=copy)) if entry == "capsule" else (
            lambda: dlframe.tensor(fake.capsule)
        )
        ok, out = attempt(call)
        if kind != "bad_name":
            assert fake.consumed(), "the capsule is consumed (and its tensor released) even when refused"
            with pytest.raises(ValueError, match="consumed"):
                dlframe.from_dlpack(fake.capsule)
    assert_refused(kind, ok, out, INVALID_SAYS)
    del out
    finish(made, expected_deletes=0 if kind == "bad_name" else 1)


# ---------------------------------------------------------------------------------------------
# 3. Objects with __dlpack__ / __dlpack_device__ that misbehave


class Weird:
    def __repr__(self):
        return "<Weird>"


@fuzz
@given(
    case=valid_dlpack(),
    style=st.sampled_from(["modern", "old", "raises", "returns"]),
    exc=st.sampled_from([BufferError, TypeError, RuntimeError, ValueError]),
    value=st.sampled_from([None, 1, "capsule", b"x", Weird(), (1, 0)]),
    device=st.one_of(
        st.sampled_from([(1, 0), (1, 0), (2, 0), (99, 0), (1,), "cpu", None, (1, 0, 0), (2**40, 0), ("1", "0")]),
        st.just(ValueError),
    ),
    copy=st.sampled_from([None, True, False]),
)
def test_dlpack_producers_that_misbehave(case, style, exc, value, device, copy):
    case = dict(case, device=(1, 0))
    trace(f"style={style} exc={exc} value={value!r} device={device!r} copy={copy} case={case!r}")
    producer = fakes.DLPackProducer(
        lambda: make_fake(case), device=device, style=style, exc=lambda: exc(f"{exc.__name__} from __dlpack__"), value=value
    )
    if isinstance(device, type) and issubclass(device, Exception):
        producer._device = device("from __dlpack_device__")
    # The producer's own exceptions propagate, whatever their type.
    ok, out = attempt(lambda: dlframe.from_dlpack(producer, copy=copy), allowed=(*ORDINARY, RuntimeError))
    note(f"calls={producer.calls}")
    if ok:
        check_arrow_result(out, case)
    del out
    finish(producer.made)


@fuzz
@given(case=valid_dlpack(), copy=st.sampled_from([None, True, False]))
def test_a_used_or_foreign_capsule_from_dunder_dlpack_is_refused(case, copy):
    fake = make_fake(case)
    first = dlframe.from_dlpack(fake.capsule)
    producer = fakes.DLPackProducer(None, style="returns", value=fake.capsule)
    for x in (producer, fake.capsule):
        ok, out = attempt(lambda: dlframe.from_dlpack(x, copy=copy))
        assert not ok and isinstance(out, ValueError)
    ok, out = attempt(lambda: dlframe.from_dlpack(fakes.ArrayStruct(None, [0], None).__array_struct__))
    assert not ok
    del first, out
    finish([fake])


# ---------------------------------------------------------------------------------------------
# 4. __array_interface__ dicts over real memory

TYPESTRS = {
    "bool": ["|b1", "<b1", "=b1"],
    "int8": ["|i1", "<i1", "=i1"],
    "uint8": ["|u1", "<u1"],
    "int16": ["<i2", "=i2", "|i2"],
    "uint16": ["<u2"],
    "int32": ["<i4", "=i4"],
    "uint32": ["<u4"],
    "int64": ["<i8", "<M8[ns]", "<M8[us]", "<m8[s]", "<m8[ms]", "<i08"],
    "uint64": ["<u8"],
    "float16": ["<f2"],
    "float32": ["<f4", "=f4", "|f4"],
    "float64": ["<f8"],
}
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=6,
)


@st.composite
def valid_interface(draw):
    np_name = draw(st.sampled_from(sorted(TYPESTRS)))
    np_dtype = np.dtype(np_name)
    typestr = draw(st.sampled_from(TYPESTRS[np_name]))
    shape, strides, null_strides = draw(layouts())
    buf, off = draw(memory(shape, strides, np_dtype.itemsize))
    seq = draw(st.sampled_from([tuple, list]))
    d = {
        "shape": seq(shape),
        "typestr": typestr,
        "data": (buf.ctypes.data + off, draw(st.booleans())),
        "version": draw(st.sampled_from([3, 3, 2, 99, "3"])),
    }
    if null_strides:
        if draw(st.booleans()):
            d["strides"] = None
    else:
        d["strides"] = seq(s * np_dtype.itemsize for s in strides)
    for key in draw(st.lists(st.sampled_from(["descr", "mask", "offset", "extra", "stream"]), unique=True, max_size=3)):
        d[key] = draw(JUNK)
    return dict(
        d=d, buf=buf, off=off, shape=shape, strides=strides, np_dtype=np_dtype, device=(1, 0), null_strides=null_strides
    )


def buffer_range(buf):
    return buf.ctypes.data, buf.ctypes.data + buf.nbytes


@fuzz
@given(case=valid_interface(), entry=st.sampled_from(["from_dlpack", "tensor"]), copy=st.sampled_from([None, True, False]))
@example(  # datetime typestrs keep their unit: values compare as int64
    case=dict(
        d={"shape": (2,), "typestr": "<M8[ns]", "data": (None, False), "version": 3},
        buf=np.arange(16, dtype=np.uint8), off=0, shape=[2], strides=[1], np_dtype=np.dtype("int64"),
        device=(1, 0), null_strides=True,
    ),
    entry="from_dlpack", copy=None,
)
def test_array_interface_dicts_over_real_memory(case, entry, copy):
    d = case["d"]
    if d["data"][0] is None:
        d["data"] = (case["buf"].ctypes.data + case["off"], d["data"][1])
    obj = fakes.Interface(d, keep=case["buf"])
    ref = weakref.ref(obj)
    describe(repr(d))
    if entry == "tensor":
        ok, t = attempt(lambda: dlframe.tensor(obj))
        assert ok, t
        del obj
        check_tensor_result(t, case, copy)
        assert t.readonly == bool(d["data"][1])
        del t
        assert settle(lambda: ref() is None), "the Tensor released the exporter"
        return
    ok, arr = attempt(lambda: dlframe.from_dlpack(obj, copy=copy))
    del obj
    if not ok:
        assert copy is False and isinstance(arr, BufferError), arr
        return
    lo, hi = buffer_range(case["buf"])
    shared = any(b is not None and lo <= b.address < hi for b in arr.buffers())
    if shared:
        assert ref() is not None, "an Arrow array over the exporter's memory keeps the exporter alive"
    check_arrow_result(arr, case)
    del arr
    assert settle(lambda: ref() is None), "the exporter is released with the Arrow array"


@fuzz
@given(d=st.dictionaries(st.sampled_from(["shape", "typestr", "data", "strides", "version", "descr", "mask", "offset"]) | st.text(max_size=4), JUNK, max_size=7), as_dict=st.booleans())
@example(d={"shape": (3,), "typestr": "<f4", "data": (0, False), "version": 3}, as_dict=True)
@example(d={"shape": (0,), "typestr": "<f4", "data": (0, False), "version": 3}, as_dict=True)
@example(d={"shape": (), "typestr": "<f4", "data": (0, False), "version": 3}, as_dict=True)
@example(d={"shape": (2**62, 2**62), "typestr": "<f4", "data": (0, False), "version": 3}, as_dict=True)
def test_array_interface_garbage_dicts(d, as_dict):
    """Arbitrary keys and values. A data pointer here is never real memory: any int pointer is
    replaced by 0 (NULL), so a dict is either refused or describes no elements."""
    data = d.get("data")
    if isinstance(data, (tuple, list)) and data and isinstance(data[0], int) and not isinstance(data[0], bool):
        d["data"] = (0, *data[1:])
    elif isinstance(data, int) and not isinstance(data, bool):
        d["data"] = 0
    value = d if as_dict else list(d.items())
    trace(value)
    obj = fakes.Interface(value)
    for call in (lambda: dlframe.from_dlpack(obj), lambda: dlframe.tensor(obj)):
        ok, out = attempt(call)
        if ok:
            if isinstance(out, dlframe.Tensor):
                count = math.prod(out.shape)
            else:
                count = len(out)
                if isinstance(out.type, pa.FixedShapeTensorType):
                    count *= math.prod(out.type.shape)
            assert count == 0, f"{d!r} describes NULL memory, yet {count} elements came back"


IFACE_INVALID = [
    "negative_extent",
    "ndim_too_big",
    "overflow_numel",
    "overflow_span",
    "null_data",
    "strides_length",
    "partial_stride",
    "address_wrap",
    "byte_order",
    "bad_typestr",
    "data_not_a_pair",
    "not_a_dict",
    "missing_key",
]
IFACE_INVALID_SAYS = {
    "negative_extent": "negative extent",
    "ndim_too_big": r"ndim \d+ exceeds the limit",
    "overflow_numel": "overflows",
    "overflow_span": "overflows",
    "null_data": "data is NULL",
    "strides_length": r"\d+ strides for \d+ dimensions",
    "partial_stride": r"not a multiple of the itemsize|unsupported dtype <f3",  # (<f3 for 1-byte items)
    "address_wrap": OUTSIDE,
    "byte_order": r"non-native byte order|unsupported dtype <c8",  # (<c8 for 1-byte items)
    # (a typestr that is not a str is refused by the argument conversion, which names the type)
    "bad_typestr": r"typestr|unsupported dtype|is not an instance of 'str'",
    "data_not_a_pair": re.escape("data must be a (pointer, read_only) tuple"),
    "not_a_dict": "must be a dict",
    "missing_key": "missing (shape|typestr)",
}
assert set(IFACE_INVALID_SAYS) == set(IFACE_INVALID)


@pytest.mark.parametrize("kind", IFACE_INVALID)
@fuzz_each
@given(case=valid_interface(), data=st.data())
def test_invalid_array_interface_dicts_are_refused(case, data, kind):
    """Dicts over a real buffer, broken in one way dlframe must notice before reading."""
    d = dict(case["d"])
    item = case["np_dtype"].itemsize
    ptr = d["data"][0]
    n = data.draw(st.integers(1, 4))
    nonempty = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    if kind == "negative_extent":
        nonempty[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(-(2**63), -1))
        d["shape"], d["strides"] = tuple(nonempty), None
    elif kind == "ndim_too_big":
        k = data.draw(st.integers(65, 300))
        d["shape"], d["strides"] = (1,) * k, None
    elif kind == "overflow_numel":
        nonempty[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(I64_MAX // item // 2 + 1, I64_MAX // item))
        nonempty.append(data.draw(st.integers(2, 9)))
        d["shape"], d["strides"] = tuple(nonempty), None
    elif kind == "overflow_span":
        # (extent - 1) * |byte stride| >= 2**63: more bytes than isize::MAX between two elements.
        # (A smaller span pointing outside the buffer would be a lie, not an invalid layout.)
        first = data.draw(st.integers(3, 9))
        stride = data.draw(st.integers(-(-(2**63) // ((first - 1) * item)), I64_MAX // item)) * item
        d["shape"] = (first, *nonempty)
        d["strides"] = (stride * data.draw(st.sampled_from([1, -1])),) + tuple(s * item for s in c_strides(nonempty))
    elif kind == "null_data":
        d["shape"], d["strides"], d["data"] = tuple(nonempty), None, (0, data.draw(st.booleans()))
    elif kind == "strides_length":
        d["shape"] = tuple(nonempty)
        d["strides"] = tuple(item for _ in range(n + data.draw(st.sampled_from([-1, 1, 2]))))
    elif kind == "partial_stride":
        if item == 1:
            d["typestr"] = "<f3"
        else:
            d["shape"], d["strides"] = (2,), (item + data.draw(st.integers(1, item - 1)),)
    elif kind == "address_wrap":
        # Element 1 lies 2**48 bytes or more below element 0: below address 0.
        d["shape"], d["strides"] = (2,), (-data.draw(st.integers(2**48 // item + 1, 2**58 // item)) * item,)
    elif kind == "byte_order":
        if item == 1:
            d["typestr"] = "<c8"
        else:
            d["typestr"] = ">" + d["typestr"][1:]
    elif kind == "bad_typestr":
        d["typestr"] = data.draw(st.sampled_from(["", "<", "<f", "f4", "<f4x", "<c16", "|V8", "<U2", "|O8", "<f+4", 4, None, b"<f4"]))
        if d["typestr"] is None:
            del d["typestr"]
    elif kind == "data_not_a_pair":
        d["data"] = data.draw(st.sampled_from([(ptr,), (ptr, False, 0), ptr, "0x10", (str(ptr), False), (float(ptr), False), (-ptr, False), (2**64 + ptr, False)]))
    elif kind == "not_a_dict":
        d = data.draw(st.sampled_from([list(d.items()), tuple(d.values()), None, 3, "dict", json.dumps({"shape": [1]})]))
    elif kind == "missing_key":
        d.pop(data.draw(st.sampled_from(["shape", "typestr"])))
    describe(repr(d))
    obj = fakes.Interface(d, keep=case["buf"])
    for call in (lambda: dlframe.from_dlpack(obj), lambda: dlframe.tensor(obj)):
        ok, out = attempt(call)
        assert_refused(kind, ok, out if not ok else d, IFACE_INVALID_SAYS)


# ---------------------------------------------------------------------------------------------
# 5. typestr strings through __array_interface__

TYPESTR_TEXT = st.one_of(
    st.text(max_size=10),
    st.from_regex(r"\A[<>|=!@]?[?biufcmMOSUVtaxz]\d{0,3}(\[[a-zA-Z0-9]{0,4}\])?\Z"),
    st.sampled_from([t for ts in TYPESTRS.values() for t in ts] + [">f4", "<c8", "|V8", "<M8[xx]", "<f", "f4"]),
)


def numpy_dtype_of(typestr):
    try:
        return np.dtype(typestr)
    except Exception:  # noqa: BLE001 - numpy's opinion only
        return None


@fuzz
@given(typestr=TYPESTR_TEXT, n=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
@example(typestr="<M8[D]", n=2, seed=0)
@example(typestr="<i0", n=2, seed=0)
@example(typestr="<f99999999999999999999", n=2, seed=0)
def test_typestr_strings(typestr, n, seed):
    buf = np.random.default_rng(seed).integers(0, 256, size=n * 16 + 16, dtype=np.uint8)  # 16 bytes per element
    trace(typestr)
    obj = fakes.Interface({"shape": (n,), "typestr": typestr, "data": (buf.ctypes.data, True), "version": 3}, keep=buf)
    ok, arr = attempt(lambda: dlframe.from_dlpack(obj))
    if not ok:
        return
    nd = numpy_dtype_of(typestr)
    assert nd is not None, f"dlframe accepted {typestr!r}, which numpy cannot parse"
    assert nd.isnative or nd.itemsize == 1, f"dlframe accepted non-native {typestr!r}"
    assert nd.kind in "biufmM", f"dlframe accepted {typestr!r} of kind {nd.kind}"
    got = arrow_values(arr)
    assert got.shape == (n,) and got.dtype.itemsize == nd.itemsize, (got.dtype, nd)
    if nd.kind == "b":
        assert_same(got, np.frombuffer(buf, np.uint8, count=n) != 0, bool)
    else:
        store = np.dtype(f"u{nd.itemsize}")
        assert_same(got.view(store), np.frombuffer(buf, store, count=n), store)


# Found by the fuzz (fixed in 5e10725): the exporter outlived its last Arrow array until the next
# call into dlframe, because pyo3 only queued the decref of a Py dropped from Arrow's release.
@pytest.mark.parametrize("protocol", ["__array_interface__", "__array_struct__"])
def test_exporter_is_released_with_its_last_arrow_array(protocol):
    src = np.arange(1000, dtype=np.float64)

    class Exporter:
        pass

    obj = Exporter()
    setattr(obj, protocol, getattr(src, protocol))
    obj.keep = src
    ref = weakref.ref(obj)
    arr = dlframe.from_dlpack(obj)
    del obj
    assert ref() is not None and arr.to_numpy()[7] == 7.0
    del arr
    gc.collect()
    assert ref() is None, "the exporter is still alive after its Arrow array died"


# Found by the fuzz (fixed in 40c9656): '<M8[xx]' was accepted as int64; numpy refuses it.
def test_datetime_typestr_with_unknown_unit_is_refused():
    buf = np.zeros(16, np.uint8)
    for typestr in ("<M8[xx]", "<m8[abc]"):
        with pytest.raises((ValueError, BufferError, TypeError)):
            dlframe.from_dlpack(fakes.Interface({"shape": (2,), "typestr": typestr, "data": (buf.ctypes.data, True), "version": 3}))


# ---------------------------------------------------------------------------------------------
# 6. __array_struct__ capsules

#: numpy name -> (typekind, itemsize) of the __array_struct__ kinds dlframe reads.
STRUCT_KINDS = {d.name: (d.kind.encode(), d.itemsize) for d in fakes.DL_DTYPES.values()}


@st.composite
def valid_struct(draw):
    np_name = draw(st.sampled_from(sorted(STRUCT_KINDS)))
    np_dtype = np.dtype(np_name)
    typekind, itemsize = STRUCT_KINDS[np_name]
    shape, strides, null_strides = draw(layouts())
    buf, off = draw(memory(shape, strides, itemsize))
    flags = fakes.NPY_NOTSWAPPED | draw(st.sampled_from([0, fakes.NPY_WRITEABLE]))
    return dict(
        buf=buf, off=off, shape=shape, strides=strides, null_strides=null_strides, np_dtype=np_dtype,
        typekind=typekind, itemsize=itemsize, flags=flags, device=(1, 0),
    )


def make_struct(case, **over):
    kw = dict(
        typekind=case["typekind"], itemsize=case["itemsize"], flags=case["flags"], keep=case["buf"]
    )
    kw.update(over)
    data = case.get("data", case["buf"].ctypes.data + case["off"])
    strides = None if case["null_strides"] else [s * case["itemsize"] for s in case["strides"]]
    return fakes.ArrayStruct(data, case["shape"], strides, **kw)


@fuzz
@given(case=valid_struct(), entry=st.sampled_from(["from_dlpack", "tensor"]), copy=st.sampled_from([None, True, False]))
def test_array_struct_over_real_memory(case, entry, copy):
    describe(f"shape={case['shape']} strides={case['strides']} kind={case['typekind']} flags={case['flags']:#x}")
    obj = make_struct(case)
    # numpy's own reading of the capsule agrees with the oracle.
    assert_same(np.asarray(obj), expected_of(case), case["np_dtype"])
    if entry == "tensor":
        ok, t = attempt(lambda: dlframe.tensor(obj))
        assert ok, t
        assert t.readonly == (not case["flags"] & fakes.NPY_WRITEABLE)
        check_tensor_result(t, case, copy)
        return
    ok, arr = attempt(lambda: dlframe.from_dlpack(obj, copy=copy))
    if not ok:
        assert copy is False and isinstance(arr, BufferError), arr
        return
    del obj  # the Arrow array alone keeps the memory alive
    check_arrow_result(arr, case)


STRUCT_INVALID = [
    "two",
    "nd_negative",
    "nd_too_big",
    "nd_huge_short_arrays",
    "null_shape",
    "null_data",
    "swapped",
    "named",
    "itemsize",
    "typekind",
    "negative_extent",
    "overflow",
    "partial_stride",
    "address_wrap",
    "not_a_capsule",
]
# A header with a negative nd or itemsize is refused with the message about `two` (one check
# covers the three fields).
HEADER = re.escape("the struct does not start with two == 2")
STRUCT_INVALID_SAYS = {
    "two": HEADER,
    "nd_negative": HEADER,
    "nd_too_big": r"nd \d+ exceeds the limit",
    "nd_huge_short_arrays": r"nd \d+ exceeds the limit",
    "null_shape": "NULL shape",
    "null_data": "NULL data pointer",
    "swapped": "byte-swapped",
    "named": "a named or empty capsule",
    "itemsize": HEADER + r"|unsupported dtype \|[biufmM]\d+:",  # sizes <= 0 | sizes no dtype has
    "typekind": "unknown kind",
    "negative_extent": "negative extent",
    "overflow": "overflows",
    "partial_stride": "not a whole element",
    "address_wrap": OUTSIDE,
    "not_a_capsule": "not a capsule|a named or empty capsule",  # (a DLPack capsule is named)
}
assert set(STRUCT_INVALID_SAYS) == set(STRUCT_INVALID)


@pytest.mark.parametrize("kind", STRUCT_INVALID)
@fuzz_each
@given(data=st.data(), entry=st.sampled_from(["from_dlpack", "tensor"]))
def test_invalid_array_structs_are_refused(data, kind, entry):
    case = data.draw(valid_struct())
    case["null_strides"] = False
    item = case["itemsize"]
    over = {}
    n = data.draw(st.integers(1, 4))
    nonempty = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    if kind == "two":
        over["two"] = data.draw(st.integers(-(2**31), 2**31 - 1).filter(lambda v: v != 2))
    elif kind == "nd_negative":
        over["nd"] = data.draw(st.integers(-(2**31), -1))
    elif kind == "nd_too_big":
        k = data.draw(st.integers(65, 200))
        case["shape"], case["strides"] = [1] * k, [1] * k
    elif kind == "nd_huge_short_arrays":
        over["nd"] = data.draw(st.integers(65, 2**31 - 1))
        case["shape"], case["strides"] = [1] * 70, [1] * 70
    elif kind == "null_shape":
        case["shape"] = None
        over["nd"] = data.draw(st.integers(1, 64))
        case["null_strides"] = True
    elif kind == "null_data":
        case["shape"], case["strides"] = nonempty, c_strides(nonempty)
        case["data"] = 0
    elif kind == "swapped":
        over["flags"] = case["flags"] & ~fakes.NPY_NOTSWAPPED
    elif kind == "named":
        over["named"] = True
    elif kind == "itemsize":
        over["itemsize"] = data.draw(
            st.one_of(st.integers(-(2**31), 0), st.sampled_from([3, 5, 7, 16, 32]).filter(lambda v: v != item))
        )
        case["shape"], case["strides"] = [1], [1]  # one element: honest for any itemsize up to the pad
        case["buf"] = np.zeros(64, np.uint8)
        case["off"] = 0
    elif kind == "typekind":
        over["typekind"] = bytes([data.draw(st.integers(0, 255).filter(lambda c: chr(c) not in "biufmM"))])
    elif kind == "negative_extent":
        case["shape"] = list(nonempty)
        case["shape"][0] = data.draw(st.integers(-(2**63), -1))
        case["strides"] = c_strides([1] * len(nonempty))
    elif kind == "overflow":
        case["shape"] = list(nonempty)
        k = data.draw(st.integers(0, len(nonempty) - 1))
        case["shape"][k] = data.draw(st.integers(I64_MAX // item // 2 + 1, I64_MAX // item))
        case["shape"].insert(data.draw(st.integers(0, len(nonempty))), data.draw(st.integers(2, 9)))
        case["strides"] = [1] * len(case["shape"])
    elif kind == "partial_stride":
        if item == 1:
            kind = "two"
            over["two"] = 3
        else:
            case["shape"], case["strides"] = [2], [1]
            case["byte_strides"] = [item + data.draw(st.integers(1, item - 1))]
    elif kind == "address_wrap":
        case["shape"], case["strides"] = [2], [-(2**62) // item]
    describe(f"kind={kind} over={over} shape={case['shape']}")
    if kind == "not_a_capsule":
        obj = type("S", (), {})()
        obj.__array_struct__ = data.draw(st.sampled_from([None, 1, "x", (1, 2), fakes.dlpack_capsule(None, [0], [1]).capsule]))
    else:
        obj = make_struct(case, **over)
        if "byte_strides" in case:
            obj = fakes.ArrayStruct(case["buf"].ctypes.data + case["off"], [2], case["byte_strides"], typekind=case["typekind"], itemsize=item, flags=case["flags"], keep=case["buf"])
    call = (lambda: dlframe.from_dlpack(obj)) if entry == "from_dlpack" else (lambda: dlframe.tensor(obj))
    ok, out = attempt(call)
    assert_refused(kind, ok, out, STRUCT_INVALID_SAYS)


# ---------------------------------------------------------------------------------------------
# 7. arrow.fixed_shape_tensor metadata JSON

DIM = st.one_of(
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(-(2**64), -1),
    st.integers(2**31, 2**65),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=2),
    st.none(),
    st.booleans(),
)


JSON_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=6,
)


@st.composite
def tensor_metadata(draw):
    """(json_text, n_rows, width, value_dtype): JSON that is valid about half the time, else with
    junk in any key, broken text, or any text at all."""
    if draw(st.booleans()):
        shape = draw(st.lists(st.integers(1, 4), max_size=3))
    else:
        shape = draw(st.lists(DIM, max_size=4))
    meta = {}
    if draw(st.integers(0, 9)):
        meta["shape"] = shape
    clean = [d for d in shape if type(d) is int and 0 <= d <= 4]
    if draw(st.booleans()):
        perm = list(range(len(shape)))
        if draw(st.integers(0, 3)):
            perm = draw(st.permutations(perm))
        else:
            perm = draw(st.lists(st.integers(-2, 6), max_size=5))
        meta[draw(st.sampled_from(["permutation", "permutations"]))] = perm
    if draw(st.booleans()):
        names = st.lists(st.text(max_size=3), min_size=len(shape), max_size=len(shape))
        meta["dim_names"] = draw(names if draw(st.integers(0, 3)) else JSON_JUNK)
    if not draw(st.integers(0, 3)):
        meta[draw(st.text(max_size=4))] = draw(JSON_JUNK)
    text = json.dumps(meta)
    mode = draw(st.integers(0, 9))
    if mode == 0:
        text = draw(st.text(max_size=30))
    elif mode == 1 and text:
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=3)) + text[cut + 1 :]
    elif mode == 2:
        text = json.dumps(draw(JSON_JUNK))
    if len(clean) == len(shape) and math.prod(clean) > 0 and draw(st.integers(0, 3)):
        width = math.prod(clean)
    else:
        width = draw(st.integers(1, 8))
    n = draw(st.integers(0, 4))
    dtype = draw(st.sampled_from(["float32", "int8", "uint16", "float64", "int64"]))
    return text, n, width, dtype


def tensor_table(text, n, width, dtype, offset, container):
    values = np.arange((n + offset) * width).astype(dtype)
    col = pa.FixedSizeListArray.from_arrays(pa.array(values), width).slice(offset)
    field = pa.field(
        "t",
        col.type,
        metadata={"ARROW:extension:name": "arrow.fixed_shape_tensor", "ARROW:extension:metadata": text},
    )
    schema = pa.schema([field])
    if container == "table":
        return pa.table([col], schema=schema), values[offset * width :]
    return pa.RecordBatch.from_arrays([col], schema=schema), values[offset * width :]


def metadata_is_valid(text, width) -> bool:
    """The spec's rules: a JSON object, shape of non-negative ints whose product is the list
    width, permutation (or arrow-rs's "permutations") and dim_names null or matching."""
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    try:
        meta = json.loads(text, object_pairs_hook=no_duplicates)
        # Python reads a lone surrogate escape ("\ud800") into a str; serde_json, like the
        # Unicode standard, refuses it.
        json.dumps(meta, ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        return False
    if not isinstance(meta, dict) or "shape" not in meta or ("permutation" in meta and "permutations" in meta):
        return False
    shape = meta["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**64 for d in shape):
        return False
    if math.prod(shape) != width:
        return False
    perm = meta.get("permutation", meta.get("permutations"))
    if perm is not None and (not isinstance(perm, list) or sorted(perm) != list(range(len(shape)))):
        return False
    if perm is not None and not all(type(p) is int for p in perm):
        return False
    names = meta.get("dim_names")
    if names is not None and (not isinstance(names, list) or len(names) != len(shape) or not all(isinstance(x, str) for x in names)):
        return False
    return True


def expected_tensor(text, n, width, flat):
    meta = json.loads(text)
    shape = meta["shape"]
    perm = meta.get("permutation", meta.get("permutations")) or list(range(len(shape)))
    physical = flat.reshape([n, *shape])
    return physical.transpose([0, *[1 + p for p in perm]])


@fuzz
@given(
    meta=tensor_metadata(),
    offset=st.integers(0, 2),
    container=st.sampled_from(["table", "batch"]),
    columns=st.sampled_from(["stack", "dict"]),
    copy=st.sampled_from([None, True, False]),
)
@example(meta=('{"shape": [9223372036854775808, 0]}', 2, 1, "float32"), offset=0, container="table", columns="stack", copy=None)
@example(meta=('{"shape": []}', 1, 2, "float32"), offset=0, container="table", columns="stack", copy=True)  # panicked
@example(meta=("[[]]", 0, 1, "float32"), offset=0, container="table", columns="stack", copy=None)  # a JSON array
@example(  # a lone surrogate escape: not valid metadata (the validator here once said it was)
    meta=('{"shape": [1, 1, 1], "dim_names": ["\\ud800udc00", "", ""]}', 0, 1, "float32"),
    offset=0, container="table", columns="stack", copy=None,
)
@example(meta=('{"shape": [2, 3], "permutation": [1, 0]}', 2, 6, "float32"), offset=1, container="batch", columns="stack", copy=None)
@example(meta=('{"shape": [0, 3]}', 2, 1, "int8"), offset=0, container="table", columns="dict", copy=False)
def test_fixed_shape_tensor_metadata(meta, offset, container, columns, copy):
    text, n, width, dtype = meta
    describe(f"metadata={text!r} n={n} width={width}")
    obj, flat = tensor_table(text, n, width, dtype, offset, container)
    valid = metadata_is_valid(text, width)
    event(f"metadata {'valid' if valid else 'invalid'}")
    try:
        ok, out = True, dlframe.to_dlpack(obj, columns=columns, copy=copy)
        event("succeeded")
    except BaseException as e:  # noqa: BLE001 - a panic is a BaseException: check_error fails it
        check_error(e)
        event(f"raised {type(e).__name__}")
        ok, out = False, e
    if not ok:
        assert not valid or (copy is False and isinstance(out, BufferError)), (
            f"valid metadata {text!r} refused: {out}"
        )
        return
    if KNOWN_BUG["metadata_json_array"] and isinstance(json.loads(text), list):
        event("accepted a JSON array (known bug)")
        return
    assert valid, f"invalid metadata {text!r} (list width {width}) was accepted"
    t = out["t"] if columns == "dict" else out
    got = np.from_dlpack(t)
    expected = expected_tensor(text, n, width, flat)
    assert_same(got, expected, dtype)
    assert tuple(t.shape) == expected.shape


# Found by the fuzz (fixed in e7dc772): metadata with fewer elements than the list width was
# checked on the zero-copy path only; the copy path panicked ("mid > len" in concat_plain).
@pytest.mark.parametrize("how", ["copy", "chunks"])
def test_tensor_metadata_mismatch_on_the_copy_path(how):
    col = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 2)
    field = pa.field(
        "t",
        col.type,
        metadata={"ARROW:extension:name": "arrow.fixed_shape_tensor", "ARROW:extension:metadata": '{"shape": [1]}'},
    )
    table = pa.table([col], schema=pa.schema([field]))
    with pytest.raises(ValueError, match="fixed_shape_tensor"):
        dlframe.to_dlpack(table)  # the zero-copy path refuses it
    try:
        if how == "copy":
            dlframe.to_dlpack(table, copy=True)
        else:
            dlframe.to_dlpack(pa.concat_tables([table, table]))
    except ValueError as e:
        assert "fixed_shape_tensor" in str(e)
    except BaseException as e:  # noqa: BLE001 - PanicException
        pytest.fail(f"{type(e).__name__}: {e}")
    else:
        pytest.fail("accepted")


# ---------------------------------------------------------------------------------------------
# 8. Tensor.__dlpack__ keywords

KW_VALUE = {
    "stream": st.one_of(st.none(), st.integers(-3, 3), st.integers(-(2**70), 2**70), st.text(max_size=2)),
    "max_version": st.one_of(
        st.none(),
        st.tuples(st.integers(-2, 3), st.integers(-2, 5)),
        st.tuples(st.integers(-(2**70), 2**70), st.integers(0, 2**40)),
        JUNK,
    ),
    "dl_device": st.one_of(st.none(), st.sampled_from([(1, 0), (2, 0), (1, 1), (3, 0), (99, 0)]), JUNK),
    "copy": st.one_of(st.none(), st.booleans(), JUNK),
}


@st.composite
def arrow_columns(draw):
    dtype = draw(st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64", "bool"]))
    n = draw(st.integers(0, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        values = rng.integers(0, 2, n).astype(bool)
    else:
        values = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)
    start = draw(st.integers(0, n))
    return pa.array(values).slice(start), values[start:]


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def keywords_valid(kwargs, readonly):
    """Whether ``__dlpack__(**kwargs)`` of a CPU tensor must succeed (True) or be refused (False),
    by the DLPack rules for a CPU producer; None where Python's bool-is-an-int makes either
    answer defensible (a bool inside max_version or dl_device)."""
    stream, mv, dev, copy = (kwargs.get(k) for k in ("stream", "max_version", "dl_device", "copy"))
    if copy is not None and not isinstance(copy, bool):
        return False
    if not (stream is None or (is_int(stream) and stream == -1)):
        return False  # a CPU tensor takes no stream but -1; anything else is not a stream
    versioned = False
    for value, ok in ((mv, lambda a, b: 0 <= a < 2**32 and 0 <= b < 2**32), (dev, lambda a, b: (a, b) == (1, 0))):
        if value is None:
            continue
        if not isinstance(value, tuple) or len(value) != 2:
            return False
        if any(isinstance(v, bool) for v in value):
            return None
        if not all(is_int(v) for v in value) or not ok(*value):
            return False
    if mv is not None:
        versioned = mv[0] >= 1
    # A legacy capsule cannot mark shared read-only memory: it needs a copy.
    return not (not versioned and readonly and copy is False)


@fuzz
@given(
    col=arrow_columns(),
    kwargs=st.fixed_dictionaries({}, optional=KW_VALUE),
    consumer=st.sampled_from(["dlframe", "numpy"]),
)
def test_tensor_dlpack_keywords(col, kwargs, consumer):
    arr, values = col
    trace(f"{arr.type} n={len(arr)} kwargs={kwargs!r}")
    to_gpu = kwargs.get("dl_device") == (2, 0) and dlframe.cuda_device_count() > 0
    # With a GPU, (2, 0) copies there and a stream > 2 is taken as a live stream handle, which
    # a random integer is not (DLPack gives producers no way to check one).
    stream = kwargs.get("stream")
    assume(not (to_gpu and isinstance(stream, int) and not isinstance(stream, bool) and stream > 2))
    t = dlframe.to_dlpack(arr)
    ok, cap = attempt(lambda: t.__dlpack__(**kwargs))
    # Only memory dlframe does not own (Arrow, read-only foreign memory) needs a copy for a
    # legacy capsule; a Tensor's own copy is handed out shared.
    valid = None if to_gpu else keywords_valid(kwargs, t.readonly and not t.copied)
    event(f"keywords {'unclassified' if valid is None else 'valid' if valid else 'invalid'}")
    if valid is not None:
        assert ok == valid, f"{kwargs!r} (readonly={t.readonly}): " + ("refused: %s" % cap if valid else "accepted")
    if not ok:
        return
    if to_gpu:
        # A CUDA capsule: Arrow takes device data only by an explicit copy.
        with pytest.raises(BufferError):
            dlframe.from_dlpack(cap)
        return
    name = fakes.capsule_name(cap)
    mv = kwargs.get("max_version")
    assert name == (b"dltensor_versioned" if mv is not None and mv[0] >= 1 else b"dltensor"), (name, mv)
    back = arrow_values(dlframe.from_dlpack(cap))
    assert_same(back, values, values.dtype)
    del cap
    if consumer == "numpy":
        assert_same(np.asarray(t), values, values.dtype)
        assert_same(np.asarray(fakes.Interface(t.__array_interface__, keep=t)), values, values.dtype)


# ---------------------------------------------------------------------------------------------
# 9. Inputs that crashed the interpreter, replayed in subprocesses (fixed in 5e10725)


CRASH_REPRODUCERS = {
    "array_struct_huge_nd": """
        # PyArrayInterface with nd = 2**31 - 1 and a shape array of 65 entries: numpy refuses
        # nd > 64 before it reads the shape; dlframe read (and allocated) nd entries first: SIGSEGV.
        s = fakes.ArrayStruct(buf.ctypes.data, [1] * 65, None, nd=2**31 - 1, keep=buf)
        try:
            dlframe.from_dlpack(s)
        except ValueError as e:
            print("refused:", e)
    """,
    "interface_address_wrap": """
        # shape (2,), byte stride -2**62: element 1 lies below address 0. The DLPack importer
        # refused this layout ("reaches outside the address space"); the array interface
        # accepted it and the strided copy read it: SIGSEGV.
        o = fakes.Interface({"shape": (2,), "typestr": "<f4", "data": (buf.ctypes.data, False),
                             "strides": (-(2**62),), "version": 3}, keep=buf)
        try:
            dlframe.from_dlpack(o)
        except (ValueError, BufferError) as e:
            print("refused:", e)
    """,
    "array_struct_address_wrap": """
        s = fakes.ArrayStruct(buf.ctypes.data, [2], [-(2**62)], keep=buf)
        try:
            dlframe.from_dlpack(s)
        except (ValueError, BufferError) as e:
            print("refused:", e)
    """,
    "interface_pointer_at_the_top": """
        # 4 floats from 2**64 - 8: the last ones wrap past the end of the address space.
        o = fakes.Interface({"shape": (4,), "typestr": "<f4", "data": (2**64 - 8, False), "version": 3})
        try:
            dlframe.from_dlpack(o, copy=True)
        except (ValueError, BufferError) as e:
            print("refused:", e)
    """,
}


def run_snippet(body: str) -> subprocess.CompletedProcess:
    code = "import sys, numpy as np, dlframe, fakes\nbuf = np.zeros(4096, np.uint8)\n" + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("name", list(CRASH_REPRODUCERS))
def test_former_crash_is_refused_in_a_subprocess(name):
    proc = run_snippet(CRASH_REPRODUCERS[name])
    signal = -proc.returncode if proc.returncode < 0 else 0
    assert proc.returncode == 0, f"exit {proc.returncode} (signal {signal}); stderr:\n{proc.stderr[-2000:]}"
    assert "refused:" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------------------------
# Fixed: metadata must be a JSON object, as pyarrow requires.


@pytest.mark.parametrize("text", ["[[]]", "[[2, 3]]", "[[2, 3], null, [1, 0]]"])
def test_tensor_metadata_must_be_an_object(text):
    width = math.prod(json.loads(text)[0]) or 1
    obj, _ = tensor_table(text, 2, width, "float32", 0, "table")
    with pytest.raises(ValueError, match="fixed_shape_tensor"):
        dlframe.to_dlpack(obj)

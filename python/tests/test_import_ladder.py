"""The import side answers alike on every route, and changes no data without a word.

- A torch tensor reaches dlframe through torch's DLPack exchange table, or through
  `__dlpack__`: a tensor that requires grad, a sparse and a quantized tensor get the same
  answer both ways, torch's own `BufferError` that says what to do (before, the table imported
  the first silently and raised torch's C++ RuntimeError, stack frames included, for the others).
- numpy datetime64/timedelta64 in units Arrow lacks became bare int64 counts: datetime64[D]
  dates became day counts. Days are now date32, hours and minutes seconds (a copy, which
  copy=False refuses), and the other units are refused with an error naming the unit.
"""

import datetime
import warnings

import numpy as np
import pyarrow as pa
import pytest

import dlframe

# ---------------------------------------------------------------------------------------------
# torch: the exchange table and __dlpack__ answer alike


def _torch():
    return pytest.importorskip("torch", reason="torch is an opt-in extra (DLFRAME_TORCH=1 installs it)")


def _refusals(torch):
    with warnings.catch_warnings():  # torch deprecates its quantized tensors
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8)
    return {
        "requires grad": torch.ones(3, requires_grad=True),
        "sparse": torch.ones(3).to_sparse(),
        "quantized": quantized,
    }


@pytest.mark.parametrize("case", ["requires grad", "sparse", "quantized"])
def test_torch_tensors_that_dlpack_refuses_are_refused_on_every_route(case):
    torch = _torch()
    x = _refusals(torch)[case]
    with pytest.raises(BufferError) as own:
        x.__dlpack__()
    for route in (dlframe.tensor, dlframe.from_dlpack):
        with pytest.raises(BufferError) as ours:
            route(x)
        assert str(ours.value) == str(own.value), (case, route)
        assert "frame #" not in str(ours.value)
    # numpy, through __dlpack__ only, says the same.
    with pytest.raises(BufferError, match=str(own.value)[:20]):
        np.from_dlpack(x)


def test_a_detached_tensor_still_takes_the_table():
    torch = _torch()
    x = torch.arange(4.0, requires_grad=True)
    t = dlframe.tensor(x.detach())
    assert np.from_dlpack(t).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert t.__array_interface__["data"][0] == x.data_ptr()


# ---------------------------------------------------------------------------------------------
# numpy datetime units


def test_days_become_date32():
    x = np.array(["1970-01-01", "2024-02-29", "1969-12-31"], dtype="datetime64[D]")
    col = dlframe.from_dlpack(x)
    assert col.type == pa.date32()
    assert col.to_pylist() == [datetime.date(1970, 1, 1), datetime.date(2024, 2, 29), datetime.date(1969, 12, 31)]
    with pytest.raises(BufferError, match=r"datetime64\[D\].*date32"):
        dlframe.from_dlpack(x, copy=False)
    t = dlframe.tensor(x)
    assert t.dtype == np.int32 and t.copied


def test_days_out_of_date32_range_are_refused_and_nat_is_a_null():
    with pytest.raises(ValueError, match=r"at index 1 .*date32"):
        dlframe.from_dlpack(np.array([0, 2**40], dtype="datetime64[D]"))
    # NaT is a null, as pyarrow makes it (test_new_types.py has every unit).
    days = np.array(["NaT", "2020-01-01"], dtype="datetime64[D]")
    assert dlframe.from_dlpack(days).equals(pa.array(days))


@pytest.mark.parametrize(("unit", "seconds"), [("h", 3600), ("m", 60)])
def test_hours_and_minutes_become_seconds(unit, seconds):
    x = np.array([0, 5, -2], dtype=f"datetime64[{unit}]")
    col = dlframe.from_dlpack(x)
    assert col.type == pa.timestamp("s")
    assert col.cast(pa.int64()).to_pylist() == [0, 5 * seconds, -2 * seconds]
    assert col.to_pylist() == x.astype("datetime64[s]").tolist()
    d = dlframe.from_dlpack(np.array([1, -3], dtype=f"timedelta64[{unit}]"))
    assert d.type == pa.duration("s") and d.cast(pa.int64()).to_pylist() == [seconds, -3 * seconds]
    with pytest.raises(BufferError, match="copy"):
        dlframe.from_dlpack(x, copy=False)
    with pytest.raises(ValueError, match="at index 0"):
        dlframe.from_dlpack(np.array([2**62], dtype=f"datetime64[{unit}]"))


def test_timedelta_days_become_seconds():
    d = dlframe.from_dlpack(np.array([1, 2], dtype="timedelta64[D]"))
    assert d.type == pa.duration("s") and d.cast(pa.int64()).to_pylist() == [86_400, 172_800]


@pytest.mark.parametrize("unit", ["Y", "M", "W", "ps", "fs", "as", "10s"])
def test_units_arrow_lacks_are_refused_naming_the_unit(unit):
    x = np.array([1, 2], dtype=f"datetime64[{unit}]")
    with pytest.raises(BufferError, match=rf"datetime64\[{unit}\]"):
        dlframe.from_dlpack(x)
    with pytest.raises(BufferError, match=rf"timedelta64\[{unit}\]"):
        dlframe.tensor(np.array([1, 2], dtype=f"timedelta64[{unit}]"))


def test_arrow_units_still_share_their_memory():
    x = np.array([1, 2, 3], dtype="datetime64[us]")
    col = dlframe.from_dlpack(x)
    assert col.type == pa.timestamp("us")
    assert col.buffers()[1].address == x.ctypes.data


# ---------------------------------------------------------------------------------------------
# One input: from_dlpack, tensor and to_dlpack tell an object apart in the same order


def _inputs():
    import array

    pl = pytest.importorskip("polars", reason="polars is a test requirement")
    values = [1.0, 2.0, 3.0]
    ours = dlframe.tensor(np.array(values))
    return {
        "dlframe.Tensor": ours,
        "capsule": lambda: np.array(values).__dlpack__(),
        "numpy (__dlpack__)": np.array(values),
        "array.array (the buffer protocol)": array.array("d", values),
        "pyarrow array (Arrow before __dlpack__)": pa.array(values),
        "polars Series (Arrow only)": pl.Series("v", values),
        "polars LazyFrame": pl.DataFrame({"v": values}).lazy(),
    }


@pytest.mark.parametrize("name", list(_inputs()))
def test_from_dlpack_and_tensor_take_the_same_inputs(name):
    # Before the one input, from_dlpack took no Arrow producer without __dlpack__ (a polars
    # Series or LazyFrame raised AttributeError) while tensor() took them: each had its own order.
    x = _inputs()[name]
    make = x if callable(x) and not hasattr(x, "__dlpack__") else (lambda: x)
    # A frame is a table: one column of an (n, 1) matrix.
    np.testing.assert_array_equal(np.ravel(dlframe.from_dlpack(make()).to_pylist()), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(np.from_dlpack(dlframe.tensor(make())).ravel(), [1.0, 2.0, 3.0])


def test_a_pyarrow_array_with_nulls_is_arrow_data_on_every_route():
    # pyarrow's own __dlpack__ refuses nulls with its TypeError, which from_dlpack raised; as
    # Arrow data (which it is first), each route refuses the null in dlframe's words.
    a = pa.array([1.0, None, 3.0])
    for call in (dlframe.from_dlpack, dlframe.tensor, dlframe.to_dlpack):
        with pytest.raises(BufferError, match="null"):
            call(a)


def test_an_object_with_no_offer_is_named_on_every_route():
    for call in (dlframe.from_dlpack, dlframe.tensor, dlframe.to_dlpack):
        with pytest.raises((AttributeError, TypeError), match="object"):
            call(object())

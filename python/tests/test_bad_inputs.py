"""Runs the bad-input table of docs/hardening.md: each row must raise its exception with its message."""

import json
import pathlib
import re

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import dlframe
import fakes

TABLE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "hardening.md"


def tensor_type(metadata, width):
    return pa.field(
        "t",
        pa.list_(pa.float32(), width),
        metadata={"ARROW:extension:name": "arrow.fixed_shape_tensor", "ARROW:extension:metadata": metadata},
    )


def rows():
    text = TABLE.read_text()
    table = text.split("<!-- bad-inputs:start -->")[1].split("<!-- bad-inputs:end -->")[0]
    out = []
    for line in table.strip().splitlines()[2:]:
        m = re.fullmatch(r"\| `(.+)` \| (\w+) \| `(.+)` \|", line.strip())
        assert m, f"a bad-input row of docs/hardening.md that does not parse: {line!r}"
        out.append(m.groups())
    assert len(out) >= 20, "the bad-input table of docs/hardening.md lost its rows"
    return out


@pytest.mark.parametrize("expr,exc,message", rows(), ids=[r[0][:60] for r in rows()])
def test_bad_input_row(expr, exc, message):
    buf = np.zeros(16, np.float32)
    namespace = dict(np=np, pa=pa, pl=pl, json=json, dlframe=dlframe, Iface=fakes.Interface, WithBuffer=fakes.OwnBuffer, buf=buf, tensor_type=tensor_type)
    with pytest.raises(Exception) as info:
        eval(expr, namespace)
    assert type(info.value).__name__ == exc, f"{expr} raised {type(info.value).__name__}: {info.value}"
    assert message in str(info.value), f"{expr}: {info.value}"


class _ArrowProducer:
    """An object whose __arrow_c_array__ returns whatever it was given."""

    def __init__(self, result):
        self.result = result

    def __arrow_c_array__(self, requested_schema=None):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_a_malformed_arrow_c_array_result_is_refused_with_the_reason():
    good = pa.array([1.0, 2.0]).__arrow_c_array__()
    with pytest.raises(ValueError, match=r"_ArrowProducer.__arrow_c_array__\(\) returned a list, not a \(schema, array\) pair"):
        dlframe.to_dlpack(_ArrowProducer(list(good)))
    with pytest.raises(Exception, match="PyCapsule"):
        dlframe.to_dlpack(_ArrowProducer((1, 2)))
    with pytest.raises(ValueError, match=r"returned a tuple, not a \(schema, array\) pair"):
        dlframe.to_dlpack(_ArrowProducer((good[0],)))  # one capsule, not two
    with pytest.raises(RuntimeError, match="the producer broke"):
        dlframe.to_dlpack(_ArrowProducer(RuntimeError("the producer broke")))
    # The well-formed pair still converts.
    assert np.from_dlpack(dlframe.to_dlpack(_ArrowProducer(pa.array([1.0, 2.0]).__arrow_c_array__()))).tolist() == [1.0, 2.0]

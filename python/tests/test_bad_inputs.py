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

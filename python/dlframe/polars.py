"""dlframe for Polars: ``df.to_dlpack()``, ``series.to_dlpack()``, ``lf.to_dlpack()`` and tensors
back to Series.

Importing ``dlframe`` registers a ``dlframe`` namespace on ``pl.DataFrame``, ``pl.Series`` and
``pl.LazyFrame`` (Polars' convention: ``df.dlframe.to_dlpack()``), and attaches ``to_dlpack``
directly where Polars does not define it (it never replaces a method Polars has).

- ``df.to_dlpack()`` is a 2-D tensor, C order by default like ``df.to_torch()``, in one fused
  pass (cast, interleave, null fill); ``columns="dict"`` gives one tensor per column instead.
- ``series.to_dlpack()`` shares the Series' memory when it is one chunk of numeric data without
  nulls; ``Array`` columns become ``(n, *shape)`` tensors.
- ``lf.to_dlpack()`` collects the LazyFrame first (``engine=`` is passed to ``collect``).
- ``from_dlpack(x)`` turns any tensor into a Series; N-d tensors become ``Array`` columns.
- ``to_tensor(*exprs)`` is a Polars expression (a plugin compiled into ``dlframe._native``) that
  stacks columns into one ``Array`` column, with the cast and null fill in one pass; it works in
  ``select``, ``with_columns``, ``group_by`` and lazy/streaming queries, and its result leaves
  through ``to_dlpack`` without a copy. ``to_tensor_padded(list_expr, max_len, pad)`` pads
  lists of different lengths into an ``Array`` column.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import polars as pl

from . import _native

__all__ = ["from_dlpack", "to_dlpack", "to_tensor", "to_tensor_padded"]


def to_dlpack(
    obj: Any,
    *,
    nulls: str = "error",
    fill_value: bool | int | float | None = None,
    copy: bool | None = None,
    dtype: Any = None,
    order: str = "C",
    device: str | None = None,
    columns: str = "stack",
    stream: Any = None,
    engine: str = "auto",
    ragged: str = "error",
    pad_value: bool | int | float | None = None,
    max_len: int | None = None,
    inexact: str = "error",
) -> Any:
    """A Polars DataFrame, Series or LazyFrame as a tensor; the options are
    ``dlframe.to_dlpack``'s, and ``engine`` is passed to ``LazyFrame.collect``.

    A Series of one chunk of numeric data without nulls shares its memory (no copy, constant
    time); everything else goes through the Arrow stream and the fused kernels.
    """
    if isinstance(obj, pl.LazyFrame):
        obj = obj.collect(engine=engine)
    return _native.to_dlpack(
        obj,
        nulls=nulls,
        fill_value=fill_value,
        copy=copy,
        dtype=dtype,
        order=order,
        device=device,
        columns=columns,
        stream=stream,
        ragged=ragged,
        pad_value=pad_value,
        max_len=max_len,
        inexact=inexact,
    )


def from_dlpack(x: Any, *, name: str = "", copy: bool | None = None) -> pl.Series:
    """Any tensor (DLPack, array interface, buffer protocol) as a Series.

    1-D tensors share memory where Arrow can (as ``dlframe.from_dlpack``); N-d tensors become
    ``Array`` columns of shape ``shape[1:]`` in logical (C) order, sharing memory when the tensor
    is C-contiguous and copying a transposed or strided one (``copy=False`` then raises
    BufferError).
    """
    import numpy as np
    import pyarrow as pa

    t = x if isinstance(x, _native.Tensor) else _native.tensor(x)
    if t.ndim <= 1:
        return pl.Series(name, t.to_arrow(copy=copy))
    arr = np.from_dlpack(t)
    if copy or not arr.flags.c_contiguous:
        if copy is False:
            raise BufferError(
                f"a tensor of shape {t.shape} with strides {t.strides} is not C-contiguous, so an "
                "Array column needs a copy, but copy=False; pass copy=None or copy=True"
            )
        arr = np.ascontiguousarray(arr) if not copy else arr.copy()
    values: pa.Array = pa.array(arr.reshape(-1))
    for d in reversed(arr.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, int(d))
    return pl.Series(name, values)


def to_tensor(
    *exprs: pl.Expr | str,
    dtype: Any = None,
    nulls: str = "error",
    fill_value: bool | int | float | None = None,
    width: int | None = None,
    inexact: str = "error",
) -> pl.Expr:
    """An expression stacking columns into one ``Array`` column (one fused pass).

    - ``to_tensor("a", "b", "c")``: k numeric, boolean or temporal columns become
      ``Array(T, k)``, where T is ``dtype`` or the columns' common dtype (numpy's promotion).
      Selectors (``cs.numeric()``, ``pl.exclude("y")``) give all their columns to one call; a
      literal (``pl.lit(1.0)``) is repeated for every row. The result is named after the first
      input.
    - ``dtype``: any dtype-like ``dlframe.to_dlpack`` takes (``"float32"``, ``np.float32``,
      ``"f4"``, ``pl.Float32``, ``pa.float32()``, ``torch.float32``); an unknown one raises
      TypeError here, before the query runs.
    - ``to_tensor("lists", width=d)``: equal-length lists become ``Array(T, d)``; Polars must
      know the width before the query runs, so ``width`` is required for a List column. An
      ``Array`` column passes through (cast or filled when asked).
    - ``nulls``: ``"error"`` (default), ``"fill"`` with ``fill_value``, or ``"nan"``.
    - ``inexact``: ``"error"`` (default) refuses an integer that the float dtype cannot hold
      exactly (int64 2**53 + 1 into Float64); ``"round"`` rounds it, as numpy does.

    The expression is elementwise: it runs per row batch in lazy and streaming queries and in
    ``group_by`` aggregations. Bad input (strings, ragged lists, nulls under ``"error"``,
    columns of different lengths) raises a Polars error when the query runs.
    """
    from polars.plugins import register_plugin_function

    if not exprs:
        raise TypeError("to_tensor needs at least one column")
    if fill_value is not None and not isinstance(fill_value, (bool, int, float)):
        raise TypeError(f"fill_value must be a bool, int or float, not {type(fill_value).__name__}")
    # Every key is always sent: Polars sends no bytes at all for an empty kwargs dict.
    kwargs = {"dtype": _native._dtype_name(dtype), "nulls": nulls, "fill_value": fill_value, "width": width}
    kwargs["inexact"] = inexact
    return register_plugin_function(
        plugin_path=Path(_native.__file__),
        function_name="to_tensor",
        args=list(exprs),
        kwargs=kwargs,
        is_elementwise=True,
        # Selectors (cs.numeric(), pl.exclude("y"), pl.all()) are inputs of one call, not one
        # call per column.
        input_wildcard_expansion=True,
    )


def to_tensor_padded(
    expr: pl.Expr | str,
    max_len: int,
    pad: bool | int | float = 0,
    *,
    dtype: Any = None,
) -> pl.Expr:
    """An expression padding a List column whose rows have different lengths into
    ``Array(T, max_len)``: longer rows are truncated, shorter ones padded with ``pad``, which
    also stands for a null row and a null element (one pass after reading; copies).

    The lengths, clipped to ``max_len``, are ``pl.col(...).list.len().clip(upper_bound=max_len)``.
    ``dtype`` takes what :func:`to_tensor` takes. For the lengths and the mask as tensors, or
    for jagged (values, offsets) tensors, use ``dlframe.to_dlpack(series, ragged=...)``.
    """
    from polars.plugins import register_plugin_function

    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0:
        raise TypeError(f"max_len must be an int >= 0, not {max_len!r}")
    if not isinstance(pad, (bool, int, float)):
        raise TypeError(f"pad must be a bool, int or float, not {type(pad).__name__}")
    kwargs = {"max_len": max_len, "pad": pad, "dtype": _native._dtype_name(dtype)}
    return register_plugin_function(
        plugin_path=Path(_native.__file__),
        function_name="to_tensor_padded",
        args=[expr],
        kwargs=kwargs,
        is_elementwise=True,
    )


def _series_view(s: pl.Series) -> Any:
    """The Series' own memory as a read-only tensor (no copy), or None. Polars' public
    `to_numpy(allow_copy=False)` hands out a view of one chunk without nulls and refuses
    everything that needs a copy (several chunks, nulls, booleans stored as bits, strings);
    `_native._numpy_view` takes the view when it is a vector of numbers (not an Array column's
    matrix, nor temporal data). None sends the caller to the Arrow path, which converts all."""
    try:
        view = s.to_numpy(allow_copy=False)
    except RuntimeError:
        return None
    return _native._numpy_view(view)


@functools.wraps(to_dlpack)
def _series_to_dlpack(self: pl.Series, **options: Any) -> Any:
    # `series.to_dlpack()` without options is the Series' shared view when it has one (no copy),
    # asked for before the keyword-only defaults of `to_dlpack` are bound (binding them took a
    # third of the call); without one, or with options, the Arrow path.
    if not isinstance(self, pl.Series):
        raise TypeError(f"Series.to_dlpack needs a polars Series, not {type(self).__name__}")
    if not options:
        t = _series_view(self)
        return t if t is not None else _native.to_dlpack(self)
    return to_dlpack(self, **options)


class _Namespace:
    def __init__(self, obj: Any) -> None:
        self._obj = obj

    # The signature and docs of `to_dlpack` (inspect.signature follows __wrapped__).
    @functools.wraps(to_dlpack)
    def to_dlpack(self, **options: Any) -> Any:
        return to_dlpack(self._obj, **options)


def _install() -> None:
    for register, cls in (
        (pl.api.register_dataframe_namespace, pl.DataFrame),
        (pl.api.register_series_namespace, pl.Series),
        (pl.api.register_lazyframe_namespace, pl.LazyFrame),
    ):
        if not hasattr(cls, "dlframe"):
            register("dlframe")(type(f"{cls.__name__}DLFrame", (_Namespace,), {}))
        if not hasattr(cls, "to_dlpack"):
            # The function itself (its first argument is the object): no wrapper call per export.
            # A Series gets a version that tries its shared view before anything else.
            cls.to_dlpack = _series_to_dlpack if cls is pl.Series else to_dlpack  # type: ignore[attr-defined]


_install()

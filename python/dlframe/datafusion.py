"""dlframe for datafusion-python: ``SELECT to_tensor(a, b, c) FROM t`` and tensors as tables.

- ``register(ctx)`` installs dlframe's SQL functions (``to_tensor``, ``to_tensor_fill``,
  ``to_tensor_as``, ``tensor_shape``, ``tensor_ndim``, ``tensor_dtype``, ``tensor_reshape``,
  ``tensor_element``) in a ``datafusion.SessionContext`` through datafusion-ffi capsules, after
  checking that the installed datafusion has the major version they were built against.
- ``dlframe.to_dlpack(ctx.sql(...))`` reads a query result through ``__arrow_c_stream__``; a
  single tensor column becomes an ``(n, *cell_shape)`` tensor.
- ``options()`` gives dlframe's session options for ``SessionConfig().with_extension(...)``:
  a context made with them takes ``SET dlframe.inexact = 'round'``.
- ``register_tensors(ctx, name, {"x": array, ...})`` serves numpy, torch or jax arrays as a
  table without copying them (bool arrays are bit-packed, strided ones gathered: copies).
"""

from __future__ import annotations

from typing import Any, Mapping

from . import _native

__all__ = ["register", "udfs", "options", "register_tensors", "built_against"]


def built_against() -> str:
    """The DataFusion version dlframe's UDFs are compiled against."""
    return _native.datafusion_version()


def _check_host() -> Any:
    try:
        import datafusion
    except ImportError as e:  # pragma: no cover - exercised only without datafusion
        raise ImportError("dlframe.datafusion needs the datafusion package: pip install 'datafusion>=55,<56'") from e
    host = getattr(datafusion, "__version__", "unknown")
    ours = built_against()
    if host.split(".")[0] != ours.split(".")[0]:
        raise RuntimeError(
            f"datafusion {host} is installed, but dlframe's UDFs are built against DataFusion {ours}; "
            f"datafusion-ffi has no stable ABI across major versions, so install datafusion=={ours.split('.')[0]}.*"
        )
    return datafusion


def udfs() -> list[Any]:
    """Every dlframe UDF as a ``datafusion.ScalarUDF`` (after the version check)."""
    datafusion = _check_host()
    return [datafusion.udf(u) for u in _native.datafusion_udfs()]


def options() -> Any:
    """dlframe's session options (``dlframe.inexact``) for a new context:
    ``SessionContext(SessionConfig().with_extension(dlframe.datafusion.options()))``. Such a
    session takes ``SET dlframe.inexact = 'round'``; DataFusion adds options only when a
    session is made, so ``register(ctx)`` cannot add them to an existing one."""
    _check_host()
    return _native.DatafusionOptions()


def register(ctx: Any) -> None:
    """Registers every dlframe UDF in a ``datafusion.SessionContext``."""
    for u in udfs():
        ctx.register_udf(u)


def register_tensors(ctx: Any, name: str, columns: Mapping[str, Any] | Any, *, partitions: int | None = None) -> None:
    """Registers tensors as table ``name``: a mapping of column names to tensors, or one
    tensor (column ``tensor``). 1-D tensors become plain columns, N-d ones
    ``arrow.fixed_shape_tensor`` columns. Rows are split into ``partitions`` batches (default:
    the CPU count) without copying."""
    import os

    import pyarrow as pa

    _check_host()
    if not isinstance(columns, Mapping):
        columns = {"tensor": columns}
    if not columns:
        raise ValueError("register_tensors needs at least one column")
    arrays = {k: _native.from_dlpack(v) for k, v in columns.items()}
    table = pa.table(arrays)
    parts = max(1, min(partitions or os.cpu_count() or 1, table.num_rows or 1))
    step = -(-table.num_rows // parts) if table.num_rows else 0
    batches = table.to_batches(max_chunksize=step) if step else []
    if not batches:
        batches = [pa.RecordBatch.from_pylist([], schema=table.schema)]
    ctx.register_record_batches(name, [[b] for b in batches])

"""dlframe: dataframe columns to tensors and back, without copying where the memory allows.

- ``to_dlpack(obj, ...)`` takes anything that speaks the Arrow PyCapsule interface (pyarrow,
  polars, datafusion, duckdb, arro3, nanoarrow) and Polars LazyFrames, and returns a
  :class:`Tensor` that numpy, torch, jax and cupy consume through ``__dlpack__`` or the array
  interfaces.
- ``from_dlpack(x, ...)`` takes any tensor (DLPack, array interface, buffer protocol) and
  returns a pyarrow array, sharing memory where possible.
- ``batches(source, batch_size, ...)`` streams any Arrow stream (a DataFusion query, a pyarrow
  dataset, a Polars LazyFrame) as tensors of exactly ``batch_size`` rows, converting the next
  batch on a background thread.
- ``dlframe.flight.query(location, sql, shard=(rank, world))`` is a Flight SQL query (such as
  ``dlframe serve``'s) as a source of ``batches``, each reader fetching only its endpoints.
- ``dlframe.polars`` (imported with ``dlframe`` when Polars is installed) and
  ``dlframe.datafusion`` (imported on first use, so ``import dlframe`` never imports
  datafusion) hold the Polars and DataFusion integrations.
"""

from typing import Any

from ._native import Tensor, __version__, cuda_device_count, from_dlpack, tensor, to_dlpack
from . import _arrow_types
from ._stream import Batches, batches
from . import flight as flight

import importlib.util as _util

# bfloat16's Arrow extension type, so that from_dlpack gives typed pyarrow arrays.
_arrow_types.register()

if _util.find_spec("polars") is not None:
    # df.to_dlpack(), series.to_dlpack(), lf.to_dlpack() and the `dlframe` namespaces.
    from . import polars as polars  # noqa: F401

__all__ = ["Batches", "Tensor", "batches", "cuda_device_count", "from_dlpack", "tensor", "to_dlpack", "__version__"]


def __getattr__(name: str) -> Any:
    """``dlframe.datafusion`` on first use: the module imports datafusion only when called."""
    if name == "datafusion":
        import importlib

        return importlib.import_module(".datafusion", __name__)
    raise AttributeError(f"module 'dlframe' has no attribute {name!r}")

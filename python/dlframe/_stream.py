"""``dlframe.batches``: exact-size tensor batches of a result larger than memory."""

from __future__ import annotations

import pickle
import sys
from typing import Any, Iterator

from . import _native

_IN_WORKERS = (
    "this source cannot be read in DataLoader worker processes ({what}); pass a function that "
    "makes it there, dlframe.batches(make_source, ...), a pyarrow Table, or use num_workers=0 "
    "(dlframe converts the next batch on its own background thread already)"
)


class Batches:
    """An iterable of tensors of exactly ``batch_size`` rows over any Arrow stream; each
    iteration is one pass over the source. See :func:`batches`."""

    def __init__(self, source: Any, batch_size: int, prefetch: int, options: dict[str, Any]) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, not {prefetch!r}")
        self.source = source
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.options = options
        _register_with_torch()

    def __iter__(self) -> Iterator[Any]:
        shard = _worker_shard()
        source = self.source
        if callable(source) and not _speaks_arrow(source):
            source = source()
        elif shard != (0, 1) and not _in_memory(source):
            raise TypeError(_IN_WORKERS.format(what=f"a {type(source).__module__}.{type(source).__name__}"))
        iterate = False
        if _is_lazy_frame(source):
            if hasattr(source, "collect_batches"):
                # Polars' streaming engine hands out DataFrames as it makes them.
                source, iterate = source.collect_batches(engine="streaming"), True
            else:
                source = source.collect(engine="streaming")
        elif not _speaks_arrow(source):
            if type(source).__module__.startswith("pyarrow") and hasattr(source, "scanner"):
                source = source.scanner()  # a pyarrow dataset
            if type(source).__module__.startswith("pyarrow") and hasattr(source, "to_reader"):
                source = source.to_reader()  # a pyarrow dataset scanner: its batches as they are read
            elif hasattr(source, "__iter__") and not isinstance(source, (str, bytes, dict)):
                iterate = True
            else:
                raise TypeError(
                    "dlframe.batches takes an object with __arrow_c_stream__ or __arrow_c_array__ "
                    "(a DataFusion DataFrame, a pyarrow Table, RecordBatchReader or dataset scanner, a "
                    "Polars DataFrame or LazyFrame, a duckdb result), an iterable of them, or a "
                    f"function that returns one, not {type(source).__name__}"
                )
        return _native.BatchStream(
            source, self.batch_size, iterate=iterate, prefetch=self.prefetch, shard=shard, **self.options
        )

    def __len__(self) -> int:
        raise TypeError(
            "dlframe.batches has no length (it streams); torch's DataLoader takes it as an "
            "IterableDataset when torch is imported before dlframe.batches() is called"
        )

    def __reduce__(self) -> Any:
        # The source is pickled here, once, so that a source that cannot be pickled is refused
        # with what to pass instead; the outer pickler carries its bytes.
        try:
            source = pickle.dumps(self.source)
        except Exception as e:
            raise TypeError(
                _IN_WORKERS.format(what=f"a {type(self.source).__name__} cannot be pickled: {e}")
            ) from e
        return (_unpickled, (source, self.batch_size, self.prefetch, self.options))

    def __repr__(self) -> str:
        return f"dlframe.batches({type(self.source).__name__}, batch_size={self.batch_size})"


def _unpickled(source: bytes, batch_size: int, prefetch: int, options: dict[str, Any]) -> Batches:
    """A pickled :class:`Batches` again, in a DataLoader worker."""
    return Batches(pickle.loads(source), batch_size, prefetch, options)


def batches(
    source: Any,
    batch_size: int,
    *,
    columns: str = "stack",
    nulls: str = "error",
    fill_value: bool | int | float | None = None,
    dtype: Any = None,
    order: str = "C",
    device: str | None = None,
    drop_last: bool = False,
    prefetch: int = 2,
    ragged: str = "error",
    pad_value: bool | int | float | None = None,
    max_len: int | None = None,
) -> Batches:
    """Exact-size tensor batches of any Arrow stream, for results larger than memory.

    ``source`` is an object with ``__arrow_c_stream__`` or ``__arrow_c_array__`` (a DataFusion
    DataFrame, executed as a stream and never collected; a pyarrow Table, RecordBatchReader or
    dataset scanner; a Polars DataFrame, or a LazyFrame on the streaming engine; a duckdb
    result), an iterable of such objects, or a function returning one (called at each pass,
    and in each DataLoader worker).

    Each batch has exactly ``batch_size`` rows, the last one fewer unless ``drop_last``. A
    table's batch is an ``(n, k)`` matrix (``columns="stack"``) or a dict of column tensors
    (``columns="dict"``); a single column's is its own tensor. ``nulls``, ``fill_value``,
    ``dtype``, ``order``, ``device``, ``ragged``, ``pad_value`` and ``max_len`` are
    :func:`dlframe.to_dlpack`'s: ``nulls="mask"`` gives ``(values, mask)`` pairs, and a List
    column under ``ragged="pad"`` gives ``(values, lengths)`` (each batch as wide as its longest
    row, or ``max_len``) and under ``ragged="jagged"`` gives ``(values, offsets)``.

    Input batches of any sizes are cut and joined in the one fused pass that casts, interleaves
    and fills (a copy); a batch inside one input batch of a column without nulls shares its
    memory (no copy). The next batches are converted on background threads (up to ``prefetch``
    at once), without the GIL, while the consumer works: at most ``prefetch + 1`` batches are
    made ahead. A tensor handed out is never written again.

    Works as ``torch.utils.data.DataLoader(dlframe.batches(...), batch_size=None)`` (import torch
    first). With ``num_workers=n``, worker i makes batches i, i+n, ..., so the loader yields them
    in order, each once; a source that cannot be shared with worker processes is refused with
    what to pass instead.
    """
    options = {"columns": columns, "nulls": nulls, "fill_value": fill_value, "dtype": dtype}
    options.update(order=order, device=None if device is None else str(device), drop_last=drop_last)
    options.update(ragged=ragged, pad_value=pad_value, max_len=max_len)
    return Batches(source, batch_size, prefetch, options)


def _speaks_arrow(obj: Any) -> bool:
    t = type(obj)
    return hasattr(t, "__arrow_c_stream__") or hasattr(t, "__arrow_c_array__")


def _is_lazy_frame(obj: Any) -> bool:
    t = type(obj)
    return t.__name__ == "LazyFrame" and t.__module__.startswith("polars")


def _in_memory(obj: Any) -> bool:
    """True for data that a forked worker can read from its copy of the parent's memory."""
    if isinstance(obj, (list, tuple)):
        return all(_in_memory(x) for x in obj)
    t = type(obj)
    return t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "Array", "ChunkedArray")


def _worker_shard() -> tuple[int, int]:
    """(worker id, worker count) inside a torch DataLoader worker, else (0, 1)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


def _register_with_torch() -> None:
    """Makes Batches an IterableDataset for torch's DataLoader, when torch is imported (a
    virtual subclass: dlframe does not import torch)."""
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(Batches, data.IterableDataset):
        data.IterableDataset.register(Batches)

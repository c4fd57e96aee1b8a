"""``dlframe.batches``: exact-size tensor batches of a result larger than memory, sharded over
ranks, shuffled and resumable for training."""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any, Iterator

from . import _native

_IN_WORKERS = (
    "this source cannot be read in DataLoader worker processes ({what}); pass a function that "
    "makes it there, dlframe.batches(make_source, ...), a pyarrow Table, Parquet files, or use "
    "num_workers=0 (dlframe converts the next batch on its own background thread already)"
)

#: The version of :meth:`Batches.state_dict`'s format.
STATE_VERSION = 1


class Batches:
    """An iterable of tensors of exactly ``batch_size`` rows over any Arrow stream; each
    iteration is one pass over the source (one epoch). See :func:`batches`."""

    def __init__(
        self, source: Any, batch_size: int, prefetch: int, options: dict[str, Any], training: dict[str, Any]
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, not {prefetch!r}")
        self.source = source
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.options = options
        self.training = _checked_training(training, batch_size)
        self._epoch = 0
        # Where the next pass starts: (rank batch, whether the state was a worker's own).
        self._resume: tuple[int, bool] | None = None
        # The pass in progress in this process: [first batch, stride, batches yielded].
        self._progress: list[int] | None = None
        # The first batch of the latest pass begun in this process.
        self._base = 0
        self._units: Any = None
        _register_with_torch()

    # -- the epoch ---------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next pass: with ``shuffle=True``, another epoch gives another
        order (as ``DistributedSampler.set_epoch`` does). A resumed state's position is kept
        when its own epoch is set again."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, not {epoch!r}")
        if epoch != self._epoch:
            self._resume, self._base = None, 0
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        """The epoch of the next (or current) pass."""
        return self._epoch

    def state_dict(self, batches_seen: int | None = None) -> dict[str, Any]:
        """Where this process is in the epoch: after ``load_state_dict`` in a fresh process,
        the next batch is the one an uninterrupted run would have given next. It is the
        position of the pass iterated in this process; inside a DataLoader worker, that
        worker's own (torchdata's ``StatefulDataLoader`` keeps one per worker). Where the
        batches are made in worker processes of a plain DataLoader, pass the number of batches
        your loop has taken this epoch as ``batches_seen``."""
        worker = _worker_shard()
        if batches_seen is not None:
            if not isinstance(batches_seen, int) or isinstance(batches_seen, bool) or batches_seen < 0:
                raise ValueError(f"batches_seen must be an int >= 0, not {batches_seen!r}")
            if worker != (0, 1):
                raise ValueError("batches_seen is the main process's count; a worker knows its own position")
            base = self._resume[0] if self._resume is not None and not self._resume[1] else self._base
            nxt = base + batches_seen
        elif self._progress is not None:
            first, stride, yielded = self._progress
            nxt = first + stride * yielded
        elif self._resume is not None:
            nxt = self._resume[0]
        else:
            nxt = 0
        t = self.training
        return {
            "version": STATE_VERSION,
            "stream_version": _native._STREAM_VERSION,
            "epoch": self._epoch,
            "next": nxt,
            "worker": list(worker) if worker != (0, 1) else None,
            "batch_size": self.batch_size,
            "drop_last": bool(self.options["drop_last"]),
            "world": self._shard()[1],
            "even": t["even"],
            "seed": t["seed"] if t["shuffle"] else None,
            "shuffle_buffer": t["shuffle_buffer"] if t["shuffle"] else None,
            "unit_rows": self._unit_rows() if t["shuffle"] else None,
            "rows": self._total_rows(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at the position ``state`` saved: the next pass starts with the batch that
        would have come next. A state saved under another world size, batch size, shuffle or
        source is refused, unless it can be honoured exactly (an unshuffled state under
        another batch size that divides the rows already given)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a dlframe.batches state of version {STATE_VERSION}: {state!r}")
        mine = self.state_dict()
        nxt, epoch = state.get("next"), state.get("epoch")
        for key, v in (("next", nxt), ("epoch", epoch)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"the state's {key!r} must be an int >= 0, not {v!r}")
        saved = state.get("batch_size")
        if isinstance(saved, int) and saved > 0 and saved != self.batch_size and state.get("seed") is None and mine["seed"] is None:
            rows = nxt * saved
            if rows % self.batch_size:
                raise ValueError(
                    f"the state was saved with batch_size={saved} after {rows} rows, which "
                    f"is not a whole number of batches of {self.batch_size}; resume with the same batch_size"
                )
            nxt, state = rows // self.batch_size, {**state, "batch_size": self.batch_size}
        keys = ["stream_version", "batch_size", "drop_last", "world", "even", "seed", "shuffle_buffer", "unit_rows", "rows"]
        for key in keys:
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"the state was saved with {key}={state.get(key)!r}, but these batches have "
                    f"{key}={mine[key]!r}: its position would not name the same batch here"
                )
        worker = state.get("worker")
        here = _worker_shard()
        if worker is not None:
            if not isinstance(worker, (list, tuple)) or tuple(worker) != here:
                raise ValueError(
                    f"the state is DataLoader worker {worker[0]}'s of {worker[1]}, and this is "
                    f"{'the main process' if here == (0, 1) else f'worker {here[0]} of {here[1]}'}: "
                    "load a worker's state in the same worker (torchdata's StatefulDataLoader does), "
                    "or save the state of the loop that consumes the batches"
                )
        self._epoch = epoch
        self._resume = (nxt, worker is not None)
        self._progress = None

    # -- passes ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        worker = _worker_shard()
        resume, own = self._resume if self._resume is not None else (0, False)
        self._resume, self._base = None, resume
        # Worker w of n makes batches start + w, start + w + n, ...; a worker's own state
        # names its own next batch.
        start = resume - worker[0] if own else resume
        first = resume if own else resume + worker[0]
        kind, source, units = self._source(worker)
        epoch = self._epoch_arg(kind, units, start)
        iterate = False
        if kind == "units":
            plan = _native._epoch_plan(self.batch_size, self.options["drop_last"], epoch)
            # The plan's units, whole and in its order; the stream keeps the rows of each that
            # this rank makes.
            source = _read_row_groups(self.source_dataset, self._units, plan["read"])
        elif kind == "stream":
            source, iterate = source
        stream = _native.BatchStream(
            source,
            self.batch_size,
            iterate=iterate,
            prefetch=self.prefetch,
            shard=worker,
            epoch=epoch,
            **self.options,
        )
        self._progress = [first, worker[1], 0]
        return _Pass(stream, self._progress, self.training["to"])

    def __len__(self) -> int:
        """Batches of this rank in one epoch (of all its DataLoader workers together), for a
        source whose length is known ahead; a stream has no length."""
        kind, _, units = self._source((0, 1), describe_only=True)
        if kind == "stream":
            raise TypeError(
                "dlframe.batches over a stream has no length (it is not known ahead); torch's "
                "DataLoader takes it as an IterableDataset when torch is imported before "
                "dlframe.batches() is called"
            )
        return int(self._plan(kind, units)["batches"])

    def plan(self) -> dict[str, int]:
        """This rank's epoch over a source of known length: ``rows`` and ``batches`` it makes,
        the source's ``total`` rows, and the rows ``dropped`` (``even="drop"``) or ``padded``
        (``even="pad"``) to give every rank the same count."""
        kind, _, units = self._source((0, 1), describe_only=True)
        if kind == "stream":
            raise TypeError("a stream's length is not known ahead, so it has no plan")
        p = self._plan(kind, units)
        return {k: p[k] for k in ("rows", "batches", "total", "dropped", "padded")}

    def _plan(self, kind: str, units: Any) -> dict[str, Any]:
        """The native plan of this rank's epoch over a "table" or "units" source."""
        return _native._epoch_plan(self.batch_size, self.options["drop_last"], self._epoch_arg(kind, units, 0))

    def _epoch_arg(self, kind: str, units: Any, start: int) -> dict[str, Any]:
        """The epoch as the native side takes it: this rank, the shuffle, the pass's first
        batch, and the source's rows (a table's count, or its units' counts)."""
        rank, world = self._shard()
        t = self.training
        epoch = {
            "rank": rank,
            "world": world,
            "even": t["even"],
            "seed": t["seed"] if t["shuffle"] else None,
            "buffer": t["shuffle_buffer"] or 0,
            "epoch": self._epoch,
            "start": start,
        }
        if kind == "table":
            epoch["table"] = (units, self._unit_rows())
        elif kind == "units":
            epoch["units"] = units
        return epoch

    # -- the source --------------------------------------------------------------------------

    def _shard(self) -> tuple[int, int]:
        shard = self.training["shard"]
        return _auto_shard() if shard == "auto" else shard

    def _unit_rows(self) -> int:
        """Rows of a unit of a table in memory: a batch unshuffled; with a shuffle, a sixteenth
        of the smaller of a batch and the buffer, so that every batch mixes rows from all over."""
        t = self.training
        if not t["shuffle"]:
            return self.batch_size
        return max(1, min(self.batch_size, t["shuffle_buffer"]) // 16)

    def _total_rows(self) -> int | None:
        kind, _, units = self._source((0, 1), describe_only=True)
        if kind == "table":
            return int(units)
        if kind == "units":
            return int(sum(units))
        return None

    def _source(self, worker: tuple[int, int], describe_only: bool = False) -> tuple[str, Any, Any]:
        """("table", source, rows), ("units", dataset, row counts of its row groups) or
        ("stream", (source, iterate), None)."""
        source = self.source
        if callable(source) and not _speaks_arrow(source) and not _is_path(source):
            if describe_only:
                return "stream", None, None
            source = source()
        elif worker != (0, 1) and not _in_memory(source) and not _is_parquet(source):
            raise TypeError(_IN_WORKERS.format(what=f"a {type(source).__module__}.{type(source).__name__}"))
        rows = _known_rows(source)
        if rows is not None:
            return "table", source, rows
        if _is_parquet(source):
            if self._units is None:
                self.source_dataset = _parquet_dataset(source)
                self._units = _row_groups(self.source_dataset)
            return "units", self.source_dataset, [u[2] for u in self._units]
        if describe_only:
            return "stream", None, None
        return "stream", _stream_of(source), None

    def __reduce__(self) -> Any:
        # The source is pickled here, once, so that a source that cannot be pickled is refused
        # with what to pass instead; the outer pickler carries its bytes. shard="auto" is
        # resolved here, where torch.distributed knows the rank.
        try:
            source = pickle.dumps(self.source)
        except Exception as e:
            raise TypeError(
                _IN_WORKERS.format(what=f"a {type(self.source).__name__} cannot be pickled: {e}")
            ) from e
        training = {**self.training, "shard": self._shard()}
        state = (self._epoch, self._resume)
        return (_unpickled, (source, self.batch_size, self.prefetch, self.options, training, state))

    def __repr__(self) -> str:
        return f"dlframe.batches({type(self.source).__name__}, batch_size={self.batch_size})"


class _Pass:
    """One pass: the native stream's batches, counted for :meth:`Batches.state_dict`, as
    torch tensors when asked."""

    def __init__(self, stream: Any, progress: list[int], to: str) -> None:
        self._stream = stream
        self._progress = progress
        self._torch = None
        if to == "torch":
            import torch

            self._torch = torch.from_dlpack

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        batch = next(self._stream)
        self._progress[2] += 1
        if self._torch is not None:
            return _to_torch(batch, self._torch)
        return batch

    def close(self) -> None:
        """Stops the background thread (batches already handed out stay valid)."""
        self._stream.close()


def _to_torch(batch: Any, from_dlpack: Any) -> Any:
    """A batch's tensors as torch tensors, without copying."""
    if isinstance(batch, dict):
        return {k: _to_torch(v, from_dlpack) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(from_dlpack(t) for t in batch)
    return from_dlpack(batch)


def _unpickled(
    source: bytes, batch_size: int, prefetch: int, options: dict[str, Any], training: dict[str, Any], state: Any
) -> Batches:
    """A pickled :class:`Batches` again, in a DataLoader worker."""
    b = Batches(pickle.loads(source), batch_size, prefetch, options, training)
    b._epoch, b._resume = state
    return b


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
    inexact: str = "error",
    shard: tuple[int, int] | str | None = None,
    even: str = "keep",
    shuffle: bool = False,
    seed: int | None = None,
    shuffle_buffer: int | None = None,
    to: str = "dlframe",
) -> Batches:
    """Exact-size tensor batches of any Arrow stream, for results larger than memory, sharded
    over ranks, shuffled and resumable for training.

    ``source`` is an object with ``__arrow_c_stream__`` or ``__arrow_c_array__`` (a DataFusion
    DataFrame, executed as a stream and never collected; a pyarrow Table, RecordBatchReader or
    dataset scanner; a Polars DataFrame, or a LazyFrame on the streaming engine; a duckdb
    result), Parquet files (a path, a directory, a list of paths, or a ``pyarrow.dataset``
    of Parquet files), an iterable of Arrow objects, or a function returning one (called at
    each pass, and in each DataLoader worker).

    Each batch has exactly ``batch_size`` rows, the last one fewer unless ``drop_last``. A
    table's batch is an ``(n, k)`` matrix (``columns="stack"``) or a dict of column tensors
    (``columns="dict"``); a single column's is its own tensor. ``nulls``, ``fill_value``,
    ``dtype``, ``inexact``, ``order``, ``device``, ``ragged``, ``pad_value`` and ``max_len`` are
    :func:`dlframe.to_dlpack`'s: ``nulls="mask"`` gives ``(values, mask)`` pairs, and a List
    column under ``ragged="pad"`` gives ``(values, lengths)`` (each batch as wide as its longest
    row, or ``max_len``) and under ``ragged="jagged"`` gives ``(values, offsets)``.
    ``to="torch"`` hands each tensor over as a torch tensor (zero-copy).

    Input batches of any sizes are cut and joined in the one fused pass that casts, interleaves
    and fills (a copy); a batch inside one input batch of a column without nulls shares its
    memory (no copy). The next batches are converted on background threads (up to ``prefetch``
    at once), without the GIL, while the consumer works: at most ``prefetch + 1`` batches are
    made ahead. A tensor handed out is never written again.

    Training:

    - ``shard=(rank, world_size)``, or ``"auto"`` for torch.distributed's (or the ``RANK`` and
      ``WORLD_SIZE`` variables'): each rank gets one contiguous share of the epoch's rows, and
      a source of known length (in memory, or Parquet, by row groups) is read only where the
      share lies. ``even="keep"`` keeps every row (ranks may then differ by one batch, which
      hangs DDP's last all-reduce), ``"drop"`` leaves the remainder rows out and ``"pad"``
      repeats rows from the start, so that every rank makes the same number of batches. A
      stream of unknown length is shared out by batches (rank r makes its batches r, r + world,
      ...) and read whole by every rank.
    - ``shuffle=True, seed=S``: the order of the units (row groups, or ranges of rows in
      memory) is shuffled, and rows are shuffled within blocks of ``shuffle_buffer`` rows
      (default one batch, at least 65,536 rows), deterministic for ``(seed, epoch)``; :meth:`Batches.set_epoch`
      changes it. The permutation is applied in the conversion pass itself (a gather).
    - :meth:`Batches.state_dict` / :meth:`Batches.load_state_dict` resume mid-epoch at exactly
      the next batch, also inside DataLoader workers (torchdata's ``StatefulDataLoader``).

    Works as ``torch.utils.data.DataLoader(dlframe.batches(...), batch_size=None)`` (import torch
    first). With ``num_workers=n``, worker i makes batches i, i+n, ..., so the loader yields them
    in order, each once; a source that cannot be shared with worker processes is refused with
    what to pass instead.
    """
    options = {"columns": columns, "nulls": nulls, "fill_value": fill_value, "dtype": dtype}
    options.update(order=order, device=None if device is None else str(device), drop_last=drop_last)
    options.update(ragged=ragged, pad_value=pad_value, max_len=max_len, inexact=inexact)
    training = {"shard": shard, "even": even, "shuffle": shuffle, "seed": seed}
    training.update(shuffle_buffer=shuffle_buffer, to=to)
    return Batches(source, batch_size, prefetch, options, training)


def _checked_training(t: dict[str, Any], batch_size: int) -> dict[str, Any]:
    shard = t["shard"]
    if shard is None:
        shard = (0, 1)
    elif shard != "auto":
        if (
            not isinstance(shard, (tuple, list))
            or len(shard) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in shard)
            or not 0 <= shard[0] < shard[1]
        ):
            raise ValueError(f"shard must be (rank, world_size) with 0 <= rank < world_size, or 'auto', not {shard!r}")
        shard = (int(shard[0]), int(shard[1]))
    if t["even"] not in ("keep", "drop", "pad"):
        raise ValueError(f"even must be 'keep', 'drop' or 'pad', not {t['even']!r}")
    if not isinstance(t["shuffle"], bool):
        raise ValueError(f"shuffle must be True or False, not {t['shuffle']!r}")
    seed, buffer = t["seed"], t["shuffle_buffer"]
    if t["shuffle"]:
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise ValueError(
                f"shuffle=True needs seed=, an int in [0, 2**64), the same on every rank, not {seed!r}"
            )
        buffer = max(batch_size, 65536) if buffer is None else buffer
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
            raise ValueError(f"shuffle_buffer must be a positive int (rows), not {buffer!r}")
    elif seed is not None or buffer is not None:
        raise ValueError("seed= and shuffle_buffer= take effect with shuffle=True only")
    if t["to"] not in ("dlframe", "torch"):
        raise ValueError(f"to must be 'dlframe' or 'torch', not {t['to']!r}")
    return {**t, "shard": shard, "seed": seed, "shuffle_buffer": buffer}


def _auto_shard() -> tuple[int, int]:
    """(rank, world size) of torch.distributed when it is initialized, else of the RANK and
    WORLD_SIZE variables (torchrun sets them), else (0, 1)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        return int(rank), int(world)
    return (0, 1)


def _speaks_arrow(obj: Any) -> bool:
    t = type(obj)
    methods = ("__arrow_c_stream__", "__arrow_c_array__", "__arrow_c_device_array__", "__arrow_c_device_stream__")
    return any(hasattr(t, m) for m in methods)


def _is_lazy_frame(obj: Any) -> bool:
    t = type(obj)
    return t.__name__ == "LazyFrame" and t.__module__.startswith("polars")


def _in_memory(obj: Any) -> bool:
    """True for data that a forked worker can read from its copy of the parent's memory."""
    if isinstance(obj, (list, tuple)):
        return all(_in_memory(x) for x in obj)
    t = type(obj)
    return t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "Array", "ChunkedArray")


def _known_rows(obj: Any) -> int | None:
    """The rows of a table or column held in memory (pyarrow, Polars), else None."""
    t = type(obj)
    memory = (t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "ChunkedArray")) or (
        t.__module__.startswith("polars") and t.__name__ in ("DataFrame", "Series")
    )
    if memory or (t.__module__.startswith("pyarrow") and isinstance(obj, _pyarrow_array())):
        return len(obj)
    return None


def _pyarrow_array() -> type:
    import pyarrow as pa

    return pa.Array


def _is_path(obj: Any) -> bool:
    if isinstance(obj, (str, os.PathLike)):
        return True
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and all(isinstance(x, (str, os.PathLike)) for x in obj)


def _is_parquet(obj: Any) -> bool:
    """Parquet files: paths, or a pyarrow FileSystemDataset of Parquet files."""
    if _is_path(obj):
        return True
    t = type(obj)
    return (
        t.__module__.startswith("pyarrow")
        and t.__name__ == "FileSystemDataset"
        and type(obj.format).__name__ == "ParquetFileFormat"
    )


def _parquet_dataset(obj: Any) -> Any:
    import pyarrow.dataset as ds

    if _is_path(obj):
        paths = [os.fspath(p) for p in obj] if isinstance(obj, (list, tuple)) else os.fspath(obj)
        return ds.dataset(paths, format="parquet")
    return obj


def _row_groups(dataset: Any) -> list[tuple[Any, int, int]]:
    """(fragment, row group id, rows) of every row group of a Parquet dataset, in its order
    (read from the files' footers)."""
    units = []
    for frag in dataset.get_fragments():
        frag.ensure_complete_metadata()
        units.extend((frag, rg.id, rg.num_rows) for rg in frag.row_groups)
    return units


def _read_row_groups(dataset: Any, units: list[tuple[Any, int, int]], read: list[int]) -> Any:
    """A reader of the row groups `read` (indices into `units`), whole and in that order,
    decoded by pyarrow's threads ahead of the consumer; the others are never read."""
    import pyarrow.dataset as ds

    fragments = [units[i][0].subset(row_group_ids=[units[i][1]]) for i in read]
    part = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
    # pyarrow decodes the next row groups while dlframe converts; its read-ahead is kept small,
    # so that memory stays near a few row groups.
    return part.scanner(use_threads=True, batch_readahead=4, fragment_readahead=2).to_reader()


def _stream_of(source: Any) -> tuple[Any, bool]:
    """(an Arrow producer, False) or (an iterable of them, True)."""
    if _is_lazy_frame(source):
        if hasattr(source, "collect_batches"):
            # Polars' streaming engine hands out DataFrames as it makes them.
            return source.collect_batches(engine="streaming"), True
        return source.collect(engine="streaming"), False
    if _speaks_arrow(source):
        return source, False
    if type(source).__module__.startswith("pyarrow") and hasattr(source, "scanner"):
        source = source.scanner()  # a pyarrow dataset of another format
    if type(source).__module__.startswith("pyarrow") and hasattr(source, "to_reader"):
        return source.to_reader(), False  # a pyarrow dataset scanner: its batches as they are read
    if hasattr(source, "__iter__") and not isinstance(source, (str, bytes, dict)):
        return source, True
    raise TypeError(
        "dlframe.batches takes an object with __arrow_c_stream__ or __arrow_c_array__ "
        "(a DataFusion DataFrame, a pyarrow Table, RecordBatchReader or dataset scanner, a "
        "Polars DataFrame or LazyFrame, a duckdb result), Parquet files, an iterable of them, "
        f"or a function that returns one, not {type(source).__name__}"
    )


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

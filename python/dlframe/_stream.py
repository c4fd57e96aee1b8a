"""``dlframe.batches``: exact-size tensor batches of a result larger than memory, for training:
split so that a restart on another world size continues the same order, shuffled, resumable.

The rules (the plan of an epoch, the saved state and its checks) are the native ``Schedule``
and ``Plan``; this module finds the rank, the DataLoader worker and the source's units, and
picks the reader of Parquet row groups (dlframe's, or pyarrow's)."""

from __future__ import annotations

import json
import pickle
import sys
from typing import Any, Iterator

from . import _native
from ._place import _Control, _auto_shard, _checked_shard, _index, _register_with_torch, _worker
from ._sources import _in_memory, _is_parquet, _is_path, _known_rows, _parquet_dataset, _read_row_groups
from ._sources import _IN_WORKERS, _native_files, _row_groups, _speaks_arrow, _stream_of

class Batches:
    """An iterable of tensors of exactly ``batch_size`` rows over any Arrow stream; each
    iteration is one pass over the source (one epoch). See :func:`batches`."""

    def __init__(self, source: Any, batch_size: Any, settings: dict[str, Any], shard: Any, to: str) -> None:
        self._schedule = _native.Schedule(batch_size, **settings)
        self.source, self.batch_size, self._settings = source, self._schedule.batch_size, settings
        self._shard = "auto" if shard == "auto" else _checked_shard((0, 1) if shard is None else shard)
        if to not in ("dlframe", "torch"):
            raise ValueError(f"to must be 'dlframe' or 'torch', not {to!r}")
        self._to = to
        self._ctl = _Control()
        self._consumed = -1  # the generation of the loaded position this process has used
        self._progress: list[int] | None = None  # [first step, stride, batches yielded]
        self._rows: list[int] | None = None  # the rows of a Parquet source's row groups
        self._units: Any = None  # pyarrow's fragments of them, or
        self._files: Any = None  # dlframe's reader of them, where it takes them
        self._reader = ""
        _register_with_torch(Batches)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next pass, in this process and in DataLoader workers (persistent
        ones too): with ``shuffle=True``, another epoch gives another order, as
        ``DistributedSampler.set_epoch`` does. A loaded state's position is kept when its own
        epoch is set again."""
        epoch = _index(epoch, "epoch")
        c = self._ctl
        if epoch != c.epoch:
            c.set(epoch=epoch, step=0, own=0, generation=c.generation + 1, pass_id=-1, in_workers=0)

    @property
    def epoch(self) -> int:
        """The epoch of the next (or current) pass."""
        return self._ctl.epoch

    def state_dict(self, batches_seen: int | None = None) -> dict[str, Any]:
        """The job's position: the epoch, the next global step, and everything the rows of that
        step depend on. Under DDP every rank is at the same step, so rank 0's state is the job's.
        Inside a DataLoader worker it is that worker's own (torchdata's ``StatefulDataLoader``
        keeps one per worker). Where a plain DataLoader's workers make the batches, pass the
        number of batches your loop took this epoch as ``batches_seen``."""
        worker, _ = _worker()
        c = self._ctl
        if batches_seen is not None:
            if worker != (0, 1):
                raise ValueError("batches_seen is the main process's count; a worker knows its own position")
            step = (0 if c.own else c.step) + _index(batches_seen, "batches_seen")
        elif self._progress is not None:
            first, stride, yielded = self._progress
            step = first + stride * yielded
        elif c.in_workers:
            raise ValueError(
                "this epoch's batches are made in DataLoader worker processes, whose position this "
                "process does not see: pass the batches your loop took, state_dict(batches_seen=n), "
                "or save torchdata's StatefulDataLoader.state_dict()"
            )
        else:
            step = c.step if self._consumed != c.generation else 0
        plan = self._plan(self._source(worker, describe=True)[2])
        return json.loads(plan.state(step, None if worker == (0, 1) else worker))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state``: the next pass starts at its step, with the same rows, here
        or on another world size that divides its splits (with ``batch_size x world`` equal to
        its). A state of another source, layout, seed, splits or global batch, or past the end of
        its epoch, is refused with ``ValueError`` naming what differs."""
        if not isinstance(state, dict):
            raise ValueError(f"not a dlframe.batches state: {state!r}")
        worker, _ = _worker()
        rank, world = self._rank()
        rows, units = self._source(worker, describe=True)[2]
        text = json.dumps(state)
        epoch, step, own, splits, buffer = self._schedule.resume(text, rows, units, rank=rank, world=world, worker=worker)
        c = self._ctl
        c.set(epoch=epoch, step=step, own=int(own), generation=c.generation + 1, pass_id=-1, in_workers=0)
        c.set(splits=-1 if splits is None else splits, buffer=-1 if buffer is None else buffer)
        self._progress = None

    def __iter__(self) -> Iterator[Any]:
        worker, pass_id = _worker()
        c = self._ctl
        # A loaded position is used by the first pass after it: in this process, or by every
        # worker of the first DataLoader pass (they share its seed).
        fresh = c.generation != self._consumed and (pass_id is None or c.pass_id in (-1, pass_id))
        step, own = (c.step, bool(c.own)) if fresh else (0, False)
        self._consumed = c.generation
        if pass_id is not None:
            c.set(pass_id=pass_id, in_workers=1)
        kind, source, layout = self._source(worker)
        plan = self._plan(layout)
        if kind == "units":
            source = self._files or _read_row_groups(self._dataset, self._units, plan.reads(step, own, worker))
        stream = _native.BatchStream(
            source, self._schedule, plan, step=step, own=own, worker=worker, iterate=kind == "iterable"
        )
        self._progress = [step if own else step + worker[0], worker[1], 0]
        return _Pass(stream, self._progress, self._to)

    def __len__(self) -> int:
        """Batches of this rank in one epoch (all its DataLoader workers'); a stream has none."""
        kind, source, layout = self._source((0, 1), describe=True)
        batches = self._plan(layout).batches
        if batches is None:
            raise TypeError(
                f"dlframe.batches over a stream ({type(source).__name__}) has no length: it is not "
                "known ahead; torch's DataLoader takes it as an IterableDataset when torch is "
                "imported before dlframe.batches() is called"
            )
        return int(batches)

    def plan(self) -> dict[str, Any]:
        """This rank's epoch: ``rows`` and ``batches`` it makes, the source's ``total`` rows,
        rows ``dropped`` or ``padded`` by ``even``, the epoch's global ``steps`` of
        ``global_batch`` rows, its ``splits``, whether the order is ``elastic`` (continues on
        another world size), the ``shuffle_buffer``, a ``note`` where the splits are not
        what was asked for (a stream's counts are None: its length is not known ahead), and
        for Parquet files the ``reader``: ``"dlframe"``, or ``"pyarrow: "`` and why."""
        summary = json.loads(self._plan(self._source((0, 1), describe=True)[2]).summary())
        if self._rows is not None:
            summary["reader"] = self._reader
        return summary

    def _plan(self, layout: tuple[int | None, list[int] | None]) -> Any:
        rank, world = self._rank()
        c = self._ctl
        adopted = {"splits": None if c.splits < 0 else c.splits, "shuffle_buffer": None if c.buffer < 0 else c.buffer}
        return self._schedule.plan(*layout, rank=rank, world=world, epoch=c.epoch, **adopted)

    def _rank(self) -> tuple[int, int]:
        return _auto_shard() if self._shard == "auto" else self._shard

    def _source(self, worker: tuple[int, int], describe: bool = False) -> tuple[str, Any, Any]:
        """(kind, the source to read, (rows, units)): a "table" of known rows, Parquet "units"
        (row groups), or a "stream" or "iterable" of Arrow producers."""
        source = self.source
        if callable(source) and not _speaks_arrow(source) and not _is_path(source):
            source = source()
        elif worker != (0, 1) and not _in_memory(source) and not _is_parquet(source):
            raise TypeError(_IN_WORKERS.format(what=f"a {type(source).__module__}.{type(source).__name__}"))
        rows = _known_rows(source)
        if rows is not None:
            return "table", source, (rows, None)
        if _is_parquet(source):
            if self._rows is None:
                self._dataset = _parquet_dataset(source)
                self._files, self._reader = _native_files(source, self._dataset, self._schedule)
                if self._files is None:
                    self._units = _row_groups(self._dataset)
                self._rows = self._files.units if self._files is not None else [u[2] for u in self._units]
            return "units", self._dataset, (None, self._rows)
        if describe:
            return "stream", source, (None, None)
        source, iterate = _stream_of(source)
        return ("iterable" if iterate else "stream"), source, (None, None)

    def __reduce__(self) -> Any:
        # The source is pickled here, once, so that a source that cannot be pickled is refused
        # with what to pass instead. shard="auto" is resolved here, where the rank is known.
        try:
            source = pickle.dumps(self.source)
        except Exception as e:
            raise TypeError(_IN_WORKERS.format(what=f"a {type(self.source).__name__} cannot be pickled: {e}")) from e
        args = (source, self.batch_size, self._settings, self._rank(), self._to, self._ctl, self._consumed)
        return (_unpickled, args)

    def __repr__(self) -> str:
        return f"dlframe.batches({type(self.source).__name__}, batch_size={self.batch_size})"


def _unpickled(source: bytes, batch_size: int, settings: Any, shard: Any, to: str, ctl: _Control, seen: int) -> Batches:
    """A pickled :class:`Batches` again, in a DataLoader worker.""" 
    b = Batches(pickle.loads(source), batch_size, settings, shard, to)
    b._ctl, b._consumed = ctl, seen
    return b


class _Pass:
    """One pass: the native stream's batches, counted for :meth:`Batches.state_dict`, as
    torch tensors when asked."""

    def __init__(self, stream: Any, progress: list[int], to: str) -> None:
        self._stream, self._progress = stream, progress
        self._torch = __import__("torch").from_dlpack if to == "torch" else None

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        batch = next(self._stream)
        self._progress[2] += 1
        return batch if self._torch is None else _to_torch(batch, self._torch)

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
    splits: int | None = None,
    to: str = "dlframe",
) -> Batches:
    """Exact-size tensor batches of any Arrow stream, for results larger than memory, split over
    ranks, shuffled and resumable for training (also on another number of ranks).

    ``source`` is an object with ``__arrow_c_stream__`` or ``__arrow_c_array__`` (a DataFusion
    DataFrame, executed as a stream and never collected; a pyarrow Table, RecordBatchReader or
    dataset scanner; a Polars DataFrame, or a LazyFrame on the streaming engine; a duckdb
    result), Parquet files (a path, a directory, a list of paths, ``s3://`` URIs, or a
    ``pyarrow.dataset`` of Parquet files on any filesystem), an iterable of Arrow objects, or a
    function returning one (called at each pass, and in each DataLoader worker).

    Each batch has exactly ``batch_size`` rows, the last one fewer unless ``drop_last``. A
    table's batch is an ``(n, k)`` matrix (``columns="stack"``) or a dict of column tensors
    (``columns="dict"``); a single column's is its own tensor. ``nulls``, ``fill_value``,
    ``dtype``, ``inexact``, ``order``, ``device``, ``ragged``, ``pad_value`` and ``max_len`` are
    :func:`dlframe.to_dlpack`'s: ``nulls="mask"`` gives ``(values, mask)`` pairs, and a List
    column under ``ragged="pad"`` gives ``(values, lengths)`` and under ``ragged="jagged"`` gives
    ``(values, offsets)``. ``to="torch"`` hands each tensor over as a torch tensor (zero-copy).
    Input batches are cut and joined in the one fused pass that casts, interleaves and fills,
    ``prefetch`` batches ahead on background threads. A tensor handed out is never written again.

    Training (``docs/training.md``):

    - ``shard=(rank, world_size)``, or ``"auto"`` (torch.distributed's, or the ``RANK`` and
      ``WORLD_SIZE`` variables'). A global step is ``batch_size x world_size`` rows; an epoch of
      a source of known length (in memory, or Parquet by row groups) is cut into ``splits``
      ranges (default 8 when shuffled, one per rank when not), each giving its share of every
      step, and each rank reads only its own splits. The steps are the same on every world size
      that divides ``splits``. ``even`` says what the last, partial step does: ``"keep"`` every
      row (ranks may differ by one batch), ``"drop"`` or ``"pad"`` (every rank the same count).
      A stream of unknown length is read whole by every rank, each making its part of a step.
    - ``shuffle=True, seed=S``: units (row groups, or ranges of rows in memory) in an order drawn
      from ``(seed, epoch)``, and each split's rows permuted in blocks of ``shuffle_buffer``
      rows of the whole job (default one step, at least 65,536); :meth:`Batches.set_epoch`
      changes the epoch, also in DataLoader workers.
    - :meth:`Batches.state_dict` / :meth:`Batches.load_state_dict` continue at exactly the next
      step, in a fresh process, inside DataLoader workers (torchdata's ``StatefulDataLoader``),
      or on another world size with the same ``batch_size x world_size``.

    Works as ``torch.utils.data.DataLoader(dlframe.batches(...), batch_size=None)`` (import torch
    first): with ``num_workers=n``, worker i makes batches i, i+n, ..., so the loader yields them
    in order, each once.
    """
    settings = {"columns": columns, "nulls": nulls, "fill_value": fill_value, "dtype": dtype, "order": order}
    settings.update(device=None if device is None else str(device), drop_last=drop_last, prefetch=prefetch)
    settings.update(ragged=ragged, pad_value=pad_value, max_len=max_len, inexact=inexact, even=even)
    settings.update(shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer, splits=splits)
    return Batches(source, batch_size, settings, shard, to)

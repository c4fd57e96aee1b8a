"""Where a pass of ``dlframe.batches`` runs: the rank (``shard=``, torch.distributed, or the
``RANK`` and ``WORLD_SIZE`` variables), the DataLoader worker, and the epoch and loaded position
shared with worker processes."""

from __future__ import annotations

import operator
import os
import sys
from typing import Any


class _Control:
    """The epoch and a loaded position, shared with DataLoader worker processes (persistent
    ones too): written where ``set_epoch`` and ``load_state_dict`` run, read where a pass runs."""

    FIELDS = ("epoch", "step", "own", "generation", "splits", "buffer", "pass_id", "in_workers")

    def __init__(self, values: Any = None) -> None:
        values = list(values) if values is not None else [0, 0, 0, 0, -1, -1, -1, 0]
        try:
            import multiprocessing

            self._a: Any = multiprocessing.RawArray("q", values)
        except Exception:  # no shared memory here: the values stay in this process
            self._a = values

    def __getattr__(self, name: str) -> int:
        return int(self.__dict__["_a"][_Control.FIELDS.index(name)])

    def set(self, **values: int) -> None:
        for k, v in values.items():
            self._a[_Control.FIELDS.index(k)] = v

    def __reduce__(self) -> Any:
        from multiprocessing import context

        if context.get_spawning_popen() is not None and not isinstance(self._a, list):
            return (_shared_control, (self._a,))  # a worker being spawned shares the memory
        return (_Control, (list(self._a),))


def _shared_control(a: Any) -> _Control:
    c = _Control.__new__(_Control)
    c._a = a
    return c


def _index(v: Any, name: str) -> int:
    """An int >= 0 (a numpy integer too, not a bool)."""
    try:
        n = operator.index(v) if not isinstance(v, bool) else -1
    except TypeError:
        n = -1
    if n < 0:
        raise ValueError(f"{name} must be an int >= 0, not {v!r}")
    return n


def _checked_shard(shard: Any) -> tuple[int, int]:
    if not isinstance(shard, (tuple, list)) or len(shard) != 2:
        raise ValueError(f"shard must be (rank, world_size) with 0 <= rank < world_size, or 'auto', not {shard!r}")
    rank, world = (_index(x, "shard's rank and world_size") for x in shard)
    if not rank < world:
        raise ValueError(f"shard must be (rank, world_size) with 0 <= rank < world_size, or 'auto', not {shard!r}")
    return rank, world


def _auto_shard() -> tuple[int, int]:
    """(rank, world size) of torch.distributed when it is initialized, else of the RANK and
    WORLD_SIZE variables (torchrun sets both), else (0, 1)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if (rank is None) != (world is None):
        raise ValueError(
            f"shard='auto' found RANK={rank!r} and WORLD_SIZE={world!r}: set both (torchrun does), "
            "initialize torch.distributed, or pass shard=(rank, world_size)"
        )
    if rank is None:
        return (0, 1)
    try:
        return _checked_shard((int(rank), int(world)))
    except ValueError as e:
        raise ValueError(f"shard='auto': RANK={rank!r}, WORLD_SIZE={world!r}: {e}") from None


def _worker() -> tuple[tuple[int, int], int | None]:
    """((worker id, worker count), the DataLoader pass's seed) inside a torch DataLoader worker,
    else ((0, 1), None). The workers of one pass share its base seed; another pass has another."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    if info is None:
        return (0, 1), None
    return (int(info.id), int(info.num_workers)), int(info.seed) - int(info.id)


def _register_with_torch(batches_type: type) -> None:
    """Makes Batches an IterableDataset for torch's DataLoader, when torch is imported (a
    virtual subclass: dlframe does not import torch)."""
    data = sys.modules.get("torch.utils.data")
    if data is not None and not issubclass(batches_type, data.IterableDataset):
        data.IterableDataset.register(batches_type)

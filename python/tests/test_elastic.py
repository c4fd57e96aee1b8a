"""Elastic order: an epoch's global steps are the same for every world size that divides the
splits, a state saved on one world size continues on another with every row once, a rank reads
only the row groups of its splits, and the cases where a resume used to repeat or drop rows
silently are refused or fixed."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import dlframe
from conftest import optional
from training_helpers import id_table, pafs_dataset, row_groups_read, write_parquet

HERE = os.path.dirname(os.path.abspath(__file__))
G = 96  # rows of a global step: batch_size x world


def ids_of(batches):
    return [np.from_dlpack(b["id"]).tolist() for b in batches]


def make(source, world, rank, epoch=0, **kw):
    kw = {"shuffle": True, "seed": 17, "splits": 8, **kw}
    b = dlframe.batches(source, G // world, shard=(rank, world), columns="dict", **kw)
    b.set_epoch(epoch)
    return b


def steps_of(per_rank):
    """The global steps: step s is the ranks' batches s, rank 0 first."""
    n = max(len(b) for b in per_rank)
    return [sum((b[s] if s < len(b) else [] for b in per_rank), []) for s in range(n)]


def global_steps(source, world, epoch=0, **kw):
    return steps_of([ids_of(make(source, world, r, epoch, **kw)) for r in range(world)])


@pytest.fixture(params=["memory", "parquet"])
def source(request, tmp_path):
    """10,007 rows in memory, or in 3 Parquet files of row groups of 500 (the last ones short)."""
    if request.param == "memory":
        return id_table(10_007), 10_007
    write_parquet(str(tmp_path), files=3, rows=3_001, row_group=500)
    return str(tmp_path), 9_003


def test_global_steps_are_equal_for_every_world_size_that_divides_the_splits(source):
    data, rows = source
    base = global_steps(data, 1)
    assert sorted(sum(base, [])) == list(range(rows))
    assert [len(s) for s in base[:-1]] == [G] * (len(base) - 1)
    for world in (2, 4, 8):
        assert global_steps(data, world) == base, world
    # Another epoch is another order, elastic too.
    other = global_steps(data, 1, epoch=1)
    assert other != base and sorted(sum(other, [])) == list(range(rows))
    assert global_steps(data, 4, epoch=1) == other
    # Without a shuffle too, with splits= given.
    plain = global_steps(data, 1, shuffle=False, seed=None)
    assert global_steps(data, 8, shuffle=False, seed=None) == plain
    assert sorted(sum(plain, [])) == list(range(rows))


@pytest.mark.parametrize("before,after", [(4, 2), (2, 8), (8, 1)])
def test_a_state_saved_on_one_world_size_continues_on_another_with_every_row_once(source, before, after):
    data, rows = source
    base = global_steps(data, 1, epoch=3)
    k = len(base) // 3
    first = []
    for rank in range(before):
        b = make(data, before, rank, epoch=3)
        it = iter(b)
        first.append([np.from_dlpack(next(it)["id"]).tolist() for _ in range(k)])
        if rank == 0:
            state = pickle.loads(pickle.dumps(b.state_dict()))
    assert state["step"] == k and state["epoch"] == 3
    rest = []
    for rank in range(after):
        b = make(data, after, rank)
        b.load_state_dict(state)
        assert b.epoch == 3
        rest.append(ids_of(b))
    got = steps_of(first) + steps_of(rest)
    assert got == base
    assert sorted(sum(got, [])) == list(range(rows))


def test_each_rank_reads_only_the_row_groups_of_its_splits(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_parquet(str(data), files=4, rows=4_000, row_group=250)  # 64 row groups of 250 rows
    for rank in range(4):
        log = str(tmp_path / f"reads-{rank}.log")
        b = make(pafs_dataset(str(data), log), 4, rank)
        rows = sum(ids_of(b), [])
        assert len(rows) == 4_000
        # The row groups that hold the rank's rows, and no other, were read.
        want = {(r // 4_000, (r % 4_000) // 250) for r in rows}
        got = {(int(os.path.basename(p)[5:-8]), g) for p, g in row_groups_read(log)}
        assert got == want, (rank, sorted(got - want), sorted(want - got))
        assert len(got) <= 64 // 4 + 2  # its quarter, and at most one shared at each end


def test_a_state_over_another_layout_of_the_same_rows_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_parquet(str(a), files=1, rows=50_003, row_group=3_000)
    write_parquet(str(b), files=1, rows=50_003, row_group=1_111)
    saved = dlframe.batches(str(a), 1000, shuffle=True, seed=1)
    it = iter(saved)
    next(it), next(it)
    state = saved.state_dict()
    assert state["source"]["units"] == 17 and state["source"]["rows"] == 50_003
    with pytest.raises(ValueError, match="saved with source=17 units .* but these batches have source=46 units"):
        dlframe.batches(str(b), 1000, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="but these batches have source=a table of 50003 rows in memory"):
        dlframe.batches(id_table(50_003), 1000, shuffle=True, seed=1).load_state_dict(state)
    # The same layout continues.
    again = dlframe.batches(str(a), 1000, shuffle=True, seed=1)
    again.load_state_dict(state)
    assert len(list(again)) == len(saved) - 2


def test_a_state_past_the_end_is_refused_and_one_at_the_end_gives_nothing():
    table = id_table(1000)
    b = dlframe.batches(table, 100, shuffle=True, seed=1)
    state = b.state_dict()
    end = dlframe.batches(table, 100, shuffle=True, seed=1)
    end.load_state_dict({**state, "step": 10})
    assert list(end) == []
    with pytest.raises(ValueError, match="saved with step=11, but these batches have step=at most 10"):
        dlframe.batches(table, 100, shuffle=True, seed=1).load_state_dict({**state, "step": 11})


def test_rank_without_world_size_is_refused(monkeypatch):
    table = id_table(10)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="found RANK='1' and WORLD_SIZE=None"):
        len(dlframe.batches(table, 2, shard="auto"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="RANK='1', WORLD_SIZE='1'"):
        list(dlframe.batches(table, 2, shard="auto"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert dlframe.batches(table, 2, shard="auto").plan()["rows"] == 5


def test_numpy_integers_are_ints_everywhere():
    table = id_table(1000)
    b = dlframe.batches(
        table,
        np.int64(50),
        shard=(np.int64(1), np.int32(2)),
        shuffle=True,
        seed=np.uint64(7),
        splits=np.int16(4),
        shuffle_buffer=np.int64(300),
        prefetch=np.int8(1),
        columns="dict",
    )
    b.set_epoch(np.int64(2))
    ref = dlframe.batches(table, 50, shard=(1, 2), shuffle=True, seed=7, splits=4, shuffle_buffer=300, columns="dict")
    ref.set_epoch(2)
    assert ids_of(b) == ids_of(ref)
    assert b.state_dict(batches_seen=np.int64(3))["step"] == 3
    with pytest.raises(ValueError, match="batch_size must be a positive int, not True"):
        dlframe.batches(table, True)


def test_len_and_plan_work_on_a_callable_source_or_say_why():
    table = id_table(1000)
    b = dlframe.batches(lambda: table, 100, shard=(1, 2))
    assert len(b) == 5
    assert b.plan()["rows"] == 500
    s = dlframe.batches(lambda: table.to_reader(), 100)
    with pytest.raises(TypeError, match=r"over a stream \(RecordBatchReader\) has no length"):
        len(s)
    p = s.plan()
    assert p["batches"] is None and "stream" in p["note"]


def test_the_plan_says_when_the_order_is_not_elastic():
    table = id_table(1000)
    p = dlframe.batches(table, 10, shard=(0, 4), shuffle=True, seed=1).plan()
    assert (p["splits"], p["elastic"], p["note"], p["global_batch"]) == (8, True, None, 40)
    p = dlframe.batches(table, 10, shard=(0, 3), shuffle=True, seed=1).plan()
    assert (p["splits"], p["elastic"]) == (3, False)
    assert "splits=8 cannot be shared by 3 ranks" in p["note"]
    with pytest.raises(ValueError, match="splits=8 cannot be shared by 3 ranks"):
        len(dlframe.batches(table, 10, shard=(0, 3), splits=8))


def test_set_epoch_reaches_persistent_dataloader_workers():
    optional("torch")
    from torch.utils.data import DataLoader

    table = id_table(4000)
    b = dlframe.batches(table, 250, columns="dict", shuffle=True, seed=3, to="torch")
    loader = DataLoader(b, batch_size=None, num_workers=2, persistent_workers=True)
    seen = []
    for epoch in range(3):
        b.set_epoch(epoch)
        seen.append([x["id"].tolist() for x in loader])
    for epoch in range(3):
        ref = dlframe.batches(table, 250, columns="dict", shuffle=True, seed=3)
        ref.set_epoch(epoch)
        assert seen[epoch] == ids_of(ref), epoch
    assert seen[0] != seen[1] != seen[2]


def test_a_plain_dataloader_s_state_without_batches_seen_is_refused():
    optional("torch")
    from torch.utils.data import DataLoader

    b = dlframe.batches(id_table(1000), 100, columns="dict", shuffle=True, seed=3, to="torch")
    for i, _ in enumerate(DataLoader(b, batch_size=None, num_workers=2)):
        if i == 3:
            break
    with pytest.raises(ValueError, match="made in DataLoader worker processes.*batches_seen"):
        b.state_dict()
    assert b.state_dict(batches_seen=4)["step"] == 4


def test_torchrun_on_four_ranks_restarts_on_two_with_every_row_once(tmp_path):
    optional("torch")
    data = tmp_path / "data"
    data.mkdir()
    write_parquet(str(data), files=4, rows=2_000, row_group=200)
    state = tmp_path / "state.json"

    def torchrun(world, phase, stop):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
        cmd += [os.path.join(HERE, "elastic_job.py"), str(data), str(tmp_path), phase, str(stop), str(state)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
        subprocess.run(cmd, check=True, timeout=300, env=env, stdout=subprocess.DEVNULL)
        return [json.load(open(tmp_path / f"{phase}-{r}.json")) for r in range(world)]

    first = torchrun(4, "first", 7)
    assert json.load(open(state))["step"] == 7
    rest = torchrun(2, "rest", -1)
    got = steps_of(first) + steps_of(rest)
    assert sorted(sum(got, [])) == list(range(8_000))
    # The same steps as one process going through the epoch without a stop.
    b = dlframe.batches(str(data), 64, columns="dict", shuffle=True, seed=5)
    b.set_epoch(1)
    assert got == steps_of([ids_of(b)])

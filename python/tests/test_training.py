"""dlframe.batches for training: sharding over ranks (equal counts, every row once, each rank
reading only its own row groups), shuffling (fixed by seed and epoch, mixing beyond the
buffer), resuming in a fresh process bit for bit, and real torch.distributed ranks with
DataLoader workers."""

import json
import os
import pickle
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

import dlframe
from conftest import optional
from training_helpers import id_table, pafs_dataset, row_groups_read, write_parquet

HERE = os.path.dirname(os.path.abspath(__file__))


def ids_of(batches):
    """The row ids of each batch of columns="dict" batches."""
    return [np.from_dlpack(b["id"]).tolist() for b in batches]


@pytest.mark.parametrize("even", ["keep", "drop", "pad"])
@pytest.mark.parametrize("source", ["memory", "parquet"])
def test_ranks_share_the_rows_out_once_with_equal_counts(tmp_path, even, source):
    rows, world = 1003, 4
    data = id_table(rows) if source == "memory" else str(tmp_path)
    if source == "parquet":
        write_parquet(str(tmp_path), files=3, rows=rows // 3, row_group=50)
        rows = rows // 3 * 3
    per_rank = [ids_of(dlframe.batches(data, 32, shard=(r, world), even=even, columns="dict")) for r in range(world)]
    counts = [len(b) for b in per_rank]
    flat = [sum(b, []) for b in per_rank]
    everything = sorted(sum(flat, []))
    if even == "keep":
        assert max(counts) - min(counts) <= 1
        assert everything == list(range(rows))
    elif even == "drop":
        assert len(set(counts)) == 1 and len(set(map(len, flat))) == 1
        assert len(everything) == rows - rows % world == len(set(everything))
    else:
        assert len(set(counts)) == 1 and len(set(map(len, flat))) == 1
        assert set(everything) == set(range(rows))
        assert len(everything) == -(-rows // world) * world
    for r in range(world):
        b = dlframe.batches(data, 32, shard=(r, world), even=even)
        assert len(b) == counts[r]


def test_one_hundred_rows_over_four_ranks_and_two_workers_give_twenty_five_each():
    torch = optional("torch")
    from torch.utils.data import DataLoader

    table = id_table(100)
    seen = []
    for rank in range(4):
        b = dlframe.batches(table, 4, shard=(rank, 4), columns="dict", to="torch")
        loader = DataLoader(b, batch_size=None, num_workers=2)
        rows = torch.cat([x["id"] for x in loader]).tolist()
        assert len(rows) == 25, rank
        seen += rows
    assert sorted(seen) == list(range(100))


def test_each_rank_reads_only_the_row_groups_of_its_rows(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    write_parquet(str(data_dir), files=4, rows=4000, row_group=1000)  # 16 row groups of 1000
    world = 3
    for rank in range(world):
        log = str(tmp_path / f"reads-{rank}.log")
        b = dlframe.batches(pafs_dataset(str(data_dir), log), 500, shard=(rank, world), columns="dict")
        rows = sum(ids_of(b), [])
        lo = rank * 16000 // world
        assert rows == list(range(lo, lo + len(rows)))
        # The row groups that hold rows lo..lo+len: the rank's own, and no other.
        want = {g for g in range(16) if g * 1000 < lo + len(rows) and lo < (g + 1) * 1000}
        got = {int(os.path.basename(p)[5:-8]) * 4 + g for p, g in row_groups_read(log)}
        assert got == want, (rank, sorted(got), sorted(want))


def test_a_shuffle_is_fixed_by_seed_and_epoch_and_gives_every_row_once():
    table = id_table(20_000)
    run = lambda **kw: ids_of(dlframe.batches(table, 1000, columns="dict", shuffle=True, **kw))
    a = run(seed=7)
    assert a == run(seed=7)
    flat = sum(a, [])
    assert sorted(flat) == list(range(20_000)) and flat != list(range(20_000))
    assert sum(run(seed=8), []) != flat
    b = dlframe.batches(table, 1000, columns="dict", shuffle=True, seed=7)
    b.set_epoch(1)
    epoch1 = sum(ids_of(b), [])
    assert sorted(epoch1) == list(range(20_000)) and epoch1 != flat
    b.set_epoch(0)
    assert ids_of(b) == a


def test_a_shuffle_mixes_beyond_its_buffer():
    # With the default buffer (65,536 rows), a block-local shuffle would keep each batch's rows
    # within a window of 66,000 ids. Unit order is shuffled too: a batch draws from all over.
    rows, batch = 100_000, 1000
    got = ids_of(dlframe.batches(id_table(rows), batch, columns="dict", shuffle=True, seed=3))
    spans = [max(b) - min(b) for b in got]
    assert np.median(spans) > 0.8 * rows, np.median(spans)
    # Position in the epoch and row id are uncorrelated (Spearman's rho near 0; a block-local
    # shuffle of this table gives rho > 0.99).
    flat = np.array(sum(got, []))
    rho = np.corrcoef(np.arange(rows), flat)[0, 1]
    assert abs(rho) < 0.05, rho
    # Within one batch the ids are not sorted runs: adjacent rows come from different units.
    first = np.array(got[0])
    assert np.mean(np.abs(np.diff(first)) == 1) < 0.05


def test_a_shuffled_stack_and_the_unshuffled_one_hold_the_same_rows():
    table = id_table(5000)
    plain = np.concatenate([np.from_dlpack(b) for b in dlframe.batches(table, 512, dtype="float64")])
    mixed = np.concatenate(
        [np.from_dlpack(b) for b in dlframe.batches(table, 512, dtype="float64", shuffle=True, seed=1)]
    )
    assert mixed.shape == plain.shape
    np.testing.assert_array_equal(mixed[np.argsort(mixed[:, 0])], plain)
    np.testing.assert_array_equal(mixed[:, 2], 2 * mixed[:, 0])  # rows stay whole


RESUME = """
import pickle, sys
sys.path.insert(0, {here!r})
import numpy as np
import dlframe
from training_helpers import id_table
state_in, k, state_out, out = sys.argv[1:5]
k = int(k)
b = dlframe.batches({source}, 700, columns="dict", shuffle=True, seed=5, shard=(1, 3), even="pad")
b.set_epoch(2)
if state_in != "-":
    b.load_state_dict(pickle.load(open(state_in, "rb")))
got = []
it = iter(b)
for i, x in enumerate(it):
    got.append(np.from_dlpack(x["id"]).tolist())
    if len(got) == k:
        break
pickle.dump(b.state_dict(), open(state_out, "wb"))
pickle.dump(got, open(out, "wb"))
"""


@pytest.mark.parametrize("source", ["memory", "parquet"])
def test_a_run_stopped_anywhere_resumes_in_a_fresh_process_with_the_same_batches(tmp_path, source):
    if source == "parquet":
        (tmp_path / "data").mkdir()
        write_parquet(str(tmp_path / "data"), files=3, rows=4000, row_group=900)
        src = repr(str(tmp_path / "data"))
    else:
        src = "id_table(12_000)"
    script = tmp_path / "resume.py"
    script.write_text(RESUME.format(here=HERE, source=src))

    def run(state_in, k, tag):
        out, state = tmp_path / f"out-{tag}", tmp_path / f"state-{tag}"
        subprocess.run([sys.executable, str(script), state_in, str(k), str(state), str(out)], check=True, timeout=120)
        return pickle.load(open(out, "rb")), str(state)

    whole, _ = run("-", 10**9, "whole")
    assert len(whole) >= 5
    rng = np.random.default_rng(0)
    for stop in sorted(set(rng.integers(1, len(whole), 3).tolist())):
        first, state = run("-", stop, f"a{stop}")
        assert first == whole[:stop]
        rest, _ = run(state, 10**9, f"b{stop}")
        assert rest == whole[stop:], stop


def test_a_state_from_other_settings_is_refused_unless_it_is_exact():
    table = id_table(1000)
    b = dlframe.batches(table, 100, shard=(0, 2))
    it = iter(b)
    next(it), next(it)
    state = b.state_dict()
    assert (state["step"], state["global_batch"], state["splits"]) == (2, 200, 2)
    # Unshuffled, the default is one split per rank: 4 ranks cannot share 2 splits.
    with pytest.raises(ValueError, match="saved with splits=2, which 4 ranks cannot share"):
        dlframe.batches(table, 100, shard=(0, 4)).load_state_dict(state)
    shuffled = dlframe.batches(table, 100, shard=(0, 2), shuffle=True, seed=1)
    with pytest.raises(ValueError, match=r"batch_size x world=100 x 2 = 200, but these batches have batch_size x world=100 x 4"):
        dlframe.batches(table, 100, shard=(0, 4), shuffle=True, seed=1).load_state_dict(shuffled.state_dict())
    with pytest.raises(ValueError, match="seed=None, but these batches have seed=1"):
        dlframe.batches(table, 100, shard=(0, 2), shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="source=a table of 1000 rows in memory, but these batches have source=a table of 999"):
        dlframe.batches(id_table(999), 100, shard=(0, 2)).load_state_dict(state)
    # Unshuffled, 400 rows given are 4 steps of 100: honoured exactly.
    c = dlframe.batches(table, 50, shard=(0, 2), columns="dict")
    c.load_state_dict(state)
    assert ids_of(c)[0] == list(range(200, 250))
    with pytest.raises(ValueError, match="400 rows already given are not whole steps of 600"):
        dlframe.batches(table, 300, shard=(0, 2)).load_state_dict(state)
    with pytest.raises(ValueError, match="not a dlframe.batches state"):
        b.load_state_dict({"next": 3})
    with pytest.raises(ValueError, match="older dlframe"):
        b.load_state_dict({"version": 1, "next": 3})
    with pytest.raises(ValueError, match="not a valid dlframe.batches state"):
        b.load_state_dict({**state, "step": -1})
    with pytest.raises(ValueError, match="worker 1 of 2"):
        b.load_state_dict({**state, "worker": [1, 2]})


def test_bad_training_arguments_are_refused():
    t = id_table(10)
    for kwargs, match in [
        (dict(shard=(4, 4)), "0 <= rank < world_size"),
        (dict(shard=(True, 2)), "an int >= 0"),
        (dict(splits=0), "splits must be a positive int"),
        (dict(shuffle=True, seed=-1), "seed must be an int in"),
        (dict(shard="rank0"), "or 'auto'"),
        (dict(even="most"), "'keep', 'drop' or 'pad'"),
        (dict(shuffle=True), "needs seed="),
        (dict(seed=3), "with shuffle=True only"),
        (dict(shuffle=True, seed=1, shuffle_buffer=0), "positive int"),
        (dict(to="jax"), "'dlframe' or 'torch'"),
    ]:
        with pytest.raises(ValueError, match=match):
            dlframe.batches(t, 2, **kwargs)
    with pytest.raises(ValueError, match="known ahead"):
        list(dlframe.batches(t.to_reader(), 2, shard=(0, 2), even="drop"))


def test_a_stream_is_shared_out_by_batches_and_shuffled_alike_on_every_rank():
    table = id_table(1000)
    make = lambda: pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=77))
    per_rank = [ids_of(dlframe.batches(make(), 100, shard=(r, 3), columns="dict")) for r in range(3)]
    assert per_rank[1][0] == list(range(100, 200))
    assert sorted(sum(sum(per_rank, []), [])) == list(range(1000))
    mixed = [ids_of(dlframe.batches(make(), 100, shard=(r, 3), columns="dict", shuffle=True, seed=2)) for r in range(3)]
    assert sorted(sum(sum(mixed, []), [])) == list(range(1000))
    assert mixed != per_rank


def test_torch_tensors_come_out_of_a_dataloader():
    torch = optional("torch")
    from torch.utils.data import DataLoader

    table = id_table(1000)
    loader = DataLoader(dlframe.batches(table, 128, dtype="float32", to="torch"), batch_size=None, num_workers=2)
    out = torch.cat(list(loader))
    assert out.dtype == torch.float32 and out.shape == (1000, 3)
    assert out[:, 0].tolist() == list(range(1000))


def test_resume_with_dataloader_workers_through_statefuldataloader(tmp_path):
    optional("torch")
    tdl = optional("torchdata.stateful_dataloader")
    table = id_table(9000)

    def loader(state=None):
        b = dlframe.batches(table, 500, columns="dict", shuffle=True, seed=9, to="torch")
        dl = tdl.StatefulDataLoader(b, batch_size=None, num_workers=2)
        if state is not None:
            dl.load_state_dict(state)
        return dl

    whole = [x["id"].tolist() for x in loader()]
    assert len(whole) == 18
    for stop in (1, 6, 11):
        dl = loader()
        got = []
        for x in dl:
            got.append(x["id"].tolist())
            if len(got) == stop:
                break
        state = pickle.loads(pickle.dumps(dl.state_dict()))
        del dl
        assert got + [x["id"].tolist() for x in loader(state)] == whole, stop


def test_resume_with_a_plain_dataloader_counts_the_batches_seen():
    torch = optional("torch")
    from torch.utils.data import DataLoader

    table = id_table(6000)
    b = dlframe.batches(table, 500, columns="dict", shuffle=True, seed=4, to="torch")
    whole = [x["id"].tolist() for x in DataLoader(b, batch_size=None, num_workers=2)]
    got = []
    for x in DataLoader(b, batch_size=None, num_workers=2):
        got.append(x["id"].tolist())
        if len(got) == 5:
            break
    state = b.state_dict(batches_seen=len(got))
    fresh = dlframe.batches(table, 500, columns="dict", shuffle=True, seed=4, to="torch")
    fresh.load_state_dict(state)
    assert got + [x["id"].tolist() for x in DataLoader(fresh, batch_size=None, num_workers=2)] == whole


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("source,rows,batch,even", [("memory", 100, 4, "keep"), ("parquet", 8000, 300, "drop")])
def test_torch_distributed_ranks_with_dataloader_workers(tmp_path, source, rows, batch, even):
    optional("torch")
    world = 4
    if source == "parquet":
        data = tmp_path / "data"
        data.mkdir()
        write_parquet(str(data), files=8, rows=rows // 8, row_group=250)
        source = str(data)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    code = "import sys, training_helpers as h; h.rank_main(*[int(a) if a.isdigit() else a for a in sys.argv[1:]])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(world), str(port), str(tmp_path), source, str(rows), str(batch), even],
            env=env,
        )
        for r in range(world)
    ]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0] * world
    results = [json.load(open(tmp_path / f"rank-{r}.json")) for r in range(world)]
    counts = results[0]["counts"]
    assert len(set(counts)) == 1, counts
    assert all(r["len"] == counts[0] for r in results)
    flat = sorted(i for r in results for b in r["batches"] for i in b)
    if even == "keep":
        assert flat == list(range(rows))
        assert all(sum(map(len, r["batches"])) == rows // world for r in results)
    else:
        assert flat == sorted(set(flat)) and len(flat) == rows - rows % world
    if source != "memory":
        for rank in range(world):
            files_groups = row_groups_read(str(tmp_path / f"reads-{rank}.log"))
            got = {int(os.path.basename(p)[5:-8]) * 4 + g for p, g in files_groups}
            lo = rank * (rows // world)
            want = {g for g in range(rows // 250) if g * 250 < lo + rows // world and lo < (g + 1) * 250}
            assert got == want, (rank, sorted(got), sorted(want))

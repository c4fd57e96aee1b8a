#!/usr/bin/env python3
"""dlframe.batches against the loaders people train with, one job, one run, timed in turn.

The job: 8 float32 columns, 4M rows (``--rows``), in 8 Parquet files (row groups of 131,072
rows) written once per codec (``--codecs``, default ``none,snappy,zstd``) and page encoding
(``--encodings``, default ``plain,dictionary``: the values as they are, or pyarrow's default
dictionary pages, which for random floats hold a dictionary as large as the data), and the same rows
written as Lance; batches of 65,536 rows as ``(B, 8)`` torch float32 tensors, one epoch per
timing, the best of 3 (Ray and HF datasets: of 2).

- floors, measured here: the decode alone (pyarrow's dataset ``to_batches`` loop, no
  conversion) for each codec's files, the decompression alone (the same bytes cut into pages
  of 1 MB as Parquet cuts them, compressed with the codec, then decompressed by
  ``pyarrow.Codec`` on as many threads as there are cores), a numpy copy of the same bytes
  (memcpy) in memory, and for a shuffle the gather of the same bytes by a permutation
  (``np.take``) and making that permutation (``rng.permutation``);
- dlframe: ``dlframe.batches(paths_or_table, B, to="torch")``, unshuffled and with
  ``shuffle=True, seed=0``: the elastic epoch (the default 8 splits, units shuffled, a buffer
  of one step) and the same with ``splits=1`` (the order before splits: one range of rows);
  each loader made once and iterated once an epoch, as a training loop does (and as pyarrow's
  dataset and Polars' scan are made once here), and from Parquet ``dlframe, made each epoch``,
  which also opens the files, reads their footers and maps them in every epoch; and over 4
  ranks (``shard=(r, 4)``: 4 processes at once, each reading its quarter, against 1 process,
  uncompressed files; the floor is the same with pyarrow decoding a quarter of the files in
  each process);
- Mosaic Streaming: ``StreamingDataset`` over MDS shards written from the same rows (one
  ``ndarray:float32:8`` column), ``num_canonical_nodes=1``, through a DataLoader that stacks
  each batch's samples; one epoch each way (it reads sample by sample);
- LanceDB: ``lancedb.streaming.StreamingDataset`` over the Lance dataset (``num_splits=1``,
  ``read_batch_size=B``), rows stacked into batches by ``StreamingDataLoader``; one epoch each way;
- pyarrow: ``to_batches`` + ``np.column_stack`` + ``torch.from_numpy`` (no shuffle);
- Polars: ``scan_parquet(...).collect_batches`` or ``iter_slices`` + ``to_torch``; shuffled
  with ``sample(fraction=1, shuffle=True)`` (in memory only);
- HF datasets: ``with_format("torch")``: streaming from Parquet (``shuffle(buffer_size=B)``),
  and in memory (``shuffle()``, an index map);
- Lance: ``lance.torch.data.LanceDataset`` (shuffled with ``ShardedBatchSampler(randomize=True)``);
- Ray Data: ``read_parquet`` / ``from_arrow`` + ``iter_torch_batches`` (shuffled with
  ``local_shuffle_buffer_size=B``), timed last, while Ray is up.

Every candidate runs once untimed (a warm-up: files in the page cache, threads started), then
the rounds time all candidates in turn. Ray, Lance, LanceDB, Mosaic Streaming and HF datasets
come from the ``bench`` extra (``pip install -e 'python[bench]'``); a peer that is not installed
is left out of the table and named. Prints a markdown table of ratios. Run with a release
build of the extension:
``.venv/bin/python benches/loaders.py [--rows N] [--codecs none,snappy,zstd] [--encodings plain,dictionary]
[--skip ray,hf,lance,lancedb,mosaic]``. The peers that read their own files (Lance, LanceDB,
Mosaic Streaming) are timed once, beside the uncompressed Parquet files.
"""

import importlib.metadata as md
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch

import dlframe

COLS, BATCH, FILES, ROW_GROUP = 8, 65_536, 8, 131_072
ROWS = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 4_000_000
SKIP = set(sys.argv[sys.argv.index("--skip") + 1].split(",")) if "--skip" in sys.argv else set()
CODECS = (sys.argv[sys.argv.index("--codecs") + 1] if "--codecs" in sys.argv else "none,snappy,zstd").split(",")
# PLAIN pages (the values as they are), and dictionary pages (pyarrow's default: of random floats,
# a dictionary as large as the data and a 17-bit index a value).
ENCODINGS = (sys.argv[sys.argv.index("--encodings") + 1] if "--encodings" in sys.argv else "plain,dictionary").split(",")
PAGE = 1 << 20  # pyarrow's data page size
NAMES = [f"c{j}" for j in range(COLS)]


def epoch(batches) -> int:
    """Runs one epoch; checks every batch is a (B, 8) float32 torch tensor; returns the rows."""
    rows = 0
    for b in batches:
        assert isinstance(b, torch.Tensor) and b.dtype == torch.float32 and b.shape[1] == COLS, type(b)
        rows += b.shape[0]
    return rows


def pyarrow_epoch(batches) -> int:
    """pyarrow's loop: each record batch's columns stacked by numpy, as a torch tensor."""
    return epoch(torch.from_numpy(np.column_stack([c.to_numpy() for c in b.columns])) for b in batches)


def dlframe_loaders(source) -> dict:
    """dlframe's three candidates over `source`, each loader made once and iterated an epoch
    at a time: unshuffled, shuffled (the elastic epoch) and shuffled in one split."""
    kinds = {"dlframe": {}, "dlframe shuffled": dict(shuffle=True, seed=0),
             "dlframe shuffled, one split": dict(shuffle=True, seed=0, splits=1)}
    made = {name: dlframe.batches(source, BATCH, to="torch", **kw) for name, kw in kinds.items()}
    return {name: (lambda b=b: epoch(b), 3) for name, b in made.items()}


def stacked(d) -> torch.Tensor:
    """A dict of 1-D column tensors as one (n, 8) tensor (a copy)."""
    return torch.stack([d[c] for c in NAMES], dim=1)


def timed(candidates, repeat, failed=None):
    """Best seconds of each candidate over `repeat` rounds, each round running all in turn,
    after one untimed round of those timed more than once (a warm-up). A peer that fails is
    left out and its error kept in `failed`; dlframe's and the floors' failures stop the run."""
    failed = {} if failed is None else failed

    def attempt(name, f):
        try:
            return f()
        except Exception as e:
            if name.startswith(("dlframe", "decode", "decompression", "memcpy", "gather", "permutations")):
                raise
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return None

    for name, (f, rounds) in candidates.items():
        if rounds > 1:
            attempt(name, f)
    times = {name: [] for name in candidates}
    for r in range(repeat):
        for name, (f, rounds) in candidates.items():
            if r < rounds and name not in failed:
                t = time.perf_counter()
                rows = attempt(name, f)
                if name in failed:
                    continue
                times[name].append(time.perf_counter() - t)
                # Every loader gives every row each epoch (one made once is iterated again); only
                # the decompression and the permutations floor count none.
                assert rows == ROWS or (rows == 0 and name.startswith(("decompression", "permutations"))), (name, rows)
    return {k: min(v) for k, v in times.items() if v}


def rank_job(paths, rank, world, barrier, out, decode_only):
    """One rank of the sharded run: waits for the others, then runs 3 epochs of its share
    (with `decode_only`, pyarrow decoding its share of the files, the floor)."""
    import dlframe as d

    if decode_only:
        mine = ds.dataset(paths[rank * len(paths) // world : (rank + 1) * len(paths) // world], format="parquet")
        run = lambda: sum(b.num_rows for b in mine.to_batches(batch_size=BATCH))
    else:
        b = d.batches(paths, BATCH, shard=(rank, world), to="torch")
        run = lambda: epoch(b)
    run()  # warm: the footers read and the threads started
    barrier.wait()
    t0 = time.time()
    for _ in range(3):
        run()
    out.put((rank, t0, time.time()))


def sharded(paths, world, decode_only=False) -> float:
    """Seconds per epoch of `world` ranks at once (from the first start to the last end)."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(world), ctx.Queue()
    args = lambda r: (paths, r, world, barrier, out, decode_only)
    procs = [ctx.Process(target=rank_job, args=args(r)) for r in range(world)]
    for p in procs:
        p.start()
    spans = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return (max(s[2] for s in spans) - min(s[1] for s in spans)) / 3


def ray_timings(paths, table):
    """Ray Data's candidates, timed while Ray is up (then shut down)."""
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        ray_pq = ray.data.read_parquet(paths)
        ray_mem = ray.data.from_arrow(table)
        ray_epoch = lambda d, **kw: epoch(stacked(b) for b in d.iter_torch_batches(batch_size=BATCH, **kw))
        mem = {
            "Ray Data": (lambda: ray_epoch(ray_mem), 2),
            "Ray Data shuffled": (lambda: ray_epoch(ray_mem, local_shuffle_buffer_size=BATCH), 2),
        }
        pqs = {
            "Ray Data": (lambda: ray_epoch(ray_pq), 2),
            "Ray Data shuffled": (lambda: ray_epoch(ray_pq, local_shuffle_buffer_size=BATCH), 2),
        }
        return timed(mem, 2), timed(pqs, 2)
    finally:
        ray.shutdown()


def main():
    tmp = tempfile.mkdtemp(prefix="dlframe-loaders-")
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write(tmp, table, codec, encoding):
    """The table in FILES Parquet files of `codec`, pages of `encoding`; their paths."""
    per = ROWS // FILES
    paths = []
    for f in range(FILES):
        path = os.path.join(tmp, f"{codec}-{encoding}", f"part-{f}.parquet")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table.slice(f * per, per), path, row_group_size=ROW_GROUP, compression=codec,
                       use_dictionary=encoding == "dictionary")
        paths.append(path)
    return paths


def decompression(table, codec):
    """The floor of a codec: the table's column bytes in pages of PAGE bytes, compressed with it,
    decompressed by pyarrow on as many threads as there are cores. None for no codec."""
    if codec == "none":
        return None
    from concurrent.futures import ThreadPoolExecutor

    c = pa.Codec(codec)
    pages = []
    for col in table.columns:
        raw = np.concatenate([ch.to_numpy() for ch in col.chunks]).tobytes()
        for at in range(0, len(raw), PAGE):
            page = raw[at : at + PAGE]
            pages.append((c.compress(page, asbytes=False), len(page)))
    pool = ThreadPoolExecutor(os.cpu_count())

    def run():
        list(pool.map(lambda p: c.decompress(p[0], decompressed_size=p[1], asbytes=False), pages))
        return 0

    return run


def run(tmp):
    rng = np.random.default_rng(0)
    table = pa.table({c: rng.random(ROWS // FILES * FILES, dtype=np.float32) for c in NAMES})
    files = {f"{c}, {e}": write(tmp, table, c, e) for c in CODECS for e in ENCODINGS}
    first = f"none, {ENCODINGS[0]}" if "none" in CODECS else next(iter(files))
    paths = files[first]
    src = np.stack([table[c].to_numpy() for c in NAMES], axis=1)
    dst = np.empty_like(src)
    block = BATCH
    perm = np.concatenate([rng.permutation(min(block, ROWS - s)) + s for s in range(0, ROWS, block)])
    missing = []

    def memcpy():
        np.copyto(dst, src)
        return ROWS

    def gather():
        np.take(src, perm, axis=0, out=dst)
        return ROWS

    def permute():
        for s in range(0, ROWS, block):
            rng.permutation(min(block, ROWS - s))
        return 0

    mem = {
        "memcpy": (memcpy, 3),
        "gather (np.take, blocks of B)": (gather, 3),
        "permutations (rng.permutation)": (permute, 3),
        **dlframe_loaders(table),
        "pyarrow": (lambda: pyarrow_epoch(table.to_batches(BATCH)), 3),
    }
    import polars as pl

    def parquet(paths, codec):
        """The candidates that read `paths`, the Parquet files of `codec`."""
        dataset = ds.dataset(paths, format="parquet")
        reader = dlframe.batches(paths, BATCH).plan()["reader"]
        assert reader == "dlframe", reader
        c = {
            "memcpy": (memcpy, 3),
            "decode (pyarrow to_batches)": (lambda: sum(b.num_rows for b in dataset.to_batches(batch_size=BATCH)), 3),
            **dlframe_loaders(paths),
            "dlframe, made each epoch": (lambda: epoch(dlframe.batches(paths, BATCH, to="torch")), 3),
            "pyarrow": (lambda: pyarrow_epoch(dataset.to_batches(batch_size=BATCH)), 3),
        }
        floor = decompression(table, codec.split(",")[0])
        if floor is not None:
            c["decompression alone"] = (floor, 3)
        scan = pl.scan_parquet(paths)
        if hasattr(pl.LazyFrame, "collect_batches"):
            c["Polars"] = (lambda: epoch(s.to_torch() for s in scan.collect_batches(chunk_size=BATCH)), 3)
        else:
            c["Polars"] = (lambda: epoch(s.to_torch() for s in scan.collect().iter_slices(BATCH)), 3)
        return c

    pqs = {codec: parquet(p, codec) for codec, p in files.items()}
    own = {}  # peers reading their own files
    df = pl.from_arrow(table, rechunk=False)
    shuffled_df = lambda: df.sample(fraction=1.0, shuffle=True, seed=0)
    mem["Polars"] = (lambda: epoch(s.to_torch() for s in df.iter_slices(BATCH)), 3)
    mem["Polars shuffled"] = (lambda: epoch(s.to_torch() for s in shuffled_df().iter_slices(BATCH)), 3)

    if "hf" not in SKIP and _have("datasets"):
        import datasets

        datasets.disable_progress_bars()
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        hf_mem = datasets.Dataset(datasets.table.InMemoryTable(table)).with_format("torch")
        hf_mem_shuffled = hf_mem.shuffle(seed=0)
        hf_iter = lambda d: epoch(stacked(b) for b in d.iter(batch_size=BATCH))
        mem["HF datasets"] = (lambda: hf_iter(hf_mem), 2)
        mem["HF datasets shuffled"] = (lambda: hf_iter(hf_mem_shuffled), 1)
        for codec, p in files.items():
            hf_stream = datasets.load_dataset(
                "parquet", data_files=p, split="train", streaming=True, cache_dir=os.path.join(tmp, "hf")
            )
            pqs[codec]["HF datasets"] = (lambda h=hf_stream: hf_iter(h.with_format("torch")), 2)
            pqs[codec]["HF datasets shuffled"] = (
                lambda h=hf_stream: hf_iter(h.shuffle(seed=0, buffer_size=BATCH).with_format("torch")),
                1,
            )
    else:
        missing.append("HF datasets")

    if "lance" not in SKIP and _have("pylance"):
        import lance
        from lance.sampler import ShardedBatchSampler
        from lance.torch.data import LanceDataset

        uri = os.path.join(tmp, "data.lance")
        lance.write_dataset(table, uri)
        lance_epoch = lambda **kw: epoch(
            stacked(b) for b in LanceDataset(uri, batch_size=BATCH, auto_detect_rank=False, **kw)
        )
        own["Lance (its own files)"] = (lambda: lance_epoch(), 3)
        own["Lance shuffled"] = (
            lambda: lance_epoch(sampler=ShardedBatchSampler(0, 1, randomize=True, seed=0)),
            3,
        )
    else:
        missing.append("Lance")

    if "lancedb" not in SKIP and _have("lancedb") and _have("pylance"):
        import lancedb
        from lancedb.streaming import StreamingDataLoader, StreamingDataset as LanceStream

        rows_of = lambda rb: torch.from_numpy(np.column_stack([c.to_numpy() for c in rb.columns]))
        lance_table = lancedb.connect(tmp).open_table("data")

        def lancedb_epoch(shuffle):
            d = LanceStream(lance_table, num_splits=1, rank=0, world_size=1, shuffle=shuffle, shuffle_seed=0,
                            read_batch_size=BATCH, columns=NAMES, transform=rows_of, transform_parallelism=1)
            return epoch(StreamingDataLoader(d, batch_size=BATCH, num_workers=0, collate_fn=torch.stack))

        own["LanceDB StreamingDataset (Lance files)"] = (lambda: lancedb_epoch(False), 1)
        own["LanceDB StreamingDataset shuffled"] = (lambda: lancedb_epoch(True), 1)
    else:
        missing.append("LanceDB StreamingDataset")

    if "mosaic" not in SKIP and _have("mosaicml-streaming"):
        from streaming import MDSWriter, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        from torch.utils.data import DataLoader

        mds = os.path.join(tmp, "mds")
        with MDSWriter(out=mds, columns={"x": "ndarray:float32:8"}, compression=None, size_limit="64mb") as w:
            for row in src:
                w.write({"x": row})
        stack = lambda samples: torch.from_numpy(np.stack([x["x"] for x in samples]))

        def mosaic_epoch(shuffle):
            clean_stale_shared_memory()
            d = StreamingDataset(local=mds, remote=None, batch_size=BATCH, shuffle=shuffle, shuffle_seed=0,
                                 num_canonical_nodes=1)
            return epoch(DataLoader(d, batch_size=BATCH, num_workers=0, collate_fn=stack))

        own["Mosaic Streaming (MDS files)"] = (lambda: mosaic_epoch(False), 1)
        own["Mosaic Streaming shuffled"] = (lambda: mosaic_epoch(True), 1)
    else:
        missing.append("Mosaic Streaming")

    # The ranks first, then everything but Ray, then Ray, whose background processes would
    # take the cores from the others while it is up.
    one, four = sharded(paths, 1), sharded(paths, 4)
    one_decode, four_decode = sharded(paths, 1, True), sharded(paths, 4, True)
    failed = {}
    t_mem = timed(mem, 3, failed)
    t_pq = {codec: timed(c, 3, failed) for codec, c in pqs.items()}
    t_own = timed(own, 3, failed) if own else {}
    if "ray" not in SKIP and _have("ray"):
        t_ray_mem, t_ray_pq = ray_timings(paths, table)
        t_mem.update(t_ray_mem)
        t_pq[first].update(t_ray_pq)
    else:
        missing.append("Ray Data")

    print(f"# dlframe.batches against the loaders ({ROWS:,} rows x {COLS} float32, batches of {BATCH:,})")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("versions: " + ", ".join(f"{p} {_version(p)}" for p in _PEERS if _have(p)))
    if missing:
        print("left out (not installed, or --skip): " + ", ".join(missing))
    for name, why in failed.items():
        print(f"failed (left out): {name}: {why}")
    print()
    print("| from | candidate | time / floor | time / dlframe |")
    print("|---|---|---|---|")
    sections = [(f"Parquet ({codec})", t, "decode (pyarrow to_batches)") for codec, t in t_pq.items()]
    if t_own:
        sections.append(("their own files", {**t_own, "dlframe": t_pq[first]["dlframe"],
                                             "dlframe shuffled": t_pq[first]["dlframe shuffled"]}, "dlframe"))
    sections.append(("memory", t_mem, "memcpy"))
    for where, t, floor_name in sections:
        floor = t[floor_name]
        for name, s in t.items():
            ours = t["dlframe shuffled" if "shuffled" in name else "dlframe"]
            print(f"| {where} | {name} | {s / floor:.2f}x | {s / ours:.2f}x |")
    print()
    print("| target | measured | holds |")
    print("|---|---|---|")
    floors = ("dlframe", "decode", "memcpy", "decompression")
    rows = []
    for codec, t in t_pq.items():
        limit = 0.6 if codec.startswith("none") else 0.85
        peers = {k: v for k, v in {**t, **t_own}.items() if not k.startswith(floors) and "shuffled" not in k}
        rows.append((f"{codec}: unshuffled <= {limit}x the decode", t["dlframe"] / t["decode (pyarrow to_batches)"], limit))
        if peers:
            fastest = min(peers, key=peers.get)
            rows.append((f"{codec}: unshuffled <= {limit}x the fastest peer ({fastest})", t["dlframe"] / peers[fastest], limit))
        rows.append((f"{codec}: shuffled <= 1.5x unshuffled", t["dlframe shuffled"] / t["dlframe"], 1.5))
        rows.append((f"{codec}: elastic shuffled (8 splits) <= 1.1x one split",
                     t["dlframe shuffled"] / t["dlframe shuffled, one split"], 1.1))
    rows += [
        ("unshuffled in memory <= 1.1x memcpy", t_mem["dlframe"] / t_mem["memcpy"], 1.1),
        ("shuffled <= 1.5x unshuffled, in memory", t_mem["dlframe shuffled"] / t_mem["dlframe"], 1.5),
        ("elastic shuffled (8 splits) <= 1.1x one split, in memory",
         t_mem["dlframe shuffled"] / t_mem["dlframe shuffled, one split"], 1.1),
        ("4 ranks at once: time per epoch / 1 rank's", four / one, four_decode / one_decode),
    ]
    for peer in ("Mosaic Streaming", "LanceDB StreamingDataset"):
        for kind, ours in (("", "dlframe"), (" shuffled", "dlframe shuffled")):
            name = next((k for k in t_own if k.startswith(peer) and k.endswith(" shuffled") == bool(kind)), None)
            if name is not None:
                rows.append((f"{ours} from Parquet faster than {name}", t_pq[first][ours] / t_own[name], 1.0))
    for what, ratio, limit in rows:
        print(f"| {what} | {ratio:.2f}x | {'yes' if ratio <= limit else 'no'} (limit {limit:.2f}x) |")
    print()
    for codec, t in t_pq.items():
        floor = t.get("decompression alone")
        print(
            f"Floors, {codec}: dlframe unshuffled takes {t['dlframe'] / t['memcpy']:.2f}x a memcpy of the same bytes"
            + (f" and {t['dlframe'] / floor:.2f}x the decompression alone ({floor / t['memcpy']:.2f}x a memcpy)" if floor else "")
            + "."
        )
    floor = t_mem["gather (np.take, blocks of B)"] / t_mem["memcpy"]
    print(
        f"Shuffle floors in memory: a gather of the same bytes by the permutation takes {floor:.2f}x a memcpy, "
        f"and making the permutations {t_mem['permutations (rng.permutation)'] / t_mem['memcpy']:.2f}x "
        f"(dlframe unshuffled: {t_mem['dlframe'] / t_mem['memcpy']:.2f}x)."
    )
    print(
        f"Sharding floor: 4 processes of pyarrow decoding a quarter of the files each take "
        f"{four_decode / one_decode:.2f}x the time of 1 process decoding all of them (4 processes share "
        f"{os.cpu_count()} cores); the 4-rank limit above is that ratio."
    )


_PEERS = ["pyarrow", "polars", "torch", "datasets", "pylance", "lancedb", "mosaicml-streaming", "ray"]


def _have(pkg: str) -> bool:
    try:
        md.version(pkg)
        return True
    except md.PackageNotFoundError:
        return False


def _version(pkg: str) -> str:
    return md.version(pkg)


if __name__ == "__main__":
    main()

"""Helpers of test_training.py that worker and rank processes import: Parquet files with row
ids, a filesystem that logs every byte range read, the row groups those ranges touch, and the
body of one torch.distributed rank."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def id_table(rows: int, start: int = 0) -> pa.Table:
    """A row id column and two float32 columns derived from it."""
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table({"id": ids, "x": ids.astype(np.float32), "y": (ids * 2).astype(np.float32)})


def write_parquet(root: str, files: int, rows: int, row_group: int) -> list[str]:
    """`files` Parquet files of `rows` rows each in row groups of `row_group` rows, ids in
    order across the files."""
    paths = []
    for f in range(files):
        path = os.path.join(root, f"part-{f}.parquet")
        pq.write_table(id_table(rows, f * rows), path, row_group_size=row_group, compression="none")
        paths.append(path)
    return paths


class _LoggedFile:
    """A file object that appends "path offset length" to a log for every read."""

    def __init__(self, path: str, log: str) -> None:
        self._f = open(path, "rb")
        self._path, self._log = path, log
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        at = self._f.tell()
        data = self._f.read(n)
        with open(self._log, "a") as log:
            log.write(f"{self._path} {at} {len(data)}\n")
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._f.close()

    def size(self) -> int:
        return os.fstat(self._f.fileno()).st_size


class LoggingFS(pafs.FileSystemHandler):
    """The local filesystem, read-only, logging each read to `log` (worker processes too)."""

    def __init__(self, log: str) -> None:
        self.log = log
        self.fs = pafs.LocalFileSystem()

    def __eq__(self, other):
        return isinstance(other, LoggingFS) and other.log == self.log

    def __ne__(self, other):
        return not self == other

    def get_type_name(self):
        return "logging"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def open_input_stream(self, path):
        return pa.PythonFile(_LoggedFile(path, self.log), mode="r")

    def open_input_file(self, path):
        return pa.PythonFile(_LoggedFile(path, self.log), mode="r")

    def _read_only(self, *args, **kwargs):
        raise OSError("this test filesystem is read-only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only


def row_groups_read(log: str) -> set[tuple[str, int]]:
    """(path, row group) of every row group whose bytes a logged read touched. A read that ends
    at the end of its file is the footer's (pyarrow reads the tail of a file for it)."""
    spans: dict[str, list[tuple[int, int, int]]] = {}
    touched = set()
    if not os.path.exists(log):
        return touched
    for line in open(log):
        path, at, n = line.split()
        at, n = int(at), int(n)
        if path not in spans:
            meta = pq.ParquetFile(path).metadata
            spans[path] = []
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                cols = [rg.column(c) for c in range(rg.num_columns)]
                lo = min(c.dictionary_page_offset or c.data_page_offset for c in cols)
                hi = max((c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size for c in cols)
                spans[path].append((g, lo, hi))
        if n == 0 or at + n == os.path.getsize(path):
            continue
        touched.update((path, g) for g, lo, hi in spans[path] if at < hi and lo < at + n)
    return touched


def rank_main(rank: int, world: int, port: int, out: str, source: str, rows: int, batch: int, even: str) -> None:
    """One rank of a torch.distributed job (gloo on loopback): dlframe.batches(shard="auto") in
    a DataLoader with 2 workers; writes the row ids of each batch and the batch count that every
    rank agreed on (an all-reduce per batch, as DDP makes one) to out/rank-<r>.json."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import dlframe

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        if source == "memory":
            data = id_table(rows)
        else:
            data = pafs_dataset(source, os.path.join(out, f"reads-{rank}.log"))
        b = dlframe.batches(data, batch, shard="auto", even=even, columns="dict", to="torch")
        loader = DataLoader(b, batch_size=None, num_workers=2)
        got, steps = [], 0
        for item in loader:
            got.append(item["id"].tolist())
            ones = torch.ones(1)
            dist.all_reduce(ones)  # as DDP's gradient all-reduce: every rank must take part
            steps += 1
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([steps]))
        with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
            json.dump({"batches": got, "counts": [int(c) for c in counts], "len": len(b)}, f)
    finally:
        dist.destroy_process_group()


def pafs_dataset(root: str, log: str):
    import pyarrow.dataset as ds

    return ds.dataset(root, format="parquet", filesystem=pafs.PyFileSystem(LoggingFS(log)))

"""dlframe.batches over Parquet files in an S3 bucket: a real S3-compatible server (moto) on
loopback, an elastic shuffled epoch over 4 ranks, and the byte ranges each rank fetched,
from the server's own log: its splits' row groups and the files' footers, nothing else."""

import os

import numpy as np
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

import dlframe
from conftest import optional
from training_helpers import id_table

BUCKET, FILES, ROWS, GROUP = "training", 4, 40_000, 5_000  # row groups of 80 KB


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    optional("moto")
    from s3_server import S3Server

    server = S3Server(str(tmp_path_factory.mktemp("s3") / "requests.jsonl"))
    try:
        fs = server.filesystem(allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        for f in range(FILES):
            path = f"{BUCKET}/data/part-{f}.parquet"
            pq.write_table(id_table(ROWS, f * ROWS), path, filesystem=fs, row_group_size=GROUP, compression="none")
        yield server
    finally:
        server.stop()


def extents(server, path):
    """(first byte, end) of each row group of an object, and the object's size."""
    fs = server.filesystem()
    meta = pq.ParquetFile(path, filesystem=fs).metadata
    spans = []
    for g in range(meta.num_row_groups):
        cols = [meta.row_group(g).column(c) for c in range(meta.num_columns)]
        lo = min(c.dictionary_page_offset or c.data_page_offset for c in cols)
        spans.append((lo, max((c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size for c in cols)))
    return spans, fs.get_file_info(path).size


def test_an_elastic_epoch_over_s3_reads_only_each_rank_s_row_groups(s3):
    spans = {f"{BUCKET}/data/part-{f}.parquet": extents(s3, f"{BUCKET}/data/part-{f}.parquet") for f in range(FILES)}
    steps = []
    for rank in range(4):
        key = f"rank{rank}"
        data = pads.dataset(f"{BUCKET}/data", format="parquet", filesystem=s3.filesystem(key))
        b = dlframe.batches(data, 1000, shard=(rank, 4), shuffle=True, seed=3, columns="dict")
        got = [np.from_dlpack(x["id"]).tolist() for x in b]
        steps.append(got)
        rows = sum(got, [])
        assert len(rows) == FILES * ROWS // 4
        want = {(f"{BUCKET}/data/part-{r // ROWS}.parquet", (r % ROWS) // GROUP) for r in rows}
        fetched = set()
        for path, at, n in s3.ranges(key):
            groups, size = spans[path]
            if at >= size - 64 * 1024:
                continue  # the footer: pyarrow reads the last 64 KiB of each file
            hit = {(path, g) for g, (lo, hi) in enumerate(groups) if at < hi and lo < at + n}
            assert hit and hit <= want, (rank, path, at, n, sorted(hit - want))
            fetched |= hit
        tail = {(p, g) for p, g in want if spans[p][0][g][1] > spans[p][1] - 64 * 1024}
        assert want - tail <= fetched, (rank, sorted(want - fetched))
    # The four ranks' steps are one process's steps over the same bucket, every row once.
    one = dlframe.batches(pads.dataset(f"{BUCKET}/data", format="parquet", filesystem=s3.filesystem()), 4000,
                          shuffle=True, seed=3, columns="dict")
    whole = [np.from_dlpack(x["id"]).tolist() for x in one]
    assert [sum((r[s] for r in steps), []) for s in range(len(whole))] == whole
    assert sorted(sum(whole, [])) == list(range(FILES * ROWS))


def test_an_s3_uri_reaches_batches(s3, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "uri")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    uri = f"s3://{BUCKET}/data?endpoint_override={s3.endpoint}&scheme=http&region=us-east-1"
    b = dlframe.batches(uri, 10_000, shard=(1, 2), columns="dict")
    assert len(b) == 8 and b.plan()["rows"] == FILES * ROWS // 2
    assert np.from_dlpack(next(iter(b))["id"])[0] == FILES * ROWS // 2

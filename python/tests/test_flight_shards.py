"""A result of `dlframe serve --partitions 4` read by four readers at once through
`dlframe.flight.query(..., shard=(rank, 4))` and `dlframe.batches`: the readers get disjoint
rows whose union is the local result, and each fetches only its own endpoint (the server's
log line per query names the partition it ran)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from served import Served, cli_path

import dlframe

TOKEN = "t0ken-for-shards"
FILES, ROWS = 8, 500


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("flight-shards") / "t"
    d.mkdir()
    for k in range(FILES):
        ids = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.25}), d / f"part-{k}.parquet")
    return d


@pytest.fixture(scope="module")
def server(table_dir):
    cli = cli_path()
    if not cli.exists():
        pytest.skip(f"the dlframe CLI is not built at {cli}: run `cargo build -p dlframe-cli --features serve`")
    s = Served(cli, "--table", f"t={table_dir}", "--partitions", "4", token=TOKEN)
    yield s
    assert s.stop() == 0, f"stderr: {s.errors}"


SQL = "SELECT id, x FROM t WHERE id % 3 <> 0"


def test_four_readers_get_disjoint_rows_whose_union_is_the_result(server):
    want = np.array([i for i in range(FILES * ROWS) if i % 3 != 0], dtype=np.float64)
    assert len(dlframe.flight.query(server.uri, SQL, token=TOKEN).endpoints()) == 4
    parts = []
    for rank in range(4):
        source = dlframe.flight.query(server.uri, SQL, token=TOKEN, shard=(rank, 4), timeout=60)
        got = [np.asarray(b) for b in dlframe.batches(source, 256, dtype="float64")]
        parts.append(np.concatenate(got)[:, 0] if got else np.empty(0))
        # The server ran exactly this reader's partition of the plan.
        line = server.wait_for("partition=")
        assert f"partition={rank + 1}/4" in line and line.endswith(" ok"), line
        assert len(parts[-1]) > 0, f"reader {rank} got no rows"
    ids = np.concatenate(parts)
    assert len(np.unique(ids)) == len(ids), "a row reached two readers"
    np.testing.assert_array_equal(np.sort(ids), want)


def test_a_shard_takes_every_worlds_endpoint_and_bad_shards_are_refused(server):
    one = dlframe.flight.query(server.uri, SQL, token=TOKEN, shard=(1, 2))
    assert len(one.endpoints()) == 2
    for bad in [(4, 4), (-1, 2), (0, 0), (1,), "0/4", (True, 2)]:
        with pytest.raises(ValueError, match="shard"):
            dlframe.flight.query(server.uri, SQL, shard=bad)
    with pytest.raises(ValueError, match="location"):
        dlframe.flight.query("127.0.0.1:1", SQL)

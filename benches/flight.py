#!/usr/bin/env python3
"""A tensor through `dlframe serve` (Arrow Flight SQL) against the same query in-process and
against plain columns stacked by the client, in one run; prints a markdown table of ratios
(issue targets in the third column).

8 float32 columns x 10M rows in 4 uncompressed Parquet files (so the transport, not the
decoding, is what differs), each path ending in an (n, 8) float32 numpy array:
- served: ADBC runs `SELECT to_tensor(c0, ..., c7) AS x FROM t` on the server, then
  `np.from_dlpack(dlframe.to_dlpack(result))` (the same through pyarrow.flight in a second row);
- local: `np.from_dlpack(dlframe.to_dlpack(ctx.sql(...)))` in datafusion-python, in process;
- served + np.stack: ADBC runs `SELECT c0, ..., c7 FROM t`, then `np.stack` of the 8 columns;
- memcpy: numpy copying the same 320 MB once, the bandwidth yardstick.

Run with release builds of the command and the extension:
`DLFRAME_CLI=<release dlframe> .venv/bin/python benches/flight.py [--rows N]`.

`--load` instead runs 16 clients x 100 queries at once through ADBC, each a `to_tensor_fill`
over a slice of a 100,000-row table whose every value is checked, and prints the p50 and p99
latency of one query (DLFRAME_CLI picks the binary, so two builds can be compared, and
DLFRAME_SERVE_ARGS adds arguments to `dlframe serve`, such as `--max-queries 16`).
"""

import datetime
import os
import pathlib
import platform
import sys
import tempfile
import threading
import time

import adbc_driver_flightsql.dbapi as adbc
import datafusion
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

import dlframe
import dlframe.datafusion as dldf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "tests"))
from served import Served, cli_path, statement_query  # noqa: E402
from ratio_table import best  # noqa: E402

COLS, FILES = 8, 4
ROWS = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 10_000_000
NAMES = ", ".join(f"c{j}" for j in range(COLS))
TENSOR_SQL = f"SELECT to_tensor({NAMES}) AS x FROM t"
PLAIN_SQL = f"SELECT {NAMES} FROM t"


def write_table(root: pathlib.Path) -> pathlib.Path:
    rng = np.random.default_rng(0)
    d = root / "t"
    d.mkdir()
    per = ROWS // FILES
    for k in range(FILES):
        n = per if k < FILES - 1 else ROWS - per * (FILES - 1)
        cols = {f"c{j}": rng.random(n, dtype=np.float32) for j in range(COLS)}
        pq.write_table(pa.table(cols), d / f"part-{k}.parquet", compression="none")
    return d


CLIENTS, QUERIES, LOAD_ROWS = 16, 100, 100_000


def load(cli: pathlib.Path) -> None:
    """16 clients x 100 checked queries at once; p50 and p99 of one query's latency."""
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp) / "t"
        d.mkdir()
        ids = np.arange(LOAD_ROWS, dtype=np.int64)
        b = np.where(ids % 7 == 0, np.nan, ids * 0.5)
        pq.write_table(pa.table({"id": ids, "a": ids.astype(np.float64), "b": pa.array(b, from_pandas=True)}), d / "p.parquet")
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        extra = os.environ.get("DLFRAME_SERVE_ARGS", "").split()
        with Served(cli, "--table", f"t={d}", *extra) as server:

            def client(k: int) -> None:
                conn = adbc.connect(server.uri, autocommit=True)
                cur = conn.cursor()
                mine = []
                for q in range(QUERIES):
                    m = (k * QUERIES + q) % 16
                    sql = f"SELECT to_tensor_fill(0, a, b) AS x FROM t WHERE id % 16 = {m} ORDER BY id"
                    t = time.perf_counter()
                    cur.execute(sql)
                    x = np.from_dlpack(dlframe.to_dlpack(cur.fetch_arrow_table()))
                    mine.append(time.perf_counter() - t)
                    rows = ids[ids % 16 == m]
                    want = np.stack([rows.astype(np.float64), np.where(rows % 7 == 0, 0.0, rows * 0.5)], axis=1)
                    if not np.array_equal(x, want):
                        with lock:
                            errors.append(sql)
                conn.close()
                with lock:
                    latencies.extend(mine)

            threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - start
            assert server.stop() == 0
    assert not errors, f"{len(errors)} results differed, first: {errors[0]}"
    assert len(latencies) == CLIENTS * QUERIES
    p50, p99 = np.percentile(latencies, [50, 99])
    print(f"# benches/flight.py --load, {datetime.date.today()}, {platform.machine()}, {cli} {' '.join(extra)}")
    print(f"{CLIENTS} clients x {QUERIES} queries, every result checked: p50 {p50 * 1e3:.1f} ms, "
          f"p99 {p99 * 1e3:.1f} ms, {CLIENTS * QUERIES / wall:.0f} queries/s")


def main():
    if "--load" in sys.argv:
        return load(cli_path("release"))
    cli = cli_path("release")
    if not cli.exists():
        sys.exit(f"no release dlframe at {cli}: cargo build --release -p dlframe-cli, or set DLFRAME_CLI")
    with tempfile.TemporaryDirectory() as tmp:
        table = write_table(pathlib.Path(tmp))
        ctx = datafusion.SessionContext()
        dldf.register(ctx)
        ctx.register_parquet("t", str(table))
        with Served(cli, "--table", f"t={table}") as server:
            conn = adbc.connect(server.uri, autocommit=True)
            cur = conn.cursor()
            client = fl.FlightClient(server.uri)

            def adbc_fetch(sql):
                cur.execute(sql)
                return cur.fetch_arrow_table()

            def served():
                return np.from_dlpack(dlframe.to_dlpack(adbc_fetch(TENSOR_SQL)))

            def served_flight():
                info = client.get_flight_info(fl.FlightDescriptor.for_command(statement_query(TENSOR_SQL)))
                result = pa.concat_tables([client.do_get(e.ticket).read_all() for e in info.endpoints])
                return np.from_dlpack(dlframe.to_dlpack(result))

            def local():
                return np.from_dlpack(dlframe.to_dlpack(ctx.sql(TENSOR_SQL)))

            def served_stack():
                result = adbc_fetch(PLAIN_SQL)
                return np.stack([result.column(j).to_numpy() for j in range(COLS)], axis=1)

            for f in (served, served_flight, local, served_stack):
                x = f()
                assert x.shape == (ROWS, COLS) and x.dtype == np.float32, (f.__name__, x.shape, x.dtype)
            src = np.empty((ROWS, COLS), np.float32)
            dst = np.empty_like(src)
            t_served, t_flight = best(served, 3), best(served_flight, 3)
            t_local, t_stack = best(local, 3), best(served_stack, 3)
            t_copy = best(lambda: np.copyto(dst, src))
            conn.close()
            client.close()
            code = server.stop()
            assert code == 0, f"dlframe serve exited with {code}"

    print(f"# benches/flight.py, {datetime.date.today()}, {platform.machine()}, {ROWS:,} rows x {COLS} f32")
    print("| path | ratio | target |")
    print("|---|---|---|")
    print(f"| served (ADBC) / local in-process | {t_served / t_local:.2f}x | <= 2x |")
    print(f"| served (ADBC) / served plain columns + np.stack | {t_served / t_stack:.2f}x | < 1x |")
    print(f"| served (pyarrow.flight) / local in-process | {t_flight / t_local:.2f}x | - |")
    print(f"| served (ADBC) / memcpy of the result | {t_served / t_copy:.2f}x | - |")
    print(f"| local in-process / memcpy of the result | {t_local / t_copy:.2f}x | - |")


if __name__ == "__main__":
    main()

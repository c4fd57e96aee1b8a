#!/usr/bin/env python3
"""dlframe.batches against memcpy bandwidth and the peers' batch loops, in one run; prints a
markdown table of ratios (issue targets in the third column).

8 float32 columns x 10M rows in memory (a pyarrow table in chunks of 1M rows), batches of
65,536 rows, each an (n, 8) float32 matrix:
- dlframe: `for b in dlframe.batches(table, 65536)` (cut, join and interleave in one pass, the
  next batch made on a background thread);
- memcpy: numpy copying the same 320 MB once (`np.copyto`), the bandwidth yardstick;
- Polars: `for s in df.iter_slices(65536): s.to_numpy()` (a Fortran-order matrix: one
  contiguous copy per column), also against `dlframe.batches(..., order="F")`, the same layout;
- pyarrow: `for b in table.to_batches(65536): np.column_stack([c.to_numpy() for c in b.columns])`;
- a DataFusion query over the same table (`SELECT * FROM t`, 8,192-row batches) through
  dlframe.batches, against reading its Arrow stream with pyarrow (no conversion);
- the read bound: numpy copying each batch's bytes, column by column, into one reused 2 MB
  buffer (the least any batch loop does: every byte read once from memory, written to cache).
Then the time a consumer doing about 1 ms of work per batch waits for the next one.

Run with a release build of the extension: `.venv/bin/python benches/batches.py [--rows N]`.
"""

import datetime
import platform
import sys
import time

import datafusion
import numpy as np
import polars as pl
import pyarrow as pa

import dlframe

COLS, BATCH = 8, 65_536
ROWS = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 10_000_000


def best(*fs, repeat=5):
    """Seconds of each function: the best of `repeat` rounds, each round running every function
    once in turn, so that a change in the machine's speed falls on all of them."""
    times = [[] for _ in fs]
    for _ in range(repeat):
        for f, ts in zip(fs, times):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
    return [min(ts) for ts in times]


def main():
    rng = np.random.default_rng(0)
    data = {f"c{j}": rng.random(ROWS, dtype=np.float32) for j in range(COLS)}
    table = pa.table(data)
    table = pa.Table.from_batches(table.to_batches(max_chunksize=1_000_000))
    df = pl.from_arrow(table, rechunk=False)
    src = np.stack(list(data.values()), axis=1)
    dst = np.empty_like(src)

    def ours():
        for b in dlframe.batches(table, BATCH):
            pass

    def ours_f():
        for b in dlframe.batches(table, BATCH, order="F"):
            pass

    def memcpy():
        np.copyto(dst, src)

    columns = list(data.values())
    block = np.empty((COLS, BATCH), dtype=np.float32)

    def read_bound():
        for start in range(0, ROWS, BATCH):
            end = min(start + BATCH, ROWS)
            for j, c in enumerate(columns):
                np.copyto(block[j, : end - start], c[start:end])

    def polars():
        for s in df.iter_slices(BATCH):
            s.to_numpy()

    def pyarrow():
        for b in table.to_batches(BATCH):
            np.column_stack([c.to_numpy() for c in b.columns])

    t_ours, t_copy, t_pl, t_pa, t_ours_f, t_read = best(ours, memcpy, polars, pyarrow, ours_f, read_bound)

    ctx = datafusion.SessionContext()
    ctx.register_record_batches("t", [table.to_batches()])
    query = ctx.sql("SELECT * FROM t")

    def ours_datafusion():
        for b in dlframe.batches(query, BATCH):
            pass

    def pyarrow_datafusion():
        for b in pa.RecordBatchReader.from_stream(query):
            pass

    t_df, t_df_read = best(ours_datafusion, pyarrow_datafusion)

    def consumer(work_s=0.001):
        waited, n = 0.0, 0
        it = iter(dlframe.batches(table, BATCH))
        while True:
            t = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t
            n += 1
            end = time.perf_counter() + work_s
            a = np.from_dlpack(b)
            while time.perf_counter() < end:  # about 1 ms of work that holds the GIL
                a[:16].sum()
        return waited / n

    wait = min(consumer() for _ in range(3))

    print(
        f"Measured {datetime.date.today()} on {platform.machine()} {platform.system()}; numpy "
        f"{np.__version__}, pyarrow {pa.__version__}, polars {pl.__version__}; {ROWS:,} rows x {COLS} "
        f"float32 ({ROWS * COLS * 4 / 1e6:.0f} MB), batches of {BATCH:,}.\n"
    )
    print("| what | ratio | target | |")
    print("|---|---|---|---|")

    def row(what, r, target):
        if target is None:
            print(f"| {what} | {r:.2f}x | - | |")
        else:
            print(f"| {what} | {r:.2f}x | >= {target:g}x | {'meets' if r >= target else 'misses'} |")

    row("dlframe.batches throughput / numpy memcpy bandwidth, same bytes", t_copy / t_ours, 0.8)
    row("Polars iter_slices + to_numpy time / dlframe.batches time", t_pl / t_ours, 3)
    row("Polars iter_slices + to_numpy time / dlframe.batches(order='F') time", t_pl / t_ours_f, None)
    row("pyarrow to_batches + np.column_stack time / dlframe.batches time", t_pa / t_ours, 3)
    row("read bound (each batch's bytes copied into one reused buffer) time / dlframe.batches time", t_read / t_ours, None)
    row("DataFusion query source: dlframe.batches time / numpy memcpy time", t_df / t_copy, None)
    row("DataFusion query source: pyarrow reading its stream (no conversion) time / numpy memcpy time", t_df_read / t_copy, None)
    row("consumer's wait per batch (1 ms of work per batch) / 1 ms", wait / 0.001, None)


if __name__ == "__main__":
    main()

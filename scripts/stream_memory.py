#!/usr/bin/env python3
"""Streams a DataFusion result larger than memory through dlframe.batches and reports how
much the process's peak RSS grew, against the result's size.

The result is generated on the fly (generate_series; never on disk, never collected): 8 float32
columns, 32 bytes a row. The default is about 4 GB (125M rows); `--rows` makes it smaller
(the test suite runs 12M rows, on one partition). Every batch is checked: its row count, and the column sums
against the closed form of the series. `--max-growth F` fails (exit 1) when the peak RSS grew
by more than F times the result size.

`--partitions N` sets DataFusion's target_partitions (default: its own, the number of cores).
`--source-only` reads the same stream through pyarrow's RecordBatchReader without dlframe
(each batch stacked with numpy), to tell the source's own growth from dlframe's: with more than
one partition, DataFusion repartitions generate_series and its process grows by itself.

    .venv/bin/python scripts/stream_memory.py [--rows N] [--batch-size B] [--max-growth 0.1]
        [--partitions N] [--source-only]
"""

import argparse
import resource
import sys
import time

import numpy as np


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=125_000_000)
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--max-growth", type=float, default=0.1)
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--source-only", action="store_true")
    args = ap.parse_args()

    import datafusion

    import dlframe

    config = datafusion.SessionConfig()
    if args.partitions is not None:
        config = config.with_target_partitions(args.partitions)
    ctx = datafusion.SessionContext(config)

    def stream(df):
        if not args.source_only:
            return dlframe.batches(df, args.batch_size)
        import pyarrow as pa

        return (np.column_stack([c.to_numpy() for c in b.columns]) for b in pa.RecordBatchReader.from_stream(df))

    cols = ", ".join(f"CAST(value % 1000 AS FLOAT) * {j + 1} AS c{j}" for j in range(8))
    df = ctx.sql(f"SELECT {cols} FROM generate_series(0, {args.rows - 1})")
    # Warm up the engine and the extension once, so that their one-time allocations are not
    # counted as growth.
    for _ in stream(ctx.sql(f"SELECT {cols} FROM generate_series(0, 99999)")):
        pass
    base = peak_rss_bytes()
    start = time.perf_counter()
    rows = 0
    sums = np.zeros(8)
    for b in stream(df):
        a = np.from_dlpack(b)
        exact = args.source_only or a.shape[0] == args.batch_size or rows + a.shape[0] == args.rows
        assert a.shape[1] == 8 and exact, a.shape
        sums += a.sum(axis=0, dtype=np.float64)
        rows += a.shape[0]
    seconds = time.perf_counter() - start
    grown = max(peak_rss_bytes() - base, 0)
    size = args.rows * 32

    full, rest = divmod(args.rows, 1000)
    series = full * (999 * 1000 // 2) + rest * (rest - 1) // 2  # sum of value % 1000
    want = np.array([series * (j + 1) for j in range(8)], dtype=np.float64)
    ok_values = rows == args.rows and np.allclose(sums, want, rtol=1e-9)
    ratio = grown / size
    print(
        f"{'source only (pyarrow reader, no dlframe)' if args.source_only else 'dlframe.batches'}, "
        f"target_partitions={args.partitions or 'default'}: "
        f"result {size / 1e9:.2f} GB ({rows:,} rows x 8 float32) in {seconds:.1f} s; "
        f"peak RSS grew {grown / 1e6:.1f} MB = {ratio:.2%} of the result "
        f"(limit {args.max_growth:.0%}); values {'match' if ok_values else 'DIFFER'}"
    )
    return 0 if ok_values and ratio <= args.max_growth else 1


if __name__ == "__main__":
    sys.exit(main())

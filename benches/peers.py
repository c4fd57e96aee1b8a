#!/usr/bin/env python3
"""dlframe against its peers, measured in one run; prints a markdown table of ratios.

Peers: pyarrow, polars, numpy (a plain copy of the same bytes is the memory-bandwidth
yardstick) and torch when installed. Each figure is the best of several repetitions; only
ratios are reported. Run with the test virtualenv: `.venv/bin/python benches/peers.py`.
"""

import datetime
import platform

import numpy as np
import polars as pl
import pyarrow as pa

import dlframe
from ratio_table import Table, best

try:
    import torch
except ImportError:  # torch is an opt-in extra
    torch = None


table = Table()
row = table.row


rng = np.random.default_rng(0)
N = 10_000_000

# 1. Zero-copy export is constant in length and cheaper than pyarrow's own __dlpack__.
small = pa.array(np.arange(1_000, dtype=np.float32))
big = pa.array(np.arange(N, dtype=np.float32))
t_small = best(lambda: np.from_dlpack(dlframe.to_dlpack(small)), 2000)
t_big = best(lambda: np.from_dlpack(dlframe.to_dlpack(big)), 2000)
t_pa = best(lambda: np.from_dlpack(big), 2000)
row("np.from_dlpack(dlframe.to_dlpack(col)): 10M rows / 1K rows", t_big, t_small, 1.5)
row("np.from_dlpack(dlframe.to_dlpack(col)) / pyarrow np.from_dlpack(col), 10M f32", t_big, t_pa, 0.5)

# 2. Null fill, f32, 10M rows, 10% nulls.
vals = rng.random(N, dtype=np.float32)
mask = rng.random(N) < 0.1
nulls = pa.array(vals, mask=mask)
t_copy = best(lambda: vals.copy())
t_ours = best(lambda: np.from_dlpack(dlframe.to_dlpack(nulls, nulls="nan")))
t_pa = best(lambda: nulls.to_numpy(zero_copy_only=False))
row("null fill f32 10M 10%: dlframe / pyarrow to_numpy(zero_copy_only=False)", t_ours, t_pa, 1 / 3)
row("null fill f32 10M 10%: dlframe / numpy copy of the 40 MB", t_ours, t_copy, None)
row("null fill f32 10M 10%: pyarrow / numpy copy", t_pa, t_copy, None)

# 3. Bit-packed booleans, 10M.
bools = pa.array(rng.random(N) < 0.5)
b_bytes = np.zeros(N, dtype=np.bool_)
t_copy = best(lambda: b_bytes.copy())
t_ours = best(lambda: np.from_dlpack(dlframe.to_dlpack(bools)))
t_pa = best(lambda: bools.to_numpy(zero_copy_only=False))
row("bool 10M: dlframe / pyarrow to_numpy(zero_copy_only=False)", t_ours, t_pa, 1 / 3)
row("bool 10M: dlframe / numpy copy of the 10 MB", t_ours, t_copy, None)

# 4. Several columns into one C-order matrix: 8 f32 x 2M.
M = 2_000_000
df = pl.DataFrame({f"c{j}": rng.random(M, dtype=np.float32) for j in range(8)})
tbl = df.to_arrow()
mat = np.zeros((M, 8), dtype=np.float32)
t_copy = best(lambda: mat.copy(), 7)
t_ours = best(lambda: np.from_dlpack(dlframe.to_dlpack(tbl)), 7)
t_ours_pl = best(lambda: np.from_dlpack(dlframe.to_dlpack(df)), 7)
t_pl = best(lambda: df.to_numpy(order="c"), 7)
t_np = best(lambda: np.stack([c.to_numpy() for c in tbl.columns], axis=1), 7)
row("8 f32 x 2M -> (2M, 8) C: dlframe(polars df) / polars df.to_numpy(order='c')", t_ours_pl, t_pl, 1 / 3)
row("8 f32 x 2M -> (2M, 8) C: dlframe(pyarrow table) / np.stack of to_numpy columns", t_ours, t_np, None)
df_n = df.with_columns(pl.when(pl.int_range(pl.len()) % 10 == 3).then(None).otherwise(pl.col(c)).alias(c) for c in df.columns)
t_ours_n = best(lambda: np.from_dlpack(df_n.to_dlpack(nulls="fill", fill_value=0)), 7)
t_pl_n = best(lambda: df_n.fill_null(0).to_numpy(order="c"), 7)
row("8 f32 x 2M, 10% nulls: df.to_dlpack(nulls='fill') / df.fill_null(0).to_numpy(order='c')", t_ours_n, t_pl_n, 1 / 3)
if torch is not None:
    t_torch_n = best(lambda: df_n.fill_null(0).to_torch(), 7)
    t_ours_t = best(lambda: torch.from_dlpack(df_n.to_dlpack(nulls="fill", fill_value=0)), 7)
    row("8 f32 x 2M, 10% nulls: torch.from_dlpack(df.to_dlpack(...)) / df.fill_null(0).to_torch()", t_ours_t, t_torch_n, 1 / 3)
row("8 f32 x 2M -> (2M, 8) C: dlframe / numpy copy of the 64 MB", t_ours, t_copy, None)

# 4b. The to_tensor expression plugin inside a Polars query, against Polars' own Array builder.
from dlframe.polars import to_tensor  # noqa: E402

names = df.columns
t_plug = best(lambda: np.from_dlpack(df.select(to_tensor(*names)).to_series().to_dlpack()), 7)
t_concat = best(lambda: df.select(pl.concat_arr(names)).to_series().to_numpy(), 7)
row("8 f32 x 2M: np.from_dlpack(df.select(to_tensor(c0..c7))...to_dlpack()) / select(pl.concat_arr(...)).to_numpy()",
    t_plug, t_concat, None)
row("8 f32 x 2M: the same to_tensor query / df.to_numpy(order='c')", t_plug, t_pl, None)
t_plug_n = best(lambda: np.from_dlpack(df_n.select(to_tensor(*names, fill_value=0)).to_series().to_dlpack()), 7)
t_concat_n = best(lambda: df_n.select(pl.concat_arr(pl.col(names).fill_null(0))).to_series().to_numpy(), 7)
row("8 f32 x 2M, 10% nulls: to_tensor(..., fill_value=0) query / fill_null(0) + pl.concat_arr, to numpy",
    t_plug_n, t_concat_n, None)
lazy = df.lazy().select(to_tensor(*names))
t_stream = best(lambda: np.from_dlpack(lazy.collect(engine="streaming").to_series().to_dlpack()), 7)
row("8 f32 x 2M: the to_tensor query on the streaming engine / the in-memory engine", t_stream, t_plug, None,
    "streaming output comes in chunks, joined in one more pass")

# 4c. A tensor column in F order (1M rows of (4, 4) f32): one tiled gather, against numpy's own
# asfortranarray of the same C-ordered values and a plain copy of the 64 MB.
cells = pa.FixedSizeListArray.from_arrays(
    pa.FixedSizeListArray.from_arrays(pa.array(rng.random(16 * 1_000_000, dtype=np.float32)), 4), 4)
c_view = np.from_dlpack(dlframe.to_dlpack(cells))
t_ours = best(lambda: np.from_dlpack(dlframe.to_dlpack(cells, order="F")), 7)
t_np = best(lambda: np.asfortranarray(c_view), 7)
t_copy = best(lambda: c_view.copy(), 7)
row("tensor column 1M x (4, 4) f32, order='F': dlframe / np.asfortranarray of the C view", t_ours, t_np, None)
row("tensor column 1M x (4, 4) f32, order='F': dlframe / numpy copy of the 64 MB", t_ours, t_copy, None)

# 5. Chunked column, 100 chunks of 100K.
ch = pa.chunked_array([pa.array(rng.random(100_000, dtype=np.float32)) for _ in range(100)])
t_ours = best(lambda: np.from_dlpack(dlframe.to_dlpack(ch)))
t_pa = best(lambda: ch.to_numpy())
row("chunked 100 x 100K f32: dlframe / pyarrow ChunkedArray.to_numpy()", t_ours, t_pa, None)

# 6. Polars Series, zero-copy.
s_small = pl.Series(np.arange(1_000, dtype=np.float32))
s_big = pl.Series(np.arange(N, dtype=np.float32))
t_small = best(lambda: np.from_dlpack(s_small.to_dlpack()), 2000)
t_big = best(lambda: np.from_dlpack(s_big.to_dlpack()), 2000)
t_pl = best(lambda: s_big.to_numpy(), 2000)
t_export = best(lambda: s_big.to_dlpack(), 2000)
t_np = best(lambda: np.from_dlpack(s_big.to_numpy()), 2000)
row("np.from_dlpack(series.to_dlpack()): 10M / 1K", t_big, t_small, 1.5)
row("series.to_dlpack() / series.to_numpy(), 10M f32 (both zero-copy)", t_export, t_pl, 0.5,
    "both are Python calls that wrap the same view; see the notes below")
row("np.from_dlpack(series.to_dlpack()) / np.from_dlpack(series.to_numpy()), 10M f32", t_big, t_np, None)

# 7. DataFusion: SQL results as a matrix, 8 f32 x 2M in a registered table.
import datafusion  # noqa: E402

import dlframe.datafusion  # noqa: E402

ctx = datafusion.SessionContext()
dlframe.datafusion.register(ctx)
ctx.register_record_batches("t", [tbl.to_batches(max_chunksize=8192)])
cols = ", ".join(f"c{j}" for j in range(8))


def df_builtin():
    """What a DataFusion user does without dlframe: collect, then stack the columns."""
    res = ctx.sql(f"SELECT {cols} FROM t").to_arrow_table()
    return np.stack([c.to_numpy() for c in res.columns], axis=1)


def df_make_array():
    """DataFusion's own row-wise array, flattened."""
    res = ctx.sql(f"SELECT make_array({cols}) AS x FROM t").to_arrow_table()
    return res.column(0).combine_chunks().flatten().to_numpy().reshape(-1, 8)


t_ours = best(lambda: np.from_dlpack(dlframe.to_dlpack(ctx.sql(f"SELECT to_tensor({cols}) AS x FROM t"))), 7)
t_ours_plain = best(lambda: np.from_dlpack(dlframe.to_dlpack(ctx.sql(f"SELECT {cols} FROM t"))), 7)
t_builtin = best(df_builtin, 7)
t_make = best(df_make_array, 7)
row("datafusion 8 f32 x 2M -> (2M, 8): to_dlpack(SELECT to_tensor(...)) / collect + np.stack", t_ours, t_builtin, None,
    "two passes: the UDF writes batches, then they are joined; the next rows are one pass")
row("datafusion 8 f32 x 2M -> (2M, 8): to_dlpack(SELECT to_tensor(...)) / make_array + flatten", t_ours, t_make, 1 / 3)
row("datafusion 8 f32 x 2M -> (2M, 8): to_dlpack(SELECT c0..c7) / collect + np.stack", t_ours_plain, t_builtin, None)

if torch is not None:
    t_ours = best(lambda: torch.from_dlpack(dlframe.to_dlpack(nulls, nulls="fill", fill_value=0)))
    t_torch = best(lambda: torch.from_numpy(nulls.fill_null(0).to_numpy()))
    row("null fill -> torch: dlframe / torch.from_numpy(fill_null(0).to_numpy())", t_ours, t_torch, 1 / 3)
else:
    table.rows.append(("torch comparisons", "not run", "-", "", "torch is not installed (opt-in extra)"))

table.print(f"Measured {datetime.date.today()} on {platform.machine()} {platform.system()}, "
            f"{__import__('os').cpu_count()} cores; numpy {np.__version__}, pyarrow {pa.__version__}, "
            f"polars {pl.__version__}, datafusion {datafusion.__version__}, "
            f"torch {getattr(torch, '__version__', 'absent')}.")

#!/usr/bin/env python3
"""Prints criterion results as ratios to their yardsticks (a markdown table), with targets.

Reads target/criterion/<group>/<function>/new/estimates.json (`mean.point_estimate`, ns),
as written by `cargo bench --bench kernels` (and `--bench dlpack_roundtrip`, `--bench batches`,
`-p dlframe-datafusion --bench sql`, `-p dlframe-polars --bench polars`). Python 3.11
standard library only. Exits 1 when a measured ratio misses its target.
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "target" / "criterion"

# (group, numerator, denominator, target ratio or None for information, what)
ROWS = [
    ("null_fill_f32_10M_10pct", "kernel", "memcpy", 1.2, "null fill, f32, 10M rows, 10% nulls / memcpy of 40 MB"),
    ("bool_unpack_10M", "kernel", "memcpy", 1.5, "bool unpack, 10M / memcpy of the 10 MB written"),
    ("interleave_8xf32_2M_c", "kernel", "memcpy", 1.5, "8 f32 columns x 2M rows -> (2M, 8) C order / memcpy of 64 MB"),
    ("chunk_concat_100x100k_f32", "kernel", "memcpy", 1.2, "chunk concat, 100 x 100K f32 / memcpy of 40 MB"),
    ("interleave_8xf32_2M_c", "to_tensor", "memcpy_fresh", 1.5, "same from Arrow columns, new tensor / copy into fresh memory"),
    ("interleave_fill_8xf32_2M_c", "kernel", "memcpy", None, "the same with 10% nulls per column, filled in the pass / memcpy (info)"),
    ("chunk_concat_100x100k_f32", "arrow_to_tensor", "memcpy_fresh", 1.2, "same from Arrow chunks, new tensor / copy into fresh memory"),
    ("ragged_pad_1M_rows_f32", "kernel", "memcpy_fresh", 1.5, "ragged List<f32> 1M rows -> (1M, 64) padded + lengths / copy into fresh memory"),
    ("ragged_pad_1M_rows_f32", "jagged_zero_copy", "memcpy", None, "the same read jagged (LargeList, zero-copy) / memcpy of the padded bytes (info)"),
    ("tensor_column_f_order_1Mx4x4_f32", "kernel", "memcpy", None, "tensor column 1M x (4, 4) f32 -> F order, one tiled gather into a new tensor / memcpy of 64 MB (info)"),
    ("null_fill_f32_10M_10pct", "kernel_parallel", "memcpy", None, "null fill on all cores / 1-thread memcpy (info)"),
    ("bool_unpack_10M", "kernel_parallel", "memcpy", None, "bool unpack on all cores / 1-thread memcpy (info)"),
    ("interleave_8xf32_2M_c", "kernel_parallel", "memcpy", None, "interleave on all cores / 1-thread memcpy (info)"),
    ("chunk_concat_100x100k_f32", "kernel_parallel", "memcpy", None, "chunk concat on all cores / 1-thread memcpy (info)"),
    ("interleave_8xf32_2M_c", "to_tensor_parallel", "memcpy_fresh", None, "to_tensor on all cores / 1-thread fresh copy (info)"),
    ("chunk_concat_100x100k_f32", "memcpy_fresh", "memcpy", None, "fresh memory / reused memory, for a copy (info)"),
    ("batches_8xf32_4M", "batches", "memcpy", 1.25, "exact-size batches of 65,536 rows, 8 f32 x 4M in 1M-row inputs / memcpy of 128 MB (>= 0.8x bandwidth)"),
    ("batches_8xf32_4M", "batches_ahead", "memcpy", 1.25, "the same, 2 windows converted at once (the Python thread's driver) / memcpy"),
    ("batches_8xf32_4M", "batches_ahead_8192_chunks", "memcpy", None, "the same from 8,192-row inputs (DataFusion's size) / memcpy (info)"),
    ("batches_8xf32_4M", "batches_shuffled", "batches_ahead", 1.5, "shuffled (blocks of one batch, one gather pass) / unshuffled (issue 41: <= 1.5x)"),
    ("sql_8xf32_10M", "to_tensor", "select", 1.3, "SELECT to_tensor(c0..c7) / SELECT c0..c7, MemTable 8 f32 x 10M, collected"),
    ("sql_8xf32_10M", "to_tensor", "make_array", 1 / 3, "SELECT to_tensor(c0..c7) / SELECT make_array(c0..c7)"),
    ("collect_tensor_8xf32_10M", "collect", "memcpy", 1.2, "1221 result batches -> one (10M, 8) tensor / memcpy of 320 MB"),
    ("polars_constant_cost", "series_to_tensor_10000000", "series_to_tensor_1000", 1.5, "Polars Series -> tensor, 10M f32 / 1K (zero-copy)"),
    ("polars_constant_cost", "tensor_to_series_10000000", "tensor_to_series_1000", 1.5, "tensor -> Polars Array Series, 10M / 1K (zero-copy)"),
    ("polars_8xf32_2M_c", "dataframe_to_tensor", "memcpy_fresh", 1.5, "Polars DataFrame 8 f32 x 2M -> (2M, 8) / copy into fresh memory"),
    ("polars_8xf32_2M_c", "plugin_to_tensor", "memcpy_fresh", 1.5, "to_tensor plugin's work, same columns -> Array(f32, 8) Series / fresh copy"),
    ("polars_8xf32_2M_c", "plugin_to_tensor_fill_10pct", "memcpy_fresh", None, "the plugin with 10% nulls filled in the pass / fresh copy (info)"),
    ("polars_8xf32_2M_c", "dataframe_to_tensor_fill_10pct", "memcpy_fresh", None, "DataFrame with 10% nulls filled / fresh copy (info)"),
    ("dlpack_constant_cost", "export/10000000", "export/1000", 1.5, "Arrow -> DLPack export, 10M rows / 1K rows"),
    ("dlpack_constant_cost", "import/10000000", "import/1000", 1.5, "DLPack import -> Arrow, 10M / 1K"),
    ("dlpack_constant_cost", "round_trip/10000000", "round_trip/1000", 1.5, "whole round trip, 10M / 1K"),
    ("dlpack_constant_cost", "device_export/10000000", "device_export/1000", 1.5, "tensor -> Arrow C Device array (CPU), 10M / 1K"),
    ("dlpack_constant_cost", "device_import/10000000", "device_import/1000", 1.5, "Arrow C Device array (CPU) taken, checked, validated -> Arrow, 10M / 1K"),
]


def mean_ns(group, name):
    """The mean time of one benchmark in ns, or None when it has not been run."""
    f = ROOT / group / name / "new" / "estimates.json"
    if not f.exists():
        return None
    return json.loads(f.read_text())["mean"]["point_estimate"]


def main():
    print("| group | what | ratio | target | |")
    print("|---|---|---|---|---|")
    missing, failed = [], 0
    for group, num, den, target, what in ROWS:
        a, b = mean_ns(group, num), mean_ns(group, den)
        if a is None or b is None:
            missing.append(f"{group}/{num if a is None else den}")
            continue
        r = a / b
        if target is None:
            verdict, shown = "", "-"
        else:
            verdict, shown = ("pass" if r <= target else "fail"), f"<= {target}x"
            failed += verdict == "fail"
        print(f"| {group} | {what} | {r:.2f}x | {shown} | {verdict} |")
    if missing:
        print(f"\nnot measured (run `cargo bench` first): {', '.join(missing)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

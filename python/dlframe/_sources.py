"""What a source of ``dlframe.batches`` is: a table in memory of known rows, Parquet files (read
by row groups, through dlframe's reader or pyarrow's), or a stream of Arrow producers."""

from __future__ import annotations

import os
from typing import Any

_IN_WORKERS = (
    "this source cannot be read in DataLoader worker processes ({what}); pass a function that "
    "makes it there, dlframe.batches(make_source, ...), a pyarrow Table, Parquet files, or use "
    "num_workers=0 (dlframe converts the next batch on its own background thread already)"
)


def _speaks_arrow(obj: Any) -> bool:
    t = type(obj)
    methods = ("__arrow_c_stream__", "__arrow_c_array__", "__arrow_c_device_array__", "__arrow_c_device_stream__")
    return any(hasattr(t, m) for m in methods)


def _is_lazy_frame(obj: Any) -> bool:
    t = type(obj)
    return t.__name__ == "LazyFrame" and t.__module__.startswith("polars")


def _in_memory(obj: Any) -> bool:
    """True for data that a forked worker can read from its copy of the parent's memory."""
    if isinstance(obj, (list, tuple)):
        return all(_in_memory(x) for x in obj)
    t = type(obj)
    return t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "Array", "ChunkedArray")


def _known_rows(obj: Any) -> int | None:
    """The rows of a table or column held in memory (pyarrow, Polars), else None."""
    t = type(obj)
    memory = (t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "ChunkedArray")) or (
        t.__module__.startswith("polars") and t.__name__ in ("DataFrame", "Series")
    )
    if memory or (t.__module__.startswith("pyarrow") and isinstance(obj, _pyarrow_array())):
        return len(obj)
    return None


def _pyarrow_array() -> type:
    import pyarrow as pa

    return pa.Array


def _is_path(obj: Any) -> bool:
    if isinstance(obj, (str, os.PathLike)):
        return True
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and all(isinstance(x, (str, os.PathLike)) for x in obj)


def _is_parquet(obj: Any) -> bool:
    """Parquet files: paths, or a pyarrow FileSystemDataset of Parquet files."""
    if _is_path(obj):
        return True
    t = type(obj)
    return (
        t.__module__.startswith("pyarrow")
        and t.__name__ == "FileSystemDataset"
        and type(obj.format).__name__ == "ParquetFileFormat"
    )


def _parquet_dataset(obj: Any) -> Any:
    import pyarrow.dataset as ds

    if _is_path(obj):
        paths = [os.fspath(p) for p in obj] if isinstance(obj, (list, tuple)) else os.fspath(obj)
        return ds.dataset(paths, format="parquet")
    return obj


def _row_groups(dataset: Any) -> list[tuple[Any, int, int]]:
    """(fragment, row group id, rows) of every row group of a Parquet dataset, in its order
    (read from the files' footers)."""
    units = []
    for frag in dataset.get_fragments():
        frag.ensure_complete_metadata()
        units.extend((frag, rg.id, rg.num_rows) for rg in frag.row_groups)
    return units


def _native_files(source: Any, dataset: Any, schedule: Any) -> tuple[Any, str]:
    """dlframe's reader of the dataset's files, where it decodes the batches of ``schedule``
    straight into their rows (local paths of flat fixed-width columns of one type, PLAIN or
    dictionary pages, uncompressed, snappy, zstd or lz4; stacked batches on the CPU), and
    ``plan()``'s line on it; else None and why pyarrow reads them."""
    from . import _native

    if not _is_path(source):
        return None, "pyarrow: a pyarrow dataset is read by pyarrow"
    if dataset.filesystem.type_name != "local":
        return None, f"pyarrow: files on {dataset.filesystem.type_name}"
    files = _native.ParquetFiles(dataset.files)
    why = files.route(schedule)
    return (files, "dlframe") if why is None else (None, f"pyarrow: {why}")


def _read_row_groups(dataset: Any, units: list[tuple[Any, int, int]], read: list[int]) -> Any:
    """A reader of the row groups `read` (indices into `units`), whole and in that order,
    decoded by pyarrow's threads ahead of the consumer; the others are never read."""
    import pyarrow.dataset as ds

    fragments = [units[i][0].subset(row_group_ids=[units[i][1]]) for i in read]
    part = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
    # pyarrow decodes the next row groups while dlframe converts; its read-ahead is kept small,
    # so that memory stays near a few row groups.
    return part.scanner(use_threads=True, batch_readahead=4, fragment_readahead=2).to_reader()


def _stream_of(source: Any) -> tuple[Any, bool]:
    """(an Arrow producer, False) or (an iterable of them, True)."""
    if _is_lazy_frame(source):
        if hasattr(source, "collect_batches"):
            # Polars' streaming engine hands out DataFrames as it makes them.
            return source.collect_batches(engine="streaming"), True
        return source.collect(engine="streaming"), False
    if _speaks_arrow(source):
        return source, False
    if type(source).__module__.startswith("pyarrow") and hasattr(source, "scanner"):
        source = source.scanner()  # a pyarrow dataset of another format
    if type(source).__module__.startswith("pyarrow") and hasattr(source, "to_reader"):
        return source.to_reader(), False  # a pyarrow dataset scanner: its batches as they are read
    if hasattr(source, "__iter__") and not isinstance(source, (str, bytes, dict)):
        return source, True
    raise TypeError(
        "dlframe.batches takes an object with __arrow_c_stream__ or __arrow_c_array__ "
        "(a DataFusion DataFrame, a pyarrow Table, RecordBatchReader or dataset scanner, a "
        "Polars DataFrame or LazyFrame, a duckdb result), Parquet files, an iterable of them, "
        f"or a function that returns one, not {type(source).__name__}"
    )

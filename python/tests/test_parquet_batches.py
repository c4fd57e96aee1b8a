"""`dlframe.batches` of Parquet paths: dlframe's reader decodes each row group straight into the
rows of its batches, where pyarrow's route (kept for a ``pyarrow.dataset``, remote files and
what the reader does not take) decodes into Arrow first. The reference is that route: every
codec and encoding, every fixed-width dtype, nulls, uneven row groups, shuffled, sharded and
resumed batches, equal bit for bit; the fallbacks say why; hostile files are a ValueError
naming the file."""

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import dlframe

N = 2300  # row groups of 700: 700, 700, 700, 200 per file


def _files(tmp_path, dtype=np.float32, nulls=False, files=3, **write):
    paths = []
    for i in range(files):
        rng = np.random.default_rng(i)
        if np.issubdtype(dtype, np.floating):
            a = rng.standard_normal(N).astype(dtype)
        else:
            a = rng.integers(-(2**30), 2**30, N).astype(dtype)
        b = pa.array(np.arange(N).astype(dtype), mask=(np.arange(N) % 7 == 3) if nulls else None)
        c = (np.arange(N) % 5).astype(dtype)  # few values: a dictionary that holds
        path = tmp_path / f"part-{i}.parquet"
        pq.write_table(pa.table({"a": a, "b": b, "c": c}), path, row_group_size=700, **write)
        paths.append(str(path))
    return paths


def _epoch(source, batch=500, **kw):
    return [np.from_dlpack(t) for t in dlframe.batches(source, batch, **kw)]


def _same(paths, **kw):
    """The batches of dlframe's reader, checked against pyarrow's route; how many."""
    b = dlframe.batches(paths, 500, **kw)
    assert b.plan()["reader"] == "dlframe", b.plan()["reader"]
    got, want = _epoch(paths, **kw), _epoch(ds.dataset(paths), **kw)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
    return len(got)


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "lz4"])
@pytest.mark.parametrize("dictionary", [False, True])
def test_every_codec_and_encoding_gives_pyarrow_s_batches(tmp_path, compression, dictionary):
    paths = _files(tmp_path, compression=compression, use_dictionary=dictionary, data_page_size=4096)
    assert _same(paths) == 14  # 6,900 rows in batches of 500
    assert _same(paths, drop_last=True) == 13


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_every_fixed_width_dtype(tmp_path, dtype):
    paths = _files(tmp_path, dtype)
    _same(paths)
    assert _epoch(paths)[0].dtype == dtype
    # A dtype equal to the files' is no cast: still read directly.
    _same(paths, dtype=np.dtype(dtype).name)


def test_nulls_are_filled_or_refused_by_name(tmp_path):
    paths = _files(tmp_path, nulls=True)
    _same(paths, nulls="fill", fill_value=-1.0)
    _same(paths, nulls="nan")
    # Refused as the table conversion refuses them.
    for source in (paths, ds.dataset(paths)):
        with pytest.raises(BufferError, match="column 'b' has .* null"):
            _epoch(source)
    # A mask is made by the table conversion: pyarrow's route, and it says so.
    b = dlframe.batches(paths, 500, nulls="mask")
    assert b.plan()["reader"].startswith("pyarrow: nulls=")
    values, mask = next(iter(b))
    assert not np.from_dlpack(mask)[3, 1]


@pytest.mark.parametrize("kw", [
    dict(shuffle=True, seed=5),
    dict(shuffle=True, seed=5, splits=1),
    dict(shuffle=True, seed=9, shuffle_buffer=1000, even="pad"),
    dict(shard=(1, 3), shuffle=True, seed=2, splits=6),
    dict(shard=(0, 2), even="drop"),
])
def test_shuffled_and_sharded_batches_are_pyarrow_s_bit_for_bit(tmp_path, kw):
    _same(_files(tmp_path, compression="snappy"), **kw)


def test_a_state_saved_on_either_route_resumes_on_the_other(tmp_path):
    paths = _files(tmp_path, compression="zstd")
    kw = dict(shuffle=True, seed=4, splits=4)
    whole = _epoch(paths, **kw)
    for first, then in [(paths, ds.dataset(paths)), (ds.dataset(paths), paths)]:
        b = dlframe.batches(first, 500, **kw)
        it = iter(b)
        for _ in range(5):
            next(it)
        state = b.state_dict()
        resumed = dlframe.batches(then, 500, **kw)
        resumed.load_state_dict(state)
        rest = _epoch_of(resumed)
        assert len(rest) == len(whole) - 5
        assert all(g.tobytes() == w.tobytes() for g, w in zip(rest, whole[5:]))


def _epoch_of(b):
    return [np.from_dlpack(t) for t in b]


def test_a_directory_is_read_as_its_files(tmp_path):
    _files(tmp_path)
    got = _epoch(str(tmp_path))
    want = _epoch(ds.dataset(str(tmp_path)))
    assert dlframe.batches(str(tmp_path), 500).plan()["reader"] == "dlframe"
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


def _outcome(source, **kw):
    """The batches' bytes (a dict's, by name), or the error's type and text."""
    try:
        return [sorted((k, v.tobytes()) for k, v in x.items()) if isinstance(x, dict) else x.tobytes()
                for x in ({k: np.from_dlpack(v) for k, v in t.items()} if isinstance(t, dict) else np.from_dlpack(t)
                          for t in dlframe.batches(source, 500, **kw))]
    except Exception as e:  # noqa: BLE001 - the error is the outcome compared
        return (type(e).__name__, str(e))


def test_what_the_reader_does_not_take_goes_through_pyarrow_and_says_why(tmp_path):
    paths = _files(tmp_path, files=1)
    t = pq.read_table(paths[0])
    nested = tmp_path / "nested" / "n.parquet"
    nested.parent.mkdir()
    pq.write_table(t.append_column("l", pa.array([[1.0, 2.0]] * N, pa.list_(pa.float32()))), nested)
    mixed = tmp_path / "mixed" / "m.parquet"
    mixed.parent.mkdir()
    pq.write_table(t.set_column(0, "a", t["a"].cast(pa.float64())), mixed)
    cases = [
        ([str(nested)], {}, "column 'l' is List"),
        ([str(mixed)], {}, "columns of different types"),
        (paths, dict(columns="dict"), "columns='dict'"),
        (paths, dict(dtype="float64"), "a cast from float32"),
        (paths, dict(order="F"), "order='F'"),
    ]
    for source, kw, why in cases:
        reader = dlframe.batches(source, 500, **kw).plan()["reader"]
        assert reader.startswith("pyarrow: ") and why in reader, reader
        # The route of a pyarrow dataset of the same files, whatever it gives.
        got = _outcome(source, **kw)
        assert got == _outcome(ds.dataset(source), **kw) and len(got) > 0, got
    assert dlframe.batches(ds.dataset(paths), 500).plan()["reader"] == "pyarrow: a pyarrow dataset is read by pyarrow"


def test_hostile_files_are_a_value_error_naming_the_file(tmp_path):
    paths = _files(tmp_path, compression="snappy")
    # A truncated footer in the second file.
    data = open(paths[1], "rb").read()
    open(paths[1], "wb").write(data[: len(data) - 9])
    with pytest.raises(ValueError, match="part-1.parquet"):
        _epoch(paths)
    # Files whose columns differ.
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": np.zeros(10, np.float32)}), other)
    with pytest.raises(ValueError, match="other.parquet"):
        dlframe.batches([paths[0], str(other)], 5).plan()
    # Every 97th byte of a data region overwritten: values or a ValueError naming the file.
    broken = bytearray(open(paths[0], "rb").read())
    for at in range(4, len(broken) - 2000, 97):
        broken[at] = 0xFF
    open(paths[2], "wb").write(bytes(broken))
    try:
        _epoch([paths[2]])
    except ValueError as e:
        assert "part-2.parquet" in str(e)


def test_a_page_that_declares_more_than_its_rows_can_fill_is_a_value_error(tmp_path):
    # One zstd page of 4,096 float32 values (16 KB), whose header then declares 1 MB.
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"a": np.arange(4096, dtype=np.float32)}), path, compression="zstd",
                   use_dictionary=False, data_page_size=1 << 20)
    at = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    assert data[at:at + 3] == b"\x15\x00\x15" and data[at + 5] < 0x80
    np.testing.assert_array_equal(_epoch([str(path)], 4096)[0][:, 0], np.arange(4096))
    data[at + 3:at + 6] = b"\xfe\xff\x7f"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"bomb.parquet.*declares 1048575 bytes uncompressed"):
        _epoch([str(path)], 4096)

"""`dlframe.to_dlpack("file.parquet")`: dlframe's own Parquet reader writes the pages of flat
fixed-width columns straight into the matrix, and hands anything else to arrow-rs's reader and
the table conversion. pyarrow is the reference: every codec, encoding and page version it
writes, nulls, every fixed-width dtype, row groups of uneven size; hostile files are a
ValueError naming the file."""

import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dlframe

N = 3000


def _table(dtype=np.float32, nulls=True):
    rng = np.random.default_rng(7)
    cols = {
        "a": pa.array(rng.standard_normal(N).astype(dtype) if dtype in (np.float32, np.float64) else rng.integers(-(2**30), 2**30, N).astype(dtype)),
        "b": pa.array(np.arange(N).astype(dtype), mask=(np.arange(N) % 7 == 3) if nulls else None),
        "c": pa.array((np.arange(N) % 5).astype(dtype)),  # few values: a dictionary that holds
    }
    return pa.table(cols)


def _reference(path, fill):
    t = pq.read_table(path)
    return np.column_stack([c.fill_null(fill).to_numpy() for c in t.columns])


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "lz4"])
@pytest.mark.parametrize("dictionary", [False, True])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_every_codec_encoding_and_page_version_reads_as_pyarrow_reads_it(tmp_path, compression, dictionary, version):
    path = tmp_path / "t.parquet"
    # Row groups of 700 rows (the last 200) and pages of about 4 KB: several pages per chunk.
    pq.write_table(
        _table(), path, compression=compression, use_dictionary=dictionary, data_page_version=version,
        row_group_size=700, data_page_size=4096,
    )
    got = np.from_dlpack(dlframe.to_dlpack(path, nulls="fill", fill_value=-1.0))
    want = _reference(path, -1.0)
    assert got.shape == (N, 3) and got.dtype == np.float32
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_every_fixed_width_dtype_and_a_path_object(tmp_path, dtype):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(dtype, nulls=False), path, row_group_size=1000)
    got = np.from_dlpack(dlframe.to_dlpack(pathlib.Path(path)))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, _reference(str(path), 0))
    # The same through a string, and as the Arrow route makes a table of it.
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(str(path))), got)
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(pq.read_table(path))), got)


def test_nulls_are_refused_by_name_masked_or_nan(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, row_group_size=1000)
    with pytest.raises(BufferError, match="'b' has 429 null"):
        dlframe.to_dlpack(path)
    values, mask = dlframe.to_dlpack(path, nulls="mask")
    valid = np.column_stack([c.is_valid().to_numpy(zero_copy_only=False) for c in pq.read_table(path).columns])
    np.testing.assert_array_equal(np.from_dlpack(mask), valid)
    nan = np.from_dlpack(dlframe.to_dlpack(path, nulls="nan"))
    assert np.isnan(nan[3, 1]) and not np.isnan(nan[4, 1])
    with pytest.raises(BufferError, match="decoded"):
        dlframe.to_dlpack(path, nulls="nan", copy=False)
    d = dlframe.to_dlpack(path, columns="dict", nulls="fill", fill_value=0.0)
    assert sorted(d) == ["a", "b", "c"] and np.from_dlpack(d["b"])[3] == 0.0


@pytest.mark.parametrize("compression", ["gzip", "brotli"])
def test_a_codec_the_direct_path_does_not_take_reads_through_arrow(tmp_path, compression):
    path = tmp_path / "t.parquet"
    pq.write_table(_table(), path, compression=compression, row_group_size=700)
    got = np.from_dlpack(dlframe.to_dlpack(path, nulls="fill", fill_value=-1.0))
    assert got.tobytes() == _reference(path, -1.0).tobytes()
    # `batches` says why its reader did not take the file.
    assert compression.upper() in dlframe.batches(str(path), 64).plan()["reader"]


def test_a_nested_column_goes_through_arrow(tmp_path):
    path = tmp_path / "t.parquet"
    t = pa.table({"v": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32()))})
    pq.write_table(t, path)
    got = np.from_dlpack(dlframe.to_dlpack(path))
    np.testing.assert_array_equal(got, np.from_dlpack(dlframe.to_dlpack(pq.read_table(path))))
    assert got.shape == (3, 2)


def test_hostile_files_are_a_value_error_naming_the_file(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(_table(nulls=False), good, compression="snappy", row_group_size=1000)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    text = tmp_path / "text.parquet"
    text.write_text("not parquet at all")
    for bad in [truncated, text, tmp_path / "missing.parquet"]:
        with pytest.raises(ValueError, match=bad.name):
            dlframe.to_dlpack(bad)
    # Bytes of the pages overwritten: each read gives values or a ValueError, never a crash.
    footer = int.from_bytes(data[-8:-4], "little")
    errors = 0
    for at in range(4, len(data) - 8 - footer, 97):
        for value in (0x00, 0xFF):
            bad = bytearray(data)
            bad[at] = value
            p = tmp_path / "flipped.parquet"
            p.write_bytes(bytes(bad))
            try:
                dlframe.to_dlpack(p, nulls="fill", fill_value=0.0)
            except ValueError as e:
                assert "flipped.parquet" in str(e)
                errors += 1
    assert errors > 0


def test_a_page_declaring_more_than_its_chunk_is_refused_before_arrow_rs_reads_it(tmp_path):
    # A cast takes arrow-rs's reader, which allocates what a compressed page declares (up to
    # 2 GB, and an allocation that fails aborts): one zstd page of 4,096 float32 values (16 KB)
    # whose header then declares 1 MB, more than the footer says its whole chunk holds.
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"a": np.arange(4096, dtype=np.float32)}), path, compression="zstd",
                   use_dictionary=False, data_page_size=1 << 20)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    at = chunk.data_page_offset
    data = bytearray(path.read_bytes())
    assert data[at:at + 3] == b"\x15\x00\x15" and data[at + 5] < 0x80
    np.testing.assert_array_equal(np.from_dlpack(dlframe.to_dlpack(path, dtype="float64"))[:, 0], np.arange(4096))
    data[at + 3:at + 6] = b"\xfe\xff\x7f"
    path.write_bytes(bytes(data))
    want = rf"bomb.parquet.*declares 1048575 bytes uncompressed, more than its column chunk's {chunk.total_uncompressed_size}"
    with pytest.raises(ValueError, match=want):
        dlframe.to_dlpack(path, dtype="float64")
    with pytest.raises(ValueError, match=want):
        dlframe.to_dlpack(path, columns="dict")

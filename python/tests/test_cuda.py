"""CUDA: columns onto the GPU in one transfer and one kernel, with DLPack stream semantics.

Runs where a CUDA device is present; elsewhere each test skips and says why. Results come back
to the host through dlframe's own explicit copies (``dl_device=(1, 0)``, ``to_arrow(copy=True)``),
so most tests need no other GPU library; torch (or cupy) is needed only where it is the subject:
its streams, its memory, its consumption of our capsules.
"""

import numpy as np
import pyarrow as pa
import pytest

import dlframe
from conftest import optional


@pytest.fixture(scope="module")
def gpu():
    if dlframe.cuda_device_count() == 0:
        pytest.skip("no CUDA device visible to dlframe (no driver, no GPU, or a build without the cuda feature)")


@pytest.fixture(scope="module")
def torch(gpu):
    torch = optional("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def cpu_reference(col, **kw):
    return np.from_dlpack(dlframe.to_dlpack(col, **kw))


def to_host(t):
    """A CUDA tensor's values as numpy: the consumer asks for the CPU (``dl_device=(1, 0)``), and
    dlframe copies once, the host waiting for the copy."""
    assert t.__dlpack_device__()[0] == 2, t.device
    return np.from_dlpack(t, device="cpu")


def random_column(rng, dtype, n, density, offset):
    values = rng.integers(0, 100, n + offset).astype(dtype) if dtype != np.bool_ else rng.random(n + offset) < 0.5
    mask = rng.random(n + offset) < density
    return pa.array(values, mask=mask).slice(offset, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint8, np.int64, np.float16, np.bool_])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.9])
def test_device_kernels_match_the_cpu_kernels(gpu, dtype, density):
    rng = np.random.default_rng(int(density * 10) + np.dtype(dtype).itemsize)
    for n, offset in [(1, 0), (1000, 3), (100_003, 13), (0, 0)]:
        col = random_column(rng, dtype, n, density, offset)
        fill = False if dtype == np.bool_ else 7
        want = cpu_reference(col, fill_value=fill)
        t = dlframe.to_dlpack(col, fill_value=fill, device="cuda:0")
        assert t.device == "cuda:0" and t.__dlpack_device__() == (2, 0)
        np.testing.assert_array_equal(to_host(t), want)


def test_chunks_fixed_size_lists_and_tables(gpu):
    ch = pa.chunked_array([[1.0, None], [3.0], [4.0, 5.0]], pa.float32())
    assert to_host(dlframe.to_dlpack(ch, fill_value=-1, device="cuda")).tolist() == [1.0, -1.0, 3.0, 4.0, 5.0]
    fsl = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.int32)), 3)
    assert to_host(dlframe.to_dlpack(fsl, device="cuda:0")).tolist() == np.arange(12).reshape(4, 3).tolist()
    tbl = pa.table({"a": pa.array([1, 2, 3], pa.int32()), "b": pa.array([0.5, None, 2.5])})
    m = dlframe.to_dlpack(tbl, fill_value=0, device="cuda:0")
    assert m.device == "cuda:0" and to_host(m).tolist() == [[1, 0.5], [2, 0], [3, 2.5]]
    assert m.to_arrow(copy=True).to_numpy_ndarray().tolist() == [[1, 0.5], [2, 0], [3, 2.5]]


def test_cupy_consumes_dlpack_and_the_cuda_array_interface(gpu):
    cupy = optional("cupy")
    col = pa.array([1.5, None, 3.5], pa.float32())
    t = dlframe.to_dlpack(col, fill_value=0, device="cuda:0")
    assert cupy.from_dlpack(t).get().tolist() == [1.5, 0.0, 3.5]
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] not in (None, 0) and "mask" not in cai
    assert cupy.asarray(t).get().tolist() == [1.5, 0.0, 3.5]
    with pytest.raises(AttributeError):
        dlframe.to_dlpack(col, fill_value=0).__cuda_array_interface__


def test_stream_rules(gpu):
    t = dlframe.to_dlpack(pa.array([1, 2, 3], pa.int64()), device="cuda:0")
    with pytest.raises(ValueError, match="stream=0"):
        t.__dlpack__(max_version=(1, 3), stream=0)
    for s in (None, 1, 2, -1):
        assert t.__dlpack__(max_version=(1, 3), stream=s) is not None
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 3), dl_device=(2, 1))
    # To the CPU on request: one copy, after which the host has waited for it.
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=False)
    with pytest.raises(ValueError, match="stream"):
        t.__dlpack__(max_version=(1, 3), dl_device=(1, 0), stream=2)
    assert np.from_dlpack(t, device="cpu").tolist() == [1, 2, 3]
    # copy=True on the device: a fresh allocation with the same values (the capsule adopted by
    # dlframe itself, which keeps the producer's pointer).
    c = dlframe.tensor(t.__dlpack__(max_version=(1, 3), copy=True))
    assert c.device == "cuda:0"
    assert c.__cuda_array_interface__["data"][0] != t.__cuda_array_interface__["data"][0]
    assert to_host(c).tolist() == [1, 2, 3]


def test_stream_rules_with_a_stream_torch_made(torch):
    t = dlframe.to_dlpack(pa.array([1, 2, 3], pa.int64()), device="cuda:0")
    assert t.__dlpack__(max_version=(1, 3), stream=torch.cuda.Stream().cuda_stream) is not None
    with pytest.raises(ValueError, match="stream"):
        t.__dlpack__(max_version=(1, 3), dl_device=(1, 0), stream=torch.cuda.Stream().cuda_stream)
    c = torch.from_dlpack(t.__dlpack__(max_version=(1, 3), copy=True))
    assert c.is_cuda and c.data_ptr() != torch.from_dlpack(t).data_ptr() and c.tolist() == [1, 2, 3]


def test_consumer_stream_reads_correct_data_without_host_sync(torch):
    n = 20_000_000
    rng = np.random.default_rng(5)
    values = rng.random(n, dtype=np.float32)
    mask = rng.random(n) < 0.1
    col = pa.array(values, mask=mask)
    want = np.where(mask, np.float32(0), values)
    # A long kernel on the legacy default stream: our (blocking) producer stream queues behind it.
    torch.cuda._sleep(200_000_000)
    t = dlframe.to_dlpack(col, fill_value=0, device="cuda:0")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.from_dlpack(t)  # torch passes s: s must wait for our event
        y = x.clone()
    s.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), want)
    del x, y, t
    torch.cuda.synchronize()


def test_device_path_refusals_name_the_remedy(gpu):
    col = pa.array([1.0, None])
    with pytest.raises(BufferError, match="nulls='fill'"):
        dlframe.to_dlpack(col, device="cuda:0")
    with pytest.raises(ValueError, match="at row 1"):
        dlframe.to_dlpack(pa.array([1, 300]), dtype="uint8", device="cuda:0")
    with pytest.raises(BufferError, match="cuda:99 is not available"):
        dlframe.to_dlpack(col, fill_value=0, device="cuda:99")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int32", "uint16", "uint64"])
def test_casts_masks_and_list_nulls_on_the_device_match_the_cpu(gpu, dtype):
    rng = np.random.default_rng(11)
    cols = [
        random_column(rng, np.int16, 1001, 0.2, 5),
        pa.chunked_array([random_column(rng, np.float32, 300, 0.1, 1), random_column(rng, np.float32, 77, 0.0, 0)]),
        pa.FixedSizeListArray.from_arrays(random_column(rng, np.uint8, 30, 0.1, 0), 3, mask=pa.array([i % 4 == 0 for i in range(10)])),
    ]
    for col in cols:
        for kw in ({"fill_value": 1}, {"nulls": "mask"}):
            want = dlframe.to_dlpack(col, dtype=dtype, copy=True, **kw)
            got = dlframe.to_dlpack(col, dtype=dtype, device="cuda:0", **kw)
            if kw.get("nulls") == "mask":
                (want, want_mask), (got, got_mask) = want, got
                np.testing.assert_array_equal(to_host(got_mask), np.from_dlpack(want_mask))
            np.testing.assert_array_equal(to_host(got), np.from_dlpack(want))


@pytest.mark.parametrize("order", ["C", "F"])
def test_tables_are_interleaved_on_the_device_as_on_the_cpu(gpu, order):
    rng = np.random.default_rng(12)
    tbl = pa.table({
        "a": random_column(rng, np.int32, 5000, 0.1, 3),
        "b": random_column(rng, np.float64, 5000, 0.0, 0),
        "c": random_column(rng, np.bool_, 5000, 0.2, 7),
        "d": random_column(rng, np.uint8, 5000, 0.5, 1),
    })
    tbl = pa.concat_tables([tbl.slice(0, 1234), tbl.slice(1234)])  # chunked columns
    for kw in ({"fill_value": -1}, {"nulls": "mask"}, {"fill_value": 0, "dtype": "float32"}):
        want = dlframe.to_dlpack(tbl, order=order, **kw)
        got = dlframe.to_dlpack(tbl, order=order, device="cuda:0", **kw)
        if kw.get("nulls") == "mask":
            (want, want_mask), (got, got_mask) = want, got
            np.testing.assert_array_equal(to_host(got_mask), np.from_dlpack(want_mask))
        w = np.from_dlpack(want)
        assert got.strides == tuple(s // w.itemsize for s in w.strides)
        np.testing.assert_array_equal(to_host(got), w)
        np.testing.assert_array_equal(got.to_arrow(copy=True).to_numpy_ndarray(), w)


def test_torch_to_dlframe_to_cupy_shares_one_allocation(torch):
    cupy = optional("cupy")
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    t = dlframe.tensor(x)
    assert t.device == "cuda:0" and t.shape == (3, 4) and t.dtype == "float32" and not t.copied
    assert t.__cuda_array_interface__["data"][0] == x.data_ptr()
    y = cupy.from_dlpack(t)
    assert y.data.ptr == x.data_ptr()
    z = torch.from_dlpack(t)
    assert z.data_ptr() == x.data_ptr()
    x.add_(1)  # one allocation: every view sees the write
    torch.cuda.synchronize()
    assert y.get().tolist() == (np.arange(12).reshape(3, 4) + 1).tolist()
    # The producer's memory outlives the producer's own handle while dlframe holds it.
    del x, z
    torch.cuda.synchronize()
    assert cupy.asarray(t).get()[0].tolist() == [1, 2, 3, 4]
    # A raw capsule (no stream negotiated) is adopted too, ordered after the legacy stream.
    c = dlframe.tensor(torch.full((4,), 7.0, device="cuda").__dlpack__())
    assert c.device == "cuda:0" and c.__cuda_array_interface__["stream"] not in (None, 0)
    assert cupy.from_dlpack(c).get().tolist() == [7.0] * 4
    # A transposed view keeps its strides.
    v = dlframe.tensor(torch.arange(6, dtype=torch.int64, device="cuda").reshape(2, 3).T)
    assert v.shape == (3, 2) and v.strides == (1, 3)
    assert torch.from_dlpack(v).cpu().tolist() == [[0, 3], [1, 4], [2, 5]]


def test_an_imported_tensor_is_ordered_after_the_producers_pending_work(torch):
    cupy = optional("cupy")
    n = 20_000_000
    src = torch.rand(n, device="cuda")
    # dlframe's first use of the device creates its stream, which synchronises the context:
    # do that now, so that it cannot wait out the sleep below and hide a missing ordering.
    dlframe.to_dlpack(pa.array([1.0]), device="cuda:0")
    torch.cuda.synchronize()
    # The producer's result is still being computed on torch's stream when we import it: the
    # stream we pass must make our stream (and so our consumers') wait for it.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x = src * 2
        t = dlframe.tensor(x)
    want_sum = float((src * 2).sum())
    with cupy.cuda.Stream(non_blocking=True) as s:
        y = cupy.from_dlpack(t)  # cupy passes s: s waits for our event, which waits for torch
        got = float(y.sum())
    s.synchronize()
    assert abs(got - want_sum) <= 1e-3 * abs(want_sum)
    del x, y, t
    torch.cuda.synchronize()


def test_torch_cuda_tensors_come_through_torchs_table_ordered_after_its_stream(torch):
    # torch hands its CUDA tensors to dlframe.tensor through its DLPack exchange table, with no
    # __dlpack__ call, and dlframe's stream waits for the stream the table reports as current.
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip(f"torch {torch.__version__} has no DLPack exchange table (torch 2.10 and later have one)")

    class NoDlpack(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise AssertionError("__dlpack__ was called; the exchange table should have been used")

    src = torch.rand(5_000_000, device="cuda")
    want = (src * 2).cpu().numpy()
    # dlframe's stream exists before the sleep, so making it cannot wait the sleep out.
    dlframe.to_dlpack(pa.array([1.0]), device="cuda:0")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x = (src * 2).as_subclass(NoDlpack)
        t = dlframe.tensor(x)
    assert t.device == "cuda:0" and t.__cuda_array_interface__["data"][0] == x.data_ptr()
    # The copy to the host runs on dlframe's stream, which waits for the side stream's work.
    np.testing.assert_array_equal(t.to_arrow(copy=True).to_numpy(), want)
    del x, t
    torch.cuda.synchronize()


def test_device_tensors_reach_the_host_only_by_an_explicit_copy(gpu):
    t = dlframe.to_dlpack(pa.array([1.0, None, 3.0]), fill_value=0, device="cuda:0")
    with pytest.raises(BufferError, match="copy=True"):
        t.to_arrow()
    assert t.to_arrow(copy=True).to_pylist() == [1.0, 0.0, 3.0]
    assert dlframe.from_dlpack(t, copy=True).to_pylist() == [1.0, 0.0, 3.0]
    f = dlframe.to_dlpack(pa.table({"a": [1.0, 2.0], "b": [3.0, None]}), fill_value=0, order="F", device="cuda:0")
    np.testing.assert_array_equal(f.to_arrow(copy=True).to_numpy_ndarray(), [[1.0, 3.0], [2.0, 0.0]])


def test_tensor_columns_in_f_order_reach_the_device_in_f_order(torch):
    # Made on the host in F order (the device plan writes C order) and uploaded once, as it is.
    col = pa.array([[[1, 2, 3], [4, 5, None]], [[7, 8, 9], [10, 11, 12]]], pa.list_(pa.list_(pa.int32(), 3), 2))
    t = dlframe.to_dlpack(col, fill_value=0, order="F", device="cuda:0")
    x = torch.from_dlpack(t)
    assert x.is_cuda and x.stride() == (1, 2, 4)
    want = [[[1, 2, 3], [4, 5, 0]], [[7, 8, 9], [10, 11, 12]]]
    np.testing.assert_array_equal(x.cpu().numpy(), want)
    values, mask = dlframe.to_dlpack(col, nulls="mask", order="F", device="cuda:0")
    assert torch.from_dlpack(values).stride() == torch.from_dlpack(mask).stride() == (1, 2, 4)
    assert int(torch.from_dlpack(mask).sum()) == 11 and not bool(torch.from_dlpack(mask)[0, 1, 2])
    (b,) = dlframe.batches(col, 2, fill_value=0, order="F", device="cuda:0")
    assert torch.from_dlpack(b).is_cuda and torch.from_dlpack(b).stride() == (1, 2, 4)


def test_torch_tensors_reach_the_host_only_by_an_explicit_copy(torch):
    x = torch.arange(5, dtype=torch.int32, device="cuda")
    with pytest.raises(BufferError, match="copy=True"):
        dlframe.from_dlpack(x)
    assert dlframe.from_dlpack(x, copy=True).to_pylist() == [0, 1, 2, 3, 4]
    m = dlframe.tensor(torch.arange(6, dtype=torch.float64, device="cuda").reshape(2, 3))
    np.testing.assert_array_equal(m.to_arrow(copy=True).to_numpy_ndarray(), np.arange(6.0).reshape(2, 3))
    # Strided device tensors are gathered into C order on the device, then copied once.
    tr = dlframe.tensor(torch.arange(6, device="cuda").reshape(2, 3).T)
    np.testing.assert_array_equal(tr.to_arrow(copy=True).to_numpy_ndarray(), np.arange(6).reshape(2, 3).T)


def test_the_kernel_timing_helper_measures_or_says_why_not():
    if not hasattr(dlframe._native, "_cuda_kernel_timing"):
        pytest.skip("the extension is built without the feature bench-internals (scripts/test.sh builds it)")
    if dlframe.cuda_device_count() == 0:
        with pytest.raises(BufferError, match="cuda:0 is not available"):
            dlframe._native._cuda_kernel_timing(1000)
        return
    times = dlframe._native._cuda_kernel_timing(1_000_000, 3)
    assert [name for name, _, _ in times] == ["fill", "bool unpack", "cast", "interleave", "copy"]
    assert all(moved > 0 and 0 < ms < 1000 for _, moved, ms in times), times
    with pytest.raises(RuntimeError, match="at least 8"):
        dlframe._native._cuda_kernel_timing(0)


def test_cuda_requests_without_a_device_say_why_before_touching_one():
    """Runs everywhere: refusals that come before any device is used, and the no-device errors."""
    col = pa.array([1.0, 2.0])
    with pytest.raises(ValueError, match="device='cuda:N'"):
        dlframe.to_dlpack(col, stream=1)
    cpu = dlframe.to_dlpack(col, copy=True)
    with pytest.raises(BufferError, match="copy=False"):
        cpu.__dlpack__(max_version=(1, 3), dl_device=(2, 0), copy=False)
    if dlframe.cuda_device_count() == 0:
        with pytest.raises(BufferError, match="0 CUDA device"):
            cpu.__dlpack__(max_version=(1, 3), dl_device=(2, 0))
        with pytest.raises(BufferError, match="cuda:0 is not available: 0 CUDA device"):
            dlframe.to_dlpack(col, device="cuda:0", stream=1)
        # Every way of reaching for the missing device says so with the same error.
        with pytest.raises(BufferError, match="cuda:0 is not available: 0 CUDA device"):
            dlframe.to_dlpack(pa.table({"a": col, "b": col}), device="cuda:0")
        with pytest.raises(BufferError, match="cuda:0 is not available: 0 CUDA device"):
            cpu.__dlpack__(max_version=(1, 3), dl_device=(2, 0))


def test_a_cpu_tensor_asked_for_on_a_cuda_device_is_copied_there(gpu):
    # The capsules are adopted by dlframe itself and read back with an explicit copy.
    host = dlframe.to_dlpack(pa.array([1.0, 2.0, 3.0]))
    x = dlframe.tensor(host.__dlpack__(max_version=(1, 3), dl_device=(2, 0), stream=1))
    assert x.device == "cuda:0" and to_host(x).tolist() == [1.0, 2.0, 3.0]
    # A strided host tensor is gathered first.
    m = dlframe.tensor(np.arange(6.0).reshape(2, 3).T)
    y = dlframe.tensor(m.__dlpack__(max_version=(1, 3), dl_device=(2, 0), stream=1))
    assert y.device == "cuda:0" and to_host(y).tolist() == np.arange(6.0).reshape(2, 3).T.tolist()


def test_torch_consumes_a_cpu_tensor_asked_for_on_a_cuda_device(torch):
    host = dlframe.to_dlpack(pa.array([1.0, 2.0, 3.0]))
    x = torch.from_dlpack(host.__dlpack__(max_version=(1, 3), dl_device=(2, 0), stream=1))
    assert x.is_cuda and x.tolist() == [1.0, 2.0, 3.0]


def test_to_dlpack_stream_orders_the_result_on_the_consumers_stream(torch):
    n = 20_000_000
    rng = np.random.default_rng(6)
    values = rng.random(n, dtype=np.float32)
    mask = rng.random(n) < 0.1
    want = np.where(mask, np.float32(0), values)
    s = torch.cuda.Stream()
    torch.cuda._sleep(200_000_000)  # our producer stream (blocking) queues behind this
    t = dlframe.to_dlpack(pa.array(values, mask=mask), fill_value=0, device="cuda:0", stream=s)
    with torch.cuda.stream(s):
        # stream=-1: no synchronisation at export; to_dlpack's stream= already ordered s.
        y = torch.from_dlpack(t.__dlpack__(max_version=(1, 3), stream=-1)).clone()
    s.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), want)
    values_mask = dlframe.to_dlpack(pa.array([1.0, 2.0]), nulls="mask", device="cuda:0")
    assert [v.device for v in values_mask] == ["cuda:0", "cuda:0"]



def test_columns_larger_than_the_staging_buffers_arrive_whole(gpu):
    # Pageable host memory goes up through two page-locked staging buffers (64 MiB in all),
    # reused once their uploads are done: these columns are larger than both together.
    rng = np.random.default_rng(7)
    n = 20_000_003
    values = rng.random(n, dtype=np.float32)
    mask = rng.random(n) < 0.1
    got = to_host(dlframe.to_dlpack(pa.array(values, mask=mask), fill_value=0, device="cuda:0"))
    np.testing.assert_array_equal(got, np.where(mask, np.float32(0), values))
    chunked = pa.chunked_array([values[:5_000_001], values[5_000_001:]])
    np.testing.assert_array_equal(to_host(dlframe.to_dlpack(chunked, device="cuda:0")), values)
    # A host tensor asked for on the device takes the same way.
    up = dlframe.tensor(dlframe.tensor(values).__dlpack__(max_version=(1, 3), dl_device=(2, 0), stream=1))
    np.testing.assert_array_equal(to_host(up), values)
    # From several threads at once: each conversion holds the buffers in its turn.
    from concurrent.futures import ThreadPoolExecutor

    parts = [values[i::4].copy() for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda p: to_host(dlframe.to_dlpack(pa.array(p), device="cuda:0")), parts * 2))
    for g, p in zip(got, parts * 2):
        np.testing.assert_array_equal(g, p)


def test_page_locked_sources_are_copied_straight_and_outlive_the_copy(torch):
    values = np.arange(9_000_000, dtype=np.float32)
    pinned = torch.from_numpy(values).pin_memory()
    t = dlframe.tensor(pinned)
    x = dlframe.tensor(t.__dlpack__(max_version=(1, 3), dl_device=(2, 0), stream=1))
    del t, pinned  # the host waited for the copy from page-locked memory
    np.testing.assert_array_equal(to_host(x), values)


def test_cuda_array_interface_consumers_read_our_memory(torch):
    t = dlframe.to_dlpack(pa.array([1.0, None, 3.0, 4.0]), fill_value=0, device="cuda:0")
    ptr, readonly = t.__cuda_array_interface__["data"]
    # dlframe's own copies are shared by every consumer and so read-only (docs/design.md);
    # torch has no read-only tensors and refuses them through this interface, while
    # torch.from_dlpack shares them.
    assert readonly is True
    with pytest.raises(TypeError, match="read only"):
        torch.as_tensor(t, device="cuda")
    assert torch.from_dlpack(t).data_ptr() == ptr
    # Writable device memory imported from torch stays writable, and torch.as_tensor takes it.
    w = dlframe.tensor(torch.arange(4, dtype=torch.float32, device="cuda"))
    wptr, wro = w.__cuda_array_interface__["data"]
    assert wro is False
    x = torch.as_tensor(w, device="cuda")
    assert x.data_ptr() == wptr and x.tolist() == [0.0, 1.0, 2.0, 3.0]
    numba_cuda = optional("numba.cuda")
    a = numba_cuda.as_cuda_array(t)
    assert a.device_ctypes_pointer.value == ptr
    assert a.copy_to_host().tolist() == [1.0, 0.0, 3.0, 4.0]


def jax_on_gpu():
    jax = optional("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip(f"jax sees no GPU (devices: {jax.devices()}); install jax with CUDA")
    return jax


def test_jax_cuda_arrays_are_imported_and_re_exported_without_a_copy(torch):
    jax = jax_on_gpu()
    x = jax.numpy.arange(12, dtype=jax.numpy.float32).reshape(3, 4) * 2
    t = dlframe.tensor(x)
    assert t.device == "cuda:0" and t.shape == (3, 4) and not t.copied
    assert t.__cuda_array_interface__["data"][0] == x.unsafe_buffer_pointer()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.unsafe_buffer_pointer()
    assert y.cpu().tolist() == (np.arange(12).reshape(3, 4) * 2).tolist()
    # And jax takes ours: a column converted on the device, read by jax on the same device.
    c = dlframe.to_dlpack(pa.array([1.0, None, 3.0]), fill_value=0, device="cuda:0")
    back = jax.dlpack.from_dlpack(c)
    assert np.asarray(back).tolist() == [1.0, 0.0, 3.0]


def test_jax_cuda_bfloat16_reaches_arrow_only_by_an_explicit_copy(gpu):
    jax = jax_on_gpu()
    x = jax.numpy.array([0.5, -1.25, 3.0e38, -0.0], dtype=jax.numpy.bfloat16)
    with pytest.raises(BufferError, match="copy=True"):
        dlframe.from_dlpack(x)
    col = dlframe.from_dlpack(x, copy=True)
    storage = col.storage if isinstance(col, pa.ExtensionArray) else col
    bits = np.frombuffer(storage.buffers()[1], dtype=np.uint16, count=len(storage), offset=storage.offset * 2)
    np.testing.assert_array_equal(bits, np.asarray(x).view(np.uint16))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_casts_on_the_device_match_the_cpu_and_refuse_the_same_values(gpu, name):
    ml_dtypes = optional("ml_dtypes")
    rng = np.random.default_rng(13)
    # Every float8 value's neighbourhood: whole numbers, halves and ties, nulls filled.
    values = rng.integers(-400, 400, 5000) / rng.choice([1, 2, 8, 64], 5000)
    col = pa.array(values.astype(np.float32), mask=rng.random(5000) < 0.1)
    want = dlframe.to_dlpack(col, dtype=name, fill_value=2.0).to_numpy()
    got = dlframe.to_dlpack(col, dtype=name, fill_value=2.0, device="cuda:0")
    assert got.device == "cuda:0"
    np.testing.assert_array_equal(got.to_numpy().view(np.uint8), want.view(np.uint8))
    # And back: a float8 column widened to float32 on the device, exactly.
    f8 = dlframe.from_dlpack(want)
    wide = dlframe.to_dlpack(f8, dtype="float32", device="cuda:0")
    np.testing.assert_array_equal(to_host(wide), want.astype(np.float32))
    # Out of range: refused by the plan, naming the row, before anything reaches the device.
    big = pa.array([1.0, 1e6], pa.float32())
    with pytest.raises(ValueError, match=rf"row 1 .*{name}"):
        dlframe.to_dlpack(big, dtype=name, device="cuda:0")
    assert np.dtype(getattr(ml_dtypes, name)) == want.dtype


def test_torch_cuda_float8_comes_and_goes_without_a_copy(torch):
    x = torch.tensor([1.0, -2.5, 448.0], device="cuda").to(torch.float8_e4m3fn)
    t = dlframe.tensor(x)
    assert t.device == "cuda:0"
    back = torch.from_dlpack(t)
    assert back.dtype == torch.float8_e4m3fn and back.data_ptr() == x.data_ptr()
    np.testing.assert_array_equal(t.to_numpy().astype(np.float32), [1.0, -2.5, 448.0])

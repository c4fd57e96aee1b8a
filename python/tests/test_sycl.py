"""__sycl_usm_array_interface__ with dpctl on a CPU SYCL device (OpenCL CPU runtime)."""

import gc
import os
import pathlib
import sys

import numpy as np
import pytest

# The OpenCL CPU runtime of the intel-opencl-rt wheel lives in the virtualenv's lib/.
_ocl = pathlib.Path(sys.prefix) / "lib" / "libintelocl.so"
if _ocl.exists():
    os.environ.setdefault("OCL_ICD_FILENAMES", str(_ocl))

import dlframe  # noqa: E402
from conftest import optional  # noqa: E402


@pytest.fixture(scope="module")
def queue():
    dpctl = optional("dpctl")
    try:
        return dpctl.SyclQueue("cpu")
    except Exception as e:  # no SYCL CPU device: the runtime is missing
        pytest.skip(f"no SYCL CPU device ({e}); pip install intel-opencl-rt and set OCL_ICD_FILENAMES")


class Typed:
    """A typed view over USM memory, as dpctl.tensor arrays describe themselves."""

    def __init__(self, mem, typestr, shape, strides=None, offset=0):
        self.mem = mem
        self.__sycl_usm_array_interface__ = {
            "data": (mem._pointer, False),
            "shape": shape,
            "strides": strides,
            "offset": offset,
            "typestr": typestr,
            "syclobj": mem.sycl_queue,
            "version": 1,
        }


@pytest.mark.parametrize("kind", ["MemoryUSMShared", "MemoryUSMHost", "MemoryUSMDevice"])
def test_usm_imports_zero_copy_and_keeps_the_queue_alive(queue, kind):
    import dpctl.memory as dpm

    mem = getattr(dpm, kind)(64, queue=queue)
    payload = np.arange(16, dtype=np.float32)
    mem.copy_from_host(payload.view(np.uint8))
    ptr = mem._pointer
    raw = dlframe.from_dlpack(mem)
    assert raw.buffers()[1].address == ptr and len(raw) == 64
    typed = dlframe.from_dlpack(Typed(mem, "<f4", (16,)))
    assert typed.buffers()[1].address == ptr
    strided = dlframe.from_dlpack(Typed(mem, "<f4", (4,), strides=(3,), offset=1))
    assert strided.to_pylist() == [1.0, 4.0, 7.0, 10.0]
    del mem
    gc.collect()
    assert typed.to_pylist() == payload.tolist()


def test_tensors_over_usm_reexport_the_same_interface(queue):
    import dpctl.memory as dpm

    mem = dpm.MemoryUSMShared(32, queue=queue)
    mem.copy_from_host(np.arange(8, dtype=np.int32).view(np.uint8))
    t = dlframe.tensor(Typed(mem, "<i4", (8,)))
    suai = t.__sycl_usm_array_interface__
    assert suai["data"][0] == mem._pointer and suai["syclobj"] is mem.sycl_queue
    assert suai["typestr"] == "<i4" and suai["shape"] == (8,) and suai["version"] == 1
    back = dpm.as_usm_memory(t)
    assert back.get_usm_type() == "shared"
    np.testing.assert_array_equal(np.frombuffer(back.copy_to_host(), dtype=np.int32), np.arange(8))
    with pytest.raises(AttributeError):
        dlframe.to_dlpack(__import__("pyarrow").array([1])).__sycl_usm_array_interface__


def test_bad_sycl_descriptors(queue):
    import dpctl.memory as dpm

    mem = dpm.MemoryUSMShared(16, queue=queue)
    bad = Typed(mem, "<f4", (4,))
    bad.__sycl_usm_array_interface__["version"] = 2
    with pytest.raises(ValueError, match="version"):
        dlframe.from_dlpack(bad)
    bad = Typed(mem, "|O8", (2,))
    with pytest.raises(ValueError, match="typestr"):
        dlframe.from_dlpack(bad)

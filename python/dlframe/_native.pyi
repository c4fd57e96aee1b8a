from typing import Any, Literal, overload

import numpy as np

# Every dtype-like `dtype=` accepts: a name ("float32"), a numpy dtype, type or code (np.float32,
# np.dtype("f4"), "f4", "<f4"), a pyarrow DataType, a Polars dtype or a torch dtype.
DTypeLike = Any
_Nulls = Literal["error", "fill", "nan", "mask"]

class Tensor:
    """A tensor over Arrow (or foreign) memory.

    Shared Arrow memory is read-only (DLPack READ_ONLY); copies are writable and ``copied``
    (DLPack IS_COPIED).
    """

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    @property
    def __array_struct__(self) -> Any: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA tensors only: v3, with the producer's stream (never 0)."""
    @property
    def __sycl_usm_array_interface__(self) -> dict[str, Any]:
        """Tensors over SYCL USM memory only: v1, with their syclobj."""
    def __arrow_c_array__(self, requested_schema: Any | None = None) -> tuple[Any, Any]: ...
    def __arrow_c_device_array__(self, requested_schema: Any | None = None, **kwargs: Any) -> tuple[Any, Any]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements, as DLPack counts them."""
    @property
    def dtype(self) -> np.dtype[Any]:
        """The element type as a numpy dtype (equal to its name: ``t.dtype == "float32"``)."""
    @property
    def device(self) -> str: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def copied(self) -> bool: ...
    @property
    def ndim(self) -> int: ...
    def __len__(self) -> int: ...
    def to_arrow(self, *, copy: bool | None = None) -> Any:
        """A pyarrow array (N-d: fixed_shape_tensor); copies only when sharing is impossible.

        A CUDA tensor needs ``copy=True`` (one device-to-host transfer); otherwise BufferError.
        """
    def to_polars(self, *, copy: bool | None = None) -> Any: ...
    def to_numpy(self, *, copy: bool | None = None) -> np.ndarray[Any, np.dtype[Any]]:
        """A numpy view of the memory (read-only when the tensor is); ``copy=True``: a writable copy."""

@overload
def to_dlpack(
    obj: Any,
    *,
    nulls: Literal["error", "fill", "nan"] = "error",
    fill_value: bool | int | float | None = None,
    copy: bool | None = None,
    dtype: DTypeLike | None = None,
    order: Literal["C", "F"] = "C",
    device: str | None = None,  # "cpu", "cuda" or "cuda:N"
    columns: Literal["stack"] = "stack",
    stream: Any | None = None,  # a consumer's CUDA stream (int, or a torch/cupy stream) to order the result on
    ragged: Literal["error"] = "error",
    inexact: Literal["error", "round"] = "error",  # an integer a float dtype holds only rounded: refuse, or round
) -> Tensor: ...
@overload
def to_dlpack(
    obj: Any,
    *,
    nulls: Literal["mask"],
    fill_value: bool | int | float | None = None,
    copy: bool | None = None,
    dtype: DTypeLike | None = None,
    order: Literal["C", "F"] = "C",
    device: str | None = None,  # "cpu", "cuda" or "cuda:N"
    columns: Literal["stack"] = "stack",
    stream: Any | None = None,  # a consumer's CUDA stream (int, or a torch/cupy stream) to order the result on
    ragged: Literal["error"] = "error",
    inexact: Literal["error", "round"] = "error",  # an integer a float dtype holds only rounded: refuse, or round
) -> tuple[Tensor, Tensor]: ...
@overload
def to_dlpack(
    obj: Any,
    *,
    nulls: _Nulls = "error",
    fill_value: bool | int | float | None = None,
    copy: bool | None = None,
    dtype: DTypeLike | None = None,
    order: Literal["C", "F"] = "C",
    device: str | None = None,  # "cpu", "cuda" or "cuda:N"
    columns: Literal["dict"],
    stream: Any | None = None,  # a consumer's CUDA stream (int, or a torch/cupy stream) to order the result on
    ragged: Literal["error"] = "error",
    inexact: Literal["error", "round"] = "error",  # an integer a float dtype holds only rounded: refuse, or round
) -> dict[str, Any]: ...
@overload
def to_dlpack(
    obj: Any,
    *,
    nulls: _Nulls = "error",
    fill_value: bool | int | float | None = None,
    copy: bool | None = None,
    dtype: DTypeLike | None = None,
    order: Literal["C", "F"] = "C",
    device: str | None = None,  # "cpu", "cuda" or "cuda:N"
    columns: Literal["stack"] = "stack",
    stream: Any | None = None,
    ragged: Literal["pad", "jagged"],  # (values, lengths) / (values, offsets); the mask second under nulls="mask"
    inexact: Literal["error", "round"] = "error",  # an integer a float dtype holds only rounded: refuse, or round
    pad_value: bool | int | float | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, ...]: ...
@overload
def to_dlpack(
    obj: Any,
    *,
    nulls: str = "error",
    fill_value: bool | int | float | None = None,
    copy: bool | None = None,
    dtype: DTypeLike | None = None,
    order: Literal["C", "F"] = "C",
    device: str | None = None,  # "cpu", "cuda" or "cuda:N"
    columns: str = "stack",
    stream: Any | None = None,  # a consumer's CUDA stream (int, or a torch/cupy stream) to order the result on
    ragged: str = "error",
    inexact: Literal["error", "round"] = "error",  # an integer a float dtype holds only rounded: refuse, or round
    pad_value: bool | int | float | None = None,
    max_len: int | None = None,
) -> Tensor | tuple[Tensor, ...] | dict[str, Any]:
    """Any Arrow producer as a tensor (or the path of a Parquet file, read by dlframe's own
    reader: pages of flat fixed-width columns written straight into the matrix).

    A column (chunked or not) becomes one tensor: zero-copy for one chunk of numeric data
    without nulls, otherwise one fused copy. A table or record batch becomes an ``(n, k)``
    matrix (``columns="stack"``, one fused interleave + cast pass) or a dict of column tensors
    (``columns="dict"``); a table whose only column is a list or tensor column (such as a
    ``SELECT to_tensor(...)`` result) becomes that column's ``(n, *cell_shape)`` tensor.
    ``nulls="mask"`` returns ``(values, mask)`` pairs. A List column whose rows have different
    lengths needs ``ragged="pad"`` (``(values, lengths)``: ``(n, width)`` padded with
    ``pad_value``, ``width`` = ``max_len`` or the longest row) or ``ragged="jagged"``
    (``(values, offsets)``, for ``torch.nested.nested_tensor_from_jagged``); the mask, if asked
    for, comes second. ``copy=False``
    raises BufferError when a copy would be needed; ``copy=True`` always copies.
    With ``device="cuda:N"``, ``stream`` (DLPack numbering: 1 legacy default, 2 per-thread,
    a handle, -1 none; or a torch/cupy stream) is made to wait for the conversion, so the
    result can be used there at once; the host does not block.
    """


def from_dlpack(x: Any, *, copy: bool | None = None, device: str | None = None) -> Any:
    """Any tensor as a pyarrow array, zero-copy where the memory allows.

    Accepts objects with ``__dlpack__``, raw DLPack capsules, ``__array_interface__``,
    ``__array_struct__``, the buffer protocol and Arrow data (read as ``tensor()`` reads it),
    told apart in the order ``tensor()`` and ``to_dlpack`` use. N-d tensors become ``fixed_shape_tensor``
    arrays. The producer's memory stays alive exactly as long as the Arrow buffers.
    Device tensors (CUDA and others) become host arrays only with ``copy=True`` (the producer,
    or for a dlframe Tensor one device-to-host transfer, makes the copy); otherwise BufferError.
    """

class Schedule:
    """``dlframe.batches``' settings, checked once (each held here and nowhere else)."""

    def __init__(
        self,
        batch_size: int,
        *,
        columns: str = "stack",
        nulls: str = "error",
        fill_value: bool | int | float | None = None,
        dtype: DTypeLike | None = None,
        order: str = "C",
        device: str | None = None,
        drop_last: bool = False,
        prefetch: int = 2,
        ragged: str = "error",
        pad_value: bool | int | float | None = None,
        max_len: int | None = None,
        inexact: str = "error",
        even: str = "keep",
        shuffle: bool = False,
        seed: int | None = None,
        shuffle_buffer: int | None = None,
        splits: int | None = None,
    ) -> None: ...
    @property
    def batch_size(self) -> int: ...
    def plan(
        self,
        rows: int | None,
        units: list[int] | None,
        *,
        rank: int,
        world: int,
        epoch: int,
        splits: int | None = None,
        shuffle_buffer: int | None = None,
    ) -> Plan: ...
    def resume(
        self,
        state: str,
        rows: int | None,
        units: list[int] | None,
        *,
        rank: int,
        world: int,
        worker: tuple[int, int],
    ) -> tuple[int, int, bool, int | None, int | None]: ...

class Plan:
    """One rank's plan of one epoch."""

    @property
    def batches(self) -> int | None: ...
    def summary(self) -> str: ...
    def reads(self, step: int, own: bool, worker: tuple[int, int]) -> list[int]: ...
    def state(self, step: int, worker: tuple[int, int] | None = None) -> str: ...

class ParquetFiles:
    """Parquet files that dlframe's reader decodes straight into batches."""

    def __init__(self, paths: list[str]) -> None: ...
    @property
    def units(self) -> list[int]: ...
    def route(self, schedule: Schedule) -> str | None: ...

class BatchStream:
    def __init__(
        self,
        source: Any,
        schedule: Schedule,
        plan: Plan,
        *,
        step: int = 0,
        own: bool = False,
        worker: tuple[int, int] = (0, 1),
        iterate: bool = False,
    ) -> None: ...
    def __iter__(self) -> BatchStream: ...
    def __next__(self) -> Any: ...
    def close(self) -> None: ...

def cuda_device_count() -> int:
    """CUDA devices dlframe can use: 0 without a driver, a device, or CUDA support in the build."""

def tensor(x: Any) -> Tensor:
    """Wraps a tensor-like object (DLPack, array interface, buffer) as a dlframe Tensor.

    Never copies a tensor-like object, except numpy's datetime units that Arrow lacks
    (``datetime64[D]``, ``[h]``, ``[m]``), which are converted (``Tensor.copied`` is then True).
    Arrow data (``__arrow_c_array__``, ``__arrow_c_stream__``, ``__arrow_c_device_array__``,
    ``__arrow_c_device_stream__``: a pyarrow array or table, a Polars DataFrame, an Arrow
    device array) becomes what ``to_dlpack`` makes of it with its defaults, errors included: shared for one chunk of numbers
    without nulls, one copy for booleans, several chunks or a table's matrix; nulls raise
    BufferError. A CUDA tensor (torch, cupy, jax) stays on its device: it is asked for with
    ``stream=`` dlframe's stream, and re-exports zero-copy with dlframe's stream semantics, so
    ``cupy.from_dlpack(dlframe.tensor(torch_cuda_tensor))`` shares the memory. Other devices
    raise BufferError; without CUDA support or a device, RuntimeError.
    """

__version__: str

class ScalarUDF:
    """One dlframe SQL function, exported to datafusion-python as a datafusion-ffi capsule."""

    @property
    def name(self) -> str: ...
    def __datafusion_scalar_udf__(self) -> object: ...

class DatafusionOptions:
    """dlframe's session options (``dlframe.inexact``) as a datafusion-ffi capsule, for
    ``SessionConfig().with_extension(...)``."""

    def __init__(self) -> None: ...
    def __datafusion_extension_options__(self) -> object: ...

def datafusion_udfs() -> list[ScalarUDF]:
    """Every dlframe SQL function; register them with ``dlframe.datafusion.register(ctx)``."""

def _dtype_name(dtype: DTypeLike | None, /) -> str | None:
    """dlframe's name for a dtype-like (np.float32 -> "float32"); None for None."""

def _series_view(s: Any, /) -> Tensor | None:
    """A Polars Series' values as a read-only tensor over its memory (no copy), or None when
    Polars has no such view (nulls, several chunks, booleans, temporal data)."""

def _series_method(series_type: type, with_options: Any, plain: Any, doc: str, /) -> Any:
    """``series.to_dlpack`` as a method descriptor of ``series_type`` (the shared view, else
    ``plain(series)``, or ``with_options(series, **options)``), documented by ``doc``; absent on
    Windows."""

def _plain_ndarray(x: Any, /) -> bool:
    """Whether x is a numpy.ndarray that from_dlpack hands to pyarrow.Array.from_dlpack as it
    is (1-D, non-empty, aligned, writable, contiguous, integers or IEEE floats); for tests."""

def datafusion_version() -> str:
    """The DataFusion version the SQL functions are built against."""

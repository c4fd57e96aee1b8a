"""The Arrow extension types of the tensor dtypes Arrow lacks, each over ``fixed_size_binary``
of the dtype's width (or variable-width binary, as Polars stores them) (the value's bytes, little-endian): ``lance.bfloat16`` as Lance writes
it, and dlframe's ``dlframe.float8_e4m3fn`` and ``dlframe.float8_e5m2`` (Arrow has no float8,
and no other library names one). Imported only once pyarrow is (see ``_arrow_types``)."""

import pyarrow as pa


class _BytesType(pa.ExtensionType):
    """Values of a dtype Arrow lacks, ``WIDTH`` bytes each, in ``fixed_size_binary(WIDTH)``."""

    NAME = ""
    WIDTH = 0

    def __init__(self, storage: "pa.DataType | None" = None) -> None:
        super().__init__(pa.binary(self.WIDTH) if storage is None else storage, self.NAME)

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> "_BytesType":
        # Polars keeps the extension but stores the values as variable-width binary (and
        # writes large_binary to Parquet); dlframe checks each value's width when it converts.
        if storage_type not in (pa.binary(cls.WIDTH), pa.binary(), pa.large_binary(), pa.binary_view()):
            raise TypeError(f"{cls.NAME} is stored as fixed_size_binary({cls.WIDTH}) or binary, not {storage_type}")
        return cls(storage_type)


class BFloat16Type(_BytesType):
    """bfloat16 values, two bytes each (the high half of a float32)."""

    NAME = "lance.bfloat16"
    WIDTH = 2


class Float8E4M3FNType(_BytesType):
    """float8 e4m3fn (no infinities, largest finite 448), as torch and ml_dtypes define it."""

    NAME = "dlframe.float8_e4m3fn"
    WIDTH = 1


class Float8E5M2Type(_BytesType):
    """float8 e5m2 (IEEE-style, largest finite 57344), as torch and ml_dtypes define it."""

    NAME = "dlframe.float8_e5m2"
    WIDTH = 1


# Lance registers lance.bfloat16 itself; dlframe's float8 names are its own.
FLOAT8 = (Float8E4M3FNType, Float8E5M2Type)

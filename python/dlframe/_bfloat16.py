"""bfloat16's Arrow extension type, ``lance.bfloat16`` over ``fixed_size_binary(2)`` as Lance
writes it. Imported only once pyarrow is (see ``_arrow_types``)."""

import pyarrow as pa

NAME = "lance.bfloat16"


class BFloat16Type(pa.ExtensionType):
    """bfloat16 values, two bytes each (the high half of a float32), in ``fixed_size_binary(2)``."""

    def __init__(self) -> None:
        super().__init__(pa.binary(2), NAME)

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> "BFloat16Type":
        if storage_type != pa.binary(2):
            raise TypeError(f"{NAME} is stored as fixed_size_binary(2), not {storage_type}")
        return cls()

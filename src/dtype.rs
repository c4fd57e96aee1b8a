//! Element types: [`DType`] <-> Arrow `DataType` <-> DLPack `DLDataType`.
//!
//! Array-interface typestrs (`"<f4"`) live in [`crate::interface::typestr`]. Nothing here copies.

use std::collections::HashMap;

use arrow_schema::{DataType, Field};

use crate::error::{Error, Result};
use crate::ffi::dlpack::{DLDataType, type_code};

/// The field metadata key that names an Arrow extension type.
pub const EXTENSION_NAME_KEY: &str = "ARROW:extension:name";
/// The field metadata key of an Arrow extension type's serialized metadata.
pub const EXTENSION_METADATA_KEY: &str = "ARROW:extension:metadata";

/// The element type of a tensor.
///
/// Arrow's temporal types are stored as [`DType::Int32`] / [`DType::Int64`]; the tensor keeps the
/// Arrow type beside it so the way back restores it (see [`storage_dtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// One byte per value, 0 or 1 (DLPack `kDLBool`, bits 8).
    Bool,
    /// `i8`.
    Int8,
    /// `i16`.
    Int16,
    /// `i32`.
    Int32,
    /// `i64`.
    Int64,
    /// `u8`.
    UInt8,
    /// `u16`.
    UInt16,
    /// `u32`.
    UInt32,
    /// `u64`.
    UInt64,
    /// IEEE half.
    Float16,
    /// `f32`.
    Float32,
    /// `f64`.
    Float64,
    /// bfloat16: f32's range with 8 bits of mantissa (DLPack `kDLBfloat`, bits 16). Arrow has
    /// no such type; its columns are the `lance.bfloat16` extension over `FixedSizeBinary(2)`
    /// ([`BFLOAT16_EXTENSION`]).
    BFloat16,
}

/// The Arrow extension name of bfloat16 columns (as Lance writes them): storage
/// `FixedSizeBinary(2)`, the value's bits little-endian, empty metadata.
pub const BFLOAT16_EXTENSION: &str = "lance.bfloat16";

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Float16,
        DType::Float32,
        DType::Float64,
        DType::BFloat16,
    ];

    /// Bytes per element.
    pub const fn itemsize(self) -> usize {
        match self {
            DType::Bool | DType::Int8 | DType::UInt8 => 1,
            DType::Int16 | DType::UInt16 | DType::Float16 | DType::BFloat16 => 2,
            DType::Int32 | DType::UInt32 | DType::Float32 => 4,
            DType::Int64 | DType::UInt64 | DType::Float64 => 8,
        }
    }

    /// The numpy-style name: `"float32"`, `"bool"`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::UInt8 => "uint8",
            DType::UInt16 => "uint16",
            DType::UInt32 => "uint32",
            DType::UInt64 => "uint64",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::BFloat16 => "bfloat16",
        }
    }

    /// Parses a numpy-style name (`"float32"`, `"f4"` is not accepted: use the typestr codec).
    pub fn from_name(name: &str) -> Result<Self> {
        DType::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| Error::UnsupportedDType {
            what: format!("{name:?}"),
            remedy: "use one of bool, int8..int64, uint8..uint64, float16, float32, float64, bfloat16",
        })
    }

    /// True for the float types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::Float16 | DType::Float32 | DType::Float64 | DType::BFloat16)
    }

    /// The DLPack type triple (lanes 1).
    pub const fn to_dlpack(self) -> DLDataType {
        let code = match self {
            DType::Bool => type_code::KDL_BOOL,
            DType::Int8 | DType::Int16 | DType::Int32 | DType::Int64 => type_code::KDL_INT,
            DType::UInt8 | DType::UInt16 | DType::UInt32 | DType::UInt64 => type_code::KDL_UINT,
            DType::Float16 | DType::Float32 | DType::Float64 => type_code::KDL_FLOAT,
            DType::BFloat16 => type_code::KDL_BFLOAT,
        };
        DLDataType { code, bits: (self.itemsize() * 8) as u8, lanes: 1 }
    }

    /// Reads a DLPack type triple; unknown codes, odd bit widths and `lanes != 1` are refused.
    pub fn from_dlpack(dt: DLDataType) -> Result<Self> {
        let found = DType::ALL.into_iter().find(|d| d.to_dlpack() == dt);
        found.ok_or_else(|| Error::UnsupportedDType {
            what: format!("(code={}, bits={}, lanes={})", dt.code, dt.bits, dt.lanes),
            remedy: "dlframe reads bool/8, int and uint 8-64, float 16-64 and bfloat16 with \
                     lanes=1; cast the tensor first",
        })
    }

    /// The Arrow type of a 1-D column of this dtype (bool becomes Arrow's bit-packed `Boolean`;
    /// bfloat16 the `FixedSizeBinary(2)` storage, whose field needs [`DType::arrow_field`]'s
    /// extension metadata).
    pub fn to_arrow(self) -> DataType {
        match self {
            DType::Bool => DataType::Boolean,
            DType::Int8 => DataType::Int8,
            DType::Int16 => DataType::Int16,
            DType::Int32 => DataType::Int32,
            DType::Int64 => DataType::Int64,
            DType::UInt8 => DataType::UInt8,
            DType::UInt16 => DataType::UInt16,
            DType::UInt32 => DataType::UInt32,
            DType::UInt64 => DataType::UInt64,
            DType::Float16 => DataType::Float16,
            DType::Float32 => DataType::Float32,
            DType::Float64 => DataType::Float64,
            DType::BFloat16 => DataType::FixedSizeBinary(2),
        }
    }

    /// The Arrow field of a 1-D column of this dtype: [`DType::to_arrow`]'s type, with the
    /// `lance.bfloat16` extension metadata for bfloat16.
    pub fn arrow_field(self, name: &str, nullable: bool) -> Field {
        let field = Field::new(name, self.to_arrow(), nullable);
        match self {
            DType::BFloat16 => field.with_metadata(HashMap::from([
                (EXTENSION_NAME_KEY.to_string(), BFLOAT16_EXTENSION.to_string()),
                (EXTENSION_METADATA_KEY.to_string(), String::new()),
            ])),
            _ => field,
        }
    }
}

/// The dtype of a flat Arrow column, read from its field: [`storage_dtype`] of its type, and
/// bfloat16 for a `lance.bfloat16` extension column. A `FixedSizeBinary(2)` column without the
/// extension is refused like any binary column.
///
/// # Errors
/// As [`storage_dtype`].
pub fn field_dtype(field: &Field) -> Result<DType> {
    let bf16 = field.metadata().get(EXTENSION_NAME_KEY).is_some_and(|n| n == BFLOAT16_EXTENSION);
    match field.data_type() {
        DataType::FixedSizeBinary(2) if bf16 => Ok(DType::BFloat16),
        dt => storage_dtype(dt),
    }
}

/// The dtype of a leaf array whose field has passed [`field_dtype`] (arrays carry no field
/// metadata): as [`storage_dtype`], with `FixedSizeBinary(2)` read as bfloat16.
pub(crate) fn leaf_storage(dt: &DataType) -> Result<DType> {
    match dt {
        DataType::FixedSizeBinary(2) => Ok(DType::BFloat16),
        dt => storage_dtype(dt),
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tensor dtype that holds the values of a flat Arrow type, or why there is none.
///
/// Temporal types map to the integer that stores them: date32, time32 -> int32; date64,
/// time64, timestamp, duration -> int64. Nested types (FixedSizeList, tensors) are handled by
/// [`crate::arrow`], not here.
pub fn storage_dtype(dt: &DataType) -> Result<DType> {
    use DataType as D;
    Ok(match dt {
        D::Boolean => DType::Bool,
        D::Int8 => DType::Int8,
        D::Int16 => DType::Int16,
        D::Int32 | D::Date32 | D::Time32(_) => DType::Int32,
        D::Int64 | D::Date64 | D::Time64(_) | D::Timestamp(_, _) | D::Duration(_) => DType::Int64,
        D::UInt8 => DType::UInt8,
        D::UInt16 => DType::UInt16,
        D::UInt32 => DType::UInt32,
        D::UInt64 => DType::UInt64,
        D::Float16 => DType::Float16,
        D::Float32 => DType::Float32,
        D::Float64 => DType::Float64,
        other => return Err(unsupported_arrow(other)),
    })
}

/// The error for an Arrow type with no tensor form, with a remedy that fits the type.
pub(crate) fn unsupported_arrow(dt: &DataType) -> Error {
    use DataType as D;
    let remedy = match dt {
        D::Utf8
        | D::LargeUtf8
        | D::Utf8View
        | D::Binary
        | D::LargeBinary
        | D::BinaryView
        | D::FixedSizeBinary(_) => {
            "strings and binary have no tensor form; encode them first (e.g. to category codes \
             or token ids)"
        }
        D::Decimal32(..) | D::Decimal64(..) | D::Decimal128(..) | D::Decimal256(..) => {
            "decimals have no DLPack dtype; cast to float64 (or to a scaled int64) first"
        }
        D::Dictionary(..) => {
            "dictionary arrays are not contiguous values; cast to the value type, or export the \
             keys and the dictionary separately"
        }
        D::Struct(_) => "struct columns: export each field, or pass the fields as several columns",
        D::List(_) | D::LargeList(_) | D::ListView(_) | D::LargeListView(_) => {
            "variable-length lists need equal lengths; cast to FixedSizeList first"
        }
        D::Null => "an all-null column has no values; cast it to a numeric type first",
        _ => "cast it to a numeric type first",
    };
    Error::UnsupportedArrowType { what: dt.to_string(), remedy }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_triples_round_trip_and_are_unique() {
        for d in DType::ALL {
            assert_eq!(DType::from_dlpack(d.to_dlpack()).unwrap(), d);
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
            assert_eq!(d.to_dlpack().bits as usize, d.itemsize() * 8);
        }
    }

    #[test]
    fn unknown_triples_are_refused_with_the_triple() {
        for dt in [
            DLDataType { code: type_code::KDL_BFLOAT, bits: 32, lanes: 1 },
            DLDataType { code: type_code::KDL_FLOAT, bits: 32, lanes: 2 },
            DLDataType { code: type_code::KDL_INT, bits: 7, lanes: 1 },
            DLDataType { code: 200, bits: 8, lanes: 1 },
        ] {
            let e = DType::from_dlpack(dt).unwrap_err().to_string();
            assert!(e.contains(&format!("code={}", dt.code)), "{e}");
        }
    }

    #[test]
    fn temporal_types_use_their_storage_integer() {
        use arrow_schema::TimeUnit;
        assert_eq!(storage_dtype(&DataType::Date32).unwrap(), DType::Int32);
        assert_eq!(storage_dtype(&DataType::Date64).unwrap(), DType::Int64);
        assert_eq!(
            storage_dtype(&DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))).unwrap(),
            DType::Int64
        );
        assert!(storage_dtype(&DataType::Utf8).unwrap_err().to_string().contains("encode"));
    }
}

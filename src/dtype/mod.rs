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

mod float8;
pub mod spelling;

pub use float8::{F8E4M3FN, F8E5M2};

/// The one dtype table: a row per dtype, in declaration order. Each row is
/// `Variant(Rust element type, name, kind, DLPack type code, Arrow storage type, Arrow extension
/// name, array-interface kind character, safetensors dtype, doc)`. [`DType`] and its methods are
/// generated from it here; the other layers generate their per-dtype matches (the kernels'
/// element types, the Arrow readers) by passing a macro of their own as `$callback`, which is
/// called with `$pass` and then the rows. Bool is the first row, so a callback for numeric
/// dtypes only matches it apart.
#[macro_export]
#[doc(hidden)]
macro_rules! dtype_table {
    ($callback:ident $(, $pass:tt)?) => {
        $callback! { $($pass)?
            Bool(bool, "bool", Bool, KDL_BOOL, Boolean, None, Some('b'), "BOOL",
                "One byte per value, 0 or 1 (DLPack `kDLBool`, bits 8).")
            Int8(i8, "int8", Signed, KDL_INT, Int8, None, Some('i'), "I8", "`i8`.")
            Int16(i16, "int16", Signed, KDL_INT, Int16, None, Some('i'), "I16", "`i16`.")
            Int32(i32, "int32", Signed, KDL_INT, Int32, None, Some('i'), "I32", "`i32`.")
            Int64(i64, "int64", Signed, KDL_INT, Int64, None, Some('i'), "I64", "`i64`.")
            UInt8(u8, "uint8", Unsigned, KDL_UINT, UInt8, None, Some('u'), "U8", "`u8`.")
            UInt16(u16, "uint16", Unsigned, KDL_UINT, UInt16, None, Some('u'), "U16", "`u16`.")
            UInt32(u32, "uint32", Unsigned, KDL_UINT, UInt32, None, Some('u'), "U32", "`u32`.")
            UInt64(u64, "uint64", Unsigned, KDL_UINT, UInt64, None, Some('u'), "U64", "`u64`.")
            Float16(half::f16, "float16", Float, KDL_FLOAT, Float16, None, Some('f'), "F16", "IEEE half.")
            Float32(f32, "float32", Float, KDL_FLOAT, Float32, None, Some('f'), "F32", "`f32`.")
            Float64(f64, "float64", Float, KDL_FLOAT, Float64, None, Some('f'), "F64", "`f64`.")
            BFloat16(half::bf16, "bfloat16", Float, KDL_BFLOAT, FixedSizeBinary(2), Some("lance.bfloat16"),
                None, "BF16",
                "bfloat16: f32's range with 8 bits of mantissa (DLPack `kDLBfloat`). Arrow has no such \
                 type; its columns are the `lance.bfloat16` extension over `FixedSizeBinary(2)`.")
            Float8E4M3FN($crate::dtype::F8E4M3FN, "float8_e4m3fn", Float, KDL_FLOAT8_E4M3FN, FixedSizeBinary(1),
                Some("dlframe.float8_e4m3fn"), None, "F8_E4M3",
                "float8 e4m3fn ([`F8E4M3FN`]: no infinities, largest finite 448; DLPack \
                 `kDLFloat8_e4m3fn`); in Arrow, the `dlframe.float8_e4m3fn` extension over \
                 `FixedSizeBinary(1)`.")
            Float8E5M2($crate::dtype::F8E5M2, "float8_e5m2", Float, KDL_FLOAT8_E5M2, FixedSizeBinary(1),
                Some("dlframe.float8_e5m2"), None, "F8_E5M2",
                "float8 e5m2 ([`F8E5M2`]: IEEE-style, largest finite 57344; DLPack \
                 `kDLFloat8_e5m2`); in Arrow, the `dlframe.float8_e5m2` extension over \
                 `FixedSizeBinary(1)`.")
        }
    };
}

/// What kind of number a dtype holds: the casts' and promotion's first question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// bool.
    Bool,
    /// Signed integers.
    Signed,
    /// Unsigned integers.
    Unsigned,
    /// Floats (IEEE, bfloat16, float8).
    Float,
}

macro_rules! dtype_enum {
    ($($V:ident($T:ty, $name:literal, $kind:ident, $code:ident, $arrow:ident $(($n:literal))?,
        $ext:expr, $typestr:expr, $st:literal, $doc:literal))*) => {
        /// The element type of a tensor: one row of the dtype table (`dtype_table!`).
        ///
        /// Arrow's temporal types are stored as [`DType::Int32`] / [`DType::Int64`]; the tensor
        /// keeps the Arrow type beside it so the way back restores it (see [`storage_dtype`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum DType {
            $(#[doc = $doc] $V,)*
        }

        impl DType {
            /// Every dtype, in declaration order.
            pub const ALL: [DType; [$(stringify!($V)),*].len()] = [$(DType::$V),*];

            /// Bytes per element.
            pub const fn itemsize(self) -> usize {
                match self {
                    $(DType::$V => std::mem::size_of::<$T>(),)*
                }
            }

            /// The numpy-style name (`"float32"`, `"bool"`), which torch and ml_dtypes share.
            pub const fn name(self) -> &'static str {
                match self {
                    $(DType::$V => $name,)*
                }
            }

            /// What kind of number it holds.
            pub const fn kind(self) -> Kind {
                match self {
                    $(DType::$V => Kind::$kind,)*
                }
            }

            /// The DLPack type triple (lanes 1).
            pub const fn to_dlpack(self) -> DLDataType {
                let code = match self {
                    $(DType::$V => type_code::$code,)*
                };
                DLDataType { code, bits: (self.itemsize() * 8) as u8, lanes: 1 }
            }

            /// The Arrow type of a 1-D column of this dtype: bool becomes Arrow's bit-packed
            /// `Boolean`; a dtype Arrow lacks its extension's `FixedSizeBinary` storage, whose
            /// field needs [`DType::arrow_field`]'s extension metadata.
            pub fn to_arrow(self) -> DataType {
                match self {
                    $(DType::$V => DataType::$arrow $(($n))?,)*
                }
            }

            /// The Arrow extension name of a dtype Arrow has no type for (bfloat16, float8).
            pub const fn arrow_extension(self) -> Option<&'static str> {
                match self {
                    $(DType::$V => $ext,)*
                }
            }

            /// The array-interface kind character (`'f'` of `"<f4"`); None where the array
            /// interfaces have no typestr for it (numpy would read it as opaque bytes).
            pub const fn typestr_kind(self) -> Option<char> {
                match self {
                    $(DType::$V => $typestr,)*
                }
            }

            /// The dtype's name in `.safetensors` headers (`"F32"`, `"F8_E4M3"`).
            pub const fn safetensors(self) -> &'static str {
                match self {
                    $(DType::$V => $st,)*
                }
            }
        }
    };
}
dtype_table!(dtype_enum);

/// Every dtype's DLPack type as its refusals list them: `bool (code 6, 8 bits), int8 (code 0, 8
/// bits), ...`.
fn dlpack_types() -> String {
    let each = DType::ALL.map(|d| {
        let t = d.to_dlpack();
        format!("{} (code {}, {} bits)", d.name(), t.code, t.bits)
    });
    each.join(", ")
}

/// The Arrow extension name of bfloat16 columns (as Lance writes them): storage
/// `FixedSizeBinary(2)`, the value's bits little-endian, empty metadata.
pub const BFLOAT16_EXTENSION: &str = "lance.bfloat16";

impl DType {
    /// Parses a name of [`DType::name`] (`"float32"`; `"f4"` is not accepted: use the typestr
    /// codec).
    pub fn from_name(name: &str) -> Result<Self> {
        DType::ALL.iter().copied().find(|d| d.name() == name).ok_or_else(|| Error::UnsupportedDType {
            what: format!("{name:?}"),
            remedy: format!("use one of {}", spelling::names()).into(),
        })
    }

    /// True for the float types.
    pub const fn is_float(self) -> bool {
        matches!(self.kind(), Kind::Float)
    }

    /// Reads a DLPack type triple; unknown codes, odd bit widths and `lanes != 1` are refused.
    pub fn from_dlpack(dt: DLDataType) -> Result<Self> {
        let found = DType::ALL.iter().copied().find(|d| d.to_dlpack() == dt);
        found.ok_or_else(|| Error::UnsupportedDType {
            what: format!("(code={}, bits={}, lanes={})", dt.code, dt.bits, dt.lanes),
            remedy: format!("dlframe reads, with lanes=1, {}; cast the tensor first", dlpack_types()).into(),
        })
    }

    /// The unsigned integer dtype of the same size that carries this dtype's bits where a
    /// consumer has no type for it (numpy's array interface for bfloat16 and float8); None for
    /// the dtypes with a typestr.
    pub fn bits_dtype(self) -> Option<DType> {
        if self.typestr_kind().is_some() {
            return None;
        }
        DType::ALL.into_iter().find(|d| d.kind() == Kind::Unsigned && d.itemsize() == self.itemsize())
    }

    /// The Arrow field of a 1-D column of this dtype: [`DType::to_arrow`]'s type, with the
    /// extension metadata of a dtype Arrow lacks.
    pub fn arrow_field(self, name: &str, nullable: bool) -> Field {
        let field = Field::new(name, self.to_arrow(), nullable);
        match self.arrow_extension() {
            Some(ext) => field.with_metadata(HashMap::from([
                (EXTENSION_NAME_KEY.to_string(), ext.to_string()),
                (EXTENSION_METADATA_KEY.to_string(), String::new()),
            ])),
            None => field,
        }
    }
}

/// The dtype of a flat Arrow column, read from its field: [`storage_dtype`] of its type, and
/// the dtype of an extension Arrow lacks (`lance.bfloat16`, `dlframe.float8_e4m3fn`) over its
/// `FixedSizeBinary` storage. A `FixedSizeBinary` column without the extension is refused like
/// any binary column.
///
/// # Errors
/// As [`storage_dtype`].
pub fn field_dtype(field: &Field) -> Result<DType> {
    let extension = match field.metadata().get(EXTENSION_NAME_KEY) {
        None => None,
        Some(ext) => DType::ALL.into_iter().find(|d| d.arrow_extension() == Some(ext.as_str())),
    };
    match extension {
        Some(d) if field.data_type() == &d.to_arrow() => Ok(d),
        _ => storage_dtype(field.data_type()),
    }
}

/// The dtype of a leaf array of a column whose field gave `declared` ([`field_dtype`]): arrays
/// carry no field metadata, so an extension's `FixedSizeBinary` storage is read as the declared
/// dtype, and any other type as [`storage_dtype`] reads it.
///
/// # Errors
/// As [`storage_dtype`].
pub(crate) fn leaf_dtype(dt: &DataType, declared: DType) -> Result<DType> {
    if declared.arrow_extension().is_some() && dt == &declared.to_arrow() {
        return Ok(declared);
    }
    storage_dtype(dt)
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
        D::FixedSizeBinary(_) | D::Binary | D::LargeBinary | D::BinaryView => {
            "strings and binary have no tensor form; encode them first (e.g. to category codes \
             or token ids). A bfloat16 or float8 column that pyarrow read from a file before \
             `import dlframe` has lost its type here: pass the table or record batch, whose \
             schema still names it, or read the file again after importing dlframe"
        }
        D::Utf8 | D::LargeUtf8 | D::Utf8View => {
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
    fn refusals_list_every_dtype_of_the_table() {
        let by_name = DType::from_name("float128").unwrap_err().to_string();
        let by_code = DType::from_dlpack(DLDataType { code: 5, bits: 64, lanes: 1 }).unwrap_err().to_string();
        for d in DType::ALL {
            assert!(by_name.contains(d.name()), "{by_name}");
            let t = d.to_dlpack();
            assert!(
                by_code.contains(&format!("{} (code {}, {} bits)", d.name(), t.code, t.bits)),
                "{by_code}"
            );
        }
        assert!(by_code.starts_with("unsupported dtype (code=5, bits=64, lanes=1)"), "{by_code}");
    }

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

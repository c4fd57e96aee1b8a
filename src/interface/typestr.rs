//! The numpy typestr codec: `"<f4"`, `"|b1"`, `"<M8[ns]"`, as plain data with serde.

use std::fmt;
use std::str::FromStr;

use arrow_schema::{DataType, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The byte-order character of a typestr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// `<`
    Little,
    /// `>`
    Big,
    /// `|`: not applicable (single bytes).
    NotApplicable,
    /// `=`: native.
    Native,
}

impl ByteOrder {
    fn char(self) -> char {
        match self {
            ByteOrder::Little => '<',
            ByteOrder::Big => '>',
            ByteOrder::NotApplicable => '|',
            ByteOrder::Native => '=',
        }
    }
    fn is_native(self) -> bool {
        match self {
            ByteOrder::Little => cfg!(target_endian = "little"),
            ByteOrder::Big => cfg!(target_endian = "big"),
            ByteOrder::NotApplicable | ByteOrder::Native => true,
        }
    }
}

/// A parsed typestr: byte order, kind character (`b i u f c m M O S U V t`), item size in
/// bytes (bits for `t`), and the datetime unit for `m`/`M`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TypeStr {
    /// Byte order.
    pub order: ByteOrder,
    /// Kind character.
    pub kind: char,
    /// Item size.
    pub itemsize: usize,
    /// Datetime unit (`"ns"`), for kinds `m` and `M`.
    pub unit: Option<String>,
}

impl TypeStr {
    /// The native typestr of a dtype: `"|b1"`, `"|i1"`, `"<f4"` on little-endian machines.
    ///
    /// # Errors
    /// [`Error::UnsupportedDType`] for bfloat16, which the array interfaces cannot name (numpy
    /// would read it as two opaque bytes).
    pub fn from_dtype(dtype: DType) -> Result<Self> {
        let kind = dtype.typestr_kind().ok_or_else(|| Error::UnsupportedDType {
            what: format!("{dtype} in an array interface"),
            remedy: "the array interfaces have no typestr for it; exchange it through DLPack (torch, jax, \
                     ml_dtypes) or cast to float32"
                .into(),
        })?;
        let order = if dtype.itemsize() == 1 {
            ByteOrder::NotApplicable
        } else if cfg!(target_endian = "little") {
            ByteOrder::Little
        } else {
            ByteOrder::Big
        };
        Ok(TypeStr { order, kind, itemsize: dtype.itemsize(), unit: None })
    }

    /// The typestr for an Arrow column type: datetimes keep their unit (`"<M8[us]"`), other
    /// types use their storage dtype.
    ///
    /// # Errors
    /// [`Error::UnsupportedArrowType`] for types with no tensor form.
    pub fn from_arrow(dt: &DataType) -> Result<Self> {
        let unit = |u: &TimeUnit| match u {
            TimeUnit::Second => "s",
            TimeUnit::Millisecond => "ms",
            TimeUnit::Microsecond => "us",
            TimeUnit::Nanosecond => "ns",
        };
        let base = TypeStr::from_dtype(crate::dtype::storage_dtype(dt)?)?;
        Ok(match dt {
            DataType::Timestamp(u, _) => TypeStr { kind: 'M', unit: Some(unit(u).into()), ..base },
            DataType::Date64 => TypeStr { kind: 'M', unit: Some("ms".into()), ..base },
            DataType::Duration(u) => TypeStr { kind: 'm', unit: Some(unit(u).into()), ..base },
            _ => base,
        })
    }

    /// The dtype that stores values of this typestr.
    ///
    /// # Errors
    /// [`Error::UnsupportedDType`] for non-native byte order, kinds other than `b i u f m M`,
    /// and sizes with no dtype.
    pub fn to_dtype(&self) -> Result<DType> {
        if !self.order.is_native() {
            return Err(Error::UnsupportedDType {
                what: self.to_string(),
                remedy: "non-native byte order; byteswap the array first (e.g. arr.astype(arr.dtype.newbyteorder('=')))"
                    .into(),
            });
        }
        // Datetimes and durations are stored as int64.
        let kind = if matches!(self.kind, 'M' | 'm') && self.itemsize == 8 { 'i' } else { self.kind };
        let dt = DType::ALL
            .into_iter()
            .find(|d| d.typestr_kind() == Some(kind) && d.itemsize() == self.itemsize)
            .ok_or_else(|| Error::UnsupportedDType {
                what: self.to_string(),
                remedy: format!("dlframe reads {} and M8/m8; cast the array first", typestrs()).into(),
            })?;
        Ok(dt)
    }
}

impl TypeStr {
    /// The typestr of a buffer protocol's `struct`-module format and item size (native or
    /// little-endian only): `"f"` of 4 bytes is `<f4`. None for a format with no tensor dtype.
    pub fn from_buffer_format(format: &str, itemsize: usize) -> Option<Self> {
        if format.starts_with(['>', '!']) {
            return None;
        }
        let kind = match format.trim_start_matches(['@', '=', '<']) {
            "?" => 'b',
            "b" | "h" | "i" | "l" | "q" | "n" => 'i',
            "B" | "H" | "I" | "L" | "Q" | "N" => 'u',
            "e" | "f" | "d" => 'f',
            _ => return None,
        };
        Some(TypeStr { order: ByteOrder::Little, kind, itemsize, unit: None })
    }
}

/// The typestrs of the dtype table, as a refusal lists them: `b1, i1, i2, ...`.
fn typestrs() -> String {
    let each = DType::ALL.into_iter().filter_map(|d| Some(format!("{}{}", d.typestr_kind()?, d.itemsize())));
    each.collect::<Vec<_>>().join(", ")
}

impl fmt::Display for TypeStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.order.char(), self.kind, self.itemsize)?;
        if let Some(u) = &self.unit {
            write!(f, "[{u}]")?;
        }
        Ok(())
    }
}

impl FromStr for TypeStr {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidInterface(format!("typestr {s:?}: {why}"));
        let mut chars = s.chars();
        let order = match chars.next() {
            Some('<') => ByteOrder::Little,
            Some('>') => ByteOrder::Big,
            Some('|') => ByteOrder::NotApplicable,
            Some('=') => ByteOrder::Native,
            _ => return Err(bad("the first character must be one of < > | =")),
        };
        let kind = chars.next().filter(|c| "tbiufcmMOSUV".contains(*c)).ok_or_else(|| bad("unknown kind"))?;
        let rest = chars.as_str();
        let (size, unit) = match rest.find('[') {
            Some(i) if rest.ends_with(']') && matches!(kind, 'm' | 'M') => {
                (&rest[..i], Some(rest[i + 1..rest.len() - 1].to_string()))
            }
            Some(_) => return Err(bad("a [unit] suffix belongs to m/M kinds and must close with ]")),
            None => (rest, None),
        };
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the item size must be decimal digits"));
        }
        let itemsize = size.parse().map_err(|_| bad("the item size overflows"))?;
        if let Some(u) = unit.as_deref() {
            // numpy's units, optionally with a multiple ("10s"); anything else is refused
            // rather than read as bare int64 counts.
            let base = u.trim_start_matches(|c: char| c.is_ascii_digit());
            const UNITS: [&str; 14] =
                ["Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as", "generic"];
            if !UNITS.contains(&base) {
                return Err(bad("unknown datetime unit (numpy's are Y M W D h m s ms us ns ps fs as)"));
            }
        }
        Ok(TypeStr { order, kind, itemsize, unit })
    }
}

impl TryFrom<String> for TypeStr {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<TypeStr> for String {
    fn from(t: TypeStr) -> String {
        t.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typestr_without_a_dtype_is_refused_listing_the_table_s() {
        let e = "<c8".parse::<TypeStr>().unwrap().to_dtype().unwrap_err().to_string();
        assert!(e.contains("dlframe reads b1, i1, i2, i4, i8, u1, u2, u4, u8, f2, f4, f8 and M8/m8"), "{e}");
    }

    #[test]
    fn every_dtype_round_trips_through_its_typestr() {
        for d in DType::ALL.into_iter().filter(|d| d.typestr_kind().is_some()) {
            let t = TypeStr::from_dtype(d).unwrap();
            let parsed: TypeStr = t.to_string().parse().unwrap();
            assert_eq!(parsed.to_dtype().unwrap(), d, "{t}");
        }
        assert_eq!(TypeStr::from_dtype(DType::Bool).unwrap().to_string(), "|b1");
        assert_eq!(TypeStr::from_dtype(DType::Float16).unwrap().to_string(), "<f2");
        for d in [DType::BFloat16, DType::Float8E4M3FN, DType::Float8E5M2] {
            let e = TypeStr::from_dtype(d).unwrap_err().to_string();
            assert!(e.contains("DLPack") && e.contains(d.name()), "{e}");
        }
        // ml_dtypes' float8_e5m2 says `<f1`, which names no IEEE type: refused, not guessed.
        assert!("<f1".parse::<TypeStr>().unwrap().to_dtype().is_err());
    }

    #[test]
    fn buffer_formats_name_their_typestr() {
        let f = |fmt: &str, n| TypeStr::from_buffer_format(fmt, n).map(|t| t.to_string());
        assert_eq!(f("f", 4).as_deref(), Some("<f4"));
        assert_eq!(f("<q", 8).as_deref(), Some("<i8"));
        assert_eq!(f("?", 1).as_deref(), Some("<b1"));
        assert_eq!((f(">f", 4), f("Zd", 16), f("O", 8)), (None, None, None));
    }

    #[test]
    fn datetimes_keep_their_unit() {
        let t = TypeStr::from_arrow(&DataType::Timestamp(TimeUnit::Nanosecond, None)).unwrap();
        assert_eq!(t.to_string(), "<M8[ns]");
        assert_eq!("<M8[ns]".parse::<TypeStr>().unwrap(), t);
        assert_eq!(TypeStr::from_arrow(&DataType::Duration(TimeUnit::Second)).unwrap().to_string(), "<m8[s]");
        assert_eq!(TypeStr::from_arrow(&DataType::Date32).unwrap().to_string(), "<i4");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"<M8[ns]\"");
        assert_eq!(serde_json::from_str::<TypeStr>(&json).unwrap(), t);
    }

    #[test]
    fn malformed_or_unsupported_typestrs_are_errors() {
        for bad in [
            "",
            "<",
            "f4",
            "<x4",
            "<f",
            "<f4x",
            "<i4[ns]",
            "<M8[ns",
            "<M8[]",
            "<M8[xx]",
            "<m8[abc]",
            "<M8[10]",
            "<f99999999999999999999999",
        ] {
            assert!(bad.parse::<TypeStr>().is_err(), "{bad}");
        }
        for unsupported in [">f4", "<c8", "|S5", "<f3", "|V8"] {
            let t: TypeStr = unsupported.parse().unwrap();
            assert!(t.to_dtype().is_err(), "{unsupported}");
        }
        assert!(serde_json::from_str::<TypeStr>("\"nope\"").is_err());
        for known in ["<M8[D]", "<m8[10s]", "<M8[generic]"] {
            assert!(known.parse::<TypeStr>().is_ok(), "{known}");
        }
    }
}

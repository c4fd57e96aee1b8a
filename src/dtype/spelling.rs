//! How users spell a dtype: dlframe's names, the printed names of Polars' and torch's dtypes,
//! numpy's typestrs, and Arrow types; and the list of names that errors give. One parser for
//! every boundary (Python's `dtype=` and, through it, the Polars plugin's).

use arrow_schema::DataType;

use super::{DType, storage_dtype};
use crate::error::Error;

impl DType {
    /// A dtype as a string spells it: a name of [`DType::name`] (`"float32"`), the names Polars
    /// and torch print, in any case (`"Float32"`, `"Boolean"`, `"torch.float32"`), or a numpy
    /// typestr in native byte order (`"<f4"`, `"f4"`, `"|b1"`). None for anything else: numpy's
    /// aliases (`"double"`) are numpy's to read.
    pub fn from_spelling(s: &str) -> Option<DType> {
        let s = s.trim();
        let lower = s.trim_start_matches("torch.").to_ascii_lowercase();
        let named = DType::from_name(if lower == "boolean" { "bool" } else { &lower });
        named.ok().or_else(|| from_typestr(s))
    }

    /// The dtype whose Arrow type is `dt`; None for an Arrow type that is no dtype's (the
    /// fixed-size binary storage of an extension dtype is not that dtype).
    pub fn from_arrow_type(dt: &DataType) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.arrow_extension().is_none() && &d.to_arrow() == dt)
    }
}

/// A numpy typestr without a datetime unit, in native byte order (or none given).
fn from_typestr(s: &str) -> Option<DType> {
    let native = if cfg!(target_endian = "little") { '<' } else { '>' };
    let s = s.strip_prefix([native, '|', '=']).unwrap_or(s);
    let mut chars = s.chars();
    let kind = chars.next()?;
    let digits = chars.as_str();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let size: usize = digits.parse().ok()?;
    DType::ALL.into_iter().find(|d| d.typestr_kind() == Some(kind) && d.itemsize() == size)
}

/// Every dtype's name, comma-separated, in the table's order: what a `dtype=` error lists.
pub fn names() -> String {
    DType::ALL.map(DType::name).join(", ")
}

/// What a `dtype=` error of the Python package lists as accepted: every name, and the other
/// spellings its one parser reads.
pub fn accepted() -> String {
    format!(
        "dlframe's dtypes are {}, given as a name ('float32'), a numpy dtype or code (np.float32, \
         np.dtype('f4'), 'f4', '<f4'), a pyarrow type (pa.float32()), a Polars dtype (pl.Float32), a \
         torch dtype (torch.float32) or an ml_dtypes type",
        names()
    )
}

/// The error for a column whose dtype, as Polars prints it, has no Arrow export that dlframe
/// reads: Polars' `Null` (refused as an all-null Arrow column is), and `Int128`, `UInt128` and
/// `Object`, which Polars cannot export through Arrow (a cast is the remedy). None for any other
/// dtype.
pub fn polars_refusal(column: &str, printed: &str) -> Option<Error> {
    if printed == "Null" {
        return match storage_dtype(&DataType::Null) {
            Err(Error::UnsupportedArrowType { what, remedy }) => Some(Error::UnsupportedArrowType {
                what: format!("column '{column}' of type {what}"),
                remedy,
            }),
            other => other.err(),
        };
    }
    ["Int128", "UInt128", "Object"].iter().any(|t| printed.starts_with(t)).then(|| {
        Error::Refused(format!(
            "column '{column}' is {printed}, which has no tensor dtype (and Polars cannot export it \
             through Arrow); cast it first, e.g. pl.col('{column}').cast(pl.Int64) or pl.Float64"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_is_read_by_its_name_its_printed_names_and_its_typestr() {
        for d in DType::ALL {
            assert_eq!(DType::from_spelling(d.name()), Some(d));
            assert_eq!(DType::from_spelling(&format!("torch.{}", d.name())), Some(d));
            assert_eq!(DType::from_spelling(&d.name().to_uppercase()), Some(d));
            if let Some(kind) = d.typestr_kind() {
                assert_eq!(DType::from_spelling(&format!("<{kind}{}", d.itemsize())), Some(d));
                assert_eq!(DType::from_spelling(&format!("{kind}{}", d.itemsize())), Some(d));
            }
            if d.arrow_extension().is_none() {
                assert_eq!(DType::from_arrow_type(&d.to_arrow()), Some(d));
            }
        }
        assert_eq!(DType::from_spelling("Boolean"), Some(DType::Bool));
        assert_eq!(DType::from_spelling("|b1"), Some(DType::Bool));
        assert_eq!(DType::from_spelling(" Float32 "), Some(DType::Float32));
    }

    #[test]
    fn what_is_no_dtype_of_the_table_is_left_to_the_caller() {
        for s in ["double", "f3", ">f4", "<M8[ns]", "c8", "", "float128", "<f", "u1x", "f+4", "<f 4"] {
            assert_eq!(DType::from_spelling(s), None, "{s}");
        }
        // bfloat16's storage is not bfloat16.
        assert_eq!(DType::from_arrow_type(&DataType::FixedSizeBinary(2)), None);
        assert_eq!(DType::from_arrow_type(&DataType::Utf8), None);
        let e = polars_refusal("x", "Null").unwrap().to_string();
        assert_eq!(
            e,
            "column 'x' of type Null cannot become a tensor: an all-null column has no values; cast it to a numeric type first"
        );
        let e = polars_refusal("big", "Int128").unwrap();
        assert_eq!(e.kind(), crate::ErrorKind::Buffer);
        assert!(e.to_string().contains("column 'big' is Int128") && e.to_string().contains("cast(pl.Int64)"));
        assert!(polars_refusal("o", "Object").is_some() && polars_refusal("f", "Float64").is_none());
        let names = names();
        assert!(names.starts_with("bool, int8") && names.ends_with("float8_e5m2"), "{names}");
    }
}

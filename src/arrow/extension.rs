//! `arrow.fixed_shape_tensor` metadata, read and written leniently so pyarrow and arrow-rs
//! agree.
//!
//! Reading accepts `permutation` (the spec and Arrow C++) and `permutations` (arrow-rs 59),
//! treats `null` as absent, and ignores unknown keys. Writing emits only the keys that are
//! present, spelled as the spec spells them.
//! Spec: <https://arrow.apache.org/docs/format/CanonicalExtensions.html#fixed-shape-tensor>

use std::collections::HashMap;

use arrow_schema::Field;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The extension name.
pub const FIXED_SHAPE_TENSOR: &str = "arrow.fixed_shape_tensor";
pub use crate::dtype::{EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY};

/// Parsed `arrow.fixed_shape_tensor` metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMetadata {
    /// The physical (row-major) shape of each cell.
    pub shape: Vec<usize>,
    /// Names of the physical dimensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim_names: Option<Vec<String>>,
    /// Logical dimension `i` is physical dimension `permutation[i]`.
    #[serde(default, alias = "permutations", skip_serializing_if = "Option::is_none")]
    pub permutation: Option<Vec<usize>>,
}

impl TensorMetadata {
    /// Parses and validates the JSON.
    ///
    /// # Errors
    /// [`Error::InvalidExtensionMetadata`] for bad JSON, a `dim_names` or `permutation` of the
    /// wrong length, or a `permutation` that is not one.
    pub fn parse(json: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidExtensionMetadata { json: json.to_string(), reason };
        // serde reads a struct from a JSON array by position too; the format is an object.
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if !value.is_object() {
            return Err(bad("the metadata must be a JSON object".into()));
        }
        let meta: TensorMetadata = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        meta.validate().map_err(bad)?;
        Ok(meta)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let n = self.shape.len();
        if let Some(names) = &self.dim_names
            && names.len() != n
        {
            return Err(format!("{} dim_names for {n} dimensions", names.len()));
        }
        if let Some(p) = &self.permutation {
            let mut seen = vec![false; n];
            if p.len() != n || p.iter().any(|&i| i >= n || std::mem::replace(&mut seen[i], true)) {
                return Err(format!("{p:?} is not a permutation of 0..{n}"));
            }
        }
        if self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).is_none() {
            return Err(format!("shape {:?} overflows", self.shape));
        }
        Ok(())
    }

    /// The JSON, with only the keys that are present.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serialises")
    }

    /// Elements per cell.
    pub fn cell_size(&self) -> usize {
        self.shape.iter().product()
    }

    /// The logical shape of one cell: `shape[permutation[i]]`.
    pub fn logical_shape(&self) -> Vec<i64> {
        match &self.permutation {
            Some(p) => p.iter().map(|&i| self.shape[i] as i64).collect(),
            None => self.shape.iter().map(|&d| d as i64).collect(),
        }
    }

    /// The logical strides of one cell, in elements: the physical C strides, permuted.
    pub fn logical_strides(&self) -> Vec<i64> {
        let shape: Vec<i64> = self.shape.iter().map(|&d| d as i64).collect();
        let phys = crate::tensor::c_strides(&shape);
        match &self.permutation {
            Some(p) => p.iter().map(|&i| phys[i]).collect(),
            None => phys,
        }
    }

    /// Reads the metadata of a field that carries this extension; `Ok(None)` for other fields.
    ///
    /// # Errors
    /// As [`TensorMetadata::parse`], and when the extension name is present without metadata.
    pub fn from_field(field: &Field) -> Result<Option<Self>> {
        let md = field.metadata();
        if md.get(EXTENSION_NAME_KEY).map(String::as_str) != Some(FIXED_SHAPE_TENSOR) {
            return Ok(None);
        }
        let json = md.get(EXTENSION_METADATA_KEY).ok_or_else(|| Error::InvalidExtensionMetadata {
            json: String::new(),
            reason: format!("{FIXED_SHAPE_TENSOR} field {:?} has no {EXTENSION_METADATA_KEY}", field.name()),
        })?;
        Self::parse(json).map(Some)
    }

    /// Field metadata that declares this extension.
    pub fn field_metadata(&self) -> HashMap<String, String> {
        HashMap::from([
            (EXTENSION_NAME_KEY.to_string(), FIXED_SHAPE_TENSOR.to_string()),
            (EXTENSION_METADATA_KEY.to_string(), self.to_json()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_spellings_and_nulls_writes_the_spec_key_only() {
        let pyarrow = r#"{"shape":[2,3],"permutation":[1,0]}"#;
        let arrow_rs = r#"{"shape":[2,3],"dim_names":null,"permutations":[1,0]}"#;
        let a = TensorMetadata::parse(pyarrow).unwrap();
        assert_eq!(a, TensorMetadata::parse(arrow_rs).unwrap());
        assert_eq!(a.to_json(), pyarrow);
        let plain = TensorMetadata::parse(r#"{"shape":[4],"dim_names":null,"permutations":null}"#).unwrap();
        assert_eq!(plain.to_json(), r#"{"shape":[4]}"#);
        assert_eq!(a.logical_shape(), vec![3, 2]);
        assert_eq!(a.logical_strides(), vec![1, 3]);
    }

    #[test]
    fn the_spec_example_permutes_as_documented() {
        let m = TensorMetadata::parse(r#"{"shape":[100,200,500],"permutation":[2,0,1]}"#).unwrap();
        assert_eq!(m.logical_shape(), vec![500, 100, 200]);
        assert_eq!(m.logical_strides(), vec![1, 100_000, 500]);
    }

    #[test]
    fn bad_metadata_is_an_error_with_the_json() {
        for bad in [
            "not json",
            r#"{"dim_names":["a"]}"#,
            r#"{"shape":[2,3],"permutation":[0,0]}"#,
            r#"{"shape":[2,3],"permutation":[0,2]}"#,
            r#"{"shape":[2,3],"dim_names":["a"]}"#,
            r#"{"shape":[18446744073709551615,4]}"#,
            r#"{"shape":[-1]}"#,
            r#"[[2, 3], null, [1, 0]]"#,
        ] {
            let e = TensorMetadata::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidExtensionMetadata { .. }), "{bad}: {e}");
        }
    }
}

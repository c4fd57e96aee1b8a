//! Array-interface descriptors as plain serde data: numpy's `__array_interface__` v3 and
//! `__cuda_array_interface__` v3 share [`ArrayInterface`]; typestrs are in [`typestr`].
//!
//! These are descriptions only: building one copies nothing, and reading one validates the
//! layout before anything touches memory. Spec: numpy `arrays.interface`, numba
//! `cuda_array_interface` (docs/conformance.md, "Array interfaces").

pub mod array_struct;
pub mod datetime;
pub mod typestr;

use serde::{Deserialize, Serialize};

pub use typestr::{ByteOrder, TypeStr};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, check_layout};

/// The dtype of a numpy type number (`PyArray_Descr.type_num`), as numpy's DLPack export gives
/// it; None for the types it refuses or dlframe has no dtype for (long double, complex,
/// datetime, strings, objects, and user types such as ml_dtypes').
pub fn numpy_type_num(type_num: i32) -> Option<DType> {
    let long_is_64 = std::mem::size_of::<std::ffi::c_long>() == 8;
    Some(match type_num {
        0 => DType::Bool,
        1 => DType::Int8,
        2 => DType::UInt8,
        3 => DType::Int16,
        4 => DType::UInt16,
        5 => DType::Int32,
        6 => DType::UInt32,
        7 if long_is_64 => DType::Int64,
        7 => DType::Int32,
        8 if long_is_64 => DType::UInt64,
        8 => DType::UInt32,
        9 => DType::Int64,
        10 => DType::UInt64,
        11 => DType::Float32,
        12 => DType::Float64,
        23 => DType::Float16,
        _ => return None,
    })
}

/// `__array_interface__` / `__cuda_array_interface__` v3, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrayInterface {
    /// Extents.
    pub shape: Vec<i64>,
    /// Element type, e.g. `"<f4"`.
    pub typestr: TypeStr,
    /// `(pointer, read_only)`; the pointer is 0 for empty arrays.
    pub data: (usize, bool),
    /// Byte strides, or `None` for C-contiguous.
    #[serde(default)]
    pub strides: Option<Vec<i64>>,
    /// `[("", typestr)]`.
    #[serde(default)]
    pub descr: Vec<(String, String)>,
    /// Always 3 on export.
    pub version: u32,
    /// CUDA only: the stream the data is ready on (never 0); `None` means no synchronisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<i64>,
}

impl ArrayInterface {
    /// Describes a tensor (copies nothing). Never carries a `mask`: validity travels
    /// separately (docs/conformance.md item 26).
    pub fn from_tensor(tensor: &Tensor, typestr: TypeStr) -> Self {
        let item = tensor.dtype().itemsize() as i64;
        let strides =
            (!tensor.is_c_contiguous()).then(|| tensor.strides().iter().map(|s| s * item).collect());
        let ptr = if tensor.numel() == 0 { 0 } else { tensor.data_ptr() as usize };
        ArrayInterface {
            shape: tensor.shape().to_vec(),
            descr: vec![(String::new(), typestr.to_string())],
            typestr,
            data: (ptr, tensor.shared_readonly()),
            strides,
            version: 3,
            stream: None,
        }
    }

    /// The dtype and the strides in elements, validated (nothing is read).
    ///
    /// # Errors
    /// [`Error::InvalidInterface`] for byte strides that are not whole elements or a wrong
    /// count, a NULL pointer with elements, a zero stream; [`Error::UnsupportedDType`] and
    /// [`Error::InvalidLayout`] as their names say.
    pub fn layout(&self) -> Result<(DType, Vec<i64>)> {
        let dtype = self.typestr.to_dtype()?;
        let item = dtype.itemsize() as i64;
        let strides = match &self.strides {
            None => crate::tensor::c_strides(&self.shape),
            Some(s) if s.len() != self.shape.len() => {
                return Err(Error::InvalidInterface(format!(
                    "{} strides for {} dimensions",
                    s.len(),
                    self.shape.len()
                )));
            }
            Some(s) => s
                .iter()
                .map(|&b| {
                    if b % item == 0 {
                        Ok(b / item)
                    } else {
                        Err(Error::InvalidInterface(format!(
                            "byte stride {b} is not a multiple of the itemsize {item}"
                        )))
                    }
                })
                .collect::<Result<_>>()?,
        };
        let extent = check_layout(&self.shape, &strides, dtype.itemsize())?;
        if self.data.0 == 0 && extent.numel > 0 {
            return Err(Error::InvalidInterface(format!(
                "data is NULL but the array has {} elements",
                extent.numel
            )));
        }
        if self.stream == Some(0) {
            return Err(Error::InvalidInterface(
                "stream 0 is disallowed (ambiguous); use 1 for the legacy default stream".into(),
            ));
        }
        Ok((dtype, strides))
    }
}

/// `__sycl_usm_array_interface__` v1 (dpctl), as data: unlike numpy's, its strides and offset
/// count elements.
#[derive(Debug, Clone, PartialEq)]
pub struct SyclInterface {
    /// Must be 1.
    pub version: i64,
    /// Extents.
    pub shape: Vec<i64>,
    /// Element type; the interface allows kinds b, i, u, f (and c, which dlframe lacks).
    pub typestr: TypeStr,
    /// `(pointer, read_only)`.
    pub data: (usize, bool),
    /// Strides in elements, or `None` for C order.
    pub strides: Option<Vec<i64>>,
    /// Elements from `data` to the first element.
    pub offset: i64,
}

impl SyclInterface {
    /// The dtype and the address of the first element, validated (nothing is read; the
    /// layout itself is checked when the tensor is made).
    ///
    /// # Errors
    /// [`Error::InvalidInterface`] for a version other than 1, a kind the interface does not
    /// allow, an offset that overflows, a NULL pointer with elements;
    /// [`Error::UnsupportedDType`] as the typestr codec says.
    pub fn start(&self) -> Result<(DType, usize)> {
        let bad = |m: String| Error::InvalidInterface(format!("__sycl_usm_array_interface__: {m}"));
        if self.version != 1 {
            return Err(bad(format!("version {}; only version 1 is defined", self.version)));
        }
        if !"biuf".contains(self.typestr.kind) {
            return Err(bad(format!("typestr {} (the interface allows kinds b, i, u, f, c)", self.typestr)));
        }
        let dtype = self.typestr.to_dtype()?;
        let (ptr, _) = self.data;
        let first = self
            .offset
            .checked_mul(dtype.itemsize() as i64)
            .and_then(|b| (ptr as i64).checked_add(b))
            .filter(|&p| p >= 0)
            .ok_or_else(|| bad("data + offset overflows".into()))?;
        if ptr == 0 && self.shape.iter().product::<i64>() != 0 {
            return Err(bad("NULL data with elements".into()));
        }
        Ok((dtype, first as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sycl_descriptions_are_checked_before_anything_is_read() {
        let ok = SyclInterface {
            version: 1,
            shape: vec![4],
            typestr: "<f4".parse().unwrap(),
            data: (4096, false),
            strides: None,
            offset: 2,
        };
        assert_eq!(ok.start().unwrap(), (DType::Float32, 4096 + 8));
        let bad = |s: SyclInterface| s.start().unwrap_err().to_string();
        assert!(bad(SyclInterface { version: 2, ..ok.clone() }).contains("version 2"));
        assert!(bad(SyclInterface { typestr: "<M8[ns]".parse().unwrap(), ..ok.clone() }).contains("typestr"));
        assert!(bad(SyclInterface { offset: i64::MAX, ..ok.clone() }).contains("overflows"));
        assert!(bad(SyclInterface { data: (0, false), offset: 0, ..ok.clone() }).contains("NULL"));
        assert!(SyclInterface { data: (0, false), shape: vec![0], offset: 0, ..ok }.start().is_ok());
    }

    #[test]
    fn describes_a_tensor_and_reads_it_back() {
        let t = Tensor::from_vec(vec![1.0f32; 6], vec![2, 3]).unwrap();
        let ai = ArrayInterface::from_tensor(&t, TypeStr::from_dtype(t.dtype()).unwrap());
        let json = serde_json::to_value(&ai).unwrap();
        assert_eq!(json["typestr"], "<f4");
        assert_eq!(json["strides"], serde_json::Value::Null);
        assert_eq!(json["version"], 3);
        assert!(json.get("mask").is_none() && json.get("stream").is_none());
        let back: ArrayInterface = serde_json::from_value(json).unwrap();
        assert_eq!(back.layout().unwrap(), (DType::Float32, vec![3, 1]));
    }

    #[test]
    fn bad_descriptors_are_refused() {
        let t = Tensor::from_vec(vec![1i64; 4], vec![4]).unwrap();
        let good = ArrayInterface::from_tensor(&t, TypeStr::from_dtype(t.dtype()).unwrap());
        let mut a = good.clone();
        a.strides = Some(vec![3]);
        assert!(a.layout().unwrap_err().to_string().contains("multiple"));
        let mut a = good.clone();
        a.strides = Some(vec![8, 8]);
        assert!(a.layout().is_err());
        let mut a = good.clone();
        a.data.0 = 0;
        assert!(a.layout().unwrap_err().to_string().contains("NULL"));
        let mut a = good.clone();
        a.stream = Some(0);
        assert!(a.layout().is_err());
        let mut a = good;
        a.shape = vec![-4];
        assert!(a.layout().is_err());
    }
}

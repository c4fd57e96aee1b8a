//! Array-interface descriptors as plain serde data: numpy's `__array_interface__` v3 and
//! `__cuda_array_interface__` v3 share [`ArrayInterface`]; typestrs are in [`typestr`].
//!
//! These are descriptions only: building one copies nothing, and reading one validates the
//! layout before anything touches memory. Spec: numpy `arrays.interface`, numba
//! `cuda_array_interface` (docs/conformance.md, "Array interfaces").

pub mod array_struct;
pub mod datetime;
pub mod ndarray;
pub mod typestr;

use serde::{Deserialize, Serialize};

pub use typestr::{ByteOrder, TypeStr};

use std::sync::Arc;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::CopyPolicy;
use crate::tensor::{Owner, Tensor, check_layout};

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

    /// numpy's `__array_interface__` of a host tensor (copies nothing): the typestr of its
    /// Arrow type where a 1-D tensor has one of the same storage (datetimes keep their unit),
    /// else of its dtype.
    ///
    /// # Errors
    /// [`Error::NotOffered`] for a tensor the host cannot read; [`Error::UnsupportedDType`] for
    /// a dtype with no typestr (bfloat16, float8).
    pub fn for_host(t: &Tensor) -> Result<Self> {
        host_only(t, "__array_interface__")?;
        let typestr = match t.logical().map(|f| TypeStr::from_arrow(f.data_type())) {
            Some(Ok(ts)) if ts.to_dtype().ok() == Some(t.dtype()) => ts,
            _ => TypeStr::from_dtype(t.dtype())?,
        };
        Ok(ArrayInterface::from_tensor(t, typestr))
    }

    /// `__cuda_array_interface__` v3 of a CUDA tensor (copies nothing): `stream` is the
    /// producer's stream, never 0, on which consumers must order their work.
    ///
    /// # Errors
    /// [`Error::NotOffered`] for a tensor not on a CUDA device, or without a stream;
    /// [`Error::UnsupportedDType`] as [`ArrayInterface::for_host`].
    pub fn for_cuda(t: &Tensor) -> Result<Self> {
        let (crate::Device::Cuda(_), Some(sync)) = (t.device(), t.sync()) else {
            let why = format!("the tensor is on {}", t.device());
            return Err(Error::NotOffered { protocol: "__cuda_array_interface__", why });
        };
        let mut ai = ArrayInterface::from_tensor(t, TypeStr::from_dtype(t.dtype())?);
        ai.stream = Some(sync.producer_stream().max(1) as i64);
        Ok(ai)
    }

    /// Checks that `len` bytes from `base` hold the described array, whose first element lies
    /// `offset` bytes past `base` (an interface without `data` over an object's own buffer), and
    /// sets `data` there. An empty array points at `base`.
    ///
    /// # Errors
    /// [`Error::Refused`] for a layout that reaches outside the buffer; as
    /// [`ArrayInterface::layout`].
    pub fn within(
        &mut self,
        base: usize,
        len: usize,
        offset: usize,
        readonly: bool,
    ) -> Result<(DType, Vec<i64>)> {
        self.data = (base.wrapping_add(offset), readonly);
        let (dtype, strides) = self.layout()?;
        let extent = check_layout(&self.shape, &strides, dtype.itemsize())?;
        let (lo, hi) = extent.byte_bounds(offset as i128, dtype.itemsize());
        if extent.numel == 0 {
            self.data.0 = base;
        } else if lo < 0 || hi > len as i128 {
            return Err(Error::Refused(format!(
                "the __array_interface__ (shape {:?}, typestr {}, offset {offset}) reaches bytes {lo}..{hi} of an \
                 object whose buffer holds {len} bytes",
                self.shape, self.typestr
            )));
        }
        Ok((dtype, strides))
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

    /// The host tensor over the described memory, its layout checked by
    /// [`ArrayInterface::layout`], held by `owner`: no copy, but for a datetime unit that Arrow
    /// lacks, which [`datetime::with_units`] converts (a copy that `copy` may refuse).
    ///
    /// # Safety
    /// `data` points to memory that holds the described array while `owner` lives.
    ///
    /// # Errors
    /// As [`ArrayInterface::layout`] and [`datetime::with_units`].
    pub unsafe fn import(self, owner: Arc<dyn Owner>, copy: CopyPolicy) -> Result<Tensor> {
        let (dtype, strides) = self.layout()?;
        let (ptr, readonly) = self.data;
        // SAFETY: the caller's contract; the layout was checked above.
        let t = unsafe {
            Tensor::from_raw_parts(
                ptr as *mut u8,
                self.shape,
                Some(strides),
                dtype,
                Device::Cpu,
                readonly,
                owner,
            )
        }?;
        datetime::with_units(t, &self.typestr, copy)
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

/// Refuses an array interface of a tensor the host cannot read.
pub(crate) fn host_only(t: &Tensor, protocol: &'static str) -> Result<()> {
    match t.device().is_host_accessible() {
        true => Ok(()),
        false => Err(Error::NotOffered { protocol, why: format!("the tensor is on {}", t.device()) }),
    }
}

impl SyclInterface {
    /// Describes a tensor over SYCL USM memory (copies nothing): strides in elements, `None`
    /// for C order.
    ///
    /// # Errors
    /// [`Error::UnsupportedDType`] for a dtype with no typestr.
    pub fn describe(t: &Tensor) -> Result<Self> {
        Ok(SyclInterface {
            version: 1,
            shape: t.shape().to_vec(),
            typestr: TypeStr::from_dtype(t.dtype())?,
            data: (if t.numel() == 0 { 0 } else { t.data_ptr() as usize }, t.shared_readonly()),
            strides: (!t.is_c_contiguous()).then(|| t.strides().to_vec()),
            offset: 0,
        })
    }

    /// Whether the host can read USM memory of `kind` (`"shared"`, `"host"`, `"device"`) whose
    /// device is (`on_cpu`) or is not a CPU: only then is it imported without a copy.
    ///
    /// # Errors
    /// [`Error::Refused`] for device allocations of another device, naming the remedy.
    pub fn host_readable(kind: &str, on_cpu: bool) -> Result<()> {
        if matches!(kind, "shared" | "host") || (kind == "device" && on_cpu) {
            return Ok(());
        }
        Err(Error::Refused(format!(
            "the SYCL memory is {kind} USM on a non-CPU device, which the host cannot read; copy it to \
             the host first (e.g. dpctl.tensor.asnumpy)"
        )))
    }

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

    /// The host tensor over host-readable USM memory (the caller has asked dpctl), its start
    /// checked by [`SyclInterface::start`] and its layout when the tensor is made, held by
    /// `owner` (no copy).
    ///
    /// # Safety
    /// The memory holds the described array, and the host can read it, while `owner` lives.
    ///
    /// # Errors
    /// As [`SyclInterface::start`], and [`Error::InvalidLayout`].
    pub unsafe fn import(self, owner: Arc<dyn Owner>) -> Result<Tensor> {
        let (dtype, first) = self.start()?;
        // SAFETY: the caller's contract; from_raw_parts checks the layout.
        unsafe {
            Tensor::from_raw_parts(
                first as *mut u8,
                self.shape,
                self.strides,
                dtype,
                Device::Cpu,
                self.data.1,
                owner,
            )
        }
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
        // Only USM the host can read is imported.
        assert!(["shared", "host"].iter().all(|k| SyclInterface::host_readable(k, false).is_ok()));
        assert!(SyclInterface::host_readable("device", true).is_ok());
        let e = SyclInterface::host_readable("device", false).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Buffer);
        assert!(e.to_string().starts_with("the SYCL memory is device USM on a non-CPU device"), "{e}");
    }

    fn timestamps() -> Tensor {
        use arrow_schema::{DataType, Field, TimeUnit};
        let field = Field::new("t", DataType::Timestamp(TimeUnit::Millisecond, None), false);
        Tensor::from_vec(vec![1i64, 2], vec![2]).unwrap().with_logical(Some(std::sync::Arc::new(field)))
    }

    #[test]
    fn each_protocol_is_offered_only_where_its_consumer_can_read() {
        let t = Tensor::from_vec(vec![1.0f32; 4], vec![2, 2]).unwrap();
        assert_eq!(ArrayInterface::for_host(&t).unwrap().typestr.to_string(), "<f4");
        // A datetime keeps its unit in the typestr, and is left to it by the struct.
        assert_eq!(ArrayInterface::for_host(&timestamps()).unwrap().typestr.to_string(), "<M8[ms]");
        let e = array_struct::ArrayStruct::export(&timestamps()).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Attribute, "{e}");
        assert!(array_struct::ArrayStruct::export(&t).is_ok());
        // A host tensor has no CUDA interface; hasattr says False (AttributeError).
        let e = ArrayInterface::for_cuda(&t).unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string()),
            (crate::ErrorKind::Attribute, "__cuda_array_interface__: the tensor is on cpu".into())
        );
        let (dtype, first) = SyclInterface::describe(&t).unwrap().start().unwrap();
        assert_eq!((dtype, first), (DType::Float32, t.data_ptr() as usize));
    }

    #[test]
    fn an_interface_over_a_buffer_stays_inside_it() {
        let desc = |shape: Vec<i64>, strides: Option<Vec<i64>>| ArrayInterface {
            shape,
            typestr: "<f4".parse().unwrap(),
            data: (0, true),
            strides,
            descr: Vec::new(),
            version: 3,
            stream: None,
        };
        let mut a = desc(vec![2], None);
        assert_eq!(a.within(4096, 12, 4, true).unwrap(), (DType::Float32, vec![1]));
        assert_eq!(a.data, (4100, true));
        let e = desc(vec![5], None).within(4096, 16, 0, false).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Buffer);
        assert!(
            e.to_string().contains("reaches bytes 0..20 of an object whose buffer holds 16 bytes"),
            "{e}"
        );
        // Backwards strides reach before the offset: still inside when the offset allows it.
        assert!(desc(vec![2], Some(vec![-4])).within(4096, 8, 4, false).is_ok());
        assert!(desc(vec![2], Some(vec![-4])).within(4096, 8, 0, false).is_err());
        let mut empty = desc(vec![0], None);
        assert!(empty.within(4096, 0, 64, false).is_ok());
        assert_eq!(empty.data.0, 4096);
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

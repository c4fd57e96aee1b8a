//! Typed arguments: the one parser for each kind of Python argument the binding takes, as
//! `FromPyObject` types (and the few parsers that need two arguments at once). Errors are
//! returned as [`Binding`] or core errors; `error.rs` turns them into exceptions.
//!
//! `dtype=` accepts every common dtype-like: dlframe's names (`"float32"`), numpy dtypes, types
//! and codes (`np.float32`, `np.dtype("f4")`, `"f4"`, `"<f4"`, `float`), pyarrow types
//! (`pa.float32()`, through `__arrow_c_schema__`), Polars dtypes (`pl.Float32`) and torch dtypes
//! (`torch.float32`). The Polars plugin gets the same rules: its Python wrapper normalises
//! `dtype=` with [`dtype_name`] before the keyword arguments are serialised.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString, PyTuple, PyType};
use pyo3_arrow::PyDataType;

use dlframe::dtype::spelling::accepted;
use dlframe::ffi::dlpack::DLDevice;
use dlframe::options::Order;
use dlframe::options::{CopyPolicy, ExportOptions, Inexact, NullPolicy, Ragged, Scalar};
use dlframe::{DType, Device};

use crate::error::{Binding, Error, Result};

/// A `dtype=` argument, parsed. `Option<DTypeArg>` is the usual parameter type: None keeps the
/// input's dtype.
#[derive(Debug, Clone, Copy)]
pub struct DTypeArg(pub DType);

impl<'a, 'py> FromPyObject<'a, 'py> for DTypeArg {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        parse(&obj).map(DTypeArg)
    }
}

/// A dtype-like as messages print it: a string as the core prints names (`"float128"`), other
/// objects by their repr.
fn given(obj: &Bound<'_, PyAny>) -> String {
    match obj.cast::<PyString>() {
        Ok(s) => format!("{:?}", s.to_string()),
        Err(_) => obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into()),
    }
}

/// The error for a dtype-like that names a dtype dlframe has no tensor form of.
fn unsupported(obj: &Bound<'_, PyAny>, what: &str) -> Error {
    Binding::WrongType(format!("unsupported dtype {} ({what}); {}", given(obj), accepted())).into()
}

/// The error for an object that is no dtype-like at all.
fn not_a_dtype(obj: &Bound<'_, PyAny>) -> Error {
    let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    Binding::WrongType(format!("unsupported dtype {}: a {ty} is not a dtype; {}", given(obj), accepted()))
        .into()
}

/// The module a dtype-like comes from (`"polars.datatypes.classes"`, `"torch"`), for an object
/// or a class.
fn module_of(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj.cast::<PyType>().map_or_else(|_| obj.get_type(), |t| t.clone());
    ty.module().map(|m| m.to_string()).unwrap_or_default()
}

/// Parses a dtype-like (see the module docs). TypeError names what was given and lists the
/// accepted forms.
pub fn parse(obj: &Bound<'_, PyAny>) -> Result<DType> {
    let py = obj.py();
    if let Ok(s) = obj.cast::<PyString>() {
        if let Some(d) = DType::from_spelling(&s.to_cow()?) {
            return Ok(d);
        }
        // numpy's other codes and aliases: "?", "double", "float" (float64).
        return via_numpy(obj).unwrap_or_else(|| Err(not_a_dtype(obj)));
    }
    let module = module_of(obj);
    if module.starts_with("polars") || module == "torch" {
        // Polars prints "Float32" for the class and an instance; torch "torch.float32".
        let printed = obj.str()?.to_string();
        return DType::from_spelling(&printed).ok_or_else(|| unsupported(obj, &printed));
    }
    if obj.hasattr(pyo3::intern!(py, "__arrow_c_schema__"))? {
        let dt = obj.extract::<PyDataType>().map_err(|_| not_a_dtype(obj))?.into_inner();
        return DType::from_arrow_type(&dt).ok_or_else(|| unsupported(obj, &format!("Arrow {dt}")));
    }
    via_numpy(obj).unwrap_or_else(|| Err(not_a_dtype(obj)))
}

/// `numpy.dtype(obj)` as a DType; None when numpy does not read `obj` as a dtype.
fn via_numpy(obj: &Bound<'_, PyAny>) -> Option<Result<DType>> {
    let np = match obj.py().import("numpy") {
        Ok(np) => np,
        Err(e) => return Some(Err(e.into())),
    };
    let dt = np.call_method1("dtype", (obj,)).ok()?;
    // numpy reads any Python class as the object dtype: that is no dtype-like.
    let kind: String = dt.getattr("kind").and_then(|k| k.extract()).ok()?;
    if kind == "O" && !obj.is_instance_of::<PyString>() && obj.cast::<PyType>().is_ok() {
        return None;
    }
    let native: bool = dt.getattr("isnative").and_then(|k| k.extract()).unwrap_or(false);
    let name: String = match dt.getattr("name").and_then(|n| n.extract()) {
        Ok(n) => n,
        Err(e) => return Some(Err(e.into())),
    };
    if !native {
        return Some(Err(unsupported(obj, &format!("big-endian {name}"))));
    }
    Some(DType::from_name(&name).map_err(|_| unsupported(obj, &format!("numpy {name}"))))
}

/// The canonical dlframe name of a dtype-like (`np.float32` -> `"float32"`), or None for None:
/// the Polars plugin's wrapper normalises `dtype=` with it, so both paths share [`parse`].
#[pyfunction]
#[pyo3(name = "_dtype_name", signature = (dtype, /))]
pub fn dtype_name(dtype: Option<DTypeArg>) -> Option<&'static str> {
    dtype.map(|d| d.0.name())
}

/// A two-element tuple of ints, or the error `message`. The tuple consumers pass (exact, of two
/// exact ints that fit `T`) is read without pyo3's conversions; anything else goes through them.
fn int_pair<'py, T>(obj: &Bound<'py, PyAny>, message: &str) -> Result<(T, T)>
where
    T: for<'a> FromPyObject<'a, 'py> + TryFrom<i64>,
{
    match exact_int_pair(obj) {
        Some(pair) => Ok(pair),
        None => obj.extract::<(T, T)>().map_err(|_| Binding::WrongType(message.into()).into()),
    }
}

/// An exact tuple of two exact ints that fit `T`, read directly; None for anything else.
fn exact_int_pair<T: TryFrom<i64>>(obj: &Bound<'_, PyAny>) -> Option<(T, T)> {
    let t = obj.cast_exact::<PyTuple>().ok().filter(|t| t.len() == 2)?;
    let small = |i: usize| {
        let item = t.get_borrowed_item(i).ok()?;
        T::try_from(item.cast_exact::<PyInt>().ok()?.extract::<i64>().ok()?).ok()
    };
    Some((small(0)?, small(1)?))
}

/// `__dlpack__(max_version=...)`: a `(major, minor)` tuple.
pub struct MaxVersion(pub (u32, u32));

impl<'a, 'py> FromPyObject<'a, 'py> for MaxVersion {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        int_pair(&obj, "max_version must be None or a tuple with two elements.").map(MaxVersion)
    }
}

/// `__dlpack__(dl_device=...)`: a `(device_type, device_id)` tuple.
pub struct DlDevice(pub DLDevice);

impl<'a, 'py> FromPyObject<'a, 'py> for DlDevice {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        let (device_type, device_id) =
            int_pair(&obj, "dl_device must be None or a (device_type, device_id) tuple")?;
        Ok(DlDevice(DLDevice { device_type, device_id }))
    }
}

/// `to_dlpack(stream=...)`: a DLPack stream number or handle, or a stream object with
/// `cuda_stream` (torch) or `ptr` (cupy).
pub struct ConsumerStream(pub i64);

impl<'a, 'py> FromPyObject<'a, 'py> for ConsumerStream {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        let attr = |name| obj.getattr(name).and_then(|v| v.extract::<i64>());
        let stream = obj.extract::<i64>().or_else(|_| attr("cuda_stream")).or_else(|_| attr("ptr"));
        let why = "stream must be an int (a DLPack stream number or handle) or a torch/cupy stream";
        Ok(ConsumerStream(stream.map_err(|_| Binding::WrongType(why.into()))?))
    }
}

/// `fill_value=`: a bool, int or float.
pub struct FillValue(pub Scalar);

impl<'a, 'py> FromPyObject<'a, 'py> for FillValue {
    type Error = Error;

    fn extract(v: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        if let Ok(b) = v.cast::<PyBool>() {
            return Ok(FillValue(Scalar::Bool(b.is_true())));
        }
        if let Ok(i) = v.extract::<i64>() {
            return Ok(FillValue(Scalar::Int(i)));
        }
        if let Ok(f) = v.extract::<f64>() {
            return Ok(FillValue(Scalar::Float(f)));
        }
        Err(Binding::WrongType(format!(
            "fill_value and pad_value must be a bool, int or float, not {}",
            v.get_type().name()?
        ))
        .into())
    }
}

/// The conversion keywords that `to_dlpack` and `batches` share (`nulls=` with `fill_value=`,
/// `copy=`, `dtype=`, `order=`, `ragged=` with `pad_value=` and `max_len=`, `inexact=`),
/// through the core's parsers, as the core's options.
#[allow(clippy::too_many_arguments)]
pub fn export_options(
    nulls: &str,
    fill_value: Option<FillValue>,
    copy: Option<bool>,
    dtype: Option<DTypeArg>,
    order: &str,
    ragged: &str,
    pad_value: Option<FillValue>,
    max_len: Option<usize>,
    inexact: &str,
) -> Result<ExportOptions> {
    Ok(ExportOptions {
        nulls: NullPolicy::parse(nulls, fill_value.map(|f| f.0))?,
        copy: CopyPolicy::from(copy),
        dtype: dtype.map(|d| d.0),
        order: Order::parse(order)?,
        ragged: Ragged::parse(ragged, pad_value.map(|p| p.0), max_len)?,
        inexact: Inexact::parse(inexact)?,
    })
}

/// `device=` of a conversion: `"cpu"`, `"cuda"` or `"cuda:N"` (or any object printing so, such
/// as a torch device).
pub struct TargetDevice(pub Device);

impl<'a, 'py> FromPyObject<'a, 'py> for TargetDevice {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        let name: String = obj.str()?.extract()?;
        Ok(TargetDevice(Device::parse(&name)?))
    }
}

/// `device=` of a conversion to Arrow: only the CPU, where Arrow arrays live.
pub struct HostDevice;

impl<'a, 'py> FromPyObject<'a, 'py> for HostDevice {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        let name: String = obj.str()?.extract()?;
        if name != "cpu" {
            return Err(dlframe::Error::InvalidArgument(format!(
                "device={name:?}: Arrow arrays live on the CPU; pass device='cpu' or None"
            ))
            .into());
        }
        Ok(HostDevice)
    }
}

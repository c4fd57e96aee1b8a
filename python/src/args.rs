//! Typed arguments: the one parser for each kind of Python argument the binding takes.
//!
//! `dtype=` accepts every common dtype-like: dlframe's names (`"float32"`), numpy dtypes, types
//! and codes (`np.float32`, `np.dtype("f4")`, `"f4"`, `"<f4"`, `float`), pyarrow types
//! (`pa.float32()`, through `__arrow_c_schema__`), Polars dtypes (`pl.Float32`) and torch dtypes
//! (`torch.float32`). The Polars plugin gets the same rules: its Python wrapper normalises
//! `dtype=` with [`dtype_name`] before the keyword arguments are serialised.

use arrow_schema::DataType;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};
use pyo3_arrow::PyDataType;

use dlframe::DType;

/// A `dtype=` argument, parsed. `Option<DTypeArg>` is the usual parameter type: None keeps the
/// input's dtype.
#[derive(Debug, Clone, Copy)]
pub struct DTypeArg(pub DType);

impl<'a, 'py> FromPyObject<'a, 'py> for DTypeArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        parse(&obj).map(DTypeArg)
    }
}

/// What every dtype error lists as accepted.
const ACCEPTED: &str = "dlframe's dtypes are bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, \
                        float16, float32 and float64, given as a name ('float32'), a numpy dtype or code \
                        (np.float32, np.dtype('f4'), 'f4', '<f4'), a pyarrow type (pa.float32()), a Polars \
                        dtype (pl.Float32) or a torch dtype (torch.float32)";

/// A dtype-like as messages print it: a string as the core prints names (`"float128"`), other
/// objects by their repr.
fn given(obj: &Bound<'_, PyAny>) -> String {
    match obj.cast::<PyString>() {
        Ok(s) => format!("{:?}", s.to_string()),
        Err(_) => obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into()),
    }
}

/// The error for a dtype-like that names a dtype dlframe has no tensor form of.
fn unsupported(obj: &Bound<'_, PyAny>, what: &str) -> PyErr {
    PyTypeError::new_err(format!("unsupported dtype {} ({what}); {ACCEPTED}", given(obj)))
}

/// The error for an object that is no dtype-like at all.
fn not_a_dtype(obj: &Bound<'_, PyAny>) -> PyErr {
    let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    PyTypeError::new_err(format!("unsupported dtype {}: a {ty} is not a dtype; {ACCEPTED}", given(obj)))
}

/// A dtype name as Polars and torch print them (`Float32`, `Boolean`, `torch.float32`), in any
/// case.
fn by_printed_name(name: &str) -> Option<DType> {
    let lower = name.trim().trim_start_matches("torch.").to_ascii_lowercase();
    DType::from_name(if lower == "boolean" { "bool" } else { &lower }).ok()
}

/// The DType of an Arrow type, for a `dtype=` argument (no temporal or nested types).
fn from_arrow(obj: &Bound<'_, PyAny>, dt: &DataType) -> PyResult<DType> {
    DType::ALL
        .into_iter()
        .find(|d| &d.to_arrow() == dt)
        .ok_or_else(|| unsupported(obj, &format!("Arrow {dt}")))
}

/// The module a dtype-like comes from (`"polars.datatypes.classes"`, `"torch"`), for an object
/// or a class.
fn module_of(obj: &Bound<'_, PyAny>) -> String {
    let ty = match obj.cast::<PyType>() {
        Ok(t) => t.clone(),
        Err(_) => obj.get_type(),
    };
    ty.module().map(|m| m.to_string()).unwrap_or_default()
}

/// Parses a dtype-like (see the module docs). TypeError names what was given and lists the
/// accepted forms.
pub fn parse(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let py = obj.py();
    if let Ok(s) = obj.cast::<PyString>() {
        let s = s.to_cow()?;
        if let Ok(d) = DType::from_name(&s) {
            return Ok(d);
        }
        if let Some(d) = by_printed_name(&s) {
            return Ok(d);
        }
        // numpy codes and aliases: "f4", "<f4", "?", "double", "float" (float64).
        return via_numpy(obj).unwrap_or_else(|| Err(not_a_dtype(obj)));
    }
    let module = module_of(obj);
    if module.starts_with("polars") || module == "torch" {
        // Polars prints "Float32" for the class and an instance; torch "torch.float32".
        let printed = obj.str()?.to_string();
        return by_printed_name(&printed).ok_or_else(|| unsupported(obj, &printed));
    }
    if obj.hasattr(pyo3::intern!(py, "__arrow_c_schema__"))? {
        let dt = obj.extract::<PyDataType>().map_err(|_| not_a_dtype(obj))?.into_inner();
        return from_arrow(obj, &dt);
    }
    via_numpy(obj).unwrap_or_else(|| Err(not_a_dtype(obj)))
}

/// `numpy.dtype(obj)` as a DType; None when numpy does not read `obj` as a dtype.
fn via_numpy(obj: &Bound<'_, PyAny>) -> Option<PyResult<DType>> {
    let np = match obj.py().import("numpy") {
        Ok(np) => np,
        Err(e) => return Some(Err(e)),
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
        Err(e) => return Some(Err(e)),
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

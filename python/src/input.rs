//! What a call that takes data was given (`from_dlpack`, `tensor`, `to_dlpack`, `batches`):
//! an [`Input`], told apart once, in the core's order ([`Entry::ORDER`]). Each call carries out
//! what the variant says, without asking the object again; the Arrow producers' data is read
//! here, through the PyCapsule interface.

use std::ffi::CStr;
use std::path::PathBuf;

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use arrow_schema::ffi::FFI_ArrowSchema;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyCapsule, PyString, PyType};
use pyo3_arrow::ffi::ArrayIterator;
use pyo3_arrow::input::AnyArray;
use pyo3_arrow::{PyArray, PyArrayReader};

use dlframe::arrow::device::{import_array_on_host, import_on_host};
use dlframe::arrow::device_stream::DeviceStream;
use dlframe::dlpack::Entry;
use dlframe::dtype::spelling::polars_refusal;
use dlframe::ffi::arrow_device::{
    ARROW_ARRAY, ARROW_ARRAY_STREAM, ARROW_DEVICE_ARRAY, ARROW_DEVICE_ARRAY_STREAM, ARROW_SCHEMA,
};

use crate::error::{Binding, Error, Result};
use crate::interface::{self, Offered};
use crate::ndarray;
use crate::per_type::PerType;
use crate::tensor::PyTensor;

/// An object given to a call that takes data, as what it is taken for (the first of
/// [`Entry::ORDER`] that it offers).
pub enum Input<'py> {
    /// A `dlframe.Tensor`.
    Ours(Bound<'py, PyTensor>),
    /// A DLPack capsule.
    Capsule(Bound<'py, PyCapsule>),
    /// An Arrow producer, and the method it is read through (a device form only when it offers
    /// no tensor protocol).
    Arrow(Bound<'py, PyAny>, Form),
    /// A tensor producer with `__dlpack__`.
    Dlpack(Bound<'py, PyAny>),
    /// The array interfaces or the buffer protocol.
    Interface(Bound<'py, PyAny>, Offered<'py>),
    /// A Polars LazyFrame, collected (on the streaming engine) when its data is read.
    Lazy(Bound<'py, PyAny>),
    /// A path (a string or path object): a Parquet file.
    File(Bound<'py, PyAny>, PathBuf),
    /// None of them.
    Other(Bound<'py, PyAny>),
}

/// A method of the Arrow PyCapsule interface: how an Arrow producer is read.
#[derive(Clone, Copy)]
pub enum Form {
    Array,
    Stream,
    DeviceArray,
    DeviceStream,
}

impl Form {
    fn method(self) -> &'static str {
        match self {
            Form::Array => "__arrow_c_array__",
            Form::Stream => "__arrow_c_stream__",
            Form::DeviceArray => "__arrow_c_device_array__",
            Form::DeviceStream => "__arrow_c_device_stream__",
        }
    }

    /// The first of `forms` whose method `obj`'s type has: looked up on the type, as an
    /// instance lookup of a missing method falls back to `__getattr__`, which costs a polars
    /// Series about 7 us (it searches its expression namespace), and learnt once per type in
    /// `cache`, as a missing one costs an AttributeError each time (0.4 us for a numpy array).
    fn of(obj: &Bound<'_, PyAny>, forms: [Form; 2], cache: &PerType<Option<Form>>) -> Option<Form> {
        let find = |ty: &Bound<'_, PyType>| {
            Ok::<_, ()>(forms.into_iter().find(|f| ty.hasattr(f.method()).unwrap_or(false)))
        };
        cache.get(&obj.get_type(), find).unwrap_or(None)
    }

    /// `obj`'s data through this method (no copy: the producer's structs are checked, moved
    /// from once and read in place by the core).
    fn read(self, obj: &Bound<'_, PyAny>) -> Result<AnyArray> {
        match self {
            Form::Array => imported(obj, self.method(), ARROW_ARRAY, import_array_on_host),
            Form::Stream => stream(obj, self.method(), ARROW_ARRAY_STREAM, DeviceStream::take_cpu),
            Form::DeviceArray => imported(obj, self.method(), ARROW_DEVICE_ARRAY, import_on_host),
            Form::DeviceStream => stream(obj, self.method(), ARROW_DEVICE_ARRAY_STREAM, DeviceStream::take),
        }
    }
}

/// The Arrow PyCapsule methods each type offers, on the host and on a device.
static HOST_FORMS: PerType<Option<Form>> = PerType::new();
static DEVICE_FORMS: PerType<Option<Form>> = PerType::new();

impl<'a, 'py> FromPyObject<'a, 'py> for Input<'py> {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        let obj = obj.to_owned();
        for entry in Entry::ORDER {
            if let Some(input) = Input::as_entry(&obj, entry)? {
                return Ok(input);
            }
        }
        Ok(Input::Other(obj))
    }
}

impl<'py> Input<'py> {
    /// `obj` as `entry`, when it offers it.
    fn as_entry(obj: &Bound<'py, PyAny>, entry: Entry) -> Result<Option<Self>> {
        let arrow = |forms, cache| Form::of(obj, forms, cache).map(|f| Input::Arrow(obj.clone(), f));
        Ok(match entry {
            Entry::Ours => obj.cast::<PyTensor>().ok().map(|t| Input::Ours(t.clone())),
            Entry::Capsule => obj.cast::<PyCapsule>().ok().map(|c| Input::Capsule(c.clone())),
            Entry::ArrowHost => arrow([Form::Array, Form::Stream], &HOST_FORMS),
            Entry::Dlpack => {
                // An exact numpy array has it (known per type); anything else is asked.
                let has =
                    ndarray::as_ndarray(obj)?.is_some() || obj.hasattr(intern!(obj.py(), "__dlpack__"))?;
                has.then(|| Input::Dlpack(obj.clone()))
            }
            Entry::Interface => interface::offered(obj).map(|o| Input::Interface(obj.clone(), o)),
            Entry::ArrowDevice => arrow([Form::DeviceArray, Form::DeviceStream], &DEVICE_FORMS),
            Entry::File => {
                match obj.is_instance_of::<PyString>() || obj.hasattr(intern!(obj.py(), "__fspath__"))? {
                    true => Some(Input::File(obj.clone(), obj.extract()?)),
                    false => None,
                }
            }
            Entry::Lazy => {
                let ty = obj.get_type();
                let lazy = ty.name()? == "LazyFrame" && ty.module()?.to_cow()?.starts_with("polars");
                lazy.then(|| Input::Lazy(obj.clone()))
            }
        })
    }

    /// The object itself.
    pub fn object(&self) -> &Bound<'py, PyAny> {
        match self {
            Input::Ours(t) => t.as_any(),
            Input::Capsule(c) => c.as_any(),
            Input::Arrow(o, _)
            | Input::Dlpack(o)
            | Input::Interface(o, _)
            | Input::Lazy(o)
            | Input::File(o, _)
            | Input::Other(o) => o,
        }
    }

    /// Whether it is Arrow data (a `dlframe.Tensor` is, through `__arrow_c_array__`).
    pub fn is_arrow(&self) -> bool {
        matches!(self, Input::Ours(_) | Input::Arrow(..) | Input::Lazy(_))
    }

    /// Its Arrow data (no copy; a LazyFrame is collected, which copies as Polars runs the
    /// query); an object with neither an Arrow method nor the buffer protocol is refused as the
    /// wrong kind of object, and a producer's failure is said with the object's type.
    pub fn arrow(&self) -> Result<AnyArray> {
        let obj = self.object();
        let read = match self {
            Input::Ours(_) => Form::Array.read(obj),
            Input::Arrow(_, form) => form.read(obj),
            Input::Lazy(lf) => {
                let kwargs = [("engine", "streaming")].into_py_dict(obj.py())?;
                let collected = lf.call_method("collect", (), Some(&kwargs))?;
                return collected.extract::<Input>()?.arrow();
            }
            // Buffers and other objects pyo3-arrow accepts without the protocol methods.
            _ => obj.extract::<AnyArray>().map_err(Error::from),
        };
        read.map_err(|e| self.refused(e))
    }

    /// The chunks and field of its Arrow data (one array: no reader to make and drain).
    pub fn chunks(&self) -> Result<(Vec<ArrayRef>, FieldRef)> {
        match self.arrow()? {
            AnyArray::Array(a) => Ok(a.into_inner()).map(|(array, field)| (vec![array], field)),
            input => input.into_chunked_array().map(|c| c.into_inner()).map_err(|e| self.refused(e.into())),
        }
    }

    /// Why its Arrow data could not be read: the wrong kind of object, or (for a producer that
    /// has the interface) what the producer or the import refused.
    fn refused(&self, e: Error) -> Error {
        let obj = self.object();
        let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        if !self.is_arrow() {
            return Binding::WrongType(format!(
                "to_dlpack takes an object with __arrow_c_array__, __arrow_c_stream__ or their \
                 __arrow_c_device_*__ forms (pyarrow, polars, datafusion, duckdb, arro3, nanoarrow), \
                 a Polars LazyFrame or the path of a Parquet file, not {name}"
            ))
            .into();
        }
        if let Some(found) = unsupported_polars_column(obj) {
            return found;
        }
        e.in_context(obj.py(), &format!("reading the Arrow data of a {name} failed"))
    }
}

/// The array of the `(arrow_schema, <name>)` pair of PyCapsules that `obj.<method>()` returns,
/// imported by the core (`import`: the producer's struct checked, moved from once and read in
/// place); ValueError naming what it returned when it is no such pair.
fn imported<T>(obj: &Bound<'_, PyAny>, method: &str, name: &CStr, import: Import<T>) -> Result<AnyArray> {
    let pair = obj.call_method0(method)?;
    let (schema, array) = match pair.extract::<(Bound<'_, PyCapsule>, Bound<'_, PyCapsule>)>() {
        Ok((s, a)) if s.is_valid_checked(Some(ARROW_SCHEMA)) && a.is_valid_checked(Some(name)) => (s, a),
        _ => {
            let (ty, got) = (obj.get_type().name()?, pair.get_type().name()?);
            let pair = format!("(schema, array) pair of PyCapsules named \"arrow_schema\" and {name:?}");
            return Err(dlframe::Error::InvalidArgument(format!(
                "{ty}.{method}() returned a {got}, not a {pair}"
            ))
            .into());
        }
    };
    let (schema, array) = (schema.pointer_checked(Some(ARROW_SCHEMA))?, array.pointer_checked(Some(name))?);
    // SAFETY: the capsules hold the producer's structs of these names, alive while they are; the
    // array is moved out once (its capsule then releases nothing).
    let (field, array) = unsafe { import(array.as_ptr().cast(), schema.as_ptr().cast()) }?;
    Ok(AnyArray::Array(PyArray::try_new(array, field).map_err(Error::from)?))
}

/// The stream in the capsule `obj.<method>()` returns, taken by the core (`take`: moved from
/// once; each array checked as it comes, and read in place).
fn stream<T>(obj: &Bound<'_, PyAny>, method: &str, name: &CStr, take: Take<T>) -> Result<AnyArray> {
    let capsule = obj.call_method0(method)?;
    let ptr = capsule.cast::<PyCapsule>().map_err(PyErr::from)?.pointer_checked(Some(name))?;
    // SAFETY: the capsule holds the producer's stream of this name, alive while it is; it is
    // moved out once (its capsule then releases nothing).
    let stream = unsafe { take(ptr.as_ptr().cast()) }?;
    let field = stream.field();
    Ok(AnyArray::Stream(PyArrayReader::new(Box::new(ArrayIterator::new(stream, field)))))
}

/// The core's take of a producer's stream struct, and its import of an array struct and schema.
type Take<T> = unsafe fn(*mut T) -> dlframe::Result<DeviceStream>;
type Import<T> = unsafe fn(*mut T, *const FFI_ArrowSchema) -> dlframe::Result<(FieldRef, ArrayRef)>;

/// For a Polars frame or Series with a column that Polars cannot export through Arrow, the error
/// naming it (`dlframe::dtype::spelling::polars_refusal`).
fn unsupported_polars_column(obj: &Bound<'_, PyAny>) -> Option<Error> {
    let ty = obj.get_type();
    if !ty.module().ok()?.to_cow().ok()?.starts_with("polars") {
        return None;
    }
    let schema: Vec<(String, Bound<'_, PyAny>)> = match obj.getattr("schema") {
        Ok(s) => {
            s.call_method0("items").ok()?.try_iter().ok()?.filter_map(|kv| kv.ok()?.extract().ok()).collect()
        }
        Err(_) => vec![(obj.getattr("name").ok()?.extract().ok()?, obj.getattr("dtype").ok()?)],
    };
    let refusal =
        |(col, dtype): (String, Bound<'_, PyAny>)| polars_refusal(&col, &dtype.str().ok()?.to_cow().ok()?);
    schema.into_iter().find_map(refusal).map(Into::into)
}

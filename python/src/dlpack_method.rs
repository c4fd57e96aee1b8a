//! `Tensor.__dlpack__` as a method descriptor that reads its own keywords. Consumers call it
//! with the same few names every time (numpy: `dl_device`, `copy`, `max_version`), interned, so
//! each name is matched by address before its text (the two-int tuples are read directly by
//! `args.rs`); pyo3's reading (a UTF-8 view of each name, compared as text, and its conversions)
//! was half of the method's cost. What the arguments mean is the core's `ExportRequest`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

use dlframe::dlpack::ExportRequest;

use crate::args::{DlDevice, DlpackStream, MaxVersion};
use crate::error::{Binding, Error, Result};
use crate::method_def::{self, Args};
use crate::tensor::PyTensor;

/// The keywords, in the order numpy passes them.
const NAMES: [&str; 4] = ["dl_device", "copy", "max_version", "stream"];

/// What CPython shows as the method's signature and help.
const DOC: &str = "__dlpack__($self, /, *, dl_device=None, copy=None, max_version=None, stream=None)\n--\n\n\
Exports the tensor as a DLPack capsule: `dltensor_versioned` when `max_version` is (1, x) or \
later, the legacy `dltensor` otherwise. Zero-copy unless `copy=True`, or a move to `dl_device` \
or a layout the consumer cannot read needs a copy (then marked IS_COPIED). Shared Arrow memory \
is marked READ_ONLY. `stream` is the consumer's stream on a CUDA device.";

/// The interned keyword names, made once.
static INTERNED: PyOnceLock<[Py<PyString>; 4]> = PyOnceLock::new();

/// Makes `__dlpack__` a method of `tensor_type`.
pub fn install(tensor_type: &Bound<'_, PyType>) -> PyResult<()> {
    let py = tensor_type.py();
    INTERNED.get_or_init(py, || NAMES.map(|n| PyString::intern(py, n).unbind()));
    let f = method_def::fast_method!(dlpack);
    tensor_type.setattr("__dlpack__", method_def::descriptor(tensor_type, c"__dlpack__", f, DOC)?)
}

/// The method: reads the keywords into an `ExportRequest` and exports.
fn dlpack<'py>(py: Python<'py>, a: Args<'_, 'py>) -> PyResult<Bound<'py, PyAny>> {
    let wrong = |m: String| Error::from(Binding::WrongType(m));
    if !a.positional.is_empty() {
        return Err(wrong(format!(
            "Tensor.__dlpack__() takes 0 positional arguments but {} were given",
            a.positional.len()
        ))
        .into());
    }
    let interned = INTERNED.get(py);
    let mut values: [Option<Borrowed<'_, 'py, PyAny>>; 4] = [None; 4];
    for (name, value) in a.named() {
        let slot = slot_of(interned, &name)?;
        if values[slot].is_some() {
            return Err(wrong(format!(
                "Tensor.__dlpack__() got multiple values for argument '{}'",
                NAMES[slot]
            ))
            .into());
        }
        values[slot] = Some(value);
    }
    let given = |i: usize| values[i].filter(|v| !v.is_none());
    let request = ExportRequest {
        dl_device: given(0).map(|v| v.extract::<DlDevice>()).transpose()?.map(|d| d.0),
        copy: given(1)
            .map(|v| v.extract::<bool>().map_err(|_| wrong("copy must be None or a bool".into())))
            .transpose()?,
        max_version: given(2).map(|v| v.extract::<MaxVersion>()).transpose()?.map(|m| m.0),
        stream: given(3).map(|v| v.extract::<DlpackStream>()).transpose()?.map(|s| s.0),
    };
    // SAFETY: the descriptor called us with an instance of the type it was made for.
    let tensor = unsafe { a.slf.cast_unchecked::<PyTensor>() };
    Ok(tensor.get().export_capsule(py, request)?)
}

/// Which keyword `name` is: by address for an interned name, else by its text.
fn slot_of(interned: Option<&[Py<PyString>; 4]>, name: &Borrowed<'_, '_, PyAny>) -> Result<usize> {
    if let Some(interned) = interned
        && let Some(i) = interned.iter().position(|n| n.as_ptr() == name.as_ptr())
    {
        return Ok(i);
    }
    let text = name.cast::<PyString>().ok().and_then(|n| n.to_str().ok().map(str::to_owned));
    text.as_deref().and_then(|t| NAMES.iter().position(|n| *n == t)).ok_or_else(|| {
        let shown =
            text.map_or_else(|| name.repr().map(|r| r.to_string()).unwrap_or_default(), |t| format!("'{t}'"));
        Binding::WrongType(format!("Tensor.__dlpack__() got an unexpected keyword argument {shown}")).into()
    })
}

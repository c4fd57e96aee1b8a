//! `dlframe.Tensor`: one tensor that speaks DLPack (both versions), `__array_interface__`,
//! `__array_struct__` and the Arrow PyCapsule interface.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyCapsule, PyDict, PyTuple};

use arrow_schema::FieldRef;
use dlframe::arrow::device::field_of_schema;
use dlframe::arrow::device_export::{export_tensor, exported_column};
use dlframe::arrow::{is_plain_1d, tensor_to_column_with};
use dlframe::dlpack::ExportRequest;
use dlframe::ffi::arrow_device::{ARROW_DEVICE_ARRAY, ARROW_SCHEMA};
use dlframe::interface::array_struct::ArrayStruct;
use dlframe::interface::{ArrayInterface, SyclInterface};
use dlframe::options::CopyPolicy;
use dlframe::{DType, Device, Tensor, transfer};

use crate::args::{DlDevice, MaxVersion};
use crate::capsule;
use crate::error::{Binding, Result};
use crate::gil;
use crate::interface::{interface_dict, sycl_dict};

/// A tensor over Arrow (or foreign) memory. Shared Arrow memory is read-only; copies are
/// writable and marked `copied`.
#[pyclass(name = "Tensor", module = "dlframe._native", frozen)]
pub struct PyTensor {
    pub(crate) inner: Tensor,
    /// The SYCL queue or context of USM memory imported through
    /// `__sycl_usm_array_interface__`, re-exported through the same interface.
    pub(crate) syclobj: Option<Py<PyAny>>,
}

impl PyTensor {
    pub fn new(inner: Tensor) -> Self {
        PyTensor { inner, syclobj: None }
    }
}

/// Frees an `__array_struct__` capsule's struct, which holds the tensor.
///
/// # Safety
/// Called by CPython, with the GIL, on a dying capsule made by `__array_struct__`.
unsafe extern "C" fn array_struct_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: installed only on our unnamed __array_struct__ capsules, whose pointer is a
    // boxed ArrayStruct, freed once, here.
    unsafe {
        let ptr = ffi::PyCapsule_GetPointer(capsule, std::ptr::null());
        if !ptr.is_null() {
            drop(Box::from_raw(ptr as *mut ArrayStruct));
        }
    }
}

/// The field of a consumer's `requested_schema` capsule (checked by the core before it is read).
fn requested_field(schema: Option<Bound<'_, PyCapsule>>) -> Result<Option<FieldRef>> {
    let Some(ptr) = schema.map(|c| c.pointer_checked(Some(ARROW_SCHEMA))).transpose()? else {
        return Ok(None);
    };
    // SAFETY: the consumer's live schema, only read (the capsule keeps it alive and owns it).
    Ok(Some(unsafe { field_of_schema(ptr.as_ptr().cast()) }?))
}

#[pymethods]
impl PyTensor {
    /// Exports the tensor as a DLPack capsule: `dltensor_versioned` when `max_version` is (1, x)
    /// or later, the legacy `dltensor` otherwise. Zero-copy unless `copy=True`, or a move to
    /// `dl_device` or a layout the consumer cannot read needs a copy (then marked IS_COPIED).
    /// Shared Arrow memory is marked READ_ONLY. `stream` is the consumer's stream on a CUDA
    /// device.
    ///
    /// The core resolves the request (copies, device moves, the capsule kind and the consumer's
    /// stream; docs/conformance.md, items 1-15). A CPU tensor left on the CPU has no stream to
    /// wait on and at most a small copy, so the GIL stays held (pinned or managed memory may
    /// have to wait for a stream: released).
    #[pyo3(signature = (*, dl_device=None, copy=None, max_version=None, stream=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        dl_device: Option<DlDevice>,
        copy: Option<bool>,
        max_version: Option<MaxVersion>,
        stream: Option<i64>,
    ) -> Result<Bound<'py, PyAny>> {
        let (t, dl_device) = (&self.inner, dl_device.map(|d| d.0));
        let request = ExportRequest { dl_device, copy, max_version: max_version.map(|m| m.0), stream };
        let to_cpu = dl_device.is_none_or(|d| d.device_type == Device::Cpu.to_dlpack().device_type);
        let export = gil::run(py, t.device() == Device::Cpu && to_cpu, t.nbytes(), || request.export(t))?;
        capsule::from_export(py, export)
    }

    /// `(device_type, device_id)`, e.g. `(1, 0)` for the CPU.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.inner.device().to_dlpack();
        (d.device_type, d.device_id)
    }

    /// `__cuda_array_interface__` v3 of a CUDA tensor: `stream` is the producer's stream (never
    /// 0), on which consumers must order their work. No `mask`.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyDict>> {
        Ok(interface_dict(py, &ArrayInterface::for_cuda(&self.inner)?)?)
    }

    /// numpy's array interface v3; `data` is `(pointer, read_only)`. No `mask` key, ever.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyDict>> {
        Ok(interface_dict(py, &ArrayInterface::for_host(&self.inner)?)?)
    }

    /// numpy's legacy `__array_struct__`: an unnamed capsule whose struct holds the tensor.
    #[getter]
    fn __array_struct__<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyAny>> {
        let raw = Box::into_raw(ArrayStruct::export(&self.inner)?);
        // SAFETY: an unnamed capsule (numpy asks for the NULL name) over the boxed struct.
        let cap = unsafe { ffi::PyCapsule_New(raw.cast(), std::ptr::null(), Some(array_struct_destructor)) };
        // SAFETY: a new reference, or NULL with an exception set.
        let cap = unsafe { Bound::from_owned_ptr_or_err(py, cap) };
        // SAFETY: when no capsule was made, none took the box.
        Ok(cap.inspect_err(|_| drop(unsafe { Box::from_raw(raw) }))?)
    }

    /// Exports as an Arrow array (zero-copy where possible) through the Arrow PyCapsule
    /// interface, so `pyarrow.array(tensor)` works; a `requested_schema` of another number type
    /// is a checked cast (`dlframe::arrow::device_export::exported_column`).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> Result<Bound<'py, PyTuple>> {
        let requested = requested_field(requested_schema)?;
        let (field, array) =
            gil::run_over(py, &self.inner, || exported_column(&self.inner, requested.as_deref()))?;
        Ok(pyo3_arrow::ffi::to_array_pycapsules(py, field, array.as_ref(), None)?)
    }

    /// The same Arrow array through the Arrow C Device data interface, on the CPU device
    /// (`dlframe::arrow::device_export::export_tensor`). A keyword of a later version of the
    /// interface, given a value, raises NotImplementedError.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> Result<Bound<'py, PyTuple>> {
        if let Some((k, _)) = kwargs.and_then(|kw| kw.iter().find(|(_, v)| !v.is_none())) {
            return Err(Binding::NotImplemented(format!("no keyword {k} in this version")).into());
        }
        let requested = requested_field(requested_schema)?;
        let (schema, array) =
            gil::run_over(py, &self.inner, || export_tensor(&self.inner, requested.as_deref()))?;
        let schema = PyCapsule::new_with_value(py, schema, ARROW_SCHEMA)?.into_any();
        Ok(PyTuple::new(py, [schema, PyCapsule::new_with_value(py, array, ARROW_DEVICE_ARRAY)?.into_any()])?)
    }

    /// `__sycl_usm_array_interface__` v1, for tensors over SYCL USM memory (strides and offset
    /// in elements); other tensors have no such attribute.
    #[getter]
    fn __sycl_usm_array_interface__<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyDict>> {
        let Some(syclobj) = &self.syclobj else {
            let why = "the tensor is not SYCL USM memory".into();
            return Err(dlframe::Error::NotOffered { protocol: "__sycl_usm_array_interface__", why }.into());
        };
        Ok(sycl_dict(py, &SyclInterface::describe(&self.inner)?, syclobj.bind(py))?)
    }

    /// The extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }
    /// The strides, in elements (as DLPack counts them).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }
    /// The element type as a `numpy.dtype` (`np.dtype('float32')`, which also compares equal
    /// to the string `"float32"`), so that `np.result_type(t)` and `jnp.asarray(t)` work. A
    /// tensor of datetimes reports the integer that stores them, as DLPack sees it.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyAny>> {
        numpy_dtype(py, self.inner.dtype())
    }
    /// `"cpu"`, `"cuda:0"`, ...
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }
    /// True when consumers must not write the memory: shared Arrow memory, read-only foreign
    /// memory, and dlframe's own copies, which every view of this tensor shares (ask for a
    /// writable copy with `np.from_dlpack(t, copy=True)`).
    #[getter]
    fn readonly(&self) -> bool {
        self.inner.shared_readonly()
    }
    /// True when dlframe made this memory as a copy.
    #[getter]
    fn copied(&self) -> bool {
        self.inner.copied()
    }
    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.ndim()
    }
    fn __len__(&self) -> usize {
        self.inner.shape().first().map_or(1, |&d| d as usize)
    }

    fn __repr__(&self) -> String {
        let (t, py_bool) = (&self.inner, |b: bool| if b { "True" } else { "False" });
        let (shape, dtype, device) = (t.shape(), t.dtype(), t.device());
        let (readonly, copied) = (py_bool(t.shared_readonly()), py_bool(t.copied()));
        format!(
            "dlframe.Tensor(shape={shape:?}, dtype={dtype}, device={device}, readonly={readonly}, copied={copied})"
        )
    }

    /// The tensor as a pyarrow array (copies only when the memory cannot be shared, or when
    /// `copy=True`): N-d tensors become `fixed_shape_tensor` arrays.
    #[pyo3(signature = (*, copy=None))]
    pub(crate) fn to_arrow<'py>(&self, py: Python<'py>, copy: Option<bool>) -> Result<Bound<'py, PyAny>> {
        let (host, fresh) = gil::run_over(py, &self.inner, || transfer::on_host(&self.inner, copy))?;
        // A transfer to the host is already a fresh copy: no second one.
        host_to_pyarrow(py, &host, if fresh { None } else { copy })
    }

    /// The tensor as a numpy array: a view of the same memory (read-only when the tensor is)
    /// through the array interface, or with `copy=True` a writable copy. A device tensor needs
    /// `copy=True` (one device-to-host transfer); otherwise BufferError.
    #[pyo3(signature = (*, copy=None))]
    fn to_numpy<'py>(slf: &Bound<'py, Self>, copy: Option<bool>) -> Result<Bound<'py, PyAny>> {
        let py = slf.py();
        let np = py.import(pyo3::intern!(py, "numpy"))?;
        let t = &slf.get().inner;
        if !t.device().is_host_accessible() {
            // The transfer is already a fresh copy: numpy views it.
            let (host, _) = py.detach(|| transfer::on_host(t, copy))?;
            return Self::to_numpy(&Bound::new(py, PyTensor::new(host))?, Some(false));
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item(pyo3::intern!(py, "copy"), copy == Some(true))?;
        if let Some(bits) = t.dtype().bits_dtype() {
            // numpy has no bfloat16 or float8: the bits as unsigned integers, viewed as
            // ml_dtypes' type of the same name.
            let ml = numpy_dtype(py, t.dtype())?;
            let bits = PyTensor::new(t.view_as(bits)?.with_readonly(t.shared_readonly()));
            let array = np.call_method(pyo3::intern!(py, "array"), (bits,), Some(&kwargs))?;
            return Ok(array.call_method1(pyo3::intern!(py, "view"), (ml,))?);
        }
        Ok(np.call_method(pyo3::intern!(py, "array"), (slf,), Some(&kwargs))?)
    }

    /// Pickling (torch's DataLoader workers send their batches this way): the values as a numpy
    /// array (one copy, into the pickle), and `dlframe.tensor` over the unpickled array. A
    /// device tensor is refused (TypeError): move it to the host first.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> Result<(Bound<'py, PyAny>, (Bound<'py, PyAny>,))> {
        let py = slf.py();
        let device = slf.get().inner.device();
        if !device.is_host_accessible() {
            return Err(Binding::WrongType(format!(
                "a dlframe.Tensor on {device} cannot be pickled; copy it to the host first \
                 (tensor.to_numpy(copy=True)), or keep DataLoader batches on the CPU and move them \
                 in the main process"
            ))
            .into());
        }
        let rebuild =
            py.import(pyo3::intern!(py, "dlframe._native"))?.getattr(pyo3::intern!(py, "tensor"))?;
        Ok((rebuild, (Self::to_numpy(slf, None)?,)))
    }

    /// The tensor as a polars Series: `dlframe.polars.from_dlpack` (N-d tensors become
    /// `Array` columns in logical order, copying only transposed or strided tensors).
    #[pyo3(signature = (*, copy=None))]
    fn to_polars<'py>(slf: &Bound<'py, Self>, copy: Option<bool>) -> Result<Bound<'py, PyAny>> {
        let kwargs = [("copy", copy)].into_py_dict(slf.py())?;
        Ok(slf.py().import("dlframe.polars")?.call_method("from_dlpack", (slf,), Some(&kwargs))?)
    }
}

/// The `numpy.dtype` of a dtype: numpy's own, or for the dtypes numpy lacks (bfloat16, float8)
/// ml_dtypes' type of the same name.
fn numpy_dtype(py: Python<'_>, d: DType) -> Result<Bound<'_, PyAny>> {
    let np = py.import(pyo3::intern!(py, "numpy"))?;
    if d.bits_dtype().is_none() {
        return Ok(np.call_method1(pyo3::intern!(py, "dtype"), (d.name(),))?);
    }
    // ml_dtypes (which jax installs) gives numpy these types.
    let ml = py.import(pyo3::intern!(py, "ml_dtypes")).map_err(|_| {
        Binding::WrongType(format!(
            "{d} has no numpy dtype without ml_dtypes: pip install ml_dtypes, or read the tensor \
             with torch.from_dlpack or jax.dlpack.from_dlpack"
        ))
    })?;
    Ok(np.call_method1(pyo3::intern!(py, "dtype"), (ml.getattr(d.name())?,))?)
}

/// A host tensor as a pyarrow array, zero-copy where the memory allows (`copy=True` copies),
/// through the Arrow C data interface, which pyarrow imports publicly (`pyarrow.array` of a
/// producer of `__arrow_c_array__`); N-d tensors become `fixed_shape_tensor` arrays. A tensor the
/// host cannot read is refused (BufferError).
///
/// A plain tensor (`dlframe::arrow::is_plain_1d`) goes through pyarrow's own DLPack import
/// instead, which makes exactly what the Arrow path makes of it at half the cost of a small call.
pub(crate) fn host_to_pyarrow<'py>(
    py: Python<'py>,
    t: &Tensor,
    copy: Option<bool>,
) -> Result<Bound<'py, PyAny>> {
    if !t.device().is_host_accessible() {
        let why = format!("the tensor is on {}; Arrow needs host memory", t.device());
        return Err(dlframe::Error::Refused(why).into());
    }
    if copy != Some(true)
        && is_plain_1d(t)
        && let Some(shared) = pyarrow_from_dlpack(py, Bound::new(py, PyTensor::new(t.clone()))?.as_any())
    {
        return Ok(shared);
    }
    let (field, array) = gil::run_over(py, t, || tensor_to_column_with(t, "", CopyPolicy::from(copy)))?;
    Ok(pyo3_arrow::PyArray::try_new(array, field)?.to_pyarrow(py)?.unbind().into_bound(py))
}

/// `pyarrow.Array.from_dlpack`, looked up once; None for a pyarrow without it.
static FROM_DLPACK: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();

/// `pyarrow.Array.from_dlpack(x)` (no copy); None for a pyarrow without it or that refuses
/// `x`. For producers of the plain tensors of [`host_to_pyarrow`].
pub fn pyarrow_from_dlpack<'py>(py: Python<'py>, x: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let method = FROM_DLPACK.get_or_try_init(py, || -> PyResult<_> {
        Ok(py.import("pyarrow")?.getattr("Array")?.getattr("from_dlpack").ok().map(Bound::unbind))
    });
    method.ok()?.as_ref()?.bind(py).call1((x,)).ok()
}

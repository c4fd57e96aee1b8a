//! A stream of Arrow device arrays (`ArrowDeviceArrayStream`, the C Device data interface's
//! stream) taken from its producer with one owner and read as Arrow arrays on the host, each
//! through [`super::device::DeviceArray`]: in place, checked, none copied. A stream on a device
//! the host cannot read is refused when it is taken, naming the device. A stream of the C stream
//! interface (`ArrowArrayStream`, CPU memory) is taken as a device stream on the CPU, so its
//! arrays get the same checks ([`DeviceStream::take_cpu`]).

use std::ffi::{CStr, c_int};

use arrow_array::ArrayRef;
use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{ArrowError, FieldRef};

use super::device::{DeviceArray, invalid, schema_field};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::ffi::arrow_device::{ArrowDeviceArray, ArrowDeviceArrayStream};
use crate::ffi::dlpack::DLDevice;

/// A device array stream taken from its producer (released when this drops), with its schema.
#[derive(Debug)]
pub struct DeviceStream {
    raw: Owned,
    schema: FFI_ArrowSchema,
    field: FieldRef,
}

/// The producer's stream struct, owned: released once, when it drops. A C stream
/// (`ArrowArrayStream`) is one on the CPU whose arrays come without a device.
#[derive(Debug)]
enum Owned {
    Device(ArrowDeviceArrayStream),
    /// Released by arrow-rs's `Drop`.
    Cpu(FFI_ArrowArrayStream),
}

// SAFETY: the stream is owned here alone and its callbacks are called from one thread at a time
// (`&mut self`), as the C stream interface asks; which thread is the producer's concern.
unsafe impl Send for Owned {}

impl Owned {
    /// Whether the stream has the two callbacks a reader needs.
    fn has_callbacks(&self) -> bool {
        match self {
            Owned::Device(s) => s.get_schema.is_some() && s.get_next.is_some(),
            Owned::Cpu(s) => s.get_schema.is_some() && s.get_next.is_some(),
        }
    }

    /// The producer's `get_schema` into `out`: its return code, EINVAL without the callback.
    fn get_schema(&mut self, out: &mut FFI_ArrowSchema) -> c_int {
        match self {
            // SAFETY: the producer's callback, with its live stream and a writable empty schema.
            Owned::Device(s) => s.get_schema.map_or(EINVAL, |f| unsafe { f(s, out) }),
            // SAFETY: as above.
            Owned::Cpu(s) => s.get_schema.map_or(EINVAL, |f| unsafe { f(s, out) }),
        }
    }

    /// The producer's next array, as a device array (on the CPU for a C stream): its return
    /// code is the error.
    fn get_next(&mut self) -> std::result::Result<ArrowDeviceArray, c_int> {
        let mut out = ArrowDeviceArray::on_cpu(FFI_ArrowArray::empty());
        let rc = match self {
            // SAFETY: the producer's callback, with its live stream and a writable released
            // array, which it overwrites.
            Owned::Device(s) => s.get_next.map_or(EINVAL, |f| unsafe { f(s, &mut out) }),
            // SAFETY: as above.
            Owned::Cpu(s) => s.get_next.map_or(EINVAL, |f| unsafe { f(s, &mut out.array) }),
        };
        if rc == 0 { Ok(out) } else { Err(rc) }
    }

    /// The producer's last error message, or a placeholder.
    fn last_error(&mut self) -> String {
        let p = match self {
            // SAFETY: the producer's callback, with its live stream.
            Owned::Device(s) => s.get_last_error.map(|f| unsafe { f(s) }),
            // SAFETY: as above.
            Owned::Cpu(s) => s.get_last_error.map(|f| unsafe { f(s) }),
        };
        match p {
            Some(p) if !p.is_null() => {
                // SAFETY: a non-NULL result is a NUL-terminated string valid until the next
                // call, copied here at once.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
            _ => "no message".into(),
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Owned::Device(s) = self
            && let Some(release) = s.release.take()
        {
            // SAFETY: the stream is ours and not released; the producer's release, once.
            unsafe { release(s) };
        }
    }
}

impl DeviceStream {
    /// Takes the stream out of the producer's struct (a move: its `release` is NULL after, so
    /// the producer's capsule releases nothing), refuses a device the host cannot read, and
    /// reads the schema. From the move on, this owns the stream: an error releases it, once.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceArray`] for a NULL or released stream, missing callbacks, or a
    /// schema the producer cannot give or dlframe cannot read; [`Error::UnsupportedDevice`] for
    /// a device type DLPack lacks or memory the host cannot read.
    ///
    /// # Safety
    /// `raw` is NULL or points to a live `ArrowDeviceArrayStream` that the caller may move from.
    pub unsafe fn take(raw: *mut ArrowDeviceArrayStream) -> Result<Self> {
        if raw.is_null() {
            return Err(invalid("the producer handed over a NULL ArrowDeviceArrayStream"));
        }
        // SAFETY: a live struct (the caller's promise), moved out: the source is marked released.
        let owned = unsafe {
            let s = std::ptr::read(raw);
            (*raw).release = None;
            s
        };
        if owned.release.is_none() {
            return Err(invalid("the stream was already released or moved (its release callback is NULL)"));
        }
        let device_type = owned.device_type;
        // Owned from here: every error below releases it, once.
        let owned = Owned::Device(owned);
        let device = Device::from_dlpack(DLDevice { device_type, device_id: 0 })?;
        Self::read_schema(owned, device)
    }

    /// Takes a producer's `ArrowArrayStream` (the C stream interface, CPU memory:
    /// `__arrow_c_stream__`'s) as a device stream on the CPU, so that each of its arrays is
    /// checked as a device array is before anything reads it ([`DeviceStream::take`]). A move:
    /// the producer's struct is left released. No data is copied.
    ///
    /// # Errors
    /// As [`DeviceStream::take`].
    ///
    /// # Safety
    /// `raw` is NULL or points to a live `ArrowArrayStream` that the caller may move from.
    pub unsafe fn take_cpu(raw: *mut FFI_ArrowArrayStream) -> Result<Self> {
        if raw.is_null() {
            return Err(invalid("the producer handed over a NULL ArrowArrayStream"));
        }
        // SAFETY: a live struct (the caller's promise), moved out: an empty (released) one is
        // left in its place, so the producer's capsule releases nothing.
        let inner = unsafe { std::ptr::replace(raw, FFI_ArrowArrayStream::empty()) };
        if inner.release.is_none() {
            return Err(invalid("the stream was already released or moved (its release callback is NULL)"));
        }
        Self::read_schema(Owned::Cpu(inner), Device::Cpu)
    }

    /// Refuses a stream without its callbacks or on a device the host cannot read, and reads
    /// the schema; `raw` is released on an error.
    fn read_schema(mut raw: Owned, device: Device) -> Result<Self> {
        if !raw.has_callbacks() {
            return Err(invalid("the stream has no get_schema or get_next callback"));
        }
        if !device.is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                what: format!("an Arrow device array stream on {device}"),
                remedy: "dlframe reads Arrow device streams in CPU memory (device type 1) so far; \
                         copy the data to the host first",
            });
        }
        let mut schema = FFI_ArrowSchema::empty();
        if raw.get_schema(&mut schema) != 0 {
            return Err(invalid(format!("get_schema failed: {}", raw.last_error())));
        }
        let field = schema_field(&schema)?;
        Ok(DeviceStream { raw, schema, field })
    }

    /// The stream's field (a struct field for a stream of record batches).
    pub fn field(&self) -> FieldRef {
        self.field.clone()
    }
}

impl Iterator for DeviceStream {
    type Item = std::result::Result<ArrayRef, ArrowError>;

    /// The next array, read on the host (no copy); None at the end. An error is the producer's
    /// message or the device array's refusal.
    fn next(&mut self) -> Option<Self::Item> {
        let Ok(mut out) = self.raw.get_next() else {
            let message = format!("get_next failed: {}", self.raw.last_error());
            return Some(Err(ArrowError::CDataInterface(message)));
        };
        if out.array.is_released() {
            return None;
        }
        // SAFETY: the device array the producer just wrote, moved from once.
        let read =
            unsafe { DeviceArray::take(&mut out) }.and_then(|a| a.on_host_as(&self.field, &self.schema));
        Some(read.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

/// EINVAL, which the C stream interface returns for a call it cannot make.
const EINVAL: c_int = 22;

#[cfg(test)]
mod tests {
    use std::ffi::{CString, c_char, c_int, c_void};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use arrow_array::{Array, Int32Array};
    use arrow_schema::Field;

    use super::*;

    /// What a fake producer's stream holds.
    struct Producer {
        field: Field,
        arrays: std::vec::IntoIter<ArrayRef>,
        fail_next: bool,
        error: CString,
        released: Arc<AtomicUsize>,
    }

    /// # Safety
    /// Called with a stream made by `stream` below.
    unsafe extern "C" fn get_schema(s: *mut ArrowDeviceArrayStream, out: *mut FFI_ArrowSchema) -> c_int {
        // SAFETY: our own private data and a writable schema.
        unsafe {
            let p = &*((*s).private_data as *const Producer);
            std::ptr::write(out, FFI_ArrowSchema::try_from(&p.field).unwrap());
        }
        0
    }

    /// # Safety
    /// Called with a stream made by `stream` below.
    unsafe extern "C" fn get_next(s: *mut ArrowDeviceArrayStream, out: *mut ArrowDeviceArray) -> c_int {
        // SAFETY: our own private data and a writable device array (released, so overwritten).
        unsafe {
            let p = &mut *((*s).private_data as *mut Producer);
            if p.fail_next {
                return 5;
            }
            let array =
                p.arrays.next().map_or_else(FFI_ArrowArray::empty, |a| FFI_ArrowArray::new(&a.to_data()));
            std::ptr::write(out, ArrowDeviceArray::on_cpu(array));
        }
        0
    }

    /// # Safety
    /// Called with a stream made by `stream` below.
    unsafe extern "C" fn last_error(s: *mut ArrowDeviceArrayStream) -> *const c_char {
        // SAFETY: our own private data.
        unsafe { (*((*s).private_data as *const Producer)).error.as_ptr() }
    }

    /// # Safety
    /// Called once, with a stream made by `stream` below.
    unsafe extern "C" fn release(s: *mut ArrowDeviceArrayStream) {
        // SAFETY: our own private data, freed once; the stream is marked released.
        unsafe {
            let p = Box::from_raw((*s).private_data as *mut Producer);
            p.released.fetch_add(1, Ordering::SeqCst);
            drop(p);
            (*s).release = None;
        }
    }

    fn stream(
        device_type: i32,
        arrays: Vec<ArrayRef>,
        fail_next: bool,
        released: &Arc<AtomicUsize>,
    ) -> ArrowDeviceArrayStream {
        let producer = Producer {
            released: released.clone(),
            field: Field::new("x", arrow_schema::DataType::Int32, true),
            arrays: arrays.into_iter(),
            fail_next,
            error: CString::new("the producer broke").unwrap(),
        };
        ArrowDeviceArrayStream {
            device_type,
            get_schema: Some(get_schema),
            get_next: Some(get_next),
            get_last_error: Some(last_error),
            release: Some(release),
            private_data: Box::into_raw(Box::new(producer)) as *mut c_void,
        }
    }

    fn ints(v: Vec<i32>) -> ArrayRef {
        Arc::new(Int32Array::from(v))
    }

    /// [`DeviceStream::take`] of a stream of this module's.
    fn take(raw: &mut ArrowDeviceArrayStream) -> Result<DeviceStream> {
        // SAFETY: every stream here is made by `stream` (live, its callbacks sound for its own
        // private data) or was moved from by a take before (released, refused unread).
        unsafe { DeviceStream::take(raw) }
    }

    /// [`DeviceStream::take_cpu`] of a stream of this module's.
    fn take_cpu(raw: &mut FFI_ArrowArrayStream) -> Result<DeviceStream> {
        // SAFETY: every stream here is made by arrow-rs's `FFI_ArrowArrayStream::new` (live) or
        // was moved from by a take before (released, refused unread).
        unsafe { DeviceStream::take_cpu(raw) }
    }

    #[test]
    fn a_cpu_stream_is_read_array_by_array_and_released_once() {
        let released = Arc::new(AtomicUsize::new(0));
        let mut raw = stream(1, vec![ints(vec![1, 2]), ints(vec![3])], false, &released);
        let s = take(&mut raw).unwrap();
        assert!(raw.release.is_none(), "the producer's struct is moved from");
        assert_eq!(s.field().name(), "x");
        let read: Vec<ArrayRef> = s.collect::<std::result::Result<_, _>>().unwrap();
        assert_eq!(read.iter().map(|a| a.len()).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(read[1].as_ref(), &Int32Array::from(vec![3]) as &dyn Array);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // Taken again: refused, nothing released twice.
        let e = take(&mut raw).unwrap_err();
        assert!(e.to_string().contains("already released or moved"), "{e}");
    }

    #[test]
    fn a_device_stream_or_a_failing_one_is_refused_and_released_once() {
        let released = Arc::new(AtomicUsize::new(0));
        let mut cuda = stream(2, vec![ints(vec![1])], false, &released);
        let e = take(&mut cuda).unwrap_err();
        assert!(e.to_string().contains("an Arrow device array stream on cuda:0"), "{e}");
        let mut failing = stream(1, vec![ints(vec![1])], true, &released);
        let mut s = take(&mut failing).unwrap();
        let e = s.next().unwrap().unwrap_err();
        assert!(e.to_string().contains("get_next failed: the producer broke"), "{e}");
        drop(s);
        assert_eq!(released.load(Ordering::SeqCst), 2);
        // SAFETY: NULL is refused before anything is read.
        assert!(unsafe { DeviceStream::take(std::ptr::null_mut()) }.is_err());
    }

    #[test]
    fn a_cpu_stream_is_read_through_the_same_checks_and_released_once() {
        use arrow_array::{RecordBatch, RecordBatchIterator};
        let values = Int32Array::from(vec![1, 2, 3]);
        let schema =
            Arc::new(arrow_schema::Schema::new(vec![Field::new("x", arrow_schema::DataType::Int32, false)]));
        let buffer = values.values().inner().clone();
        let held = buffer.strong_count();
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(values.clone())]).unwrap();
        let reader = RecordBatchIterator::new(vec![Ok(batch.clone()), Ok(batch)], schema);
        let mut raw = FFI_ArrowArrayStream::new(Box::new(reader));
        let stream = take_cpu(&mut raw).unwrap();
        assert!(raw.release.is_none(), "the producer's struct is moved from");
        let arrays: Vec<ArrayRef> = stream.collect::<std::result::Result<_, _>>().unwrap();
        assert_eq!(arrays.len(), 2);
        let column = arrays[1].to_data().child_data()[0].clone();
        assert_eq!(column.buffers()[0].as_ptr(), buffer.as_ptr(), "read in place");
        drop((arrays, column));
        assert_eq!(buffer.strong_count(), held, "the producer's stream and batches are released");
        // A moved-from stream is refused, and NULL.
        let e = take_cpu(&mut raw).unwrap_err();
        assert!(e.to_string().contains("already released or moved"), "{e}");
        // SAFETY: NULL is refused before anything is read.
        assert!(unsafe { DeviceStream::take_cpu(std::ptr::null_mut()) }.is_err());
    }
}

//! A stream of Arrow device arrays (`ArrowDeviceArrayStream`, the C Device data interface's
//! stream) taken from its producer with one owner and read as Arrow arrays on the host, each
//! through [`super::device::DeviceArray`]: in place, checked, none copied. A stream on a device
//! the host cannot read is refused when it is taken, naming the device.

use std::ffi::CStr;

use arrow_array::ArrayRef;
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

/// The producer's stream struct, owned: released once, when it drops.
#[derive(Debug)]
struct Owned(ArrowDeviceArrayStream);

// SAFETY: the stream is owned here alone and its callbacks are called from one thread at a time
// (`&mut self`), as the C stream interface asks; which thread is the producer's concern.
unsafe impl Send for Owned {}

impl Owned {
    /// The producer's last error message, or a placeholder.
    fn last_error(&mut self) -> String {
        let Some(f) = self.0.get_last_error else { return "no message".into() };
        // SAFETY: the producer's callback with its stream; a non-NULL result is a NUL-terminated
        // string valid until the next call, copied here at once.
        unsafe {
            let p = f(&mut self.0);
            if p.is_null() { "no message".into() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(release) = self.0.release.take() {
            // SAFETY: the stream is ours and not released; the producer's release, once.
            unsafe { release(&mut self.0) };
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
        let mut owned = Owned(unsafe {
            let s = std::ptr::read(raw);
            (*raw).release = None;
            s
        });
        if owned.0.release.is_none() {
            return Err(invalid("the stream was already released or moved (its release callback is NULL)"));
        }
        let (Some(get_schema), Some(_)) = (owned.0.get_schema, owned.0.get_next) else {
            return Err(invalid("the stream has no get_schema or get_next callback"));
        };
        let device = Device::from_dlpack(DLDevice { device_type: owned.0.device_type, device_id: 0 })?;
        if !device.is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                what: format!("an Arrow device array stream on {device}"),
                remedy: "dlframe reads Arrow device streams in CPU memory (device type 1) so far; \
                         copy the data to the host first",
            });
        }
        let mut schema = FFI_ArrowSchema::empty();
        // SAFETY: the producer's callback, with its stream and a writable empty schema.
        if unsafe { get_schema(&mut owned.0, &mut schema) } != 0 {
            return Err(invalid(format!("get_schema failed: {}", owned.last_error())));
        }
        let field = schema_field(&schema)?;
        Ok(DeviceStream { raw: owned, schema, field })
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
        let get_next = self.raw.0.get_next?;
        let mut out = ArrowDeviceArray::on_cpu(FFI_ArrowArray::empty());
        // SAFETY: the producer's callback, with its stream and a writable released device array.
        if unsafe { get_next(&mut self.raw.0, &mut out) } != 0 {
            let message = format!("get_next failed: {}", self.raw.last_error());
            return Some(Err(ArrowError::CDataInterface(message)));
        }
        if out.array.is_released() {
            return None;
        }
        // SAFETY: the device array the producer just wrote, moved from once.
        let read =
            unsafe { DeviceArray::take(&mut out) }.and_then(|a| a.on_host_as(&self.field, &self.schema));
        Some(read.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

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

    #[test]
    fn a_cpu_stream_is_read_array_by_array_and_released_once() {
        let released = Arc::new(AtomicUsize::new(0));
        let mut raw = stream(1, vec![ints(vec![1, 2]), ints(vec![3])], false, &released);
        // SAFETY: a live stream, moved from once.
        let s = unsafe { DeviceStream::take(&mut raw) }.unwrap();
        assert!(raw.release.is_none(), "the producer's struct is moved from");
        assert_eq!(s.field().name(), "x");
        let read: Vec<ArrayRef> = s.collect::<std::result::Result<_, _>>().unwrap();
        assert_eq!(read.iter().map(|a| a.len()).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(read[1].as_ref(), &Int32Array::from(vec![3]) as &dyn Array);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        // Taken again: refused, nothing released twice.
        // SAFETY: as above.
        let e = unsafe { DeviceStream::take(&mut raw) }.unwrap_err();
        assert!(e.to_string().contains("already released or moved"), "{e}");
    }

    #[test]
    fn a_device_stream_or_a_failing_one_is_refused_and_released_once() {
        let released = Arc::new(AtomicUsize::new(0));
        let mut cuda = stream(2, vec![ints(vec![1])], false, &released);
        // SAFETY: a live stream, moved from once.
        let e = unsafe { DeviceStream::take(&mut cuda) }.unwrap_err();
        assert!(e.to_string().contains("an Arrow device array stream on cuda:0"), "{e}");
        let mut failing = stream(1, vec![ints(vec![1])], true, &released);
        // SAFETY: as above.
        let mut s = unsafe { DeviceStream::take(&mut failing) }.unwrap();
        let e = s.next().unwrap().unwrap_err();
        assert!(e.to_string().contains("get_next failed: the producer broke"), "{e}");
        drop(s);
        assert_eq!(released.load(Ordering::SeqCst), 2);
        // SAFETY: NULL is refused before anything is read.
        assert!(unsafe { DeviceStream::take(std::ptr::null_mut()) }.is_err());
    }
}

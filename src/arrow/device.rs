//! Arrow arrays that arrive through the Arrow C Device data interface (`ArrowDeviceArray`): taken
//! from their producer with one owner, checked, and read on the host without a copy. Device
//! memory (CUDA) is refused with an error naming the device; reading it where it lies is the GPU
//! part of this interface, not built yet.
//!
//! The C data interface carries no buffer sizes: a producer whose `length` runs past the end of
//! its own buffers cannot be told from an honest one (pyarrow and nanoarrow trust it as well).
//! Everything else a producer writes is checked before arrow-rs reads it ([`check_raw`]).

use std::sync::Arc;

use arrow_array::{ArrayRef, make_array};
use arrow_data::ffi::FFI_ArrowArray;
use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{DataType, Field, FieldRef};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::ffi::arrow_device::{ArrowDeviceArray, RawArrowArray, RawArrowSchema};
use crate::ffi::dlpack::DLDevice;

/// A device array taken from its producer: the array (released when this drops) and where its
/// buffers live.
#[derive(Debug)]
pub struct DeviceArray {
    array: FFI_ArrowArray,
    device: Device,
    /// Whether the producer gave an event to wait on before reading.
    has_event: bool,
}

/// The error for a struct that breaks the C Device data interface.
pub(super) fn invalid(why: impl Into<String>) -> Error {
    Error::InvalidDeviceArray(why.into())
}

impl DeviceArray {
    /// Takes the array out of the producer's struct: a move, as the interface defines it (the
    /// struct's `array.release` is NULL after, so the producer's capsule releases nothing), then
    /// checks where it lives. From the move on, this owns the array: every error below releases
    /// it, once.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceArray`] for a NULL struct or an array already released or moved;
    /// [`Error::UnsupportedDevice`] for a device type DLPack does not define or a device id out
    /// of range.
    ///
    /// # Safety
    /// `raw` is NULL or points to a live `ArrowDeviceArray` that the caller may move from.
    pub unsafe fn take(raw: *mut ArrowDeviceArray) -> Result<Self> {
        if raw.is_null() {
            return Err(invalid("the producer handed over a NULL ArrowDeviceArray"));
        }
        // SAFETY: a live struct (the caller's promise); `from_raw` moves its array out and leaves
        // an empty one (release NULL) in its place.
        let (array, device_type, device_id, event) = unsafe {
            let r = &mut *raw;
            (FFI_ArrowArray::from_raw(&mut r.array), r.device_type, r.device_id, r.sync_event)
        };
        if array.is_released() {
            return Err(invalid("the array was already released or moved (its release callback is NULL)"));
        }
        let id = match (device_type, device_id) {
            // The CPU has no ordinal: pyarrow writes -1.
            (1, _) => 0,
            (_, id) => i32::try_from(id).map_err(|_| Error::UnsupportedDevice {
                what: format!("(device_type={device_type}, device_id={device_id})"),
                remedy: "a device id must fit 32 bits",
            })?,
        };
        let device = Device::from_dlpack(DLDevice { device_type, device_id: id })?;
        Ok(DeviceArray { array, device, has_event: !event.is_null() })
    }

    /// Where the array's buffers live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The array and its field, read in place on the host (no copy), checked as a whole
    /// (the schema live, the counts, pointers and children the type needs, then lengths,
    /// offsets and buffers against each other) before anything reads its values. An event on
    /// CPU memory is ignored: the CPU has nothing to wait for.
    ///
    /// # Errors
    /// [`Error::UnsupportedDevice`] for memory the host cannot read (CUDA), or pinned or
    /// managed memory with an event to wait on; [`Error::InvalidDeviceArray`] for a schema or
    /// array that breaks the C data interface.
    pub fn on_host(self, schema: &FFI_ArrowSchema) -> Result<(FieldRef, ArrayRef)> {
        self.readable()?;
        let field = schema_field(schema)?;
        let array = self.read(&field, schema)?;
        Ok((field, array))
    }

    /// [`DeviceArray::on_host`] for an array of a stream whose schema was read once, as
    /// `field`.
    ///
    /// # Errors
    /// As [`DeviceArray::on_host`].
    pub(super) fn on_host_as(self, field: &FieldRef, schema: &FFI_ArrowSchema) -> Result<ArrayRef> {
        self.readable()?;
        self.read(field, schema)
    }

    /// Refuses memory the host cannot read, or cannot read before an event it cannot wait on.
    fn readable(&self) -> Result<()> {
        let device = self.device;
        if device.is_host_accessible() && (!self.has_event || device == Device::Cpu) {
            return Ok(());
        }
        Err(Error::UnsupportedDevice {
            what: format!("an Arrow device array on {device}"),
            remedy: "dlframe reads Arrow device arrays in CPU memory (device type 1) so far; \
                     copy the data to the host first",
        })
    }

    /// The array of type `field` (`schema`'s), its C struct checked, then validated.
    fn read(self, field: &FieldRef, schema: &FFI_ArrowSchema) -> Result<ArrayRef> {
        // SAFETY: the owned array's C struct, read as its C fields (the same layout).
        let raw_array = unsafe { &*(&self.array as *const FFI_ArrowArray as *const RawArrowArray) };
        check_raw(raw_array, field.data_type(), 0)?;
        // SAFETY: the array is live and owned (moved out of the producer's struct); its counts
        // and pointers fit its type (checked above), and its lengths, offsets and buffers are
        // validated below, before any value is read.
        let data = unsafe { arrow_array::ffi::from_ffi(self.array, schema) }
            .map_err(|e| invalid(format!("its array: {e}")))?;
        data.validate_full().map_err(|e| invalid(format!("its array: {e}")))?;
        Ok(make_array(data))
    }
}

/// The field a live schema describes.
///
/// # Errors
/// [`Error::InvalidDeviceArray`] for a schema already released or moved from (whose pointers
/// may be freed), or one arrow-rs cannot read.
pub(super) fn schema_field(schema: &FFI_ArrowSchema) -> Result<FieldRef> {
    // SAFETY: a live FFI_ArrowSchema, read as its C fields (the same layout).
    let raw = unsafe { &*(schema as *const FFI_ArrowSchema as *const RawArrowSchema) };
    if raw.release.is_none() {
        return Err(invalid("the schema was already released or moved (its release callback is NULL)"));
    }
    check_schema(raw, 0)?;
    Ok(Arc::new(Field::try_from(schema).map_err(|e| invalid(format!("its schema: {e}")))?))
}

/// The field of a consumer's or producer's `ArrowSchema` (a `requested_schema` capsule's),
/// checked as [`schema_field`] checks it (no copy of any data; the schema is only read).
///
/// # Errors
/// As [`schema_field`]; [`Error::InvalidDeviceArray`] for a NULL schema.
///
/// # Safety
/// `schema` is NULL or points to a live `ArrowSchema`.
pub unsafe fn field_of_schema(schema: *const FFI_ArrowSchema) -> Result<FieldRef> {
    // SAFETY: a non-NULL schema is live (the caller's promise).
    schema_field(unsafe { schema.as_ref() }.ok_or_else(|| invalid("a NULL schema"))?)
}

/// Checks a schema's tree before arrow-rs parses it (recursively, without a bound of its own):
/// no deeper than [`MAX_DEPTH`] (a cycle would be endless), no NULL child or format, and no
/// non-nullable field of the Null type (whose rows are all null by definition, and whose length
/// no buffer bounds).
fn check_schema(s: &RawArrowSchema, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!("its schema nests deeper than {MAX_DEPTH}")));
    }
    if s.format.is_null() || s.n_children < 0 || (s.n_children > 0 && s.children.is_null()) {
        return Err(invalid("its schema has a NULL format or children array, or a negative count"));
    }
    // SAFETY: a live schema's format is a NUL-terminated string.
    let format = unsafe { std::ffi::CStr::from_ptr(s.format) }.to_bytes();
    if format == b"n" && s.flags & ARROW_FLAG_NULLABLE == 0 {
        return Err(invalid("a non-nullable field of the Null type"));
    }
    for i in 0..s.n_children as usize {
        // SAFETY: `children` holds n_children pointers (non-NULL, checked above).
        match unsafe { (*s.children.add(i)).as_ref() } {
            Some(child) => check_schema(child, depth + 1)?,
            None => return Err(invalid(format!("its schema's child {i} is NULL"))),
        }
    }
    // SAFETY: a non-NULL dictionary is a schema the parent owns.
    match unsafe { s.dictionary.as_ref() } {
        Some(d) => check_schema(d, depth + 1),
        None => Ok(()),
    }
}

/// The C data interface's flag of a nullable field.
const ARROW_FLAG_NULLABLE: i64 = 2;

/// A producer's device array and its schema as an Arrow array on the host (no copy):
/// [`DeviceArray::take`], then [`DeviceArray::on_host`].
///
/// # Errors
/// As those two; [`Error::InvalidDeviceArray`] for a NULL schema.
///
/// # Safety
/// `raw` as [`DeviceArray::take`] has it; `schema` is NULL or a live `ArrowSchema`.
pub unsafe fn import_on_host(
    raw: *mut ArrowDeviceArray,
    schema: *const FFI_ArrowSchema,
) -> Result<(FieldRef, ArrayRef)> {
    // SAFETY: the caller's promise.
    let taken = unsafe { DeviceArray::take(raw) }?;
    // SAFETY: a non-NULL schema is live (the caller's promise).
    let schema =
        unsafe { schema.as_ref() }.ok_or_else(|| invalid("the producer handed over a NULL schema"))?;
    taken.on_host(schema)
}

/// The bits of one row of `dt`'s widest buffer, at least 256 (every fixed width but a fixed-size
/// binary's or list's): a fixed-size list's values multiplied out, nested too.
///
/// # Errors
/// [`Error::InvalidDeviceArray`] for a negative width or a product that overflows.
fn row_bits(dt: &DataType) -> Result<i64> {
    let bits = match dt {
        DataType::FixedSizeBinary(n) => i64::from(*n).checked_mul(8).filter(|b| *b >= 0),
        DataType::FixedSizeList(f, n) if *n >= 0 => row_bits(f.data_type())?.checked_mul(i64::from(*n)),
        DataType::FixedSizeList(..) => None,
        _ => Some(256),
    };
    bits.map(|b| b.max(256)).ok_or_else(|| invalid(format!("a {dt} column: a negative or overflowing width")))
}

/// A producer's `ArrowArray` of the C data interface (CPU memory, `__arrow_c_array__`'s) and
/// its schema as an Arrow array on the host (no copy), checked exactly as a device array on
/// the CPU: the array is moved into an [`ArrowDeviceArray`] of device type 1, then
/// [`import_on_host`].
///
/// # Errors
/// As [`import_on_host`].
///
/// # Safety
/// `raw` is NULL or points to a live `ArrowArray` that the caller may move from; `schema` as
/// [`import_on_host`] has it.
pub unsafe fn import_array_on_host(
    raw: *mut FFI_ArrowArray,
    schema: *const FFI_ArrowSchema,
) -> Result<(FieldRef, ArrayRef)> {
    if raw.is_null() {
        return Err(invalid("the producer handed over a NULL ArrowArray"));
    }
    // SAFETY: a live array (the caller's promise), moved out once: the producer's struct is
    // left released.
    let mut on_cpu = ArrowDeviceArray::on_cpu(unsafe { FFI_ArrowArray::from_raw(raw) });
    // SAFETY: our own live struct, moved from once; the schema as the caller promises.
    unsafe { import_on_host(&mut on_cpu, schema) }
}

/// How deep children may nest before an array is refused (a producer's cycle would be endless).
const MAX_DEPTH: usize = 64;

/// Checks what arrow-rs would trust (and assert, or read) before it reads an array of type `dt`:
/// no negative count, length or offset, nor a length and offset whose buffers' byte sizes
/// overflow; the buffer and child pointers that many buffers and children need; as many children as the type has (a struct's fields, a list's one), each
/// checked against its own type; and a dictionary where the type has one.
fn check_raw(a: &RawArrowArray, dt: &DataType, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!("children nested deeper than {MAX_DEPTH}")));
    }
    let fields = [
        ("length", a.length),
        ("offset", a.offset),
        ("n_buffers", a.n_buffers),
        ("n_children", a.n_children),
    ];
    if let Some((name, v)) = fields.iter().find(|(_, v)| *v < 0) {
        return Err(invalid(format!("a negative {name} ({v})")));
    }
    // arrow-rs sizes each buffer from `offset + length` (one more for offsets) times its width
    // in bits, and a fixed-size list's values from the rows times the list size, unchecked:
    // those products must not overflow.
    let bits = row_bits(dt)?;
    let rows = a.length.checked_add(a.offset).and_then(|n| n.checked_add(1));
    if rows.and_then(|n| n.checked_mul(bits)).is_none() {
        return Err(invalid(format!(
            "length {} + offset {} overflows its buffers' sizes",
            a.length, a.offset
        )));
    }
    // arrow-rs reads as many buffers as the producer says, and sizes the variadic ones of a
    // view type by subtracting: the count must be the type's.
    let layout = arrow_data::layout(dt);
    let expected = (layout.buffers.len() + usize::from(layout.can_contain_null_mask)) as i64;
    let fits = if layout.variadic { a.n_buffers > expected } else { a.n_buffers == expected };
    if !fits {
        let what = if layout.variadic { "more than " } else { "" };
        return Err(invalid(format!(
            "{} buffers for a {dt} column, which has {what}{expected}",
            a.n_buffers
        )));
    }
    if (a.n_buffers > 0 && a.buffers.is_null()) || (a.n_children > 0 && a.children.is_null()) {
        return Err(invalid("a NULL buffers or children array"));
    }
    let children: Vec<&DataType> = match dt {
        DataType::Struct(f) => f.iter().map(|f| f.data_type()).collect(),
        DataType::Union(f, _) => f.iter().map(|(_, f)| f.data_type()).collect(),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => vec![f.data_type()],
        DataType::RunEndEncoded(r, v) => vec![r.data_type(), v.data_type()],
        _ => Vec::new(),
    };
    if a.n_children as usize != children.len() {
        return Err(invalid(format!(
            "{} children for a {dt} column, which has {}",
            a.n_children,
            children.len()
        )));
    }
    // The rows of each child that the parent's rows reach (arrow-rs slices them, and asserts).
    let reach = match dt {
        DataType::Struct(_) | DataType::Union(_, arrow_schema::UnionMode::Sparse) => {
            Some(a.offset + a.length)
        }
        DataType::FixedSizeList(_, n) => Some((a.offset + a.length) * i64::from(*n)),
        _ => None,
    };
    for (i, child_type) in children.into_iter().enumerate() {
        // SAFETY: `children` holds n_children pointers (non-NULL, checked above).
        let child = unsafe { *a.children.add(i) };
        // SAFETY: a non-NULL child is an ArrowArray the parent owns.
        let Some(c) = (unsafe { child.as_ref() }) else {
            return Err(invalid(format!("child {i} is NULL")));
        };
        check_raw(c, child_type, depth + 1)?;
        if let Some(reach) = reach.filter(|r| *r > c.length) {
            return Err(invalid(format!("child {i} has {} rows; the {dt} column reaches {reach}", c.length)));
        }
    }
    // SAFETY: a non-NULL dictionary is an ArrowArray the parent owns.
    match (dt, unsafe { a.dictionary.as_ref() }) {
        (DataType::Dictionary(_, values), Some(d)) => check_raw(d, values, depth + 1),
        (DataType::Dictionary(..), None) => Err(invalid("a dictionary column without its dictionary")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use arrow_array::{Array, Int32Array, StringArray};
    use arrow_data::ArrayData;

    use super::*;

    /// A device array over `data` on `(device_type, device_id)`, as a producer exports it.
    fn export(data: &ArrayData, device_type: i32, device_id: i64) -> (ArrowDeviceArray, FFI_ArrowSchema) {
        let (array, schema) = arrow_array::ffi::to_ffi(data).unwrap();
        let d = ArrowDeviceArray {
            array,
            device_id,
            device_type,
            sync_event: std::ptr::null_mut(),
            reserved: [0; 3],
        };
        (d, schema)
    }

    /// [`DeviceArray::take`] of a struct of this module's.
    fn take(raw: &mut ArrowDeviceArray) -> Result<DeviceArray> {
        // SAFETY: every struct here is made by `export` (a live arrow-rs export, whose fields a
        // test may overwrite as a hostile producer would, for the checks to refuse) or was moved
        // from by a take before (released, refused unread).
        unsafe { DeviceArray::take(raw) }
    }

    #[test]
    fn a_cpu_device_array_is_read_in_place_and_released_once() {
        let values = Int32Array::from(vec![Some(1), None, Some(3)]);
        let (mut raw, schema) = export(&values.to_data(), 1, -1);
        let taken = take(&mut raw).unwrap();
        assert!(raw.array.is_released(), "the producer's struct is moved from");
        assert_eq!(taken.device(), Device::Cpu);
        let (field, array) = taken.on_host(&schema).unwrap();
        assert_eq!(field.data_type(), values.data_type());
        assert_eq!(array.to_data().buffers()[0].as_ptr(), values.to_data().buffers()[0].as_ptr());
        assert_eq!(array.as_ref(), &values as &dyn Array);
        // Taking it again finds it moved.
        let e = take(&mut raw).unwrap_err();
        assert!(e.to_string().contains("already released or moved"), "{e}");
        // SAFETY: NULL is refused before anything is read.
        assert!(unsafe { DeviceArray::take(std::ptr::null_mut()) }.is_err());
    }

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    /// A release callback that counts its calls (and frees nothing).
    ///
    /// # Safety
    /// Called by the array's owner, once, with the array.
    unsafe extern "C" fn counting_release(array: *mut FFI_ArrowArray) {
        RELEASED.fetch_add(1, Ordering::SeqCst);
        let _ = array;
    }

    #[test]
    fn hostile_structs_are_refused_and_released_once() {
        let ints = Int32Array::from(vec![1, 2, 3]).to_data();
        let strings = StringArray::from(vec!["a", "bc"]).to_data();
        let refuse =
            |data: &ArrayData, device_type: i32, device_id: i64, edit: &dyn Fn(&mut ArrowDeviceArray)| {
                let (mut raw, schema) = export(data, device_type, device_id);
                edit(&mut raw);
                let r = take(&mut raw).and_then(|t| t.on_host(&schema));
                assert!(raw.array.is_released());
                r.map(|_| ()).unwrap_err().to_string()
            };
        let none = |_: &mut ArrowDeviceArray| {};
        assert!(refuse(&ints, 2, 0, &none).contains("an Arrow device array on cuda:0"));
        assert!(refuse(&ints, 99, 0, &none).contains("device_type=99"));
        assert!(refuse(&ints, 2, 1 << 40, &none).contains("fit 32 bits"));
        // A pinned host buffer with an event to wait on is not read before the wait exists.
        let with_event = |r: &mut ArrowDeviceArray| r.sync_event = 8 as *mut _;
        assert!(refuse(&ints, 3, 0, &with_event).contains("an Arrow device array on dlpack-device(3, 0)"));
        // The C struct's fields, written as a hostile producer would.
        let raw_i64 = |r: &mut ArrowDeviceArray, at: usize, v: i64| {
            // SAFETY: `at` is the byte offset of an int64 field of the C ArrowArray (length 0,
            // null_count 8, offset 16), inside the struct.
            unsafe { *((&mut r.array as *mut FFI_ArrowArray as *mut u8).add(at) as *mut i64) = v };
        };
        assert!(refuse(&ints, 1, -1, &|r| raw_i64(r, 0, -5)).contains("a negative length (-5)"));
        assert!(refuse(&ints, 1, -1, &|r| raw_i64(r, 16, -1)).contains("a negative offset (-1)"));
        assert!(refuse(&ints, 1, -1, &|r| raw_i64(r, 16, i64::MAX)).contains("overflows"));
        // Within i64, but not once arrow-rs multiplies it by the width in bits (a panic before),
        // or a fixed-size list's rows by its list size (a panic in release builds too).
        assert!(refuse(&ints, 1, -1, &|r| raw_i64(r, 16, 1 << 62)).contains("overflows its buffers' sizes"));
        assert!(refuse(&ints, 1, -1, &|r| raw_i64(r, 0, 1 << 56)).contains("overflows its buffers' sizes"));
        let cells = arrow_array::FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Int32, true)),
            1 << 9,
            Arc::new(Int32Array::from(vec![0; 1 << 9])),
            None,
        )
        .unwrap();
        let e = refuse(&cells.to_data(), 1, -1, &|r| raw_i64(r, 0, 1 << 54));
        assert!(e.contains("overflows its buffers' sizes"), "{e}");
        // Fewer buffers than the type has, and a NULL buffer array.
        assert!(refuse(&strings, 1, -1, &|r| raw_i64(r, 24, 2)).contains("invalid Arrow device array"));
        assert!(refuse(&ints, 1, -1, &|r| raw_i64(r, 40, 0)).contains("a NULL buffers or children array"));
        // A NULL values buffer.
        let null_values = |r: &mut ArrowDeviceArray| {
            // SAFETY: the C ArrowArray's `buffers` (offset 40) points to 2 buffer pointers,
            // owned by the export and writable.
            unsafe {
                let buffers =
                    *((&mut r.array as *mut FFI_ArrowArray as *mut u8).add(40) as *mut *mut *const u8);
                *buffers.add(1) = std::ptr::null();
            }
        };
        assert!(refuse(&ints, 1, -1, &null_values).contains("is null"));
        // A struct with fewer children than fields, and a list with none: refused, no panic.
        let pairs = arrow_array::StructArray::from(vec![
            (
                Arc::new(Field::new("a", DataType::Int32, false)),
                Arc::new(Int32Array::from(vec![1])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("b", DataType::Int32, false)),
                Arc::new(Int32Array::from(vec![2])) as ArrayRef,
            ),
        ]);
        let e = refuse(&pairs.to_data(), 1, -1, &|r| raw_i64(r, 32, 1));
        assert!(e.contains("1 children for a Struct"), "{e}");
        // A struct whose offset reaches past its children's rows (arrow-rs asserts when it
        // slices them), and a buffer count that is not the type's.
        let e = refuse(&pairs.to_data(), 1, -1, &|r| raw_i64(r, 16, 1));
        assert!(e.contains("child 0 has 1 rows; the Struct"), "{e}");
        let e = refuse(&ints, 1, -1, &|r| raw_i64(r, 24, 3));
        assert!(e.contains("3 buffers for a Int32 column, which has 2"), "{e}");
        let lists = arrow_array::ListArray::from_iter_primitive::<arrow_array::types::Int32Type, _, _>([
            Some(vec![Some(1)]),
        ]);
        assert!(refuse(&lists.to_data(), 1, -1, &|r| raw_i64(r, 32, 0)).contains("0 children for a List"));
        // A schema already moved from is refused before anything reads it.
        let (mut raw, mut schema) = export(&ints, 1, -1);
        // SAFETY: the schema's `release` (offset 56) is read and written as its C field; its
        // private data then leaks, which this test accepts.
        unsafe { *((&mut schema as *mut FFI_ArrowSchema as *mut u8).add(56) as *mut usize) = 0 };
        let e = take(&mut raw).unwrap().on_host(&schema).unwrap_err().to_string();
        assert!(e.contains("schema was already released or moved"), "{e}");

        // A refused array is released exactly once: here through a release that counts.
        let (mut raw, _schema) = export(&ints, 2, 0);
        let before = RELEASED.load(Ordering::SeqCst);
        // SAFETY: the C ArrowArray's `release` (offset 64) is a function pointer; the export's own
        // private data then leaks, which this test accepts to count the call.
        unsafe {
            *((&mut raw.array as *mut FFI_ArrowArray as *mut u8).add(64)
                as *mut Option<unsafe extern "C" fn(*mut FFI_ArrowArray)>) = Some(counting_release);
        }
        let taken = take(&mut raw).unwrap();
        assert!(taken.on_host(&FFI_ArrowSchema::empty()).is_err());
        assert_eq!(RELEASED.load(Ordering::SeqCst) - before, 1);
        drop(raw);
        assert_eq!(RELEASED.load(Ordering::SeqCst) - before, 1, "the moved-from struct releases nothing");
    }
}

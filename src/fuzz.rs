//! Fuzz harnesses: each takes arbitrary bytes, builds a hostile input from them and checks that
//! dlframe refuses it with an error or handles it correctly. A panic is a finding.
//!
//! The `fuzz/` crate (cargo-fuzz, nightly) drives these with coverage guidance, and
//! `tests/fuzz_corpus.rs` replays the kept corpora on stable in every test run.
//!
//! Not part of the stable API.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array};
use arrow_schema::{DataType, Field, FieldRef};

use crate::arrow::extension::{
    EXTENSION_METADATA_KEY, EXTENSION_NAME_KEY, FIXED_SHAPE_TENSOR, TensorMetadata,
};
use crate::arrow::{tensor_to_column, to_tensor};
use crate::dlpack::{ForeignTensor, export_legacy, export_versioned};
use crate::ffi::dlpack::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use crate::interface::TypeStr;
use crate::kernels::contiguous_copy;
use crate::options::ExportOptions;
use crate::tensor::{Tensor, check_layout};

/// Reads the fuzz input front to back; past its end every read is 0.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.bytes())
    }
    /// Mostly small values, sometimes any: small extents and strides find layout bugs, raw
    /// ones find overflow.
    fn small_or_any(&mut self, signed: bool) -> i64 {
        let tag = self.u8();
        match tag % 4 {
            0 => self.i64(),
            _ if signed => (tag as i8 as i64) >> 2,
            _ => (tag >> 2) as i64 % 9,
        }
    }
}

/// The bytes a fake producer's tensors may point into.
const ARENA_BYTES: usize = 4096;

/// The largest copy the harness asks for.
const MAX_COPY_BYTES: usize = 1 << 20;

/// Counts the deleter's calls through `manager_ctx`.
///
/// # Safety
/// `m` is a managed tensor the harness made with `Box::into_raw`, whose `manager_ctx` points to
/// a live counter; called once per tensor (the DLPack deleter contract).
unsafe extern "C" fn count_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: the harness made `m` with Box::into_raw and a manager_ctx pointing to a live
    // counter; the consumer calls the deleter once, so the Box is freed once.
    unsafe {
        (*((*m).manager_ctx as *const AtomicUsize)).fetch_add(1, Ordering::SeqCst);
        drop(Box::from_raw(m));
    }
}

/// [`count_versioned`] for the legacy struct.
///
/// # Safety
/// As [`count_versioned`].
unsafe extern "C" fn count_legacy(m: *mut DLManagedTensor) {
    // SAFETY: as in count_versioned.
    unsafe {
        (*((*m).manager_ctx as *const AtomicUsize)).fetch_add(1, Ordering::SeqCst);
        drop(Box::from_raw(m));
    }
}

/// What [`dlpack_import_outcome`] did with its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The import refused the tensor.
    Refused,
    /// The import accepted it; it was not read (outside the arena, or too large a copy).
    Accepted,
    /// The import accepted it, and every path that reads it ran.
    Read,
}

/// A foreign DLPack producer from fuzz bytes: either version, any flags, device, dtype, ndim,
/// shape, strides, byte offset and data pointer (NULL or into a 4 KiB arena). The import must
/// refuse what it cannot prove sane and release the tensor exactly once either way. A tensor it
/// accepts whose extent lies inside the arena is then read: to Arrow, copied contiguous, and
/// exported and imported again.
pub fn dlpack_import(input: &[u8]) {
    dlpack_import_outcome(input);
}

/// [`dlpack_import`], saying what became of the input (for seeds that must be accepted).
pub fn dlpack_import_outcome(input: &[u8]) -> Outcome {
    let mut r = Reader(input);
    let versioned = r.u8() & 1 == 1;
    let version = match r.u8() % 8 {
        0 => DLPackVersion { major: r.u32(), minor: r.u32() },
        v => DLPackVersion { major: 1, minor: v as u32 },
    };
    let flags = r.u64() & if r.u8() % 4 == 0 { u64::MAX } else { 3 };
    let device = match r.u8() % 8 {
        0 => DLDevice { device_type: r.i32(), device_id: r.i32() },
        1 => DLDevice { device_type: 3, device_id: 0 },
        2 => DLDevice { device_type: 2, device_id: r.i32() },
        _ => DLDevice { device_type: 1, device_id: 0 },
    };
    let ndim = match r.u8() % 8 {
        0 => r.i32(),
        1 => 60 + (r.u8() % 16) as i32,
        n => (n - 2) as i32,
    };
    let dtype = match r.u8() % 4 {
        0 => DLDataType { code: r.u8(), bits: r.u8(), lanes: r.u16() },
        _ => {
            let (code, bits) =
                [(0, 8), (0, 64), (1, 8), (1, 1), (2, 16), (2, 32), (2, 64), (4, 16)][r.u8() as usize % 8];
            DLDataType { code, bits, lanes: 1 }
        }
    };
    // Never more than 128 entries, whatever ndim says: an importer that reads past ndim 64
    // reads past these arrays, which the address sanitizer reports.
    let len = ndim.clamp(0, 128) as usize;
    let mut shape: Vec<i64> = (0..len).map(|_| r.small_or_any(false)).collect();
    let mut strides: Option<Vec<i64>> =
        (r.u8() % 3 != 0).then(|| (0..len).map(|_| r.small_or_any(true)).collect());
    let byte_offset = if r.u8() % 4 == 0 { r.u64() } else { r.u8() as u64 % 64 };
    let null_data = r.u8() % 8 == 0;
    let mut arena = vec![0u64; ARENA_BYTES / 8];
    for (i, w) in arena.iter_mut().enumerate() {
        *w = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    let arena_range = arena.as_ptr() as usize..arena.as_ptr() as usize + ARENA_BYTES;
    let dl = DLTensor {
        data: if null_data { std::ptr::null_mut() } else { arena.as_mut_ptr() as *mut c_void },
        device,
        ndim,
        dtype,
        shape: if len == 0 && r.u8() % 2 == 0 { std::ptr::null_mut() } else { shape.as_mut_ptr() },
        strides: strides.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
        byte_offset,
    };
    let deleted = AtomicUsize::new(0);
    let ctx = &deleted as *const AtomicUsize as *mut c_void;
    let imported = if versioned {
        let m = Box::new(DLManagedTensorVersioned {
            version,
            manager_ctx: ctx,
            deleter: Some(count_versioned),
            flags,
            dl_tensor: dl,
        });
        // SAFETY: a live managed tensor handed over; shape and strides hold `len` entries and
        // outlive the import (they are dropped at the end of this function, after the tensor).
        unsafe { ForeignTensor::from_versioned(Box::into_raw(m)) }
    } else {
        let m = Box::new(DLManagedTensor { dl_tensor: dl, manager_ctx: ctx, deleter: Some(count_legacy) });
        // SAFETY: as above.
        unsafe { ForeignTensor::from_legacy(Box::into_raw(m)) }
    };
    let outcome = match imported {
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an empty error message");
            assert_eq!(deleted.load(Ordering::SeqCst), 1, "a refused tensor is released once: {e}");
            Outcome::Refused
        }
        Ok(foreign) => {
            let t = foreign.into_tensor();
            assert_eq!(deleted.load(Ordering::SeqCst), 0, "released while still in use");
            // A broadcast view (stride 0) may have far more elements than bytes: a copy of it
            // is as large as asked, as in numpy, so copies are tried only when small.
            let read = within(&t, &arena_range) && t.nbytes() <= MAX_COPY_BYTES;
            if read {
                read_everything(&t);
            }
            drop(t);
            assert_eq!(deleted.load(Ordering::SeqCst), 1, "an accepted tensor is released once");
            if read { Outcome::Read } else { Outcome::Accepted }
        }
    };
    drop((arena, shape, strides));
    outcome
}

/// True when every element `t` can reach lies inside `arena` (or it has none).
fn within(t: &Tensor, arena: &std::ops::Range<usize>) -> bool {
    if !t.device().is_host_accessible() {
        return false;
    }
    let item = t.dtype().itemsize();
    let extent = check_layout(t.shape(), t.strides(), item).expect("an imported tensor has a valid layout");
    if extent.numel == 0 {
        return true;
    }
    let (lo, hi) = extent.byte_bounds(t.data_ptr() as usize as i128, item);
    lo >= arena.start as i128 && hi <= arena.end as i128
}

/// Reads `t` through every path that touches its memory; each may refuse, none may panic.
fn read_everything(t: &Tensor) {
    if let Ok((field, array)) = tensor_to_column(t, "x") {
        assert_eq!(array.data_type(), field.data_type());
    }
    if let Ok(c) = contiguous_copy(t) {
        assert_eq!(c.shape(), t.shape());
        assert!(c.is_c_contiguous());
    }
    let _ = t.as_bytes();
    // Our own export, imported again, is the same view.
    // SAFETY: export_versioned hands over a live tensor that from_versioned takes.
    let again = unsafe { ForeignTensor::from_versioned(export_versioned(t.clone()).into_raw()) };
    let again = again.expect("our own export imports");
    assert_eq!((again.view().shape(), again.view().strides()), (t.shape(), t.strides()));
    // SAFETY: as above, for the legacy struct.
    let legacy = unsafe { ForeignTensor::from_legacy(export_legacy(t.clone()).into_raw()) };
    assert_eq!(legacy.expect("our own export imports").view().data_ptr(), t.data_ptr());
}

/// An array-interface `typestr` from fuzz bytes. A string that parses must map to a dtype or
/// refuse with an error, and print back to a string that parses to the same value.
pub fn typestr(input: &[u8]) {
    let Ok(s) = std::str::from_utf8(input) else { return };
    let Ok(t) = s.parse::<TypeStr>() else { return };
    let _ = t.to_dtype();
    let _ = crate::interface::datetime::units(&t);
    let printed = String::from(t.clone());
    let back: TypeStr =
        printed.parse().unwrap_or_else(|e| panic!("{s:?} printed as {printed:?}, which fails: {e}"));
    assert_eq!(back, t, "{s:?} -> {printed:?}");
}

/// `arrow.fixed_shape_tensor` metadata JSON from fuzz bytes, on a FixedSizeList column of a
/// fuzzed width. The metadata must parse or be refused; a column it does not fit must be refused
/// when converted, never read out of bounds.
pub fn tensor_metadata(input: &[u8]) {
    let (width, json) = match input.split_first() {
        Some((&w, rest)) => (w as i32 % 32, rest),
        None => return,
    };
    let Ok(json) = std::str::from_utf8(json) else { return };
    if let Ok(meta) = TensorMetadata::parse(json) {
        let _ = (meta.cell_size(), meta.logical_shape(), meta.logical_strides());
        let again = TensorMetadata::parse(&meta.to_json()).expect("our own JSON parses");
        assert_eq!(again, meta);
    }
    let rows = 3usize;
    let values = Float32Array::from_iter_values((0..rows * width as usize).map(|i| i as f32));
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let Ok(list) = FixedSizeListArray::try_new(item.clone(), width, Arc::new(values), None) else { return };
    let metadata = [
        (EXTENSION_NAME_KEY.to_string(), FIXED_SHAPE_TENSOR.to_string()),
        (EXTENSION_METADATA_KEY.to_string(), json.to_string()),
    ];
    let field: FieldRef = Arc::new(
        Field::new("t", DataType::FixedSizeList(item, width), false)
            .with_metadata(metadata.into_iter().collect()),
    );
    let chunks = [Arc::new(list) as ArrayRef];
    if let Ok(c) = to_tensor(&field, &chunks, &ExportOptions::default()) {
        assert_eq!(c.values.numel(), rows * width as usize, "the tensor holds exactly the column's values");
        let _ = contiguous_copy(&c.values).expect("an accepted tensor can be copied");
    }
}

/// A Parquet file from fuzz bytes that start with `PAR1`, read whole by [`ParquetFile::read`]
/// (the direct path where it applies, arrow-rs's reader otherwise); for other bytes, a run of
/// the RLE / bit-packed hybrid encoding that the direct path decodes (the first byte its width,
/// 64 values). A malformed file must be an error, never a panic or a read past the bytes.
///
/// [`ParquetFile::read`]: crate::parquet::ParquetFile::read
#[cfg(feature = "parquet")]
pub fn parquet_file(input: &[u8]) {
    use crate::options::{NullPolicy, Scalar};
    use crate::parquet::{ParquetFile, hybrid};
    if !input.starts_with(b"PAR1") {
        let (width, data) = input.split_first().map_or((0, &[][..]), |(w, d)| (*w % 40, d));
        let mut out = [0u32; 64];
        if let Ok(read) = hybrid::decode(data, width, &mut out) {
            assert!(read <= data.len(), "read {read} of {} bytes", data.len());
        }
        return;
    }
    let bytes = bytes::Bytes::copy_from_slice(input);
    let Ok(file) = ParquetFile::from_bytes("fuzz.parquet".into(), bytes) else { return };
    let units: Vec<usize> = (0..file.units().len()).collect();
    let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..ExportOptions::default() };
    if let Ok(m) = file.read(&units, &opts) {
        assert_eq!(m.values.shape()[0] as u64, file.units().iter().sum::<u64>());
    }
}

//! Random Arrow inputs for the emulator tests: reproducible (xorshift), sliced at bit offsets,
//! with nulls, NaNs, infinities and values that do and do not survive narrowing casts.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, make_array};
use arrow_buffer::{Buffer, NullBuffer};
use arrow_data::ArrayData;
use half::{bf16, f16};

use crate::dtype::DType;
use crate::options::NullPolicy;
use crate::options::Scalar;

/// xorshift64*: reproducible inputs without a dependency.
pub(super) struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A value of `dtype`'s bytes: mostly small whole numbers (so narrowing casts often pass),
/// some halves, and some raw bit patterns (NaN, infinities, huge values).
pub(super) fn value(rng: &mut Rng, dtype: DType) -> Vec<u8> {
    let item = dtype.itemsize();
    if rng.chance(0.08) {
        return rng.next().to_le_bytes()[..item].to_vec();
    }
    let v = rng.below(200) as f64 - 100.0 + if dtype.is_float() && rng.chance(0.2) { 0.5 } else { 0.0 };
    match dtype {
        DType::Int8 => (v as i8).to_le_bytes().to_vec(),
        DType::Int16 => (v as i16).to_le_bytes().to_vec(),
        DType::Int32 => (v as i32).to_le_bytes().to_vec(),
        DType::Int64 => (v as i64).to_le_bytes().to_vec(),
        DType::UInt8 => (v.abs() as u8).to_le_bytes().to_vec(),
        DType::UInt16 => (v.abs() as u16).to_le_bytes().to_vec(),
        DType::UInt32 => (v.abs() as u32).to_le_bytes().to_vec(),
        DType::UInt64 => (v.abs() as u64).to_le_bytes().to_vec(),
        DType::Float16 => f16::from_f64(v).to_le_bytes().to_vec(),
        DType::BFloat16 => bf16::from_f64(v).to_le_bytes().to_vec(),
        DType::Float8E4M3FN => vec![crate::dtype::F8E4M3FN::from_f64(v).to_bits()],
        DType::Float8E5M2 => vec![crate::dtype::F8E5M2::from_f64(v).to_bits()],
        DType::Float32 => (v as f32).to_le_bytes().to_vec(),
        DType::Float64 => v.to_le_bytes().to_vec(),
        DType::Bool => unreachable!("bools are built as bits"),
    }
}

/// Bytes in a 64-byte aligned Arrow buffer, as Arrow allocates them.
pub(super) fn aligned_buffer(bytes: &[u8]) -> Buffer {
    let mut b = arrow_buffer::MutableBuffer::new(bytes.len());
    b.extend_from_slice(bytes);
    b.into()
}

pub(super) fn validity(rng: &mut Rng, len: usize, p_null: f64) -> Option<NullBuffer> {
    (p_null > 0.0).then(|| NullBuffer::from((0..len).map(|_| !rng.chance(p_null)).collect::<Vec<_>>()))
}

/// A random array of `dtype` with `len` rows, sliced from a longer one (so its values and
/// validity start at a bit offset).
pub(super) fn array(rng: &mut Rng, dtype: DType, len: usize, p_null: f64) -> ArrayRef {
    let off = rng.below(13) as usize;
    let total = off + len;
    let nulls = validity(rng, total, p_null);
    let a: ArrayRef = if dtype == DType::Bool {
        let bits: Vec<bool> = (0..total).map(|_| rng.chance(0.5)).collect();
        Arc::new(BooleanArray::new(bits.into(), nulls))
    } else {
        let values: Vec<u8> = (0..total).flat_map(|_| value(rng, dtype)).collect();
        let data = ArrayData::builder(dtype.to_arrow())
            .len(total)
            .add_buffer(aligned_buffer(&values))
            .nulls(nulls)
            .build()
            .unwrap();
        make_array(data)
    };
    a.slice(off, len)
}

pub(super) fn random_dtype(rng: &mut Rng) -> DType {
    DType::ALL[rng.below(DType::ALL.len() as u64) as usize]
}

pub(super) fn random_nulls(rng: &mut Rng, float: bool) -> NullPolicy {
    match rng.below(5) {
        0 => NullPolicy::Error,
        1 => NullPolicy::Mask,
        2 if float => NullPolicy::Nan,
        3 => NullPolicy::Fill(Scalar::Float(rng.below(7) as f64 - 3.0)),
        _ => NullPolicy::Fill(Scalar::Int(if rng.chance(0.1) { 1000 } else { rng.below(3) as i64 })),
    }
}

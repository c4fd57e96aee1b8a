//! Every kernel of `dlframe::kernels` against a plain scalar reference written here (bit by
//! bit reads, nested index loops, exact i128 range checks), on random lengths, bit offsets,
//! null densities, chunkings, shapes and strides (negative and zero), column types and
//! orders. Arrow's own `BooleanBuffer` is the oracle for the bit layout.

use arrow_buffer::BooleanBuffer;
use dlframe::dtype::{F8E4M3FN, F8E5M2};
use dlframe::kernels::{
    BitSlice, Column, ColumnRef, Element, Num, PARALLEL_THRESHOLD_BYTES, Typed, can_cast_safely, cast,
    common_dtype, concat_fill_into, concat_into, contiguous_copy, fill_nulls, fill_value, gather_strided,
    interleave, pack_bits, unpack_bits, unpack_bits_fill,
};
use dlframe::options::{Inexact, Order, Scalar};
use dlframe::{DType, Device, Error, Tensor};
use half::{bf16, f16};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Deterministic random data from a proptest seed.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        (self.below(1 << 20) as f64) < p * (1 << 20) as f64
    }
}

/// `off + len` random bits, a fraction `nulls` of them false (exactly none for 0, all for 1).
fn bools(n: usize, nulls: f64, rng: &mut Rng) -> Vec<bool> {
    (0..n).map(|_| !rng.chance(nulls)).collect()
}

/// The bools as an Arrow bitmap sliced at `off`: Arrow decides where each bit lives.
fn arrow_bits(v: &[bool], off: usize) -> BooleanBuffer {
    BooleanBuffer::from(v).slice(off, v.len() - off)
}

fn view(b: &BooleanBuffer) -> BitSlice<'_> {
    BitSlice::new(b.values(), b.offset(), b.len()).unwrap()
}

fn densities() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(0.1), Just(0.5), Just(1.0)]
}

// ---------------------------------------------------------------------------------------------
// Bits.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bit_slices_read_like_arrow(len in 0usize..5000, off in 0usize..64, d in densities(), seed: u64) {
        let mut rng = Rng::new(seed);
        let v = bools(off + len, d, &mut rng);
        let arrow = arrow_bits(&v, off);
        let s = view(&arrow);
        prop_assert_eq!(s.len(), len);
        for i in 0..len {
            prop_assert_eq!(s.get(i), arrow.value(i), "bit {}", i);
        }
        prop_assert_eq!(s.count_zeros(), len - arrow.count_set_bits());
        for _ in 0..20.min(len) {
            let i = rng.below(len as u64) as usize;
            let want = (i..len.min(i + 64)).map(|j| (arrow.value(j) as u64) << (j - i)).sum::<u64>();
            prop_assert_eq!(s.word(i), want, "word at {}", i);
        }
        let (a, b) = (rng.below(len as u64 + 1) as usize, rng.below(len as u64 + 1) as usize);
        let (a, b) = (a.min(b), a.max(b));
        let sub = s.slice(a, b - a);
        prop_assert_eq!(sub.count_zeros(), (a..b).filter(|&i| !v[off + i]).count());
    }

    #[test]
    fn bit_slices_refuse_bits_past_the_end(bytes in 0usize..20, off in 0usize..200, len in 0usize..200) {
        let buf = vec![0u8; bytes];
        let fits = off + len <= bytes * 8;
        prop_assert_eq!(BitSlice::new(&buf, off, len).is_ok(), fits);
        prop_assert!(BitSlice::new(&buf, usize::MAX - len / 2, len / 2 + 2).is_err());
    }

    #[test]
    fn unpack_matches_bit_by_bit(len in 0usize..5000, off in 0usize..64, d in densities(), seed: u64) {
        let v = bools(off + len, d, &mut Rng::new(seed));
        let arrow = arrow_bits(&v, off);
        let mut out = vec![7u8; len];
        unpack_bits(view(&arrow), &mut out);
        let want: Vec<u8> = (0..len).map(|i| v[off + i] as u8).collect();
        prop_assert_eq!(out, want);
    }

    #[test]
    fn unpack_with_fill_matches_bit_by_bit(
        len in 0usize..5000, voff in 0usize..64, koff in 0usize..64, d in densities(),
        nulls: bool, fill: u8, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let v = bools(voff + len, 0.5, &mut rng);
        let ok = bools(koff + len, d, &mut rng);
        let (values, validity) = (arrow_bits(&v, voff), arrow_bits(&ok, koff));
        let mut out = vec![9u8; len];
        unpack_bits_fill(view(&values), nulls.then(|| view(&validity)), fill, &mut out).unwrap();
        let want: Vec<u8> =
            (0..len).map(|i| if !nulls || ok[koff + i] { v[voff + i] as u8 } else { fill }).collect();
        prop_assert_eq!(out, want);
    }

    #[test]
    fn pack_matches_arrow_and_inverts_unpack(len in 0usize..5000, d in densities(), seed: u64) {
        let mut rng = Rng::new(seed);
        // Any nonzero byte is true, not just 1.
        let bytes: Vec<u8> = (0..len).map(|_| if rng.chance(d) { 0 } else { 1 + rng.below(255) as u8 }).collect();
        let truth: Vec<bool> = bytes.iter().map(|&b| b != 0).collect();
        let mut packed = vec![0xa5u8; len.div_ceil(8)];
        pack_bits(&bytes, &mut packed);
        let arrow = BooleanBuffer::from(&truth[..]);
        prop_assert_eq!(&packed[..], &arrow.values()[..len.div_ceil(8)]);
        if len % 8 != 0 {
            prop_assert_eq!(packed[len / 8] >> (len % 8), 0, "padding bits are 0");
        }
        let mut back = vec![0u8; len];
        unpack_bits(BitSlice::new(&packed, 0, len).unwrap(), &mut back);
        prop_assert_eq!(back, truth.iter().map(|&b| b as u8).collect::<Vec<_>>());
    }
}

// ---------------------------------------------------------------------------------------------
// Null fill and concatenation.

fn reference_fill<T: Copy>(values: &[T], valid: Option<(&[bool], usize)>, fill: T) -> Vec<T> {
    (0..values.len())
        .map(|i| if valid.is_none_or(|(v, off)| v[off + i]) { values[i] } else { fill })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn fill_nulls_matches_reference(
        len in 0usize..5000, off in 0usize..64, d in densities(), has_validity: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let valid = bools(off + len, d, &mut rng);
        let arrow = arrow_bits(&valid, off);
        let validity = has_validity.then(|| view(&arrow));
        let reference = has_validity.then_some((&valid[..], off));
        let floats: Vec<f32> = (0..len).map(|_| rng.next() as f32).collect();
        let mut out = vec![0f32; len];
        fill_nulls(&floats, validity, f32::NAN, &mut out).unwrap();
        let want = reference_fill(&floats, reference, f32::NAN);
        prop_assert_eq!(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let bytes: Vec<i8> = (0..len).map(|_| rng.next() as i8).collect();
        let mut out = vec![0i8; len];
        fill_nulls(&bytes, validity, -1, &mut out).unwrap();
        prop_assert_eq!(out, reference_fill(&bytes, reference, -1));
        let wide: Vec<u64> = (0..len).map(|_| rng.next()).collect();
        let mut out = vec![0u64; len];
        fill_nulls(&wide, validity, 3, &mut out).unwrap();
        prop_assert_eq!(out, reference_fill(&wide, reference, 3));
    }

    #[test]
    fn concat_matches_reference(
        lens in prop::collection::vec(0usize..700, 0..12), d in densities(), fill: i32, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let chunks: Vec<Vec<i32>> = lens.iter().map(|&n| (0..n).map(|_| rng.next() as i32).collect()).collect();
        // Each chunk: no validity, or its own bitmap at its own bit offset.
        let valids: Vec<Option<(Vec<bool>, usize)>> = lens
            .iter()
            .map(|&n| {
                let off = rng.below(64) as usize;
                rng.chance(0.7).then(|| (bools(off + n, d, &mut rng), off))
            })
            .collect();
        let arrows: Vec<Option<BooleanBuffer>> = valids.iter().map(|v| v.as_ref().map(|(v, off)| arrow_bits(v, *off))).collect();
        let total: usize = lens.iter().sum();

        let refs: Vec<&[i32]> = chunks.iter().map(|c| &c[..]).collect();
        let mut out = vec![0i32; total];
        concat_into(&refs, &mut out).unwrap();
        prop_assert_eq!(&out, &chunks.concat());

        let parts: Vec<(&[i32], Option<BitSlice>)> = chunks.iter().zip(&arrows).map(|(c, a)| (&c[..], a.as_ref().map(view))).collect();
        concat_fill_into(&parts, fill, &mut out).unwrap();
        let want: Vec<i32> = chunks
            .iter()
            .zip(&valids)
            .flat_map(|(c, v)| reference_fill(c, v.as_ref().map(|(v, off)| (&v[..], *off)), fill))
            .collect();
        prop_assert_eq!(&out, &want);

        // One element too many or too few is an error, never a panic.
        let mut longer = vec![0i32; total + 1];
        prop_assert!(matches!(concat_into(&refs, &mut longer), Err(Error::LengthMismatch { .. })), "one too many");
        prop_assert!(concat_fill_into(&parts, fill, &mut longer).is_err());
        if total > 0 {
            prop_assert!(concat_into(&refs, &mut out[1..]).is_err());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Strided gathers.

/// Shapes of 0..=4 dimensions (sizes 0..6), and for each a stride pattern: random (negative
/// and zero included), C-contiguous, or C-contiguous with some dimensions reversed or
/// broadcast, so both the row-copy and the element paths run.
fn layouts() -> impl Strategy<Value = (Vec<usize>, Vec<isize>)> {
    prop::collection::vec(0usize..6, 0..=4).prop_flat_map(|shape| {
        let nd = shape.len();
        let random = prop::collection::vec(-7isize..8, nd).boxed();
        let shape2 = shape.clone();
        let contiguous = prop::collection::vec(0u8..4, nd)
            .prop_map(move |kinds| {
                let mut strides = vec![0isize; nd];
                let mut acc = 1isize;
                for k in (0..nd).rev() {
                    strides[k] = match kinds[k] {
                        0 => -acc,
                        1 => 0,
                        _ => acc,
                    };
                    acc *= shape2[k].max(1) as isize;
                }
                strides
            })
            .boxed();
        (Just(shape), prop_oneof![random, contiguous])
    })
}

/// The element offsets a view reaches, from its lowest to its highest.
fn extent(shape: &[usize], strides: &[isize]) -> (isize, isize) {
    let (mut lo, mut hi) = (0, 0);
    for (&d, &s) in shape.iter().zip(strides) {
        let far = (d.max(1) as isize - 1) * s;
        if far < 0 { lo += far } else { hi += far }
    }
    (lo, hi)
}

/// Nested index loops (as an odometer over the C-order flat index).
fn reference_gather<T: Copy>(data: &[T], start: isize, shape: &[usize], strides: &[isize]) -> Vec<T> {
    let numel: usize = shape.iter().product();
    (0..numel)
        .map(|flat| {
            let (mut rem, mut at) = (flat, start);
            for (&d, &s) in shape.iter().zip(strides).rev() {
                at += (rem % d) as isize * s;
                rem /= d;
            }
            data[at as usize]
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gather_matches_nested_loops((shape, strides) in layouts(), seed: u64) {
        let (lo, hi) = extent(&shape, &strides);
        let mut rng = Rng::new(seed);
        let data: Vec<u32> = (0..(hi - lo + 1) as usize).map(|_| rng.next() as u32).collect();
        let numel: usize = shape.iter().product();
        let mut out = vec![0u32; numel];
        // SAFETY: every reachable offset lies in [lo, hi] around data[-lo], inside `data`.
        unsafe { gather_strided(data.as_ptr().offset(-lo), &shape, &strides, &mut out) }.unwrap();
        prop_assert_eq!(&out, &reference_gather(&data, -lo, &shape, &strides));

        // Three-byte elements (alignment 1) take the same paths.
        let bytes: Vec<[u8; 3]> = data.iter().map(|x| [*x as u8, (x >> 8) as u8, (x >> 16) as u8]).collect();
        let mut out3 = vec![[0u8; 3]; numel];
        // SAFETY: as above.
        unsafe { gather_strided(bytes.as_ptr().offset(-lo), &shape, &strides, &mut out3) }.unwrap();
        prop_assert_eq!(&out3, &reference_gather(&bytes, -lo, &shape, &strides));

        // A wrong output length is an error, never a read.
        let mut wrong = vec![0u32; numel + 1];
        // SAFETY: refused before any read.
        prop_assert!(unsafe { gather_strided(data.as_ptr(), &shape, &strides, &mut wrong) }.is_err(), "wrong length");
    }

    #[test]
    fn contiguous_copy_of_a_tensor_matches_nested_loops((shape, strides) in layouts()) {
        let (lo, hi) = extent(&shape, &strides);
        let base = Tensor::from_vec((0..(hi - lo + 1) as i64).collect::<Vec<_>>(), vec![(hi - lo + 1) as i64]).unwrap();
        // SAFETY: every reachable element is inside `base`, which the owner keeps alive.
        let t = unsafe {
            Tensor::from_raw_parts(
                (base.data_ptr() as *mut i64).offset(-lo) as *mut u8,
                shape.iter().map(|&d| d as i64).collect(),
                Some(strides.iter().map(|&s| s as i64).collect()),
                DType::Int64,
                Device::Cpu,
                true,
                base.owner().clone(),
            )
        }.unwrap();
        let copy = contiguous_copy(&t).unwrap();
        prop_assert!(copy.is_c_contiguous() && copy.copied());
        let data = base.as_slice::<i64>().unwrap();
        prop_assert_eq!(copy.as_slice::<i64>().unwrap(), &reference_gather(data, -lo, &shape, &strides)[..]);
    }
}

// ---------------------------------------------------------------------------------------------
// Casts, fill values, promotion, interleave.

/// An exact value: every integer of every type, or a float (exact for f16/f32/f64).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Exact {
    I(i128),
    F(f64),
}

/// The reference conversion: exact i128 range checks, and floats rounded once by Rust.
trait Target: Typed {
    fn expect(v: Exact) -> Option<Self>;
    /// The bits, every NaN alike (a NaN's payload is not part of its value).
    fn bits(self) -> u64;
}

fn finite<D: Element>(x: D) -> bool {
    !matches!(x.to_num(), Num::Float(y) if y.is_infinite())
}

/// Under [`Inexact::Error`], an integer that the float target does not hold exactly is refused.
fn exact_only<D: Element>(v: Exact, x: Option<D>, inexact: Inexact) -> Option<D> {
    match (v, x.map(|d| d.to_num())) {
        (Exact::I(i), Some(Num::Float(f))) if inexact == Inexact::Error && f as i128 != i => None,
        _ => x,
    }
}

/// A float target refuses a finite value it cannot hold, rather than making it infinite;
/// infinities themselves pass.
fn no_overflow<D: Element>(v: Exact, x: D) -> Option<D> {
    (matches!(v, Exact::F(f) if f.is_infinite()) || finite(x)).then_some(x)
}

macro_rules! int_target {
    ($($t:ty),*) => {$(
        impl Target for $t {
            fn expect(v: Exact) -> Option<Self> {
                match v {
                    Exact::I(i) => <$t>::try_from(i).ok(),
                    // `f as i128` is exact for every whole float below 2^127 in magnitude.
                    Exact::F(f) if f.is_finite() && f.fract() == 0.0 => <$t>::try_from(f as i128).ok(),
                    Exact::F(_) => None,
                }
            }
            fn bits(self) -> u64 {
                self as u64
            }
        }
    )*};
}
int_target!(i8, i16, i32, i64, u8, u16, u32, u64);

impl Target for f32 {
    fn expect(v: Exact) -> Option<Self> {
        no_overflow(
            v,
            match v {
                Exact::I(i) => i as f32,
                Exact::F(f) => f as f32,
            },
        )
    }
    fn bits(self) -> u64 {
        if self.is_nan() { u64::MAX } else { self.to_bits() as u64 }
    }
}

impl Target for f64 {
    fn expect(v: Exact) -> Option<Self> {
        no_overflow(
            v,
            match v {
                Exact::I(i) => i as f64,
                Exact::F(f) => f,
            },
        )
    }
    fn bits(self) -> u64 {
        if self.is_nan() { u64::MAX } else { self.to_bits() }
    }
}

impl Target for f16 {
    fn expect(v: Exact) -> Option<Self> {
        no_overflow(
            v,
            match v {
                // Exact in f32 below 2^24, and infinite in f16 above 65520 either way.
                Exact::I(i) => f16::from_f32(i as f32),
                Exact::F(f) => f16::from_f64(f),
            },
        )
    }
    fn bits(self) -> u64 {
        if self.is_nan() { u64::MAX } else { self.to_bits() as u64 }
    }
}

/// bfloat16's reference: the nearest value found by bisecting the (monotone) bit patterns and
/// comparing exactly, ties to the even pattern; beyond the largest finite value the next
/// pattern is infinity. Independent of `half`'s and dlframe's rounding code.
impl Target for bf16 {
    fn expect(v: Exact) -> Option<Self> {
        let x = match v {
            Exact::F(f) if f.is_nan() => return Some(bf16::NAN),
            Exact::F(f) => Mag::F(f),
            Exact::I(i) if i.abs() < 1 << 53 => Mag::F(i as f64),
            Exact::I(i) => Mag::I(i),
        };
        let negative = match x {
            Mag::F(f) => f.is_sign_negative(),
            Mag::I(i) => i < 0,
        };
        // Largest pattern whose value is <= |x| (0x7f80 is infinity).
        let (mut lo, mut hi) = (0u16, 0x7f80u16);
        if !x.below(hi) {
            lo = hi;
        } else {
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if x.below(mid) { hi = mid } else { lo = mid }
            }
        }
        let pick = if lo == 0x7f80 || x.at(lo) {
            lo
        } else {
            // Compare the distances to lo and lo + 1 exactly (infinity counts as 2^128).
            match x.cmp_mid(lo) {
                std::cmp::Ordering::Less => lo,
                std::cmp::Ordering::Greater => lo + 1,
                std::cmp::Ordering::Equal => {
                    if lo % 2 == 0 {
                        lo
                    } else {
                        lo + 1
                    }
                }
            }
        };
        let out = bf16::from_bits(pick | if negative { 0x8000 } else { 0 });
        no_overflow(v, out)
    }
    fn bits(self) -> u64 {
        if self.is_nan() { u64::MAX } else { self.to_bits() as u64 }
    }
}

/// float8's reference: the value of a non-negative pattern from the format's bit layout
/// (`man` mantissa bits, exponent `bias`), written out here apart from dlframe's codec.
fn f8_value(bits: u8, man: u32, bias: i32) -> f64 {
    let (e, m) = ((bits >> man) as i32, (bits & ((1 << man) - 1)) as f64);
    let scale = |k: i32| 2f64.powi(k);
    if e == 0 { m * scale(1 - bias - man as i32) } else { (1.0 + m / scale(man as i32)) * scale(e - bias) }
}

/// float8's reference rounding: the nearest finite pattern up to `max` (the largest finite
/// one), comparing exactly against midpoints, ties to the even pattern; the pattern after `max`
/// stands for overflow, which is refused (infinities pass where the format has them, `inf`).
/// Returns the bits.
fn f8_expect(v: Exact, man: u32, bias: i32, max: u8, inf: Option<u8>, nan: u8) -> Option<u8> {
    let x = match v {
        Exact::F(f) if f.is_nan() => return Some(nan),
        Exact::F(f) if f.is_infinite() => return inf.map(|b| b | if f < 0.0 { 0x80 } else { 0 }),
        Exact::F(f) => f,
        // Beyond 2^53 every integer overflows float8 anyway.
        Exact::I(i) => i as f64,
    };
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let value = |p: u8| {
        if p > max {
            2.0 * f8_value(max, man, bias) - f8_value(max - 1, man, bias)
        } else {
            f8_value(p, man, bias)
        }
    };
    let lo = (0..=max).rev().find(|&p| value(p) <= a).unwrap_or(0);
    let pick = if value(lo) == a {
        lo
    } else {
        match (2.0 * a).partial_cmp(&(value(lo) + value(lo + 1))).unwrap() {
            std::cmp::Ordering::Less => lo,
            std::cmp::Ordering::Greater => lo + 1,
            std::cmp::Ordering::Equal => lo + (lo % 2),
        }
    };
    (pick <= max).then_some(pick | sign)
}

impl Target for F8E4M3FN {
    fn expect(v: Exact) -> Option<Self> {
        f8_expect(v, 3, 7, 0x7e, None, 0x7f).map(F8E4M3FN::from_bits)
    }
    fn bits(self) -> u64 {
        if self.is_nan() { u64::MAX } else { self.to_bits() as u64 }
    }
}

impl Target for F8E5M2 {
    fn expect(v: Exact) -> Option<Self> {
        f8_expect(v, 2, 15, 0x7b, Some(0x7c), 0x7e).map(F8E5M2::from_bits)
    }
    fn bits(self) -> u64 {
        if self.is_nan() { u64::MAX } else { self.to_bits() as u64 }
    }
}

/// The magnitude of a value to round: a float, or an integer beyond 2^53 (where every
/// bfloat16 near it is an integer too).
#[derive(Clone, Copy)]
enum Mag {
    F(f64),
    I(i128),
}

impl Mag {
    /// The value of a non-negative bfloat16 pattern, with infinity as 2^128.
    fn value(bits: u16) -> f64 {
        if bits == 0x7f80 { 2f64.powi(128) } else { bf16::from_bits(bits).to_f64() }
    }
    fn below(self, bits: u16) -> bool {
        match self {
            Mag::F(f) => f.abs() < Mag::value(bits),
            Mag::I(i) => i.unsigned_abs() < Mag::value(bits) as u128,
        }
    }
    fn at(self, bits: u16) -> bool {
        match self {
            Mag::F(f) => f.abs() == Mag::value(bits),
            Mag::I(i) => i.unsigned_abs() == Mag::value(bits) as u128,
        }
    }
    /// |x| against the midpoint of pattern `lo` and the next one.
    fn cmp_mid(self, lo: u16) -> std::cmp::Ordering {
        let (a, b) = (Mag::value(lo), Mag::value(lo + 1));
        match self {
            // 2|x| vs a + b: both sides exact in f64 (a power-of-two scaling and one rounding-free sum).
            Mag::F(f) => (2.0 * f.abs()).partial_cmp(&(a + b)).unwrap(),
            Mag::I(i) => (2 * i.unsigned_abs()).cmp(&(a as u128 + b as u128)),
        }
    }
}

/// A column's values, owned, of one of the numeric types.
#[derive(Debug)]
enum Owned {
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    F16(Vec<f16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    F8E4M3FN(Vec<F8E4M3FN>),
    F8E5M2(Vec<F8E5M2>),
}

/// Every dtype but bool.
fn numeric_dtypes() -> Vec<DType> {
    DType::ALL.into_iter().filter(|d| *d != DType::Bool).collect()
}

/// Integers near every type's edges.
fn int_edges() -> Vec<i128> {
    let mut v = vec![0, 1, -1, 2, 100];
    for bits in [7, 8, 15, 16, 31, 32, 53, 63, 64] {
        let p = 1i128 << bits;
        v.extend([p - 2, p - 1, p, p + 1, -p - 1, -p, -p + 1]);
    }
    // Beside bfloat16's ties beyond 2^53, where a rounding through f64 would land on the tie.
    for bits in [56, 60, 62] {
        let tie = (1i128 << bits) + (1i128 << (bits - 8));
        v.extend([tie - 1, tie, tie + 1, -tie - 1]);
    }
    v
}

/// Floats near every integer type's edges, and the ones no integer holds.
fn float_edges() -> Vec<f64> {
    let mut v = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.5,
        -0.0,
        1.5,
        -2.5,
        1e300,
        -1e300,
        65504.0,
        65520.0,
    ];
    v.extend(int_edges().into_iter().map(|i| i as f64));
    v
}

impl Owned {
    /// `n` values of `dtype`: small whole numbers (which every type holds) when `tame`,
    /// else a mix of edge values and random bit patterns.
    fn random(dtype: DType, n: usize, tame: bool, rng: &mut Rng) -> Owned {
        let (ints, floats) = (int_edges(), float_edges());
        let int = |rng: &mut Rng| -> i128 {
            match (tame, rng.below(3)) {
                (true, _) => rng.below(101) as i128,
                (false, 0) => rng.next() as i64 as i128,
                _ => ints[rng.below(ints.len() as u64) as usize],
            }
        };
        let float = |rng: &mut Rng| -> f64 {
            match (tame, rng.below(3)) {
                (true, _) => rng.below(101) as f64,
                (false, 0) => f64::from_bits(rng.next()),
                _ => floats[rng.below(floats.len() as u64) as usize],
            }
        };
        macro_rules! ints {
            ($v:ident, $t:ty) => {
                Owned::$v(
                    (0..n)
                        .map(|_| {
                            let i = int(rng);
                            <$t>::try_from(i).unwrap_or(i as $t)
                        })
                        .collect(),
                )
            };
        }
        match dtype {
            DType::Int8 => ints!(I8, i8),
            DType::Int16 => ints!(I16, i16),
            DType::Int32 => ints!(I32, i32),
            DType::Int64 => ints!(I64, i64),
            DType::UInt8 => ints!(U8, u8),
            DType::UInt16 => ints!(U16, u16),
            DType::UInt32 => ints!(U32, u32),
            DType::UInt64 => ints!(U64, u64),
            DType::Float16 => Owned::F16((0..n).map(|_| f16::from_f64(float(rng))).collect()),
            DType::Float32 => Owned::F32((0..n).map(|_| float(rng) as f32).collect()),
            DType::Float64 => Owned::F64((0..n).map(|_| float(rng)).collect()),
            DType::BFloat16 => Owned::BF16((0..n).map(|_| bf16::from_f64(float(rng))).collect()),
            DType::Float8E4M3FN => Owned::F8E4M3FN((0..n).map(|_| F8E4M3FN::from_f64(float(rng))).collect()),
            DType::Float8E5M2 => Owned::F8E5M2((0..n).map(|_| F8E5M2::from_f64(float(rng))).collect()),
            DType::Bool => unreachable!("not a numeric column"),
        }
    }

    fn as_ref(&self) -> ColumnRef<'_> {
        match self {
            Owned::I8(v) => v[..].into(),
            Owned::I16(v) => v[..].into(),
            Owned::I32(v) => v[..].into(),
            Owned::I64(v) => v[..].into(),
            Owned::U8(v) => v[..].into(),
            Owned::U16(v) => v[..].into(),
            Owned::U32(v) => v[..].into(),
            Owned::U64(v) => v[..].into(),
            Owned::F16(v) => v[..].into(),
            Owned::F32(v) => v[..].into(),
            Owned::F64(v) => v[..].into(),
            Owned::BF16(v) => v[..].into(),
            Owned::F8E4M3FN(v) => v[..].into(),
            Owned::F8E5M2(v) => v[..].into(),
        }
    }

    fn get(&self, i: usize) -> Exact {
        match self {
            Owned::I8(v) => Exact::I(v[i] as i128),
            Owned::I16(v) => Exact::I(v[i] as i128),
            Owned::I32(v) => Exact::I(v[i] as i128),
            Owned::I64(v) => Exact::I(v[i] as i128),
            Owned::U8(v) => Exact::I(v[i] as i128),
            Owned::U16(v) => Exact::I(v[i] as i128),
            Owned::U32(v) => Exact::I(v[i] as i128),
            Owned::U64(v) => Exact::I(v[i] as i128),
            Owned::F16(v) => Exact::F(v[i].to_f64()),
            Owned::F32(v) => Exact::F(v[i] as f64),
            Owned::F64(v) => Exact::F(v[i]),
            Owned::BF16(v) => Exact::F(v[i].to_f64()),
            Owned::F8E4M3FN(v) => Exact::F(v[i].to_f64()),
            Owned::F8E5M2(v) => Exact::F(v[i].to_f64()),
        }
    }
}

/// One random interleave case checked against the reference for target `D`.
fn check_interleave<D: Target>(
    n: usize,
    types: &[DType],
    order: Order,
    with_fill: bool,
    d: f64,
    seed: u64,
) -> Result<(), TestCaseError> {
    let mut rng = Rng::new(seed);
    let k = types.len();
    let values: Vec<Owned> = types.iter().map(|&t| Owned::random(t, n, rng.chance(0.6), &mut rng)).collect();
    let valids: Vec<Option<(Vec<bool>, usize)>> = (0..k)
        .map(|_| {
            let off = rng.below(64) as usize;
            rng.chance(0.5).then(|| (bools(off + n, d, &mut rng), off))
        })
        .collect();
    let arrows: Vec<Option<BooleanBuffer>> =
        valids.iter().map(|v| v.as_ref().map(|(v, off)| arrow_bits(v, *off))).collect();
    let names: Vec<String> =
        (0..k).map(|j| if j % 2 == 0 { String::new() } else { format!("c{j}") }).collect();
    let cols: Vec<Column> = (0..k)
        .map(|j| Column {
            values: values[j].as_ref(),
            validity: arrows[j].as_ref().map(view),
            name: &names[j],
            first_row: 0,
        })
        .collect();
    let fill = with_fill.then(|| D::expect(Exact::I(7)).unwrap());
    let inexact = if rng.chance(0.5) { Inexact::Error } else { Inexact::Round };
    let mut out = vec![D::default(); n * k];
    let got = interleave(&cols, order, fill, inexact, &mut out);

    let is_valid = |j: usize, r: usize| valids[j].as_ref().is_none_or(|(v, off)| v[off + r]);
    let label = |j: usize| if names[j].is_empty() { j.to_string() } else { format!("'{}'", names[j]) };
    let has_nulls = (0..k).any(|j| (0..n).any(|r| !is_valid(j, r)));
    if has_nulls && !with_fill {
        prop_assert!(matches!(got, Err(Error::InvalidArgument(_))), "{:?}", got);
        return Ok(());
    }
    let mut bad = Vec::new();
    let mut want = vec![0u64; n * k];
    for r in 0..n {
        for (j, column) in values.iter().enumerate() {
            let at = match order {
                Order::C => r * k + j,
                Order::F => j * n + r,
            };
            want[at] = if !is_valid(j, r) {
                fill.unwrap().bits()
            } else {
                match exact_only(column.get(r), D::expect(column.get(r)), inexact) {
                    Some(x) => x.bits(),
                    None => {
                        bad.push(format!("at row {r} of column {}", label(j)));
                        0
                    }
                }
            };
        }
    }
    if bad.is_empty() {
        prop_assert!(got.is_ok(), "{:?}", got);
        prop_assert_eq!(out.iter().map(|x| x.bits()).collect::<Vec<_>>(), want);
    } else {
        match got {
            Err(Error::ValueOutOfRange { place, target, .. } | Error::InexactCast { place, target, .. }) => {
                prop_assert!(
                    bad.contains(&place.to_string()),
                    "{} is not one of the bad cells {:?}",
                    place,
                    bad
                );
                prop_assert_eq!(target, D::DTYPE.to_string());
            }
            other => prop_assert!(false, "expected a refused cast at one of {:?}, got {:?}", bad, other),
        }
    }
    Ok(())
}

macro_rules! with_target {
    ($dtype:expr, $D:ident => $body:expr) => {
        match $dtype {
            DType::Int8 => {
                type $D = i8;
                $body
            }
            DType::Int16 => {
                type $D = i16;
                $body
            }
            DType::Int32 => {
                type $D = i32;
                $body
            }
            DType::Int64 => {
                type $D = i64;
                $body
            }
            DType::UInt8 => {
                type $D = u8;
                $body
            }
            DType::UInt16 => {
                type $D = u16;
                $body
            }
            DType::UInt32 => {
                type $D = u32;
                $body
            }
            DType::UInt64 => {
                type $D = u64;
                $body
            }
            DType::Float16 => {
                type $D = f16;
                $body
            }
            DType::Float32 => {
                type $D = f32;
                $body
            }
            DType::Float64 => {
                type $D = f64;
                $body
            }
            DType::BFloat16 => {
                type $D = bf16;
                $body
            }
            DType::Float8E4M3FN => {
                type $D = F8E4M3FN;
                $body
            }
            DType::Float8E5M2 => {
                type $D = F8E5M2;
                $body
            }
            DType::Bool => unreachable!(),
        }
    };
}

fn numeric() -> impl Strategy<Value = DType> {
    prop::sample::select(numeric_dtypes())
}

/// The integer range of an integer dtype (reference data, written out).
fn int_range(d: DType) -> Option<(i128, i128)> {
    Some(match d {
        DType::Int8 => (-128, 127),
        DType::Int16 => (-32768, 32767),
        DType::Int32 => (i32::MIN as i128, i32::MAX as i128),
        DType::Int64 => (i64::MIN as i128, i64::MAX as i128),
        DType::UInt8 => (0, 255),
        DType::UInt16 => (0, 65535),
        DType::UInt32 => (0, u32::MAX as i128),
        DType::UInt64 => (0, u64::MAX as i128),
        _ => return None,
    })
}

/// The largest binary exponent of a float dtype's finite values.
fn max_exponent(d: DType) -> i32 {
    match d {
        DType::Float8E4M3FN => 8,
        DType::Float16 | DType::Float8E5M2 => 15,
        DType::Float32 | DType::BFloat16 => 127,
        _ => 1023,
    }
}

/// Whether `to` holds every value of `from`, from ranges and mantissa widths (numpy also calls
/// 64-bit integers into float64 safe).
fn holds(to: DType, from: DType) -> bool {
    let mantissa = |d: DType| match d {
        DType::Float16 => Some(11u32),
        DType::Float32 => Some(24),
        DType::Float64 => Some(53),
        DType::BFloat16 => Some(8),
        DType::Float8E4M3FN => Some(4),
        DType::Float8E5M2 => Some(3),
        _ => None,
    };
    match (int_range(from), int_range(to), mantissa(to)) {
        _ if from == to || from == DType::Bool => true,
        (Some((lo, hi)), Some((tlo, thi)), _) => tlo <= lo && hi <= thi,
        (Some((lo, hi)), None, Some(m)) => {
            (lo.abs().max(hi) <= 1i128 << m) || (from.itemsize() == 8 && to == DType::Float64)
        }
        (None, None, Some(m)) => {
            mantissa(from).is_some_and(|f| f <= m) && max_exponent(from) <= max_exponent(to)
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn interleave_matches_reference(
        n in 0usize..600,
        types in prop::collection::vec(numeric(), 0..7),
        target in numeric(),
        f_order: bool,
        with_fill: bool,
        d in densities(),
        seed: u64,
    ) {
        let order = if f_order { Order::F } else { Order::C };
        with_target!(target, D => check_interleave::<D>(n, &types, order, with_fill, d, seed))?;
    }

    #[test]
    fn same_type_dense_stacks_match_reference(n in 0usize..3000, k in 1usize..10, f_order: bool, seed: u64) {
        // The row-at-a-time fast path: k columns of the target type, no nulls.
        with_target!(DType::Float32, D => check_interleave::<D>(n, &vec![DType::Float32; k], if f_order { Order::F } else { Order::C }, false, 0.0, seed))?;
    }

    #[test]
    fn unequal_columns_are_errors(n in 1usize..100, k in 2usize..6, short in 0usize..6, target in numeric()) {
        let long = vec![1u8; n];
        let cut = vec![1u8; n - 1];
        let cols: Vec<Column> = (0..k).map(|j| Column::new(if j == short % k { &cut[..] } else { &long[..] })).collect();
        with_target!(target, D => {
            let mut out = vec![D::default(); n * k];
            prop_assert!(matches!(interleave(&cols, Order::C, None, Inexact::Error, &mut out), Err(Error::LengthMismatch { .. })), "unequal");
        });
    }

    #[test]
    fn casts_near_the_edges_match_reference(
        i in prop::sample::select(int_edges()),
        f in prop::sample::select(float_edges()),
        delta in -2i128..=2,
        target in numeric(),
    ) {
        let i = i + delta;
        with_target!(target, D => {
            let bits = |x: Option<D>| x.map(Target::bits);
            if let Ok(v) = i64::try_from(i) {
                for mode in [Inexact::Round, Inexact::Error] {
                    prop_assert_eq!(bits(cast::<i64, D>(v, mode)), bits(exact_only(Exact::I(i), D::expect(Exact::I(i)), mode)), "{} as i64", i);
                }
            }
            if let Ok(v) = u64::try_from(i) {
                for mode in [Inexact::Round, Inexact::Error] {
                    prop_assert_eq!(bits(cast::<u64, D>(v, mode)), bits(exact_only(Exact::I(i), D::expect(Exact::I(i)), mode)), "{} as u64", i);
                }
            }
            if let Ok(v) = i16::try_from(i) {
                for mode in [Inexact::Round, Inexact::Error] {
                    prop_assert_eq!(bits(cast::<i16, D>(v, mode)), bits(exact_only(Exact::I(i), D::expect(Exact::I(i)), mode)), "{} as i16", i);
                }
            }
            prop_assert_eq!(bits(cast::<f64, D>(f, Inexact::Error)), bits(D::expect(Exact::F(f))), "{} as f64", f);
            let f32v = f as f32;
            prop_assert_eq!(bits(cast::<f32, D>(f32v, Inexact::Error)), bits(D::expect(Exact::F(f32v as f64))), "{} as f32", f32v);
            let h = f16::from_f64(f);
            prop_assert_eq!(bits(cast::<f16, D>(h, Inexact::Error)), bits(D::expect(Exact::F(h.to_f64()))), "{} as f16", h);
        });
    }

    #[test]
    fn fill_values_fit_exactly_or_are_refused(
        i in prop::sample::select(int_edges()),
        f in prop::sample::select(float_edges()),
        target in numeric(),
    ) {
        with_target!(target, D => {
            if let Ok(v) = i64::try_from(i) {
                let want = D::expect(Exact::I(i));
                let got = fill_value::<D>(Scalar::Int(v));
                prop_assert_eq!(got.as_ref().ok().map(|x| x.bits()), want.map(Target::bits), "{}", v);
                if let Err(e) = got {
                    prop_assert!(matches!(&e, Error::ValueOutOfRange { place, .. } if place == "(fill_value)"), "{}", e);
                }
            }
            // A finite float must stay finite; NaN and infinities only go into floats.
            let want = D::expect(Exact::F(f));
            let got = fill_value::<D>(Scalar::Float(f)).ok().map(|x| x.bits());
            prop_assert_eq!(got, want.map(Target::bits), "{}", f);
        });
    }

    #[test]
    fn promotion_holds_every_input_minimally_and_ignores_order(
        types in prop::collection::vec(prop::sample::select(DType::ALL.to_vec()), 1..6),
        seed: u64,
    ) {
        let r = common_dtype(&types);
        for &t in &types {
            prop_assert!(holds(r, t), "{:?} -> {} does not hold {}", types, r, t);
            prop_assert_eq!(can_cast_safely(t, r), holds(r, t));
        }
        // Nothing smaller holds them all.
        for smaller in DType::ALL.into_iter().filter(|d| d.itemsize() < r.itemsize()) {
            prop_assert!(!types.iter().all(|&t| holds(smaller, t)), "{} would do for {:?}", smaller, types);
        }
        let mut shuffled = types.clone();
        let mut rng = Rng::new(seed);
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.below(i as u64 + 1) as usize);
        }
        prop_assert_eq!(common_dtype(&shuffled), r);
        // Integers promote to an integer whenever one holds them all (i8 + u8 -> int16, not float16).
        let int_holds = DType::ALL.into_iter().any(|d| int_range(d).is_some() && types.iter().all(|&t| holds(d, t)));
        prop_assert_eq!(int_range(r).is_some() || r == DType::Bool, int_holds || types.iter().all(|&t| t == DType::Bool));
        let mut with_result = types.clone();
        with_result.push(r);
        prop_assert_eq!(common_dtype(&with_result), r);
    }
}

// ---------------------------------------------------------------------------------------------
// Large inputs: the parallel paths run and agree with the reference.

#[test]
fn the_parallel_paths_run_and_agree() {
    let n = PARALLEL_THRESHOLD_BYTES / 4 + 4099;
    let mut rng = Rng::new(42);
    let valid = bools(n + 3, 0.1, &mut rng);
    let arrow = arrow_bits(&valid, 3);
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();

    let mut out = vec![0f32; n];
    fill_nulls(&values, Some(view(&arrow)), -1.0, &mut out).unwrap();
    assert_eq!(out, reference_fill(&values, Some((&valid, 3)), -1.0));

    // Bits: just over the parallel threshold of output bytes, at odd offsets.
    let m = PARALLEL_THRESHOLD_BYTES + 77;
    let v = bools(m + 5, 0.5, &mut rng);
    let ok = bools(m + 1, 0.1, &mut rng);
    let mut bytes = vec![0u8; m];
    unpack_bits(view(&arrow_bits(&v[..m + 5], 5)), &mut bytes);
    assert!(bytes.iter().enumerate().all(|(i, &b)| b == v[5 + i] as u8));
    unpack_bits_fill(view(&arrow_bits(&v[..m + 2], 2)), Some(view(&arrow_bits(&ok, 1))), 2, &mut bytes)
        .unwrap();
    assert!(bytes.iter().enumerate().all(|(i, &b)| b == if ok[1 + i] { v[2 + i] as u8 } else { 2 }));
    let mut packed = vec![0u8; m.div_ceil(8)];
    pack_bits(&bytes, &mut packed);
    assert_eq!(&packed[..], BooleanBuffer::from_iter(bytes.iter().map(|&b| b != 0)).values());

    // Two columns, C and F order, with a cast and nulls: 2 * n f64 is past the threshold.
    let ints: Vec<i16> = (0..n).map(|i| (i % 30_000) as i16).collect();
    let cols = [Column::new(&values[..]).with_validity(Some(view(&arrow))), Column::new(&ints[..])];
    for order in [Order::C, Order::F] {
        let mut m = vec![0f64; 2 * n];
        interleave(&cols, order, Some(f64::NAN), Inexact::Error, &mut m).unwrap();
        for i in (0..n).step_by(7) {
            let (a, b) = match order {
                Order::C => (m[2 * i], m[2 * i + 1]),
                Order::F => (m[i], m[n + i]),
            };
            assert_eq!(a.is_nan(), !valid[3 + i], "row {i}");
            assert!(a.is_nan() || a == i as f64, "row {i}");
            assert_eq!(b, (i % 30_000) as f64, "row {i}");
        }
    }
    // An out-of-range value deep inside a large column is found on the parallel path too.
    let mut wide: Vec<i64> = (0..n as i64).map(|i| i % 100).collect();
    wide[n - 10] = -1;
    let e = interleave(&[Column::new(&wide[..])], Order::C, None, Inexact::Error, &mut vec![0u32; n])
        .unwrap_err();
    assert!(e.to_string().contains(&format!("at row {} of column 0", n - 10)), "{e}");

    // A large strided gather: every other element, reversed.
    let src: Vec<u32> = (0..2 * n as u32).collect();
    let mut g = vec![0u32; n];
    // SAFETY: offsets 2n-1, 2n-3, ..., 1 are inside `src`.
    unsafe { gather_strided(src.as_ptr().add(2 * n - 1), &[n], &[-2], &mut g) }.unwrap();
    assert!(g.iter().enumerate().all(|(i, &x)| x as usize == 2 * n - 1 - 2 * i));

    // Chunks in parallel.
    let chunks: Vec<Vec<f32>> = (0..40).map(|c| vec![c as f32; n / 40 + c]).collect();
    let refs: Vec<&[f32]> = chunks.iter().map(|c| &c[..]).collect();
    let mut cat = vec![0f32; refs.iter().map(|c| c.len()).sum()];
    concat_into(&refs, &mut cat).unwrap();
    assert_eq!(cat, chunks.concat());
}

// ---------------------------------------------------------------------------------------------
// Error cases: Err, never a panic.

#[test]
fn bad_inputs_are_errors_not_panics() {
    let bits = [0xffu8; 2];
    let short = BitSlice::new(&bits, 0, 3).unwrap();
    assert!(BitSlice::new(&bits, 0, 17).is_err(), "a bitmap too short");
    assert!(BitSlice::new(&bits, 10, usize::MAX).is_err(), "an overflowing range");
    let values = [1.0f32; 4];
    let mut out = [0f32; 4];
    assert!(matches!(fill_nulls(&values, Some(short), 0.0, &mut out), Err(Error::LengthMismatch { .. })));
    assert!(matches!(fill_nulls(&values[..3], None, 0.0, &mut out), Err(Error::LengthMismatch { .. })));
    assert!(unpack_bits_fill(short, None, 0, &mut [0u8; 4]).is_err());
    assert!(unpack_bits_fill(short, Some(BitSlice::new(&bits, 0, 4).unwrap()), 0, &mut [0u8; 3]).is_err());
    assert!(concat_fill_into(&[(&values[..], Some(short))], 0.0, &mut out).is_err());
    let a = [1u64, 2, 3];
    let b = [1u64, 2];
    let e = interleave(
        &[Column::new(&a[..]), Column::new(&b[..]).named("b")],
        Order::F,
        None,
        Inexact::Error,
        &mut [0f64; 6],
    );
    assert!(e.unwrap_err().to_string().contains("column 'b'"));
    assert!(interleave(&[Column::new(&a[..])], Order::C, None, Inexact::Error, &mut [0f64; 4]).is_err());
    let e = fill_value::<u8>(Scalar::Int(300)).unwrap_err().to_string();
    assert!(e.contains("300") && e.contains("(fill_value)") && e.contains("uint8"), "{e}");
    assert!(fill_value::<i32>(Scalar::Float(1.5)).is_err());
    assert!(fill_value::<i64>(Scalar::Float(f64::NAN)).is_err());
    let nulls = [0b101u8];
    let with_nulls = Column::new(&a[..]).with_validity(Some(BitSlice::new(&nulls, 0, 3).unwrap()));
    let e = interleave(&[Column::new(&a[..]), with_nulls], Order::C, None, Inexact::Error, &mut [0f64; 6])
        .unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("column 1")), "{e}");
    let mut g = [0u8; 2];
    // SAFETY: refused before any read (3 strides for 2 dimensions, then a wrong output size).
    unsafe {
        assert!(gather_strided(bits.as_ptr(), &[1, 2], &[1, 1, 1], &mut g).is_err());
        assert!(gather_strided(bits.as_ptr(), &[3], &[1], &mut g).is_err());
    }
}

//! The emulator's test cases: plans run through the kernels built for the CPU (and through a
//! real device where there is one) against the CPU path, on random columns, matrices, lists
//! and views, and every half conversion.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, FixedSizeListArray, make_array};
use arrow_buffer::NullBuffer;
use arrow_data::ArrayData;
use arrow_schema::{DataType, Field, FieldRef};
use half::{bf16, f16};

use super::inputs::{Rng, aligned_buffer, array, random_dtype, random_nulls, validity};
use super::{Emulator, Missing, emulator};
use crate::arrow::{columns_to_tensor, to_tensor};
use crate::cuda::plan;
use crate::dtype::DType;
use crate::error::Error;
use crate::options::{ExportOptions, NullPolicy, Order, Scalar};
use crate::tensor::Tensor;

/// Set to 1, lets the emulator tests skip on a machine without a C++ compiler; without it a
/// missing compiler fails them (so a CI that lost its compiler does not pass vacuously).
const ALLOW_SKIP: &str = "DLFRAME_ALLOW_SKIP_EMU";

fn emu() -> Option<&'static Emulator> {
    match emulator() {
        Ok(e) => Some(e),
        Err(Missing::NoCompiler(why)) => {
            assert!(
                std::env::var_os(ALLOW_SKIP).is_some_and(|v| v == "1"),
                "{why}; install one (or set CXX), or set {ALLOW_SKIP}=1 to skip the emulator tests"
            );
            eprintln!("skipped ({ALLOW_SKIP}=1): {why}");
            None
        }
    }
}

/// Says how many cases ran through the emulator (shown with `--nocapture`), and fails when
/// none did.
fn report(test: &str, cases: usize) {
    eprintln!("emulator: {test}: {cases} cases ran");
    assert!(cases > 0, "{test}: no case ran through the emulator");
}

/// The bytes of a tensor's memory (every element, in memory order).
fn memory(t: &Tensor) -> Vec<u8> {
    // SAFETY: a host tensor made by the CPU path: one fresh buffer of nbytes bytes.
    unsafe { std::slice::from_raw_parts(t.data_ptr(), t.nbytes()) }.to_vec()
}

/// The bytes of a device tensor's memory, in memory order (downloaded as one flat view).
fn device_memory(t: &Tensor) -> Vec<u8> {
    // SAFETY: the tensor's memory is one dense allocation of numel elements (a fresh device
    // tensor in C, F or permuted order), kept alive by the same owner.
    let flat = unsafe {
        Tensor::from_raw_parts(
            t.data_ptr() as *mut u8,
            vec![t.numel() as i64],
            None,
            t.dtype(),
            t.device(),
            false,
            t.owner().clone(),
        )
    }
    .unwrap()
    .with_sync(t.sync().cloned());
    memory(&crate::cuda::download(&flat).unwrap())
}

fn is_nan(dtype: DType, b: &[u8]) -> bool {
    match dtype {
        DType::Float16 => f16::from_le_bytes([b[0], b[1]]).is_nan(),
        DType::BFloat16 => bf16::from_le_bytes([b[0], b[1]]).is_nan(),
        DType::Float8E4M3FN => crate::dtype::F8E4M3FN::from_bits(b[0]).is_nan(),
        DType::Float8E5M2 => crate::dtype::F8E5M2::from_bits(b[0]).is_nan(),
        DType::Float32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
        DType::Float64 => f64::from_le_bytes(b.try_into().unwrap()).is_nan(),
        _ => false,
    }
}

/// Element by element equal, NaN matching any NaN.
fn assert_same(dtype: DType, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let item = dtype.itemsize();
    for (i, (g, w)) in got.chunks(item).zip(want.chunks(item)).enumerate() {
        assert!(
            g == w || (is_nan(dtype, g) && is_nan(dtype, w)),
            "{what}: element {i}: {g:?} != {w:?} ({dtype})"
        );
    }
}

/// The plan (emulated over three grids) against the CPU result: same shape, strides, dtype,
/// values and mask, or the same error. True when values were compared (not an error), and
/// whether the kernel ran (not only direct copies).
fn check(
    e: &Emulator,
    plan: crate::error::Result<plan::Plan>,
    cpu: crate::error::Result<crate::arrow::Converted>,
    what: &str,
) -> (bool, bool) {
    let (plan, cpu) = match (plan, cpu) {
        (Ok(p), Ok(c)) => (p, c),
        (Err(p), Err(c)) => {
            assert_eq!(p.to_string(), c.to_string(), "{what}: errors");
            return (false, false);
        }
        (p, c) => panic!("{what}: device plan {:?} but CPU {:?}", p.err(), c.err()),
    };
    assert_eq!(
        (plan.made.target, &plan.made.shape[..], &plan.made.strides[..]),
        (cpu.values.dtype(), cpu.values.shape(), cpu.values.strides()),
        "{what}"
    );
    // One thread; a grid a thread of which takes several slots (rows, or units of eight bool
    // rows) a grid-width apart; a wide one.
    for (grid, block) in [((1, 1), 1), ((2, 1), 2), ((3, 2), 4)] {
        let (out, mask) = e.run(&plan, grid, block);
        assert_same(plan.made.target, &out, &memory(&cpu.values), what);
        assert_eq!(mask, cpu.mask.as_ref().map(memory), "{what}: mask");
    }
    if crate::cuda::device_count() > 0 {
        // The same plan on the real device, where there is one.
        let c = crate::cuda::transfer::run(crate::cuda::driver::gpu(0).unwrap(), &plan).unwrap();
        assert_same(
            plan.made.target,
            &device_memory(&c.values),
            &memory(&cpu.values),
            &format!("{what} (device)"),
        );
        assert_eq!(
            c.mask.as_ref().map(device_memory),
            cpu.mask.as_ref().map(memory),
            "{what}: mask (device)"
        );
    }
    (true, plan.needs_kernel())
}

/// One column's plan against the CPU copy, under `nulls`.
fn check_column(
    e: &Emulator,
    field: &FieldRef,
    chunks: &[ArrayRef],
    nulls: NullPolicy,
    target: Option<DType>,
    case: usize,
) -> (bool, bool) {
    // Rounding, as numpy rounds: the kernel's casts are compared; the check that refuses
    // inexact integers runs on the host, the same for both (plan.rs's tests).
    let inexact = crate::options::Inexact::Round;
    let opts = ExportOptions { nulls, dtype: target, inexact, ..Default::default() };
    let always = ExportOptions { copy: crate::options::CopyPolicy::Always, ..opts };
    let what =
        format!("case {case}: {} in {} chunk(s) -> {target:?}, {nulls:?}", field.data_type(), chunks.len());
    check(e, plan::column(field, chunks, &opts), to_tensor(field, chunks, &always), &what)
}

/// Counts of (compared, through the kernel, cases); the random tests must mostly compare
/// values, through the kernel, not agree on errors.
fn tally(counts: &mut (usize, usize, usize), (compared, kernel): (bool, bool)) {
    counts.0 += compared as usize;
    counts.1 += kernel as usize;
    counts.2 += 1;
}

fn assert_mostly_compared(test: &str, counts: (usize, usize, usize)) {
    report(test, counts.2);
    eprintln!("{} of {} cases compared values, {} through the kernel", counts.0, counts.2, counts.1);
    assert!(counts.0 * 2 > counts.2 && counts.1 * 3 > counts.2, "{counts:?}");
}

#[test]
fn cuda_kernels_match_the_cpu_on_random_columns() {
    let Some(e) = emu() else { return };
    let mut rng = Rng(0x5eed_0001);
    let mut counts = (0, 0, 0);
    for case in 0..600 {
        let leaf = random_dtype(&mut rng);
        let p_null = [0.0, 0.0, 0.1, 0.5][rng.below(4) as usize];
        let chunks: Vec<ArrayRef> = (0..1 + rng.below(3))
            .map(|_| {
                let len = rng.below(70) as usize;
                array(&mut rng, leaf, len, p_null)
            })
            .collect();
        let target = rng.chance(0.5).then(|| random_dtype(&mut rng));
        let field: FieldRef = Arc::new(leaf.arrow_field("x", true));
        let nulls = random_nulls(&mut rng, target.unwrap_or(leaf).is_float());
        tally(&mut counts, check_column(e, &field, &chunks, nulls, target, case));
    }
    assert_mostly_compared("random columns", counts);
}

#[test]
fn cuda_kernels_match_the_cpu_on_random_matrices() {
    let Some(e) = emu() else { return };
    let mut rng = Rng(0x5eed_0002);
    let mut counts = (0, 0, 0);
    for case in 0..400 {
        let k = 1 + rng.below(5) as usize;
        let n = rng.below(90) as usize;
        let mut fields = Vec::new();
        let mut columns = Vec::new();
        for j in 0..k {
            let dt = if rng.chance(0.2) { DType::Bool } else { random_dtype(&mut rng) };
            let p_null = [0.0, 0.1, 0.5][rng.below(3) as usize];
            // Chunk boundaries differ from column to column.
            let mut left = n;
            let mut chunks = Vec::new();
            while left > 0 || chunks.is_empty() {
                let len = if rng.chance(0.4) { left } else { (rng.below(left as u64 + 1)) as usize };
                chunks.push(array(&mut rng, dt, len, p_null));
                left -= len;
            }
            fields.push(Arc::new(dt.arrow_field(&format!("c{j}"), true)));
            columns.push(chunks);
        }
        let target = rng.chance(0.3).then(|| random_dtype(&mut rng));
        let float = rng.chance(0.5);
        let nulls = random_nulls(&mut rng, float);
        let order = if rng.chance(0.5) { Order::C } else { Order::F };
        let opts = ExportOptions { nulls, dtype: target, order, ..Default::default() };
        let what = format!("case {case}: k {k}, n {n}, {target:?}, {nulls:?}, {order:?}");
        tally(
            &mut counts,
            check(
                e,
                plan::matrix(&fields, &columns, &opts),
                columns_to_tensor(&fields, &columns, &opts),
                &what,
            ),
        );
    }
    assert_mostly_compared("random matrices", counts);
}

#[test]
fn cuda_unpack_matches_the_cpu_on_long_bool_columns() {
    // Long enough that every grid's threads take 32 rows at a time and then the last rows eight
    // at a time; sliced, so the bits start at any offset; a chunk after the first often starts
    // at an output that is not 16-byte aligned, which unpack writes a word or byte at a time.
    let Some(e) = emu() else { return };
    let mut rng = Rng(0x5eed_0006);
    let (mut counts, mut unpacked) = ((0, 0, 0), 0);
    for case in 0..150 {
        let p_null = [0.0, 0.1, 0.5][rng.below(3) as usize];
        let chunks: Vec<ArrayRef> = (0..1 + rng.below(3))
            .map(|_| {
                let len = rng.below(800) as usize;
                array(&mut rng, DType::Bool, len, p_null)
            })
            .collect();
        let field: FieldRef = Arc::new(DType::Bool.arrow_field("b", true));
        // Mostly a fill that a bool takes; a mask or an error now and then.
        let nulls = match rng.below(6) {
            4 => NullPolicy::Mask,
            5 => NullPolicy::Error,
            _ => NullPolicy::Fill(Scalar::Int(rng.below(2) as i64)),
        };
        let opts = ExportOptions { nulls, ..Default::default() };
        unpacked +=
            plan::column(&field, &chunks, &opts).is_ok_and(|p| p.kernel() == plan::Kernel::Unpack) as usize;
        tally(&mut counts, check_column(e, &field, &chunks, nulls, None, case));
    }
    assert_mostly_compared("long bool columns", counts);
    eprintln!("{unpacked} of {} cases through unpack", counts.2);
    assert!(unpacked * 3 > counts.2, "{unpacked} of {} through unpack", counts.2);
}

#[test]
fn cuda_kernels_match_the_cpu_on_lists_with_nulls_at_every_level() {
    let Some(e) = emu() else { return };
    let mut rng = Rng(0x5eed_0003);
    let mut counts = (0, 0, 0);
    for case in 0..200 {
        let leaf = if rng.chance(0.15) { DType::Bool } else { random_dtype(&mut rng) };
        let (inner, outer) = (1 + rng.below(3) as i32, 1 + rng.below(3) as i32);
        let nested = rng.chance(0.5);
        let chunks: Vec<ArrayRef> = (0..1 + rng.below(2))
            .map(|_| {
                let rows = rng.below(20) as usize;
                let per_row = if nested { inner * outer } else { inner } as usize;
                let values = array(&mut rng, leaf, rows * per_row, 0.1);
                let item = Arc::new(leaf.arrow_field("item", true));
                let list: ArrayRef = if nested {
                    let nulls = validity(&mut rng, rows * outer as usize, 0.2);
                    let inner_list = FixedSizeListArray::new(item, inner, values, nulls);
                    let list_field = Arc::new(Field::new("item", inner_list.data_type().clone(), true));
                    let nulls = validity(&mut rng, rows, 0.2);
                    Arc::new(FixedSizeListArray::new(list_field, outer, Arc::new(inner_list), nulls))
                } else {
                    Arc::new(FixedSizeListArray::new(item, inner, values, validity(&mut rng, rows, 0.2)))
                };
                // Sometimes a slice of the list column itself.
                if rows > 2 && rng.chance(0.3) { list.slice(1, rows - 2) } else { list }
            })
            .collect();
        let field: FieldRef = Arc::new(Field::new("x", chunks[0].data_type().clone(), true));
        let target = (leaf != DType::Bool && rng.chance(0.5)).then(|| random_dtype(&mut rng));
        let nulls = random_nulls(&mut rng, target.unwrap_or(leaf).is_float());
        tally(&mut counts, check_column(e, &field, &chunks, nulls, target, case));
    }
    assert_mostly_compared("lists with nulls", counts);
}

#[test]
fn cuda_half_conversions_match_the_cpu_bit_for_bit() {
    let Some(e) = emu() else { return };
    let field = |dt: DType| -> FieldRef { Arc::new(Field::new("h", dt.to_arrow(), false)) };
    let run = |dt: DType, bytes: Vec<u8>, len: usize, to: DType| -> Vec<u8> {
        let data =
            ArrayData::builder(dt.to_arrow()).len(len).add_buffer(aligned_buffer(&bytes)).build().unwrap();
        let opts = ExportOptions { dtype: Some(to), ..Default::default() };
        let plan = plan::column(&field(dt), &[make_array(data)], &opts).unwrap();
        e.run(&plan, (2, 1), 8).0
    };
    // Every half to f64, exactly.
    let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let out = run(DType::Float16, all, 1 << 16, DType::Float64);
    for (h, got) in (0..=u16::MAX).zip(out.chunks(8)) {
        let (want, got) = (f16::from_bits(h).to_f64(), f64::from_le_bytes(got.try_into().unwrap()));
        assert_eq!(want.to_bits(), got.to_bits(), "{h:#06x}: {got} != {want}");
    }
    // Doubles to half: every half, the midpoints between neighbours (ties to even) and just
    // either side of them, subnormals, overflow, and random bit patterns.
    let mut doubles = Vec::new();
    for h in 0..0x7c00u16 {
        let (a, b) = (f16::from_bits(h).to_f64(), f16::from_bits(h + 1).to_f64());
        let mid = (a + b) / 2.0;
        doubles.extend([a, mid, f64::from_bits(mid.to_bits() + 1), f64::from_bits(mid.to_bits() - 1), -mid]);
    }
    let mut rng = Rng(7);
    doubles.extend((0..20_000).map(|_| f64::from_bits(rng.next())));
    doubles.extend([
        65504.0,
        65519.99,
        65520.0,
        1e300,
        f64::INFINITY,
        f64::NAN,
        2f64.powi(-25),
        2f64.powi(-26),
        0.0,
        -0.0,
    ]);
    // A finite double beyond half's range would become inf: the host plan refuses it (the
    // CPU's own check), so the kernel never meets one. Each is refused alone.
    let (doubles, overflows): (Vec<f64>, Vec<f64>) =
        doubles.into_iter().partition(|d| !d.is_finite() || crate::kernels::f16_from_f64(*d).is_finite());
    assert!(overflows.contains(&65520.0) && overflows.contains(&1e300) && overflows.len() > 1000);
    for d in overflows.iter().step_by(97) {
        let array = make_array(
            ArrayData::builder(DataType::Float64)
                .len(1)
                .add_buffer(aligned_buffer(&d.to_le_bytes()))
                .build()
                .unwrap(),
        );
        let opts = ExportOptions { dtype: Some(DType::Float16), ..Default::default() };
        let err =
            plan::column(&field(DType::Float64), &[array], &opts).err().expect("an overflow is refused");
        assert!(matches!(err, crate::Error::ValueOutOfRange { .. }), "{d:e}: {err}");
    }
    let bytes: Vec<u8> = doubles.iter().flat_map(|d| d.to_le_bytes()).collect();
    let out = run(DType::Float64, bytes, doubles.len(), DType::Float16);
    for (d, got) in doubles.iter().zip(out.chunks(2)) {
        let (want, got) = (crate::kernels::f16_from_f64(*d), f16::from_le_bytes([got[0], got[1]]));
        assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()), "{d:e}: {got} != {want}");
    }
    report("half conversions", (1 << 16) + doubles.len());
}

#[test]
fn cuda_bfloat16_conversions_match_the_cpu_bit_for_bit() {
    let Some(e) = emu() else { return };
    let run = |dt: DType, bytes: Vec<u8>, len: usize, to: DType| -> Vec<u8> {
        let data =
            ArrayData::builder(dt.to_arrow()).len(len).add_buffer(aligned_buffer(&bytes)).build().unwrap();
        let inexact = crate::options::Inexact::Round;
        let opts = ExportOptions { dtype: Some(to), inexact, ..Default::default() };
        let field: FieldRef = Arc::new(dt.arrow_field("b", false));
        let plan = plan::column(&field, &[make_array(data)], &opts).unwrap();
        e.run(&plan, (2, 1), 8).0
    };
    // Every bfloat16 to f64, exactly.
    let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let out = run(DType::BFloat16, all, 1 << 16, DType::Float64);
    for (h, got) in (0..=u16::MAX).zip(out.chunks(8)) {
        let (want, got) = (bf16::from_bits(h).to_f64(), f64::from_le_bytes(got.try_into().unwrap()));
        assert!(
            want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
            "{h:#06x}: {got} != {want}"
        );
    }
    // Doubles to bfloat16: every value, the midpoints between neighbours and just either side
    // of them (where a rounding through float would round twice), and random bit patterns.
    let mut doubles = Vec::new();
    for h in (0..0x7f7fu16).step_by(3) {
        let (a, b) = (bf16::from_bits(h).to_f64(), bf16::from_bits(h + 1).to_f64());
        let mid = (a + b) / 2.0;
        doubles.extend([a, mid, f64::from_bits(mid.to_bits() + 1), f64::from_bits(mid.to_bits() - 1), -mid]);
    }
    let mut rng = Rng(11);
    doubles.extend((0..20_000).map(|_| f64::from_bits(rng.next())));
    doubles.retain(|d| !d.is_finite() || crate::kernels::bf16_from_f64(*d).is_finite());
    let bytes: Vec<u8> = doubles.iter().flat_map(|d| d.to_le_bytes()).collect();
    let out = run(DType::Float64, bytes, doubles.len(), DType::BFloat16);
    for (d, got) in doubles.iter().zip(out.chunks(2)) {
        let (want, got) = (crate::kernels::bf16_from_f64(*d), bf16::from_le_bytes([got[0], got[1]]));
        assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()), "{d:e}: {got} != {want}");
    }
    // Integers beside the ties beyond 2^53, where a rounding through double lands on the tie.
    let ints: Vec<i64> = [56, 60, 62]
        .into_iter()
        .flat_map(|b| {
            let tie = (1i64 << b) + (1i64 << (b - 8));
            [tie - 1, tie, tie + 1, -tie - 1, -tie, i64::MAX, i64::MIN]
        })
        .collect();
    let bytes: Vec<u8> = ints.iter().flat_map(|v| v.to_le_bytes()).collect();
    let out = run(DType::Int64, bytes, ints.len(), DType::BFloat16);
    for (v, got) in ints.iter().zip(out.chunks(2)) {
        let want = crate::kernels::cast::<i64, bf16>(*v, crate::options::Inexact::Round).unwrap();
        assert_eq!(want.to_bits(), bf16::from_le_bytes([got[0], got[1]]).to_bits(), "{v}");
    }
    report("bfloat16 conversions", (1 << 16) + doubles.len() + ints.len());
}

#[test]
fn cuda_float8_conversions_match_the_cpu_bit_for_bit() {
    use crate::dtype::{F8E4M3FN, F8E5M2};
    let Some(e) = emu() else { return };
    let run = |dt: DType, bytes: Vec<u8>, len: usize, to: DType| -> crate::Result<Vec<u8>> {
        let data =
            ArrayData::builder(dt.to_arrow()).len(len).add_buffer(aligned_buffer(&bytes)).build().unwrap();
        let opts = ExportOptions { dtype: Some(to), ..Default::default() };
        let field: FieldRef = Arc::new(dt.arrow_field("f8", false));
        let plan = plan::column(&field, &[make_array(data)], &opts)?;
        Ok(e.run(&plan, (2, 1), 8).0)
    };
    let decode = |d: DType, b: u8| match d {
        DType::Float8E4M3FN => F8E4M3FN::from_bits(b).to_f64(),
        _ => F8E5M2::from_bits(b).to_f64(),
    };
    let encode = |d: DType, x: f64| match d {
        DType::Float8E4M3FN => F8E4M3FN::from_f64(x).to_bits(),
        _ => F8E5M2::from_f64(x).to_bits(),
    };
    let mut count = 0;
    for d in [DType::Float8E4M3FN, DType::Float8E5M2] {
        // Every pattern to f64, exactly (read through the column's extension field).
        let out = run(d, (0..=255u8).collect(), 256, DType::Float64).unwrap();
        for (b, got) in (0..=255u8).zip(out.chunks(8)) {
            let (want, got) = (decode(d, b), f64::from_le_bytes(got.try_into().unwrap()));
            assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()), "{d} {b:#04x}");
        }
        // Doubles to float8: every value, the midpoints and either side of them, random bits.
        let mut doubles: Vec<f64> = Vec::new();
        for b in 0..0x7bu8 {
            let (a, c) = (decode(d, b), decode(d, b + 1));
            let mid = (a + c) / 2.0;
            doubles.extend([
                a,
                mid,
                f64::from_bits(mid.to_bits() + 1),
                f64::from_bits(mid.to_bits() - 1),
                -mid,
            ]);
        }
        let mut rng = Rng(17);
        doubles.extend((0..5_000).map(|_| f64::from_bits(rng.next()) % 600.0));
        doubles.retain(|x| x.is_finite() && decode(d, encode(d, *x)).is_finite());
        let bytes: Vec<u8> = doubles.iter().flat_map(|x| x.to_le_bytes()).collect();
        let out = run(DType::Float64, bytes, doubles.len(), d).unwrap();
        for (x, got) in doubles.iter().zip(&out) {
            assert_eq!(encode(d, *x), *got, "{d} {x:e}");
        }
        // A value beyond the range is refused by the plan, before anything runs, as on the CPU.
        let err = run(DType::Float32, 1e6f32.to_le_bytes().to_vec(), 1, d).unwrap_err();
        assert!(matches!(err, crate::Error::ValueOutOfRange { .. }), "{err}");
        count += 256 + doubles.len();
    }
    report("float8 conversions", count);
}

#[test]
fn cuda_plans_refuse_what_the_cpu_refuses_before_anything_moves() {
    let f: FieldRef = Arc::new(Field::new("x", DataType::Int64, true));
    let big: ArrayRef = Arc::new(arrow_array::Int64Array::from(vec![Some(1), None, Some(300)]));
    let to_u8 = ExportOptions {
        dtype: Some(DType::UInt8),
        nulls: NullPolicy::Fill(Scalar::Int(0)),
        ..Default::default()
    };
    let e = plan::column(&f, std::slice::from_ref(&big), &to_u8).err().unwrap();
    assert!(
        matches!(&e, Error::ValueOutOfRange { value, place, .. } if value == "300" && place == "at row 2 of column 'x'"),
        "{e}"
    );
    // The bad value under a null is not read.
    let masked =
        big.to_data().into_builder().nulls(Some(NullBuffer::from(vec![true, true, false]))).build().unwrap();
    assert!(plan::column(&f, &[make_array(masked)], &to_u8).is_ok());
    // A bool fill must be a bool, 0 or 1.
    let b: FieldRef = Arc::new(Field::new("b", DataType::Boolean, true));
    let bools: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None]));
    let seven = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(7)), ..Default::default() };
    assert!(matches!(plan::column(&b, &[bools], &seven), Err(Error::ValueOutOfRange { .. })));
}

#[test]
fn cuda_gather_matches_the_cpu_gather_on_random_views() {
    let Some(e) = emu() else { return };
    let mut rng = Rng(0x5eed_0004);
    let base: Vec<u64> = (0..4096).map(|_| rng.next()).collect();
    let cases = 300;
    for case in 0..cases {
        let dtype = [DType::UInt8, DType::Int16, DType::Float32, DType::Float64][rng.below(4) as usize];
        let item = dtype.itemsize();
        let ndim = rng.below(5) as usize;
        let shape: Vec<i64> = (0..ndim).map(|_| rng.below(6) as i64).collect();
        let strides: Vec<i64> = (0..ndim).map(|_| rng.below(21) as i64 - 10).collect();
        // Element 0 in the middle, so negative strides stay inside the buffer.
        let start = (base.len() * 8 / item / 2) as isize;
        // SAFETY: shapes below 6 and strides within 10 elements over at most 4 dimensions
        // reach at most 200 elements either side of the middle of a 32 KB buffer, which
        // `base` keeps alive for the view's life.
        let view = unsafe {
            Tensor::from_raw_parts(
                (base.as_ptr() as *mut u8).offset(start * item as isize),
                shape.clone(),
                Some(strides.clone()),
                dtype,
                crate::device::Device::Cpu,
                true,
                Arc::new(()),
            )
        }
        .unwrap();
        let want = memory(&crate::kernels::contiguous_copy(&view).unwrap());
        for (blocks, block) in [(1, 1), (3, 5)] {
            assert_eq!(e.gather(&view, blocks, block), want, "case {case}: {shape:?} {strides:?} {dtype}");
        }
    }
    report("gather", cases);
}

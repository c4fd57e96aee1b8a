//! Every kernel against a plain scalar reference, on random lengths, bit offsets, null
//! densities, slices, shapes and strides (proptest).

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float32Array, Int16Array, Int64Array, UInt8Array};
use arrow_buffer::NullBuffer;
use arrow_schema::{Field, FieldRef};
use dlframe::arrow::{ExportOptions, NullPolicy, Order, Scalar, columns_to_tensor, to_tensor};
use dlframe::kernels::{
    BitSlice, Column, ColumnRef, PARALLEL_THRESHOLD_BYTES, concat_fill_into, contiguous_copy, fill_nulls,
    interleave, pack_bits, unpack_bits, unpack_bits_fill,
};
use dlframe::{DType, Device, Tensor};
use proptest::prelude::*;

fn pack(v: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; v.len().div_ceil(8)];
    for (i, &b) in v.iter().enumerate() {
        out[i / 8] |= (b as u8) << (i % 8);
    }
    out
}

/// Random validity of `off + len` bits with the given null density.
fn validity(len: usize, off: usize, density: f64, seed: u64) -> Vec<bool> {
    let mut x = seed | 1;
    (0..off + len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f64 / 1000.0 >= density
        })
        .collect()
}

fn densities() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(0.1), Just(0.5), Just(1.0)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn fill_nulls_matches_reference(len in 0usize..5000, off in 0usize..64, d in densities(), seed: u64) {
        let valid = validity(len, off, d, seed);
        let bits = pack(&valid);
        let values: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let mut out = vec![0f32; len];
        fill_nulls(&values, Some(BitSlice::new(&bits, off, len).unwrap()), -1.0, &mut out).unwrap();
        let want: Vec<f32> = (0..len).map(|i| if valid[off + i] { i as f32 } else { -1.0 }).collect();
        prop_assert_eq!(out, want);
    }

    #[test]
    fn unpack_and_pack_match_reference(len in 0usize..5000, off in 0usize..64, d in densities(), seed: u64) {
        let v = validity(len, off, d, seed);
        let bits = pack(&v);
        let mut out = vec![7u8; len];
        unpack_bits(BitSlice::new(&bits, off, len).unwrap(), &mut out);
        let want: Vec<u8> = v[off..].iter().map(|&b| b as u8).collect();
        prop_assert_eq!(&out, &want);
        let mut packed = vec![0u8; len.div_ceil(8)];
        pack_bits(&out, &mut packed);
        prop_assert_eq!(packed, pack(&v[off..]));
        let valid = validity(len, off, 0.3, seed.wrapping_add(1));
        let vbits = pack(&valid);
        let mut filled = vec![0u8; len];
        unpack_bits_fill(BitSlice::new(&bits, off, len).unwrap(), Some(BitSlice::new(&vbits, off, len).unwrap()), 9, &mut filled).unwrap();
        let want: Vec<u8> = (0..len).map(|i| if valid[off + i] { v[off + i] as u8 } else { 9 }).collect();
        prop_assert_eq!(filled, want);
    }

    #[test]
    fn concat_matches_reference(lens in prop::collection::vec(0usize..700, 0..12), d in densities(), seed: u64) {
        let chunks: Vec<Vec<i64>> = lens.iter().enumerate().map(|(c, &l)| (0..l as i64).map(|i| i * 10 + c as i64).collect()).collect();
        let valid: Vec<Vec<bool>> = lens.iter().enumerate().map(|(c, &l)| validity(l, 0, d, seed + c as u64)).collect();
        let bits: Vec<Vec<u8>> = valid.iter().map(|v| pack(v)).collect();
        let parts: Vec<(&[i64], Option<BitSlice>)> = chunks.iter().zip(&bits).map(|(c, b)| (c.as_slice(), Some(BitSlice::new(b, 0, c.len()).unwrap()))).collect();
        let mut out = vec![0i64; lens.iter().sum()];
        concat_fill_into(&parts, Some(-5), &mut out).unwrap();
        let want: Vec<i64> = chunks.iter().zip(&valid).flat_map(|(c, v)| c.iter().zip(v).map(|(&x, &ok)| if ok { x } else { -5 })).collect();
        prop_assert_eq!(out, want);
    }

    #[test]
    fn strided_gather_matches_index_loops(
        shape in prop::collection::vec(0usize..5, 0..4),
        signs in prop::collection::vec(prop_oneof![Just(-1i64), Just(0), Just(1), Just(2)], 4),
        perm_seed: u64,
    ) {
        // A base buffer big enough for any stride pattern; start in its middle.
        let n = 4096usize;
        let base = Tensor::from_vec((0..n as i32).collect::<Vec<_>>(), vec![n as i64]).unwrap();
        let mut strides = Vec::new();
        let mut acc = 1i64;
        for (i, &d) in shape.iter().enumerate().rev() {
            strides.push(signs[i] * acc);
            acc *= d.max(1) as i64 * 2;
        }
        strides.reverse();
        let _ = perm_seed;
        let mid = (n / 2) as isize;
        // SAFETY: every reachable offset is within +-(acc) < n/2 of the middle element.
        let t = unsafe {
            Tensor::from_raw_parts((base.data_ptr() as *mut i32).offset(mid) as *mut u8, shape.iter().map(|&d| d as i64).collect(),
                Some(strides.clone()), DType::Int32, Device::Cpu, true, base.owner().clone())
        }.unwrap();
        let got = contiguous_copy(&t).unwrap();
        let numel: usize = shape.iter().product();
        let mut want = Vec::with_capacity(numel);
        for flat in 0..numel {
            let mut rem = flat;
            let mut off = mid as i64;
            for (k, &d) in shape.iter().enumerate().rev() {
                off += (rem % d) as i64 * strides[k];
                rem /= d;
            }
            want.push(off as i32);
        }
        prop_assert_eq!(got.as_slice::<i32>().unwrap(), &want[..]);
    }

    #[test]
    fn interleave_matches_reference(n in 0usize..600, k in 1usize..6, f_order: bool, d in densities(), seed: u64) {
        // Even columns are int16, odd ones uint8: a mixed stack cast to float64.
        let cols_i16: Vec<Vec<i16>> = (0..k).map(|j| (0..n).map(|i| (i * 3 + j) as i16 - 700).collect()).collect();
        let cols_u8: Vec<Vec<u8>> = (0..k).map(|j| (0..n).map(|i| (i * 7 + j) as u8).collect()).collect();
        let valid: Vec<Vec<bool>> = (0..k).map(|j| validity(n, 0, d, seed + j as u64)).collect();
        let bits: Vec<Vec<u8>> = valid.iter().map(|v| pack(v)).collect();
        let names: Vec<String> = (0..k).map(|j| format!("c{j}")).collect();
        let cols: Vec<Column> = (0..k).map(|j| Column {
            values: if j % 2 == 0 { ColumnRef::I16(&cols_i16[j]) } else { ColumnRef::U8(&cols_u8[j]) },
            validity: Some(BitSlice::new(&bits[j], 0, n).unwrap()),
            name: &names[j],
        }).collect();
        let order = if f_order { Order::F } else { Order::C };
        let mut out = vec![0f64; n * k];
        interleave(&cols, order, Some(-1.0), &mut out).unwrap();
        for i in 0..n {
            for j in 0..k {
                let raw = if j % 2 == 0 { cols_i16[j][i] as f64 } else { cols_u8[j][i] as f64 };
                let v = if valid[j][i] { raw } else { -1.0 };
                let at = if f_order { j * n + i } else { i * k + j };
                prop_assert_eq!(out[at], v);
            }
        }
    }

    #[test]
    fn sliced_arrow_columns_with_nulls_fill_like_the_reference(len in 1usize..3000, off in 0usize..100, d in densities(), seed: u64) {
        let valid = validity(len + off, 0, d, seed);
        let full = Int64Array::new((0..(len + off) as i64).collect(), Some(NullBuffer::from(valid.clone())));
        let sliced: ArrayRef = Arc::new(full.slice(off, len));
        let field: FieldRef = Arc::new(Field::new("x", sliced.data_type().clone(), true));
        let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(-1)), ..Default::default() };
        let got = to_tensor(&field, &[sliced], &opts).unwrap().values;
        let want: Vec<i64> = (off..off + len).map(|i| if valid[i] { i as i64 } else { -1 }).collect();
        prop_assert_eq!(got.as_slice::<i64>().unwrap(), &want[..]);
    }
}

#[test]
fn the_parallel_paths_run_and_agree() {
    let n = PARALLEL_THRESHOLD_BYTES / 4 * 2 + 77;
    let valid = validity(n, 3, 0.1, 42);
    let bits = pack(&valid);
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut out = vec![0f32; n];
    fill_nulls(&values, Some(BitSlice::new(&bits, 3, n).unwrap()), f32::NAN, &mut out).unwrap();
    for i in (0..n).step_by(997) {
        assert_eq!(out[i].is_nan(), !valid[3 + i], "row {i}");
    }
    let a: ArrayRef = Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32)));
    let b: ArrayRef = Arc::new(Int16Array::from_iter_values((0..n).map(|i| (i % 1000) as i16)));
    let fields: Vec<FieldRef> = vec![
        Arc::new(Field::new("a", a.data_type().clone(), false)),
        Arc::new(Field::new("b", b.data_type().clone(), false)),
    ];
    let m = columns_to_tensor(&fields, &[vec![a], vec![b]], &ExportOptions::default()).unwrap().values;
    let s = m.as_slice::<f32>().unwrap();
    for i in (0..n).step_by(1009) {
        assert_eq!((s[2 * i], s[2 * i + 1]), (i as f32, (i % 1000) as f32));
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let a: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
    let b: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
    let f = |n: &str, x: &ArrayRef| -> FieldRef { Arc::new(Field::new(n, x.data_type().clone(), true)) };
    let e = columns_to_tensor(
        &[f("a", &a), f("b", &b)],
        &[vec![a.clone()], vec![b.clone()]],
        &ExportOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("'b'"), "{e}");
    let s: ArrayRef = Arc::new(arrow_array::StringArray::from(vec!["x", "y", "z"]));
    assert!(
        columns_to_tensor(
            &[f("a", &a), f("s", &s)],
            &[vec![a.clone()], vec![s.clone()]],
            &ExportOptions::default()
        )
        .is_err()
    );
    let nulls: ArrayRef = Arc::new(UInt8Array::from(vec![Some(1), None]));
    let opts = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(300)), ..Default::default() };
    let e = to_tensor(&f("u", &nulls), std::slice::from_ref(&nulls), &opts).unwrap_err();
    assert!(e.to_string().contains("fill_value"), "{e}");
    let never = ExportOptions {
        nulls: NullPolicy::Fill(Scalar::Int(0)),
        copy: dlframe::arrow::CopyPolicy::Never,
        ..Default::default()
    };
    assert!(
        to_tensor(&f("u", &nulls), std::slice::from_ref(&nulls), &never)
            .unwrap_err()
            .to_string()
            .contains("copy=False")
    );
    let big: ArrayRef = Arc::new(Int64Array::from(vec![1, 300]));
    let narrow = ExportOptions { dtype: Some(DType::UInt8), ..Default::default() };
    let e = columns_to_tensor(&[f("x", &big)], &[vec![big.clone()]], &narrow).unwrap_err();
    assert!(e.to_string().contains("at row 1 of column 'x'"), "{e}");
    assert!(BitSlice::new(&[0u8], 0, 9).is_err());
    let _ = a.len();
}

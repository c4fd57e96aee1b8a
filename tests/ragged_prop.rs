//! Ragged list columns (`ragged="pad"` and `"jagged"`) against a reference built row by row
//! from the same values: List and LargeList, several chunks, sliced chunks (offsets that do not
//! start at 0), null rows that hold values and null elements under fill and mask, truncation
//! with `max_len`, casts, and the zero-copy cases.

use std::sync::Arc;

use arrow_array::builder::{GenericListBuilder, Int32Builder};
use arrow_array::{Array, ArrayRef, OffsetSizeTrait};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef};
use dlframe::arrow::to_tensor;
use dlframe::options::{CopyPolicy, ExportOptions, NullPolicy, Ragged, Scalar};
use dlframe::{DType, Error};
use proptest::prelude::*;

/// A row: None for a null row, else its elements (None for a null element).
type Row = Option<Vec<Option<i32>>>;

fn list<O: OffsetSizeTrait>(rows: &[Row]) -> ArrayRef {
    let mut b = GenericListBuilder::<O, _>::new(Int32Builder::new());
    for row in rows {
        match row {
            Some(items) => {
                for v in items {
                    b.values().append_option(*v);
                }
                b.append(true);
            }
            None => {
                // A null row that still covers values, as Arrow allows.
                b.values().append_value(99);
                b.append(false);
            }
        }
    }
    Arc::new(b.finish())
}

fn field(large: bool) -> FieldRef {
    let item = Arc::new(Field::new("item", DataType::Int32, true));
    let dt = if large { DataType::LargeList(item) } else { DataType::List(item) };
    Arc::new(Field::new("tokens", dt, true))
}

/// The column in chunks cut at `cuts`, each chunk a slice of one list array (so its offsets
/// start where the slice starts).
fn chunks(rows: &[Row], large: bool, cuts: &[usize]) -> Vec<ArrayRef> {
    let whole = if large { list::<i64>(rows) } else { list::<i32>(rows) };
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (rows.len() + 1)).collect();
    bounds.extend([0, rows.len()]);
    bounds.sort_unstable();
    bounds.windows(2).map(|w| whole.slice(w[0], w[1] - w[0])).collect()
}

fn element(v: Option<i32>, fill: i32) -> i32 {
    v.unwrap_or(fill)
}

fn rows_strategy() -> impl Strategy<Value = Vec<Row>> {
    let item = prop_oneof![9 => any::<i16>().prop_map(|v| Some(v as i32)), 1 => Just(None)];
    let row = prop_oneof![8 => prop::collection::vec(item, 0..7).prop_map(Some), 1 => Just(None)];
    prop::collection::vec(row, 0..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn pad_and_jagged_match_the_rows(
        rows in rows_strategy(),
        large in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..4),
        cap in prop::option::of(0usize..6),
        mask in any::<bool>(),
        cast in any::<bool>(),
    ) {
        let f = field(large);
        let cs = chunks(&rows, large, &cuts);
        let fill = -7;
        let nulls = if mask { NullPolicy::Mask } else { NullPolicy::Fill(Scalar::Int(fill as i64)) };
        let dtype = cast.then_some(DType::Float64);
        let live = |r: &Row| r.clone().unwrap_or_default();
        let value = |v: Option<i32>| if mask { v.unwrap_or(0) } else { element(v, fill) };

        // Pad.
        let pad = Ragged::Pad { pad: Scalar::Int(5), max_len: cap };
        let c = to_tensor(&f, &cs, &ExportOptions { nulls, dtype, ragged: pad, ..Default::default() }).unwrap();
        let width = cap.unwrap_or_else(|| rows.iter().map(|r| live(r).len()).max().unwrap_or(0));
        prop_assert_eq!(c.values.shape(), &[rows.len() as i64, width as i64][..]);
        let lengths = c.index.as_ref().unwrap().as_slice::<i64>().unwrap().to_vec();
        let mut want = Vec::new();
        let mut want_mask = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let items = live(r);
            let kept = cap.map_or(items.len(), |c| items.len().min(c));
            prop_assert_eq!(lengths[i], kept as i64, "row {}", i);
            for j in 0..width {
                let item = items.get(j).copied().filter(|_| j < kept);
                want.push(item.map_or(5.0, |v| value(v) as f64));
                want_mask.push(matches!(item, Some(Some(_))));
            }
        }
        let got: Vec<f64> = if cast {
            c.values.as_slice::<f64>().unwrap().to_vec()
        } else {
            c.values.as_slice::<i32>().unwrap().iter().map(|&v| v as f64).collect()
        };
        // Masked slots hold whatever the copy wrote there; compare the valid ones.
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if !mask || want_mask[k] || *w == 5.0 && k % width.max(1) >= lengths[k / width.max(1)] as usize {
                prop_assert_eq!(g, w, "slot {}", k);
            }
        }
        prop_assert_eq!(c.mask.is_some(), mask);
        if let Some(m) = &c.mask {
            prop_assert_eq!(m.dtype(), DType::Bool);
            let m: Vec<bool> = m.as_bytes().unwrap().iter().map(|&b| b == 1).collect();
            prop_assert_eq!(m, want_mask);
        }

        // Jagged.
        let c = to_tensor(&f, &cs, &ExportOptions { nulls, dtype, ragged: Ragged::Jagged, ..Default::default() })
            .unwrap();
        let offsets = c.index.as_ref().unwrap().as_slice::<i64>().unwrap().to_vec();
        let mut want_offsets = vec![0i64];
        let mut want = Vec::new();
        let mut want_valid = Vec::new();
        for r in &rows {
            let items = live(r);
            want_offsets.push(want_offsets.last().unwrap() + items.len() as i64);
            want.extend(items.iter().map(|&v| value(v) as f64));
            want_valid.extend(items.iter().map(|v| v.is_some()));
        }
        prop_assert_eq!(&offsets, &want_offsets);
        prop_assert_eq!(c.values.shape(), &[want.len() as i64][..]);
        let got: Vec<f64> = if cast {
            c.values.as_slice::<f64>().unwrap().to_vec()
        } else {
            c.values.as_slice::<i32>().unwrap().iter().map(|&v| v as f64).collect()
        };
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if !mask || want_valid[k] {
                prop_assert_eq!(g, w, "element {}", k);
            }
        }
        if let Some(m) = &c.mask {
            let m: Vec<bool> = m.as_bytes().unwrap().iter().map(|&b| b == 1).collect();
            prop_assert_eq!(m, want_valid);
        }
    }
}

#[test]
fn jagged_shares_a_large_lists_values_and_offsets_and_copies_only_what_it_must() {
    let rows: Vec<Row> =
        vec![Some(vec![Some(1), Some(2)]), Some(vec![]), Some(vec![Some(3), Some(4), Some(5)])];
    let large = list::<i64>(&rows);
    let jagged = ExportOptions { ragged: Ragged::Jagged, copy: CopyPolicy::Never, ..Default::default() };
    let c = to_tensor(&field(true), std::slice::from_ref(&large), &jagged).unwrap();
    let l = large.as_any().downcast_ref::<arrow_array::LargeListArray>().unwrap();
    assert_eq!(c.values.data_ptr(), l.values().to_data().buffers()[0].as_ptr());
    assert_eq!(c.index.as_ref().unwrap().data_ptr(), l.offsets().inner().inner().as_ptr());
    assert!(!c.values.copied() && c.values.readonly());
    assert_eq!(c.index.unwrap().as_slice::<i64>().unwrap(), [0, 2, 2, 5]);

    // An i32 List's offsets are rebased to int64 (a copy, which copy=False refuses), its values shared.
    let small = list::<i32>(&rows);
    let e = to_tensor(&field(false), std::slice::from_ref(&small), &jagged).unwrap_err();
    assert!(matches!(e, Error::CopyRequired { .. }), "{e}");
    let c = to_tensor(
        &field(false),
        &[small.slice(1, 2)],
        &ExportOptions { ragged: Ragged::Jagged, ..Default::default() },
    )
    .unwrap();
    assert_eq!(c.index.unwrap().as_slice::<i64>().unwrap(), [0, 0, 3]);
    assert!(!c.values.copied());
    assert_eq!(c.values.as_slice::<i32>().unwrap(), [3, 4, 5]);

    // Padding always copies, so copy=False refuses it.
    let pad = ExportOptions {
        ragged: Ragged::Pad { pad: Scalar::Int(0), max_len: None },
        copy: CopyPolicy::Never,
        ..Default::default()
    };
    assert!(matches!(to_tensor(&field(true), &[large], &pad), Err(Error::CopyRequired { .. })));
}

#[test]
fn null_rows_and_elements_under_error_name_the_column_and_a_bad_pad_is_refused() {
    let rows: Vec<Row> = vec![Some(vec![Some(1)]), None, Some(vec![Some(2), None])];
    let cs = [list::<i32>(&rows)];
    let pad = Ragged::Pad { pad: Scalar::Int(0), max_len: None };
    let e = to_tensor(&field(false), &cs, &ExportOptions { ragged: pad, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("column 'tokens' (null list rows) has 1 null(s)"), "{e}");
    let no_null_rows = [list::<i32>(&[rows[0].clone(), rows[2].clone()])];
    let e = to_tensor(
        &field(false),
        &no_null_rows,
        &ExportOptions { ragged: Ragged::Jagged, ..Default::default() },
    )
    .unwrap_err();
    assert!(matches!(&e, Error::Nulls { column, null_count: 1 } if column == "'tokens'"), "{e}");
    let to_u8 = ExportOptions {
        ragged: Ragged::Pad { pad: Scalar::Int(300), max_len: Some(3) },
        nulls: NullPolicy::Fill(Scalar::Int(0)),
        dtype: Some(DType::UInt8),
        ..Default::default()
    };
    let e = to_tensor(&field(false), &cs, &to_u8).unwrap_err();
    assert!(e.to_string().contains("300 (pad_value) does not fit uint8"), "{e}");
    assert!(Ragged::parse("jagged", Some(Scalar::Int(0)), None).is_err());
    assert!(
        Ragged::parse("ragged", None, None)
            .unwrap_err()
            .to_string()
            .contains("expected 'error', 'pad' or 'jagged'")
    );
}

#[test]
fn cells_of_fixed_size_lists_pad_as_whole_cells_and_an_empty_column_has_the_width() {
    // List<FixedSizeList<f32>[2]>: embeddings per item.
    let values = arrow_array::Float32Array::from(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cell = Arc::new(Field::new("item", DataType::Float32, false));
    let fsl = arrow_array::FixedSizeListArray::new(cell.clone(), 2, Arc::new(values), None);
    let item = Arc::new(Field::new("item", fsl.data_type().clone(), false));
    let offsets = OffsetBuffer::new(ScalarBuffer::from(vec![0i32, 1, 3, 3]));
    let lists = arrow_array::ListArray::new(
        item.clone(),
        offsets,
        Arc::new(fsl),
        Some(NullBuffer::from(vec![true, true, false])),
    );
    let f = Arc::new(Field::new("emb", lists.data_type().clone(), true));
    let opts = ExportOptions {
        ragged: Ragged::Pad { pad: Scalar::Float(-1.0), max_len: None },
        nulls: NullPolicy::Fill(Scalar::Int(0)),
        ..Default::default()
    };
    let c = to_tensor(&f, &[Arc::new(lists) as ArrayRef], &opts).unwrap();
    assert_eq!(c.values.shape(), &[3, 2, 2]);
    assert_eq!(
        c.values.as_slice::<f32>().unwrap(),
        [1.0, 2.0, -1.0, -1.0, 3.0, 4.0, 5.0, 6.0, -1.0, -1.0, -1.0, -1.0]
    );
    assert_eq!(c.index.unwrap().as_slice::<i64>().unwrap(), [1, 2, 0]);

    let empty = arrow_array::ListArray::new_null(item, 0);
    let opts =
        ExportOptions { ragged: Ragged::Pad { pad: Scalar::Int(0), max_len: Some(4) }, ..Default::default() };
    let c = to_tensor(&f, &[Arc::new(empty) as ArrayRef], &opts).unwrap();
    assert_eq!(c.values.shape(), &[0, 4, 2]);
    assert_eq!(c.index.unwrap().shape(), &[0]);
}

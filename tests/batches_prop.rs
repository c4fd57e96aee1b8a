//! `dlframe::batches` against a collect-then-slice reference: random input batch boundaries
//! (empty batches too), every numeric dtype and bool, nulls under fill and mask, casts, several
//! columns stacked (C and F order) or by name, drop_last and worker shards. Every batch must
//! have exactly `batch_size` rows (the last one fewer, unless dropped) and the reference's
//! values, bit for bit.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float16Array, Float32Array, Float64Array, Int8Array, Int32Array, Int64Array,
    RecordBatch, UInt16Array, UInt64Array,
};
use arrow_schema::{ArrowError, Field, Schema};
use dlframe::arrow::Converted;
use dlframe::batches::{Ahead, BatchOptions, Batcher, Batches};
use dlframe::kernels::contiguous_copy;
use dlframe::options::{ExportOptions, NullPolicy, Order, Scalar};
use dlframe::table::{Columns, TableTensors, table_on};
use dlframe::{DType, Device, Error, Tensor};
use half::f16;
use proptest::prelude::*;

/// Column `kind` of `n` rows: values from `seed`, every `null_every`-th one null (0: none).
fn column(kind: u8, n: usize, seed: i64, null_every: usize) -> ArrayRef {
    let valid = |i: usize| null_every == 0 || i % null_every != 1;
    let v = |i: usize| (seed + i as i64 * 7) % 100 - 50;
    match kind % 8 {
        0 => Arc::new((0..n).map(|i| valid(i).then(|| v(i) as i8)).collect::<Int8Array>()),
        1 => Arc::new((0..n).map(|i| valid(i).then(|| v(i) as i32)).collect::<Int32Array>()),
        2 => Arc::new((0..n).map(|i| valid(i).then(|| v(i) * 1_000_003)).collect::<Int64Array>()),
        3 => Arc::new((0..n).map(|i| valid(i).then(|| v(i).unsigned_abs() as u16)).collect::<UInt16Array>()),
        4 => Arc::new((0..n).map(|i| valid(i).then(|| v(i).unsigned_abs())).collect::<UInt64Array>()),
        5 => Arc::new(
            (0..n).map(|i| valid(i).then(|| f16::from_f32(v(i) as f32 / 4.0))).collect::<Float16Array>(),
        ),
        6 => Arc::new((0..n).map(|i| valid(i).then(|| v(i) as f32 / 8.0)).collect::<Float32Array>()),
        _ => Arc::new((0..n).map(|i| valid(i).then(|| v(i) as f64 / 3.0)).collect::<Float64Array>()),
    }
}

fn bool_column(n: usize, null_every: usize) -> ArrayRef {
    Arc::new(
        (0..n)
            .map(|i| (null_every == 0 || i % null_every != 2).then_some(i % 3 == 0))
            .collect::<BooleanArray>(),
    )
}

/// The C-order bytes of a host tensor (a copy for F order).
fn c_bytes(t: &Tensor) -> Vec<u8> {
    if t.is_c_contiguous() {
        t.as_bytes().unwrap().to_vec()
    } else {
        contiguous_copy(t).unwrap().as_bytes().unwrap().to_vec()
    }
}

/// Rows `start..end` of a C-order tensor's bytes.
fn rows_of(t: &Tensor, start: usize, end: usize) -> Vec<u8> {
    let n = t.shape()[0] as usize;
    let row = t.nbytes().checked_div(n).unwrap_or(0);
    c_bytes(t)[start * row..end * row].to_vec()
}

/// The tensors of a result, in column order (one for a stack).
fn parts(t: TableTensors) -> Vec<Converted> {
    match t {
        TableTensors::One(c) => vec![c],
        TableTensors::Dict(d) => d.into_iter().map(|(_, c)| c).collect(),
    }
}

struct Case {
    fields: Vec<Arc<Field>>,
    /// Input batches: per batch, its columns.
    input: Vec<Vec<ArrayRef>>,
    rows: usize,
}

fn case(kinds: &[u8], with_bool: bool, sizes: &[usize], null_every: usize) -> Case {
    let mut fields: Vec<Arc<Field>> = kinds
        .iter()
        .enumerate()
        .map(|(j, &k)| Arc::new(Field::new(format!("c{j}"), column(k, 0, 0, 0).data_type().clone(), true)))
        .collect();
    if with_bool {
        fields.push(Arc::new(Field::new("flag", arrow_schema::DataType::Boolean, true)));
    }
    let mut start = 0;
    let input = sizes
        .iter()
        .map(|&n| {
            let mut cols: Vec<ArrayRef> = kinds
                .iter()
                .enumerate()
                .map(|(j, &k)| column(k, n, start as i64 + j as i64 * 13, null_every))
                .collect();
            if with_bool {
                cols.push(bool_column(n, null_every));
            }
            start += n;
            cols
        })
        .collect();
    Case { fields, input, rows: start }
}

/// The batches of `c`: through [`Batches`], or with `ahead = Some(depth)` cut by a [`Batcher`]
/// and converted up to `depth` at once by [`Ahead`], as the Python binding's thread does.
fn run(c: &Case, options: BatchOptions, ahead: Option<usize>) -> Vec<dlframe::Result<TableTensors>> {
    let schema = Arc::new(Schema::new(c.fields.clone()));
    let Some(depth) = ahead else {
        let input: Vec<Result<RecordBatch, ArrowError>> =
            c.input.iter().map(|cols| RecordBatch::try_new(schema.clone(), cols.clone())).collect();
        return Batches::new(schema, input.into_iter(), options).collect();
    };
    let mut batcher = Batcher::new(c.fields.clone(), true, options).unwrap();
    let mut ahead = Ahead::new(depth);
    let mut out = Vec::new();
    let mut drive = |batcher: &mut Batcher, ahead: &mut Ahead| {
        while let Some(w) = batcher.next_window() {
            if ahead.is_full() {
                out.push(ahead.pop().unwrap());
            }
            ahead.push(w);
        }
    };
    for cols in &c.input {
        batcher.push(cols.clone()).unwrap();
        drive(&mut batcher, &mut ahead);
    }
    batcher.end();
    drive(&mut batcher, &mut ahead);
    out.extend(std::iter::from_fn(|| ahead.pop()));
    out
}

/// The whole input converted at once, from its batches as chunks.
fn reference(c: &Case, options: &BatchOptions) -> dlframe::Result<TableTensors> {
    let columns: Vec<Vec<ArrayRef>> =
        (0..c.fields.len()).map(|j| c.input.iter().map(|b| b[j].clone()).collect()).collect();
    table_on(&c.fields, &columns, options.columns, &options.export, Device::Cpu)
}

fn policies() -> impl Strategy<Value = NullPolicy> {
    prop_oneof![Just(NullPolicy::Fill(Scalar::Int(1))), Just(NullPolicy::Mask)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn batches_are_exact_and_equal_the_reference(
        kinds in prop::collection::vec(0u8..8, 1..4),
        with_bool in any::<bool>(),
        sizes in prop::collection::vec(0usize..40, 0..8),
        batch_size in 1usize..30,
        null_every in prop_oneof![Just(0usize), 2usize..6],
        nulls in policies(),
        cast in any::<bool>(),
        dict in any::<bool>(),
        f_order in any::<bool>(),
        drop_last in any::<bool>(),
        shards in 1usize..4,
        shard_seed in any::<usize>(),
    ) {
        let c = case(&kinds, with_bool, &sizes, null_every);
        let shard = shard_seed % shards;
        let export = ExportOptions {
            nulls,
            dtype: cast.then_some(DType::Float64),
            order: if f_order { Order::F } else { Order::C },
            ..Default::default()
        };
        let columns = if dict { Columns::Dict } else { Columns::Stack };
        let options = BatchOptions { drop_last, columns, export, ..BatchOptions::new(batch_size).unwrap() }
            .for_worker(shard, shards)
            .unwrap();
        let expected = reference(&c, &options);
        let depth = shard_seed / 4 % 4;
        let got = run(&c, options, (depth > 0).then_some(depth));
        let whole = c.rows / batch_size + usize::from(!drop_last && c.rows % batch_size > 0);
        let mine: Vec<usize> = (0..whole).filter(|g| g % shards == shard).collect();
        let expected = match expected {
            Ok(e) => parts(e),
            Err(e) => {
                // A table the whole conversion refuses for its types (a bool cast to numbers) is
                // refused batch by batch, with the same message.
                prop_assert_eq!(got.len(), mine.len());
                for b in &got {
                    prop_assert_eq!(b.as_ref().unwrap_err().to_string(), e.to_string());
                }
                return Ok(());
            }
        };
        prop_assert_eq!(got.len(), mine.len());
        for (b, &g) in got.into_iter().zip(&mine) {
            let (start, end) = (g * batch_size, ((g + 1) * batch_size).min(c.rows));
            let b = parts(b.unwrap());
            prop_assert_eq!(b.len(), expected.len());
            for (p, e) in b.iter().zip(&expected) {
                prop_assert_eq!(p.values.shape()[0] as usize, end - start);
                prop_assert_eq!(&p.values.shape()[1..], &e.values.shape()[1..]);
                prop_assert_eq!(p.values.dtype(), e.values.dtype());
                prop_assert_eq!(rows_of(&p.values, 0, end - start), rows_of(&e.values, start, end));
                // No mask means every value is valid (the binding then makes an all-true one).
                let cells = p.values.numel();
                let got_mask = p.mask.as_ref().map_or(vec![1u8; cells], |m| rows_of(m, 0, end - start));
                let want_mask = e.mask.as_ref().map_or(vec![1u8; cells], |m| rows_of(m, start, end));
                prop_assert_eq!(got_mask, want_mask);
            }
        }
    }
}

fn f32_case(sizes: &[usize]) -> Case {
    case(&[6], false, sizes, 0)
}

#[test]
fn a_window_inside_one_input_batch_shares_its_memory_and_one_across_two_is_one_copy() {
    let c = f32_case(&[10, 6]);
    let input: Vec<Vec<ArrayRef>> = c.input.clone();
    let mut b = Batcher::new(c.fields.clone(), false, BatchOptions::new(4).unwrap()).unwrap();
    for cols in input.iter().cloned() {
        b.push(cols).unwrap();
    }
    b.end();
    let base = input[0][0].to_data().buffers()[0].as_ptr();
    let values = |r: Option<dlframe::Result<TableTensors>>| parts(r.unwrap().unwrap()).remove(0).values;
    let first = values(b.next_ready());
    let second = values(b.next_ready());
    // Rows 0..4 and 4..8 of the first input batch: views into its buffer, read-only.
    assert_eq!((first.data_ptr(), first.readonly(), first.copied()), (base, true, false));
    assert_eq!(second.data_ptr() as usize, base as usize + 16);
    // Rows 8..12 span both input batches: one fresh, writable copy.
    let third = values(b.next_ready());
    assert!(third.copied() && !third.readonly());
    assert_eq!(third.as_slice::<f32>().unwrap(), rows_f32(&c, 8, 12));
    let last = values(b.next_ready());
    assert_eq!(last.shape(), &[4]);
    assert!(b.next_ready().is_none());
    assert_eq!(b.buffered(), 0);
}

fn rows_f32(c: &Case, start: usize, end: usize) -> Vec<f32> {
    let all: Vec<f32> = c
        .input
        .iter()
        .flat_map(|b| {
            arrow_array::cast::AsArray::as_primitive::<arrow_array::types::Float32Type>(&b[0])
                .values()
                .to_vec()
        })
        .collect();
    all[start..end].to_vec()
}

#[test]
fn the_last_short_batch_is_kept_or_dropped_and_nothing_is_held_after_it() {
    let c = f32_case(&[5, 0, 3]);
    let one = |drop_last| {
        let mut b = Batcher::new(
            c.fields.clone(),
            false,
            BatchOptions { drop_last, ..BatchOptions::new(3).unwrap() },
        )
        .unwrap();
        for cols in c.input.iter().cloned() {
            b.push(cols).unwrap();
        }
        let mut shapes = Vec::new();
        while let Some(r) = b.next_ready() {
            shapes.push(parts(r.unwrap())[0].values.shape().to_vec());
        }
        // Without the end of the input, the 2 rows left wait for more.
        assert_eq!(b.buffered(), 2);
        b.end();
        while let Some(r) = b.next_ready() {
            shapes.push(parts(r.unwrap())[0].values.shape().to_vec());
        }
        shapes
    };
    assert_eq!(one(false), [vec![3], vec![3], vec![2]]);
    assert_eq!(one(true), [vec![3], vec![3]]);
}

#[test]
fn bad_input_and_options_are_refused_with_the_reason() {
    assert!(BatchOptions::new(0).unwrap_err().to_string().contains("batch_size must be at least 1"));
    assert!(
        BatchOptions::new(4).unwrap().for_worker(2, 2).unwrap_err().to_string().contains("worker 2 of 2")
    );
    let c = case(&[6, 1], false, &[3], 0);
    let mut b = Batcher::new(c.fields.clone(), true, BatchOptions::new(2).unwrap()).unwrap();
    let e = b.push(vec![c.input[0][0].clone()]).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { expected: 2, found: 1, .. }), "{e}");
    let e = b.push(vec![c.input[0][0].clone(), c.input[0][0].clone()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("column 'c1' of an input batch is Float32, but the stream's schema says Int32"),
        "{e}"
    );
    let e = b.push(vec![c.input[0][0].clone(), c.input[0][1].slice(0, 2)]).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { expected: 3, found: 2, .. }), "{e}");
    // Nulls under the default policy: the batch that has them fails, naming the column.
    let c = case(&[6], false, &[4, 4], 2);
    let got = run(&c, BatchOptions::new(3).unwrap(), None);
    let e = got[0].as_ref().unwrap_err();
    assert!(matches!(e, Error::Nulls { null_count: 1, .. }), "{e}");
    // A failing source ends the batches after its error.
    let schema = Arc::new(Schema::new(c.fields.clone()));
    let input = vec![
        RecordBatch::try_new(schema.clone(), c.input[0].clone()),
        Err(ArrowError::IoError("the disk went away".into(), std::io::Error::other("gone"))),
        RecordBatch::try_new(schema.clone(), c.input[1].clone()),
    ];
    let opts = BatchOptions {
        export: ExportOptions { nulls: NullPolicy::Nan, ..Default::default() },
        ..BatchOptions::new(3).unwrap()
    };
    let got: Vec<_> = Batches::new(schema, input.into_iter(), opts).collect();
    assert_eq!(got.len(), 2, "one full batch, then the error, then nothing");
    assert!(got[0].is_ok());
    assert!(got[1].as_ref().unwrap_err().to_string().contains("the disk went away"));
}

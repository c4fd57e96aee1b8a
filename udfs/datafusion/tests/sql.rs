//! Every SQL function through a real `SessionContext`: types and promotion, nulls, lists,
//! empty tables, several batches, WHERE / GROUP BY / subqueries, metadata through the plan,
//! and results and tables as tensors.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int64Type};
use arrow_array::*;
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema};
use datafusion::catalog::MemTable;
use datafusion::prelude::SessionContext;
use dlframe::arrow::TensorMetadata;
use dlframe::{DType, Tensor};
use dlframe_datafusion::{collect_tensor, register, register_tensors, sql_to_tensor};

fn ctx_with(batches: Vec<RecordBatch>) -> SessionContext {
    let ctx = SessionContext::new();
    register(&ctx);
    let schema = batches[0].schema();
    let parts = batches.into_iter().map(|b| vec![b]).collect();
    ctx.register_table("t", Arc::new(MemTable::try_new(schema, parts).unwrap())).unwrap();
    ctx
}

fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter_with_nullable(
        columns.into_iter().map(|(n, a)| (n, a.clone(), a.null_count() > 0)),
    )
    .unwrap()
}

async fn query(
    ctx: &SessionContext,
    sql: &str,
) -> datafusion::common::Result<(Arc<Schema>, Vec<RecordBatch>)> {
    let df = ctx.sql(sql).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    Ok((schema, df.collect().await?))
}

async fn tensor(ctx: &SessionContext, sql: &str) -> Tensor {
    sql_to_tensor(ctx, sql, None).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn error(ctx: &SessionContext, sql: &str) -> String {
    match query(ctx, sql).await {
        Ok(_) => panic!("{sql} should fail"),
        Err(e) => e.to_string(),
    }
}

fn f64s(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::Float64 => t.as_slice::<f64>().unwrap().to_vec(),
        DType::Float32 => t.as_slice::<f32>().unwrap().iter().map(|&v| v as f64).collect(),
        DType::Int64 => t.as_slice::<i64>().unwrap().iter().map(|&v| v as f64).collect(),
        DType::Int32 => t.as_slice::<i32>().unwrap().iter().map(|&v| v as f64).collect(),
        other => panic!("unexpected {other}"),
    }
}

fn numeric_columns() -> Vec<(&'static str, ArrayRef, DType)> {
    vec![
        ("i8", Arc::new(Int8Array::from(vec![1, -2, 3])), DType::Int8),
        ("i16", Arc::new(Int16Array::from(vec![1, -2, 3])), DType::Int16),
        ("i32", Arc::new(Int32Array::from(vec![1, -2, 3])), DType::Int32),
        ("i64", Arc::new(Int64Array::from(vec![1, -2, 3])), DType::Int64),
        ("u8", Arc::new(UInt8Array::from(vec![1, 2, 3])), DType::UInt8),
        ("u16", Arc::new(UInt16Array::from(vec![1, 2, 3])), DType::UInt16),
        ("u32", Arc::new(UInt32Array::from(vec![1, 2, 3])), DType::UInt32),
        ("u64", Arc::new(UInt64Array::from(vec![1, 2, 3])), DType::UInt64),
        ("f16", Arc::new(Float16Array::from(vec![half::f16::ONE; 3])), DType::Float16),
        ("f32", Arc::new(Float32Array::from(vec![1.5, -2.5, 3.5])), DType::Float32),
        ("f64", Arc::new(Float64Array::from(vec![1.5, -2.5, 3.5])), DType::Float64),
    ]
}

#[tokio::test]
async fn each_numeric_type_keeps_its_dtype_and_values() {
    let cols = numeric_columns();
    let ctx = ctx_with(vec![batch(cols.iter().map(|(n, a, _)| (*n, a.clone())).collect())]);
    for (name, array, dtype) in &cols {
        let t = tensor(&ctx, &format!("SELECT to_tensor({name}, {name}) FROM t")).await;
        assert_eq!(t.dtype(), *dtype, "{name}");
        assert_eq!(t.shape(), &[3, 2]);
        let (_, batches) = query(&ctx, &format!("SELECT to_tensor({name}) AS x FROM t")).await.unwrap();
        let list = batches[0].column(0).as_fixed_size_list();
        assert_eq!(list.values().as_ref(), array.as_ref(), "{name}");
        assert_eq!(list.value_length(), 1);
    }
}

#[tokio::test]
async fn mixed_types_promote_like_numpy_and_interleave_row_by_row() {
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Int32Array::from(vec![1, 2]))),
        ("b", Arc::new(Float32Array::from(vec![0.5, 1.5]))),
        ("c", Arc::new(Int16Array::from(vec![7, 8]))),
        ("d", Arc::new(Float32Array::from(vec![9.0, 10.0]))),
    ])]);
    let t = tensor(&ctx, "SELECT to_tensor(a, b) FROM t").await;
    assert_eq!(t.dtype(), DType::Float64, "int32 + float32 -> float64");
    assert_eq!(f64s(&t), vec![1.0, 0.5, 2.0, 1.5]);
    let t = tensor(&ctx, "SELECT to_tensor(c, d) FROM t").await;
    assert_eq!(t.dtype(), DType::Float32, "int16 + float32 -> float32");
    assert_eq!(f64s(&t), vec![7.0, 9.0, 8.0, 10.0]);
    let t = tensor(&ctx, "SELECT to_tensor_as('float32', a, b, c) FROM t").await;
    assert_eq!(t.dtype(), DType::Float32);
    assert_eq!(f64s(&t), vec![1.0, 0.5, 7.0, 2.0, 1.5, 8.0]);
    let t = tensor(&ctx, "SELECT to_tensor_as('int64', a, c) FROM t").await;
    assert_eq!(t.as_slice::<i64>().unwrap(), &[1, 7, 2, 8]);
    let e = error(&ctx, "SELECT to_tensor_as('int8', a, b) FROM t").await;
    assert!(e.contains("does not fit"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_as('float31', a) FROM t").await;
    assert!(e.contains("float31") && e.contains("float32"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_as(a, b) FROM t").await;
    assert!(e.contains("must be a literal"), "{e}");
}

#[tokio::test]
async fn inexact_integers_are_refused_unless_the_session_asks_for_rounding() {
    let big = (1i64 << 53) + 1;
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Int32Array::from(vec![1, 16_777_217]))),
        ("big", Arc::new(Int64Array::from(vec![2, big]))),
    ])]);
    let e = error(&ctx, "SELECT to_tensor_as('float64', a, big) FROM t").await;
    assert!(e.contains("9007199254740993 at row 1 of a batch of 2 rows, column 'big'"), "{e}");
    assert!(e.contains("has no exact float64"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_as('float32', a) FROM t").await;
    assert!(e.contains("16777217") && e.contains("SET dlframe.inexact = 'round'"), "{e}");
    assert!(e.contains("CAST(x AS DOUBLE)") && !e.contains("inexact='round'"), "{e}");
    // int64 holds every int32 and float64 every int32: the default promotion passes.
    let t = tensor(&ctx, "SELECT to_tensor(a, CAST(a AS DOUBLE)) FROM t").await;
    assert_eq!(f64s(&t), vec![1.0, 1.0, 16_777_217.0, 16_777_217.0]);
    ctx.sql("SET dlframe.inexact = 'round'").await.unwrap();
    let t = tensor(&ctx, "SELECT to_tensor_as('float64', a, big) FROM t").await;
    assert_eq!(f64s(&t), vec![1.0, 2.0, 16_777_217.0, 9_007_199_254_740_992.0]);
    ctx.sql("SET dlframe.inexact = 'nearest'").await.unwrap();
    let e = error(&ctx, "SELECT to_tensor_as('float64', a, big) FROM t").await;
    assert!(e.contains("dlframe.inexact") && e.contains("'error' or 'round'"), "{e}");
}

#[tokio::test]
async fn the_output_is_a_fixed_shape_tensor_with_a_non_null_child() {
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Float32Array::from(vec![1.0, 2.0]))),
        ("b", Arc::new(Float32Array::from(vec![3.0, 4.0]))),
    ])]);
    let (schema, batches) = query(&ctx, "SELECT to_tensor(a, b) AS x FROM t").await.unwrap();
    let field = schema.field(0);
    let meta = TensorMetadata::from_field(field).unwrap().expect("tensor metadata on the result");
    assert_eq!(meta.shape, vec![2]);
    let DataType::FixedSizeList(item, 2) = field.data_type() else { panic!("{}", field.data_type()) };
    assert!(!item.is_nullable());
    assert_eq!(item.data_type(), &DataType::Float32);
    assert_eq!(batches[0].schema().field(0).metadata(), field.metadata());
}

#[tokio::test]
async fn nulls_are_an_error_naming_the_column_or_are_filled_in_the_same_pass() {
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0)]))),
        ("b", Arc::new(Int64Array::from(vec![None, Some(5), Some(6)]))),
    ])]);
    let e = error(&ctx, "SELECT to_tensor(a, b) FROM t").await;
    assert!(e.contains("'a'") && e.contains("1 null") && e.contains("to_tensor_fill"), "{e}");
    let t = tensor(&ctx, "SELECT to_tensor_fill(-1, a, b) FROM t").await;
    assert_eq!(f64s(&t), vec![1.0, -1.0, -1.0, 5.0, 3.0, 6.0]);
    let t = tensor(&ctx, "SELECT to_tensor_fill(0.5, a) FROM t").await;
    assert_eq!(f64s(&t), vec![1.0, 0.5, 3.0]);
    let e = error(&ctx, "SELECT to_tensor_fill(0.5, b) FROM t").await;
    assert!(e.contains("does not fit"), "{e}");
    let t = tensor(&ctx, "SELECT to_tensor(a, b) FROM t WHERE a IS NOT NULL AND b IS NOT NULL").await;
    assert_eq!(f64s(&t), vec![3.0, 6.0]);
    let e = error(&ctx, "SELECT to_tensor_fill(b, a) FROM t").await;
    assert!(e.contains("must be a literal"), "{e}");
}

fn list_array(rows: Vec<Option<Vec<Option<f32>>>>) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(rows))
}

#[tokio::test]
async fn lists_become_tensors_and_ragged_rows_are_named() {
    let fsl = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float64, false)),
        3,
        Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
        None,
    )
    .unwrap();
    let fsl_values = fsl.values().to_data().buffers()[0].as_ptr();
    let ctx = ctx_with(vec![batch(vec![
        ("l", list_array(vec![Some(vec![Some(1.0), Some(2.0)]), Some(vec![Some(3.0), Some(4.0)])])),
        ("r", list_array(vec![Some(vec![Some(1.0), Some(2.0)]), Some(vec![Some(3.0)])])),
        ("n", list_array(vec![Some(vec![Some(1.0), None]), Some(vec![Some(3.0), Some(4.0)])])),
        ("f", Arc::new(fsl)),
    ])]);
    let t = tensor(&ctx, "SELECT to_tensor(l, 2) FROM t").await;
    assert_eq!((t.shape(), f64s(&t)), (&[2i64, 2][..], vec![1.0, 2.0, 3.0, 4.0]));
    let t = tensor(&ctx, "SELECT to_tensor(l, 1, 2) FROM t").await;
    assert_eq!(t.shape(), &[2, 1, 2]);
    let (_, batches) = query(&ctx, "SELECT to_tensor(f) FROM t").await.unwrap();
    let out = batches[0].column(0).as_fixed_size_list();
    assert_eq!(out.values().to_data().buffers()[0].as_ptr(), fsl_values, "a FixedSizeList is not copied");
    let t = tensor(&ctx, "SELECT to_tensor(f, 3, 1) FROM t").await;
    assert_eq!(t.shape(), &[2, 3, 1]);
    let t = tensor(&ctx, "SELECT to_tensor_as('float32', f) FROM t").await;
    assert_eq!((t.dtype(), f64s(&t)), (DType::Float32, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
    let e = error(&ctx, "SELECT to_tensor(r, 2) FROM t").await;
    assert!(e.contains("row 1"), "{e}");
    let e = error(&ctx, "SELECT to_tensor(l) FROM t").await;
    assert!(e.contains("to_tensor(l, d)"), "{e}");
    let e = error(&ctx, "SELECT to_tensor(l, 3) FROM t").await;
    assert!(e.contains("row 0 of list column 'l' (in a batch of 2 rows"), "{e}");
    assert!(e.contains("has 2 elements, but the shape [3] needs 3"), "{e}");
    let e = error(&ctx, "SELECT to_tensor(n, 2) FROM t").await;
    assert!(e.contains("null"), "{e}");
    let t = tensor(&ctx, "SELECT to_tensor_fill(9, n, 2) FROM t").await;
    assert_eq!(f64s(&t), vec![1.0, 9.0, 3.0, 4.0]);
    let e = error(&ctx, "SELECT to_tensor(l, f) FROM t").await;
    assert!(e.contains("literal"), "{e}");
    let e = error(&ctx, "SELECT to_tensor(f, 4) FROM t").await;
    assert!(e.contains("holds 4 elements but each cell has 3"), "{e}");
}

#[tokio::test]
async fn strings_and_mixed_lists_are_refused_while_planning() {
    let ctx = ctx_with(vec![batch(vec![
        ("s", Arc::new(StringArray::from(vec!["x"]))),
        ("a", Arc::new(Int32Array::from(vec![1]))),
        ("l", list_array(vec![Some(vec![Some(1.0)])])),
    ])]);
    let e = error(&ctx, "SELECT to_tensor(a, s) FROM t").await;
    assert!(e.contains("column 's'") && e.contains("Utf8") && e.contains("cannot become a tensor"), "{e}");
    let e = error(&ctx, "SELECT to_tensor(a, l) FROM t").await;
    assert!(e.contains("'l' is a list"), "{e}");
    let e = error(&ctx, "SELECT to_tensor() FROM t").await;
    assert!(!e.is_empty());
    let e = error(&ctx, "SELECT tensor_shape(a) FROM t").await;
    assert!(e.contains("FixedSizeList"), "{e}");
}

#[tokio::test]
async fn empty_tables_and_many_batches() {
    let make = |lo: i64, hi: i64| {
        batch(vec![
            ("a", Arc::new(Int64Array::from_iter_values(lo..hi)) as ArrayRef),
            ("b", Arc::new(Float64Array::from_iter_values((lo..hi).map(|v| v as f64 / 2.0)))),
        ])
    };
    let ctx = ctx_with(vec![make(0, 100), make(100, 250), make(250, 251)]);
    let t = tensor(&ctx, "SELECT to_tensor(a, b) FROM t ORDER BY a").await;
    assert_eq!(t.shape(), &[251, 2]);
    let v = f64s(&t);
    assert!((0..251).all(|i| v[2 * i] == i as f64 && v[2 * i + 1] == i as f64 / 2.0));
    let t = tensor(&ctx, "SELECT to_tensor(a, b) FROM t WHERE a < 0").await;
    assert_eq!(t.shape(), &[0, 2]);
    let empty = ctx_with(vec![make(0, 0)]);
    let t = tensor(&empty, "SELECT to_tensor_as('float32', a, b) FROM t").await;
    assert_eq!((t.shape(), t.dtype()), (&[0i64, 2][..], DType::Float32));
}

#[tokio::test]
async fn where_group_by_and_subqueries() {
    let ctx = ctx_with(vec![batch(vec![
        ("g", Arc::new(Int64Array::from(vec![1, 2, 1, 2]))),
        ("a", Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0]))),
        ("b", Arc::new(Float64Array::from(vec![5.0, 6.0, 7.0, 8.0]))),
    ])]);
    let t = tensor(&ctx, "SELECT to_tensor(a, b) FROM t WHERE tensor_element(to_tensor(a, b), 1) > 6").await;
    assert_eq!(f64s(&t), vec![3.0, 7.0, 4.0, 8.0]);
    let (_, b) =
        query(&ctx, "SELECT g, sum(tensor_element(to_tensor(a, b), 0)) AS s FROM t GROUP BY g ORDER BY g")
            .await
            .unwrap();
    assert_eq!(b[0].column(1).as_primitive::<Float64Type>().values(), &[4.0, 6.0]);
    let (_, b) =
        query(&ctx, "SELECT g, count(*) FROM t GROUP BY g, to_tensor(a, b) ORDER BY g").await.unwrap();
    assert_eq!(b.iter().map(|b| b.num_rows()).sum::<usize>(), 4);
    let t = tensor(&ctx, "SELECT x FROM (SELECT to_tensor(a, b) AS x, g FROM t) WHERE g = 2").await;
    assert_eq!(t.shape(), &[2, 2], "metadata survives a subquery");
    assert_eq!(f64s(&t), vec![2.0, 6.0, 4.0, 8.0]);
    let t = tensor(&ctx, "SELECT tensor_reshape(x, 2, 1) FROM (SELECT to_tensor(a, b) AS x FROM t) s").await;
    assert_eq!(t.shape(), &[4, 2, 1]);
}

#[tokio::test]
async fn case_drops_the_extension_metadata_as_datafusion_24860_documents() {
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
        ("b", Arc::new(Float64Array::from(vec![5.0, 6.0]))),
    ])]);
    let sql = "SELECT CASE WHEN a > 0 THEN tensor_reshape(to_tensor(a, b), 2, 1) END AS x FROM t";
    let (schema, _) = query(&ctx, sql).await.unwrap();
    let kept = TensorMetadata::from_field(schema.field(0)).unwrap();
    // DataFusion 55 loses the field metadata through CASE: the column is a plain FixedSizeList
    // of 2, so it collects as (n, 2) rather than (n, 2, 1). If a release fixes #24860 this
    // assertion fails and the note in docs/design.md ("SQL") can go.
    assert_eq!(kept, None);
    let t = tensor(&ctx, sql).await;
    assert_eq!(t.shape(), &[2, 2]);
    let t = tensor(
        &ctx,
        &sql.replace("CASE WHEN a > 0 THEN", "tensor_reshape(CASE WHEN a > 0 THEN")
            .replace("END", "END, 2, 1)"),
    )
    .await;
    assert_eq!(t.shape(), &[2, 2, 1], "tensor_reshape after CASE restores the shape");
}

#[tokio::test]
async fn inspection_functions() {
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Float32Array::from(vec![1.0, 2.0]))),
        ("b", Arc::new(Float32Array::from(vec![3.0, 4.0]))),
        ("c", Arc::new(Float32Array::from(vec![5.0, 6.0]))),
        ("d", Arc::new(Float32Array::from(vec![7.0, 8.0]))),
        ("e", Arc::new(Float32Array::from(vec![9.0, 10.0]))),
        ("f", Arc::new(Float32Array::from(vec![11.0, 12.0]))),
    ])]);
    let sql = "SELECT tensor_shape(x) AS s, tensor_ndim(x) AS n, tensor_dtype(x) AS d, \
               tensor_element(x, 1, 0) AS e, tensor_element(x, -1, -1) AS last \
               FROM (SELECT tensor_reshape(to_tensor(a, b, c, d, e, f), -1, 3) AS x FROM t) s";
    let (_, b) = query(&ctx, sql).await.unwrap();
    let b = &b[0];
    let shapes = b.column(0).as_list::<i32>();
    assert_eq!(shapes.value(0).as_primitive::<Int64Type>().values(), &[2, 3]);
    assert_eq!(b.column(1).as_primitive::<Int64Type>().values(), &[2, 2]);
    assert_eq!(b.column(2).as_string::<i32>().value(1), "float32");
    assert_eq!(b.column(3).as_primitive::<Float32Type>().values(), &[7.0, 8.0]);
    assert_eq!(b.column(4).as_primitive::<Float32Type>().values(), &[11.0, 12.0]);
    let e = error(&ctx, "SELECT tensor_element(to_tensor(a, b), 2) FROM t").await;
    assert!(e.contains("index 2 is out of bounds for dimension 0 of size 2 in row 0"), "{e}");
    let e = error(&ctx, "SELECT tensor_element(to_tensor(a, b), 0, 0) FROM t").await;
    assert!(e.contains("1 dimension(s) and 2 index(es)"), "{e}");
    let e = error(&ctx, "SELECT tensor_reshape(to_tensor(a, b, c), -1, 2) FROM t").await;
    assert!(e.contains("cannot infer -1"), "{e}");
}

#[tokio::test]
async fn permuted_tensor_columns_index_in_logical_order() {
    // A pyarrow-style tensor column: physical shape [2, 3], permutation [1, 0] (logical 3 x 2).
    let meta = TensorMetadata { shape: vec![2, 3], dim_names: None, permutation: Some(vec![1, 0]) };
    let item: FieldRef = Arc::new(Field::new("item", DataType::Int64, true));
    let storage =
        FixedSizeListArray::try_new(item, 6, Arc::new(Int64Array::from_iter_values(0..6)), None).unwrap();
    let field = Field::new("p", storage.data_type().clone(), false).with_metadata(meta.field_metadata());
    let schema = Arc::new(Schema::new(vec![field]));
    let ctx = ctx_with(vec![RecordBatch::try_new(schema, vec![Arc::new(storage)]).unwrap()]);
    let (_, b) = query(&ctx, "SELECT tensor_shape(p), tensor_element(p, 2, 1) FROM t").await.unwrap();
    assert_eq!(b[0].column(0).as_list::<i32>().value(0).as_primitive::<Int64Type>().values(), &[3, 2]);
    // logical [2, 1] is physical [1, 2] = 1 * 3 + 2.
    assert_eq!(b[0].column(1).as_primitive::<Int64Type>().value(0), 5);
    let e = error(&ctx, "SELECT tensor_reshape(p, 6) FROM t").await;
    assert!(e.contains("permuted"), "{e}");
    let t = tensor(&ctx, "SELECT to_tensor(p) FROM t").await;
    assert_eq!((t.shape(), t.strides()), (&[1i64, 3, 2][..], &[6i64, 1, 3][..]), "kept permuted, zero-copy");
}

#[tokio::test]
async fn one_batch_collects_without_copying_and_tables_serve_tensors_without_copying() {
    let x = Tensor::from_vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), vec![4, 3]).unwrap();
    let y = Tensor::from_vec(vec![10i64, 20, 30, 40], vec![4]).unwrap();
    let ctx = SessionContext::new();
    register(&ctx);
    register_tensors(&ctx, "m", &[("x", &x), ("y", &y)]).unwrap();
    let (schema, batches) = query(&ctx, "SELECT x, y FROM m").await.unwrap();
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(total, 4);
    let first = batches.iter().find(|b| b.num_rows() > 0).unwrap();
    let xs = first.column(0).as_fixed_size_list().values().to_data();
    let base = xs.buffers()[0].as_ptr() as usize;
    assert!(base >= x.data_ptr() as usize && base < x.data_ptr() as usize + x.nbytes(), "x is shared");
    let one = collect_tensor(&schema, &batches[..1], "y").unwrap();
    assert!(one.data_ptr() as usize >= y.data_ptr() as usize, "one batch: a view of y's memory");
    assert!((one.data_ptr() as usize) < y.data_ptr() as usize + y.nbytes());
    let t = tensor(&ctx, "SELECT x FROM m ORDER BY y").await;
    assert_eq!((t.shape(), f64s(&t)), (&[4i64, 3][..], (0..12).map(f64::from).collect::<Vec<_>>()));
    let t = tensor(&ctx, "SELECT sum(y) FROM m").await;
    assert_eq!(f64s(&t), vec![100.0]);
    let t = tensor(&ctx, "SELECT tensor_element(x, 2) * y AS z FROM m ORDER BY y").await;
    assert_eq!(f64s(&t), vec![20.0, 100.0, 240.0, 440.0]);
    let e = sql_to_tensor(&ctx, "SELECT x, y FROM m", None).await.unwrap_err().to_string();
    assert!(e.contains("name the one"), "{e}");
    let short = Tensor::from_vec(vec![1i64], vec![1]).unwrap();
    let e = register_tensors(&ctx, "bad", &[("x", &x), ("s", &short)]).unwrap_err().to_string();
    assert!(e.contains("length") || e.contains("same"), "{e}");
}

#[tokio::test]
async fn collect_concatenates_many_batches_into_one_buffer() {
    let lists: Vec<RecordBatch> = (0..5)
        .map(|k| {
            let item = Arc::new(Field::new("item", DataType::Float32, false));
            let vals = Float32Array::from_iter_values((0..20).map(|v| (k * 20 + v) as f32));
            let list = ListArray::new(
                item,
                OffsetBuffer::new(ScalarBuffer::from(vec![0, 4, 8, 12, 16, 20])),
                Arc::new(vals),
                None,
            );
            batch(vec![("l", Arc::new(list) as ArrayRef)])
        })
        .collect();
    let ctx = ctx_with(lists);
    let t = tensor(&ctx, "SELECT to_tensor(l, 2, 2) AS x FROM t").await;
    assert_eq!(t.shape(), &[25, 2, 2]);
    assert!(t.copied());
    let mut v = f64s(&t);
    v.sort_by(f64::total_cmp);
    assert_eq!(v, (0..100).map(f64::from).collect::<Vec<_>>());
}

#[tokio::test]
async fn float_narrowing_that_overflows_is_an_error_and_inf_and_nan_stay() {
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Float64Array::from(vec![1.0, 70000.0])) as ArrayRef),
        ("b", Arc::new(Float64Array::from(vec![f64::INFINITY, f64::NAN])) as ArrayRef),
        ("c", Arc::new(Float64Array::from(vec![1.0, 1e300])) as ArrayRef),
    ])]);
    let e = error(&ctx, "SELECT to_tensor_as('float16', a) FROM t").await;
    assert!(e.contains("70000") && e.contains("row 1") && e.contains("float16"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_as('float32', b, c) FROM t").await;
    assert!(e.contains("1e300") && e.contains("row 1") && e.contains("float32"), "{e}");
    let t = tensor(&ctx, "SELECT to_tensor_as('float32', b) FROM t").await;
    let got = t.as_slice::<f32>().unwrap();
    assert!(got[0] == f32::INFINITY && got[1].is_nan(), "{got:?}");
}

#[tokio::test]
async fn bfloat16_tensors_cast_stack_fill_and_read_lance_columns() {
    use dlframe::dtype::{BFLOAT16_EXTENSION, EXTENSION_NAME_KEY};
    let bf16 = |v: f32| half::bf16::from_f32(v);
    let ctx = ctx_with(vec![batch(vec![
        ("a", Arc::new(Float32Array::from(vec![1.0 + 2f32.powi(-8), 2.5])) as ArrayRef),
        ("b", Arc::new(Int8Array::from(vec![Some(-3), None])) as ArrayRef),
    ])]);
    // A cast that rounds to nearest even (1 + 2^-8 ties to 1).
    let (schema, batches) =
        query(&ctx, "SELECT to_tensor_as('bfloat16', a, coalesce(b, 7)) AS x FROM t").await.unwrap();
    let DataType::FixedSizeList(item, 2) = schema.field(0).data_type() else { panic!("{}", schema.field(0)) };
    assert_eq!(item.metadata().get(EXTENSION_NAME_KEY).map(String::as_str), Some(BFLOAT16_EXTENSION));
    let t = tensor(&ctx, "SELECT to_tensor_as('bfloat16', a, coalesce(b, 7)) FROM t").await;
    assert_eq!((t.dtype(), t.shape()), (DType::BFloat16, &[2i64, 2][..]));
    assert_eq!(t.as_slice::<half::bf16>().unwrap(), &[bf16(1.0), bf16(-3.0), bf16(2.5), bf16(7.0)]);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 2);

    // A lance.bfloat16 column stacks with int8 as bfloat16 (as torch and jax promote).
    let bits: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| bf16(*v).to_bits().to_le_bytes()).collect();
    let w: ArrayRef = Arc::new(FixedSizeBinaryArray::new(2, arrow_buffer::Buffer::from_vec(bits), None));
    let schema = Arc::new(Schema::new(vec![
        DType::BFloat16.arrow_field("w", false),
        Field::new("i", DataType::Int8, false),
    ]));
    let rb = RecordBatch::try_new(schema.clone(), vec![w, Arc::new(Int8Array::from(vec![4, 5]))]).unwrap();
    let ctx = SessionContext::new();
    register(&ctx);
    ctx.register_table("l", Arc::new(MemTable::try_new(schema, vec![vec![rb]]).unwrap())).unwrap();
    let t = tensor(&ctx, "SELECT to_tensor(w, i) FROM l").await;
    assert_eq!(t.dtype(), DType::BFloat16);
    assert_eq!(t.as_slice::<half::bf16>().unwrap(), &[bf16(1.5), bf16(4.0), bf16(-2.0), bf16(5.0)]);
    let t = tensor(&ctx, "SELECT to_tensor_as('float32', w) FROM l").await;
    assert_eq!(t.as_slice::<f32>().unwrap(), &[1.5, -2.0]);
    // Overflow is refused, not made infinite.
    let ctx = ctx_with(vec![batch(vec![("big", Arc::new(Float64Array::from(vec![1e39])) as ArrayRef)])]);
    let e = error(&ctx, "SELECT to_tensor_as('bfloat16', big) FROM t").await;
    assert!(e.contains("does not fit bfloat16"), "{e}");
}

#[tokio::test]
async fn ragged_lists_pad_and_truncate_in_sql() {
    let large = LargeListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(1), Some(2), Some(3)]),
        None,
        Some(vec![]),
        Some(vec![Some(4), None]),
    ]);
    let ctx = ctx_with(vec![batch(vec![
        (
            "r",
            list_array(vec![
                Some(vec![Some(1.0), Some(2.0), Some(3.0)]),
                None,
                Some(vec![]),
                Some(vec![Some(4.0), None]),
            ]),
        ),
        ("big", Arc::new(large)),
    ])]);
    let t = tensor(&ctx, "SELECT to_tensor_padded(r, 4, -1) FROM t").await;
    assert_eq!(t.shape(), &[4, 4]);
    assert_eq!(t.dtype(), DType::Float32);
    #[rustfmt::skip]
    assert_eq!(f64s(&t), vec![
        1.0, 2.0, 3.0, -1.0,
        -1.0, -1.0, -1.0, -1.0,
        -1.0, -1.0, -1.0, -1.0,
        4.0, -1.0, -1.0, -1.0,
    ]);
    let t = tensor(&ctx, "SELECT to_tensor_padded(big, 2, 0) FROM t").await;
    assert_eq!((t.dtype(), f64s(&t)), (DType::Int64, vec![1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0]));
    let (schema, _) = query(&ctx, "SELECT to_tensor_padded(r, 3, 0) AS x FROM t").await.unwrap();
    let meta = TensorMetadata::from_field(schema.field(0)).unwrap().unwrap();
    assert_eq!(meta.shape, vec![3]);
    let e = error(&ctx, "SELECT to_tensor_padded(r, -1, 0) FROM t").await;
    assert!(e.contains("max_len must be >= 0"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_padded(big, 2, 1.5) FROM t").await;
    assert!(e.contains("1.5") && e.contains("int64"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_padded(r, 2) FROM t").await;
    assert!(e.contains("to_tensor_padded"), "{e}");
    let e = error(&ctx, "SELECT to_tensor(r, 3) FROM t").await;
    assert!(e.contains("use to_tensor_padded(r, max_len, pad)"), "{e}");
}

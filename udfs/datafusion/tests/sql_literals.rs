//! Arguments that must be literals, written as constant expressions (`CAST('NaN' AS DOUBLE)`),
//! and `to_tensor(*)`, which DataFusion does not expand.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::catalog::MemTable;
use datafusion::prelude::SessionContext;
use dlframe_datafusion::{register, sql_to_tensor};

fn ctx() -> SessionContext {
    let a: ArrayRef = Arc::new(Float64Array::from(vec![Some(1.0), None, Some(3.0)]));
    let b: ArrayRef = Arc::new(Int64Array::from(vec![Some(4), Some(5), None]));
    let g: ArrayRef = Arc::new(Float64Array::from(vec![0.5, 0.5, 0.25]));
    let batch =
        RecordBatch::try_from_iter_with_nullable([("a", a, true), ("b", b, true), ("g", g, false)]).unwrap();
    let ctx = SessionContext::new();
    register(&ctx);
    let table = MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx
}

async fn values(ctx: &SessionContext, sql: &str) -> Vec<f64> {
    let t = sql_to_tensor(ctx, sql, None).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    t.as_slice::<f64>().unwrap().to_vec()
}

async fn error(ctx: &SessionContext, sql: &str) -> String {
    match sql_to_tensor(ctx, sql, None).await {
        Ok(t) => panic!("{sql} should fail, gave {:?}", t.shape()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn constant_fill_expressions_fill_nulls() {
    let ctx = ctx();
    for fill in ["CAST('NaN' AS DOUBLE)", "'NaN'::double", "CAST('nan' AS FLOAT)", "-(1.5 * 2)"] {
        let v = values(&ctx, &format!("SELECT to_tensor_fill({fill}, a, b) FROM t")).await;
        assert_eq!(v.len(), 6, "{fill}");
        assert_eq!([v[0], v[1], v[4]], [1.0, 4.0, 3.0], "{fill}");
        let want = if fill.starts_with('-') { -3.0 } else { f64::NAN };
        for slot in [2, 5] {
            assert!(v[slot].total_cmp(&want).is_eq(), "{fill}: slot {slot} is {}", v[slot]);
        }
    }
    let v = values(&ctx, "SELECT to_tensor_fill(CAST('inf' AS DOUBLE), a) FROM t").await;
    assert_eq!(v, vec![1.0, f64::INFINITY, 3.0]);
    let v = values(&ctx, "SELECT to_tensor_fill(CAST('-Infinity' AS DOUBLE), a) FROM t").await;
    assert_eq!(v, vec![1.0, f64::NEG_INFINITY, 3.0]);
}

#[tokio::test]
async fn a_column_as_the_fill_is_still_refused() {
    let ctx = ctx();
    let e = error(&ctx, "SELECT to_tensor_fill(g, a) FROM t").await;
    assert!(e.contains("must be a literal"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_fill(b, a) FROM t").await;
    assert!(e.contains("must be a literal"), "{e}");
    let e = error(&ctx, "SELECT to_tensor_fill(CAST(NULL AS DOUBLE), a) FROM t").await;
    assert!(e.contains("fill value"), "{e}");
}

#[tokio::test]
async fn to_tensor_of_star_says_what_to_write_instead() {
    let ctx = ctx();
    for sql in
        ["SELECT to_tensor(*) FROM t", "SELECT to_tensor_fill(0, *) FROM t", "SELECT to_tensor(t.*) FROM t"]
    {
        let e = error(&ctx, sql).await;
        assert!(
            e.contains("does not expand") && e.contains("to_tensor") && e.contains("(a, b, c)"),
            "{sql}: {e}"
        );
        assert!(!e.contains("Null cannot become a tensor"), "{sql}: {e}");
    }
}

//! Functions that build a large value from a small input, bounded: `repeat('x', 1000000000)`
//! allocates a gigabyte outside DataFusion's memory pool, and an allocation the machine cannot
//! give stops the process. `dlframe serve` registers these wrappers over DataFusion's own
//! `repeat`, `lpad` and `rpad`: each call first works out how many bytes its result would take
//! (from the lengths and counts it was given, without building anything), and a call past the
//! limit fails with "Resources exhausted", as a query over its memory limit does. A call on
//! constants counts a full batch of its value, since that is what the plan makes of it.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array};
use arrow_schema::{DataType, FieldRef};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How a function's result size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(s, n)`: each row is `s` n times.
    Repeat,
    /// `lpad(s, n, ...)`, `rpad(s, n, ...)`: each row is n characters, up to 4 bytes each.
    Pad,
}

/// A function whose result is checked against `limit` bytes before it is built.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: Arc<ScalarUDF>,
    growth: Growth,
    limit: usize,
}

/// The lengths in bytes of a string argument, one per row (a scalar: one value for all rows).
fn lengths(arg: &ColumnarValue, rows: usize) -> Result<Vec<u64>> {
    Ok(match arg {
        ColumnarValue::Scalar(s) => {
            let len = match s {
                ScalarValue::Utf8(v) | ScalarValue::LargeUtf8(v) | ScalarValue::Utf8View(v) => {
                    v.as_ref().map_or(0, |s| s.len())
                }
                _ => 0,
            };
            vec![len as u64; rows.max(1)]
        }
        ColumnarValue::Array(a) => {
            let strings = datafusion::arrow::compute::cast(a, &DataType::LargeUtf8)?;
            let strings =
                strings.as_any().downcast_ref::<arrow_array::LargeStringArray>().expect("cast to LargeUtf8");
            strings.iter().map(|s| s.map_or(0, |s| s.len() as u64)).collect()
        }
    })
}

/// The counts of an integer argument, one per row (negative and null as 0).
fn counts(arg: &ColumnarValue, rows: usize) -> Result<Vec<u64>> {
    let array: ArrayRef = match arg {
        ColumnarValue::Scalar(s) => s.to_array_of_size(rows.max(1))?,
        ColumnarValue::Array(a) => a.clone(),
    };
    let ints = datafusion::arrow::compute::cast(&array, &DataType::Int64)?;
    let ints = ints.as_any().downcast_ref::<Int64Array>().expect("cast to Int64");
    Ok(ints.iter().map(|n| n.map_or(0, |n| n.max(0) as u64)).collect())
}

impl Bounded {
    /// The bytes the call's result would take, at most (saturating).
    fn result_bytes(&self, args: &ScalarFunctionArgs) -> Result<u64> {
        let rows = args.number_rows;
        let (Some(first), Some(second)) = (args.args.first(), args.args.get(1)) else { return Ok(0) };
        let n = counts(second, rows)?;
        let per_row: Vec<u64> = match self.growth {
            Growth::Repeat => {
                lengths(first, rows)?.iter().zip(&n).map(|(l, n)| l.saturating_mul(*n)).collect()
            }
            Growth::Pad => n.iter().map(|n| n.saturating_mul(4)).collect(),
        };
        // An array call's rows add up. A call on constants is made once (often while the plan
        // is simplified) and its value is then copied onto every row of each batch, so it
        // counts a full batch of copies.
        let all_scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        Ok(if all_scalar {
            let copies = args.config_options.execution.batch_size.get().max(rows) as u64;
            per_row.first().copied().unwrap_or(0).saturating_mul(copies)
        } else {
            per_row.iter().fold(0u64, |acc, b| acc.saturating_add(*b))
        })
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytes = self.result_bytes(&args)?;
        if bytes > self.limit as u64 {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{}() would build {bytes} bytes, over the query's memory limit of {} MB (--query-memory)",
                self.name(),
                self.limit >> 20
            )));
        }
        self.inner.invoke_with_args(args)
    }
}

/// Replaces `repeat`, `lpad` and `rpad` in `ctx` with versions whose result is at most
/// `limit` bytes a call.
pub(crate) fn register(ctx: &SessionContext, limit: usize) -> Result<()> {
    for (name, growth) in [("repeat", Growth::Repeat), ("lpad", Growth::Pad), ("rpad", Growth::Pad)] {
        let inner = ctx.udf(name)?;
        ctx.register_udf(ScalarUDF::new_from_impl(Bounded { inner, growth, limit }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(ctx: &SessionContext, sql: &str) -> Result<usize> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn calls_past_the_limit_fail_before_they_allocate() {
        let ctx = SessionContext::new();
        register(&ctx, 1 << 20).unwrap();
        // Constants within a batch's share (1 MB / 8,192 rows = 128 bytes a value) run.
        assert_eq!(run(&ctx, "SELECT repeat('ab', 50), lpad('x', 30), rpad('y', 30, 'z')").await.unwrap(), 1);
        for sql in [
            // A constant is copied onto every row: 8,192 copies of 200 KB.
            "SELECT repeat('x', 200000) FROM generate_series(1, 8192)",
            "SELECT length(repeat('x', 1000000000)) FROM generate_series(1, 5)",
            "SELECT repeat(CAST(value AS VARCHAR), 100000) FROM generate_series(1, 100)",
            "SELECT lpad('x', 1000000000)",
            "SELECT rpad(CAST(value AS VARCHAR), 300000) FROM generate_series(1, 10)",
        ] {
            let e = run(&ctx, sql).await.unwrap_err();
            assert!(matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)), "{sql}: {e}");
            assert!(e.to_string().contains("over the query's memory limit"), "{sql}: {e}");
        }
        // A constant within a batch's share (1 MB / 8,192 rows), and an array call within the
        // limit, run; nulls and negative counts build nothing.
        assert_eq!(run(&ctx, "SELECT repeat('x', 100) FROM generate_series(1, 20000)").await.unwrap(), 20000);
        assert_eq!(
            run(&ctx, "SELECT repeat(CAST(value AS VARCHAR), 10) FROM generate_series(1, 1000)")
                .await
                .unwrap(),
            1000
        );
        assert_eq!(run(&ctx, "SELECT repeat(NULL, 1000000000), repeat('x', -5)").await.unwrap(), 1);
    }
}

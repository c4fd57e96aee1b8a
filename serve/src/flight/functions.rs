//! What a query on `dlframe serve` may call and build outside DataFusion's memory accounting.
//!
//! - The scalar functions it exposes: an allow-list, each entry with the rule that bounds its
//!   result by its arguments (`growth.rs`). Every other scalar function is removed from the
//!   server's session when it starts, so a function that a new DataFusion adds stays off until
//!   it is listed here with its rule. Aggregate and window functions keep DataFusion's
//!   accounting (the operator that runs them charges their state to the query's pool), and the
//!   table functions `range` and `generate_series` stream in batches.
//! - [`bound_plan`]: the plan that runs calls only bounded functions (`bounded.rs`).
//! - [`check_constants`]: a constant is copied onto every row of each batch, so a plan's
//!   literals, times those rows, are held to the query's limit.

use std::sync::Arc;

use datafusion::common::stats::Precision;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::LogicalPlan;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::prelude::SessionContext;

use super::bounded::Rules;
use super::growth::Growth;

/// Functions whose result is made of their input (numbers, comparisons, most string, date and
/// list functions): at most twice their arguments' bytes.
const BY_INPUT: &[&str] = &[
    // math
    "abs",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "cbrt",
    "ceil",
    "cos",
    "cosh",
    "cot",
    "degrees",
    "exp",
    "factorial",
    "floor",
    "gcd",
    "isnan",
    "iszero",
    "lcm",
    "ln",
    "log",
    "log10",
    "log2",
    "nanvl",
    "pi",
    "power",
    "radians",
    "random",
    "round",
    "signum",
    "sin",
    "sinh",
    "sqrt",
    "tan",
    "tanh",
    "trunc",
    // conditionals and structure
    "coalesce",
    "greatest",
    "least",
    "nullif",
    "nvl",
    "nvl2",
    "get_field",
    "named_struct",
    "struct",
    "union_extract",
    "union_tag",
    "arrow_typeof",
    "arrow_metadata",
    "arrow_field",
    "version",
    "map",
    "map_entries",
    "map_extract",
    "map_keys",
    "map_values",
    // strings that select or measure
    "ascii",
    "bit_length",
    "btrim",
    "character_length",
    "concat",
    "contains",
    "ends_with",
    "find_in_set",
    "left",
    "ltrim",
    "octet_length",
    "overlay",
    "reverse",
    "right",
    "rtrim",
    "split_part",
    "starts_with",
    "strpos",
    "substr",
    "substr_index",
    "regexp_count",
    "regexp_instr",
    "regexp_like",
    "decode",
    // dates and times
    "current_date",
    "current_time",
    "date_bin",
    "date_part",
    "date_trunc",
    "from_unixtime",
    "make_date",
    "make_time",
    "now",
    "to_date",
    "to_local_time",
    "to_time",
    "to_timestamp",
    "to_timestamp_micros",
    "to_timestamp_millis",
    "to_timestamp_nanos",
    "to_timestamp_seconds",
    "to_unixtime",
    // lists
    "array_add",
    "array_any_value",
    "array_avg",
    "array_compact",
    "array_normalize",
    "array_product",
    "array_scale",
    "array_subtract",
    "array_sum",
    "cosine_distance",
    "inner_product",
    "with_metadata",
    "array_append",
    "array_concat",
    "array_dims",
    "array_distance",
    "array_distinct",
    "array_element",
    "empty",
    "array_except",
    "array_has",
    "array_has_all",
    "array_has_any",
    "array_intersect",
    "array_length",
    "array_max",
    "array_min",
    "array_ndims",
    "array_pop_back",
    "array_pop_front",
    "array_position",
    "array_prepend",
    "array_remove",
    "array_remove_all",
    "array_remove_n",
    "array_reverse",
    "array_slice",
    "array_sort",
    "array_union",
    "arrays_zip",
    "cardinality",
    "flatten",
    "make_array",
    // dlframe's tensor functions
    "to_tensor",
    "to_tensor_fill",
    "tensor_dtype",
    "tensor_element",
    "tensor_ndim",
    "tensor_reshape",
    "tensor_shape",
];

/// Functions whose text or values may be a few times their input: case mapping (one character
/// may become three), hex and base64, digests and uuids (a fixed size a row), a regex's groups.
const FOUR_TIMES: &[&str] = &[
    "upper",
    "lower",
    "initcap",
    "translate",
    "to_hex",
    "encode",
    "digest",
    "md5",
    "sha224",
    "sha256",
    "sha384",
    "sha512",
    "uuid",
    "chr",
    "regexp_match",
];

/// Functions whose values may be wider than their input: casts (an int8 as text or float64),
/// splitting text into one value per character, positions as 8-byte integers.
const EIGHT_TIMES: &[&str] = &[
    "arrow_cast",
    "arrow_try_cast",
    "cast_to_type",
    "try_cast_to_type",
    "string_to_array",
    "array_positions",
    "to_tensor_as",
];

/// Functions whose result grows with a count or a replacement they are given.
const GROWING: &[(&str, Growth)] = &[
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("array_repeat", Growth::ElementTimes),
    ("array_resize", Growth::Resize),
    ("to_tensor_padded", Growth::Resize),
    ("range", Growth::Range),
    ("generate_series", Growth::Range),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::RegexpReplace),
    ("concat_ws", Growth::Join),
    ("array_to_string", Growth::ListJoin),
    ("array_replace", Growth::ReplaceItems),
    ("array_replace_n", Growth::ReplaceItems),
    ("array_replace_all", Growth::ReplaceItems),
    ("levenshtein", Growth::Pairwise),
    // Text of a date, up to 16 times its format (`%c` is 2 characters for 24).
    ("to_char", Growth::Scaled(16)),
];

/// Every exposed function (by its DataFusion name; its aliases come with it) and its rule.
pub(crate) fn exposed() -> impl Iterator<Item = (&'static str, Growth)> {
    let scaled = |names: &'static [&'static str], k| names.iter().map(move |n| (*n, Growth::Scaled(k)));
    scaled(BY_INPUT, 2)
        .chain(scaled(FOUR_TIMES, 4))
        .chain(scaled(EIGHT_TIMES, 8))
        .chain(GROWING.iter().copied())
}

/// Leaves in `ctx` only the exposed scalar functions, each bounded to `limit` bytes a call and
/// charged to the running query's pool. Returns the rules, which [`bound_plan`] applies, and
/// the names of the functions it removed.
pub(crate) fn expose(ctx: &SessionContext, limit: usize) -> Result<(Arc<Rules>, Vec<String>)> {
    let rules = Rules::new(exposed(), limit);
    let mut removed = Vec::new();
    let mut names: Vec<String> = ctx.state().udfs().into_iter().collect();
    names.sort();
    for name in names {
        let Ok(udf) = ctx.udf(&name) else { continue };
        // Aliases share their function's entry; each function is handled once, by its name.
        if udf.name() != name {
            continue;
        }
        match rules.wrap(udf) {
            Some(bounded) => ctx.register_udf(bounded),
            None => {
                ctx.deregister_udf(&name);
                removed.push(name);
            }
        }
    }
    Ok((rules, removed))
}

/// `plan` (optimized, about to become a physical plan) with every function call bounded by
/// `rules`, whatever put it there; a function that is not exposed is refused. The output's
/// names do not change.
pub(crate) fn bound_plan(plan: LogicalPlan, rules: &Arc<Rules>) -> Result<LogicalPlan> {
    let bounded = plan.transform_up_with_subqueries(|node| {
        let names = NamePreserver::new(&node);
        node.map_expressions(|e| {
            let name = names.save(&e);
            Ok(rules.bound(e)?.update_data(|e| name.restore(e)))
        })
    })?;
    Ok(bounded.data)
}

/// The bytes a physical plan's constants take, copied onto the rows of a batch; an error where
/// they pass `limit`: `SELECT repeat('x', 60000) || repeat('x', 60000) || ...` folds into one
/// large literal, which every batch then copies onto each of its rows. A projection counts a
/// full batch of `batch_size` rows, or fewer where its input's row count is known exactly. The
/// caller charges the bytes to the query's pool while it runs.
pub(crate) fn check_constants(plan: &Arc<dyn ExecutionPlan>, batch_size: usize, limit: usize) -> Result<u64> {
    fn literals(e: &Arc<dyn PhysicalExpr>, total: &mut u64) {
        if let Some(l) = e.downcast_ref::<Literal>() {
            // Its value's bytes on the heap and a slot of up to 16 bytes, twice: the copies are
            // built by a buffer that doubles as it grows.
            let heap = l.value().size().saturating_sub(std::mem::size_of::<ScalarValue>());
            *total = total.saturating_add(2 * (heap as u64 + 16));
        }
        for child in e.children() {
            literals(child, total);
        }
    }
    fn walk(plan: &Arc<dyn ExecutionPlan>, batch_size: usize, bytes: &mut u64) -> Result<()> {
        if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
            let mut total = 0;
            for e in p.expr() {
                literals(&e.expr, &mut total);
            }
            let rows = match StatisticsContext::new()
                .compute(p.input().as_ref(), &StatisticsArgs::new())?
                .num_rows
            {
                Precision::Exact(n) => n.min(batch_size),
                _ => batch_size,
            };
            *bytes = bytes.saturating_add(total.saturating_mul(rows as u64));
        }
        for child in plan.children() {
            walk(child, batch_size, bytes)?;
        }
        Ok(())
    }
    let mut bytes = 0u64;
    walk(plan, batch_size, &mut bytes)?;
    if bytes > limit as u64 {
        return Err(DataFusionError::ResourcesExhausted(format!(
            "the query's constants take {bytes} bytes copied onto the rows of a batch, over the query's \
             memory limit of {} MB (--query-memory)",
            limit >> 20
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> SessionContext {
        let ctx = SessionContext::new();
        dlframe_datafusion::register(&ctx);
        ctx
    }

    #[test]
    fn every_listed_function_exists_under_its_own_name() {
        let ctx = served();
        let wrong: Vec<String> = exposed()
            .filter_map(|(name, _)| match ctx.udf(name) {
                Err(_) => Some(format!("{name} (no such function)")),
                Ok(udf) if udf.name() != name => Some(format!("{name} (an alias of {})", udf.name())),
                Ok(_) => None,
            })
            .collect();
        assert!(wrong.is_empty(), "listed under the wrong name: {}", wrong.join(", "));
        let (_, removed) = expose(&ctx, 1 << 20).unwrap();
        println!("functions not exposed: {}", removed.join(", "));
        for name in &removed {
            assert!(ctx.udf(name).is_err(), "{name} was removed but still resolves");
        }
        // An alias resolves to the bounded function.
        assert_eq!(ctx.udf("list_repeat").unwrap().name(), "array_repeat");
    }

    /// Runs `sql` as the server does: its constants checked, then its batches collected.
    async fn run(ctx: &SessionContext, rules: &Arc<Rules>, sql: &str) -> Result<usize> {
        let state = ctx.state();
        let plan = bound_plan(state.optimize(&ctx.sql(sql).await?.into_unoptimized_plan())?, rules)?;
        let plan = state.query_planner().create_physical_plan(&plan, &state).await?;
        check_constants(&plan, 8192, 1 << 20)?;
        let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn calls_past_the_limit_fail_before_they_allocate() {
        let ctx = served();
        let (rules, _) = expose(&ctx, 1 << 20).unwrap();
        // Constants within a batch's share (1 MB / 8,192 rows = 128 bytes a value) run.
        assert_eq!(
            run(&ctx, &rules, "SELECT repeat('ab', 50), lpad('x', 30), rpad('y', 30, 'z')").await.unwrap(),
            1
        );
        for sql in [
            // A constant is copied onto every row: 8,192 copies of 200 KB.
            "SELECT repeat('x', 200000) FROM generate_series(1, 8192)",
            "SELECT length(repeat('x', 1000000000)) FROM generate_series(1, 5)",
            "SELECT repeat(CAST(value AS VARCHAR), 100000) FROM generate_series(1, 100)",
            "SELECT lpad('x', 1000000000)",
            "SELECT rpad(CAST(value AS VARCHAR), 300000) FROM generate_series(1, 10)",
            "SELECT array_repeat(1, 1000000000)",
            "SELECT array_repeat(NULL, 1000000000)",
            "SELECT cardinality(array_repeat(value, 1000000)) FROM generate_series(1, 10)",
            "SELECT array_resize(make_array(1), 1000000000, 0)",
            "SELECT range(0, 1000000000)",
            "SELECT generate_series(DATE '2000-01-01', DATE '9999-01-01', INTERVAL '1 day')",
            "SELECT range(TIMESTAMP '2000-01-01', TIMESTAMP '2100-01-01', INTERVAL '1 second')",
            "SELECT replace(repeat('a', 100), 'a', repeat('b', 100000))",
            "SELECT regexp_replace(repeat('a', 1000), '', repeat('b', 1000), 'g') FROM generate_series(1, 100)",
            "SELECT concat_ws(repeat('-', 100), value, value, value) FROM generate_series(1, 8192)",
            "SELECT array_to_string(array_repeat(1, 100000), repeat(',', 100)) FROM generate_series(1, 3)",
            "SELECT array_replace_all(array_repeat(1, 10000), 1, 2) FROM generate_series(1, 100)",
        ] {
            let t = std::time::Instant::now();
            let e = run(&ctx, &rules, sql).await.expect_err(sql);
            eprintln!("TIME {:?} {sql}", t.elapsed());
            assert!(matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)), "{sql}: {e}");
            assert!(e.to_string().contains("over the query's memory limit"), "{sql}: {e}");
        }
        // Calls within the limit run, nulls and negative counts build nothing.
        for (sql, rows) in [
            ("SELECT repeat('x', 40) FROM generate_series(1, 20000)", 20000),
            ("SELECT repeat(CAST(value AS VARCHAR), 10) FROM generate_series(1, 1000)", 1000),
            ("SELECT repeat(NULL, 1000000000), repeat('x', -5), array_repeat(1, -3)", 1),
            (
                "SELECT array_repeat(value, 3), array_resize(make_array(value), 5, 0) FROM generate_series(1, 1000)",
                1000,
            ),
            ("SELECT range(0, value) FROM generate_series(1, 100)", 100),
            ("SELECT replace(CAST(value AS VARCHAR), '1', 'one') FROM generate_series(1, 1000)", 1000),
            ("SELECT upper(CAST(value AS VARCHAR)), abs(value) FROM generate_series(1, 10000)", 10000),
        ] {
            assert_eq!(run(&ctx, &rules, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")), rows, "{sql}");
        }
    }
}

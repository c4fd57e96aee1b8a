//! What a client may run on `dlframe serve`, written once for the three ways a query arrives:
//! SQL text, a prepared statement (SQL text kept on the server) and a Substrait plan.
//!
//! - SQL text is held to its length, then parsed, checked and planned on a planning thread
//!   (`planning.rs`), whose stack covers the deepest nesting that length allows: the parse is
//!   checked for the nesting depth of its expressions and the number of query blocks (SELECTs,
//!   table references) in it, and the plan for the nesting of its types. DataFusion's own parser
//!   refuses deeply nested parentheses and subqueries (its recursion limit, reported by its
//!   variant); these limits catch the shapes it parses without a limit (a 100,000-term sum,
//!   3,000 UNION ALLs, 1,000 chained CTEs, 100,000 nested `INT[]`), which would otherwise take a
//!   deep stack and long CPU time wherever they went next. Nothing deep leaves that thread.
//! - Every plan, from SQL or Substrait, is then held to the read-only rule: DDL, DML, COPY and
//!   statements (SET, transactions, ...) are refused, naming what was refused. A Substrait
//!   plan's nesting is already bounded by protobuf's decoding limit (100 levels).

use std::ops::ControlFlow;

use arrow_schema::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Query, Select, TableFactor, Visit, Visitor};
use datafusion::sql::sqlparser::parser::ParserError;

use super::error::ServeError;
use super::planning;

/// The limits on a query's text and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SqlLimits {
    /// The longest SQL text, in bytes; the planning threads' stacks grow with it
    /// (`planning::stack_for`).
    pub max_sql_bytes: usize,
    /// The deepest nesting of expressions (`1+1+1` is 3 deep, `((1))` is 1).
    pub max_depth: usize,
    /// The most query blocks (SELECTs, CTEs, subqueries, table references) in one statement.
    pub max_blocks: usize,
    /// The most expressions in a decoded plan, all its nodes together: the plan's width (a
    /// select list, an IN list, a call's arguments, a CASE's arms), which neither depth nor
    /// blocks see. Planning a projection of n columns takes time that grows as n² in DataFusion
    /// 55 (`push_projection_dedupl` and `EquivalenceGroup::add_constant`; 6,000 literal columns
    /// took 17 s in the debug build), within the text limit.
    pub max_expressions: usize,
}

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits { max_sql_bytes: 64 * 1024, max_depth: 256, max_blocks: 256, max_expressions: 4096 }
    }
}

/// Parses `sql` in `state`'s dialect and holds it to `limits` and the read-only rule, on a
/// planning thread; returns the plan, not yet run.
pub(crate) async fn plan_sql(
    state: &SessionState,
    sql: &str,
    limits: &SqlLimits,
) -> Result<LogicalPlan, ServeError> {
    if sql.len() > limits.max_sql_bytes {
        return Err(ServeError::Limit(format!(
            "the query is too long: {} bytes, over the server's limit of {} (--max-sql-bytes)",
            sql.len(),
            limits.max_sql_bytes
        )));
    }
    let (state, sql, limits) = (state.clone(), sql.to_owned(), *limits);
    planning::plan(limits.max_sql_bytes, move || async move {
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(&sql, &dialect).map_err(|e| parse_error(e, &limits))?;
        check_statement(&statement, &limits)?;
        let plan = state.statement_to_plan(statement).await?;
        check_decoded(&plan, &limits)?;
        Ok(plan)
    })
    .await
}

/// Plan nodes allowed per query block of `--max-blocks`: a SELECT plans into a few nodes (a
/// projection, a filter, a scan, an aggregate), so 16 leave every query within the block limit
/// room, and a Substrait plan (which has no SQL to count blocks in) the same bound.
const NODES_PER_BLOCK: usize = 16;

/// Holds a decoded plan, from SQL or Substrait, to the limits that its text could not show:
/// its size and the nesting of its types; then to the read-only rule.
pub(crate) fn check_decoded(plan: &LogicalPlan, limits: &SqlLimits) -> Result<(), ServeError> {
    let max = limits.max_blocks.saturating_mul(NODES_PER_BLOCK);
    let mut nodes = 0usize;
    plan.apply_with_subqueries(|_| {
        nodes += 1;
        Ok(if nodes > max { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })?;
    if nodes > max {
        return Err(ServeError::Limit(format!(
            "the plan is too large: over the server's limit of {max} plan nodes ({NODES_PER_BLOCK} per query \
             block of --max-blocks)"
        )));
    }
    let mut expressions = 0usize;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|_| {
                expressions += 1;
                Ok(if expressions > limits.max_expressions {
                    TreeNodeRecursion::Stop
                } else {
                    TreeNodeRecursion::Continue
                })
            })
        })
    })?;
    if expressions > limits.max_expressions {
        return Err(too_wide(limits.max_expressions));
    }
    check_types(plan, limits.max_depth)?;
    check_plan(plan)
}

/// The refusal of a plan of more than `max` expressions.
fn too_wide(max: usize) -> ServeError {
    ServeError::Limit(format!(
        "the plan is too wide: over the server's limit of {max} expressions (--max-expressions)"
    ))
}

/// The refusal of a query nested past `max` levels.
fn too_deep(max: usize) -> ServeError {
    ServeError::Limit(format!(
        "the query's expressions are nested too deeply: over the server's limit of {max} levels (--max-depth)"
    ))
}

/// A parse error; the parser's recursion limit (by its variant) as the depth limit.
fn parse_error(e: DataFusionError, limits: &SqlLimits) -> ServeError {
    match e.find_root() {
        DataFusionError::SQL(inner, _) if matches!(**inner, ParserError::RecursionLimitExceeded) => {
            too_deep(limits.max_depth)
        }
        _ => ServeError::Query(e),
    }
}

/// How deep a type nests: 1 for a primitive, one more for each list, struct, map, union,
/// dictionary or run-end level around it.
fn type_depth(t: &DataType) -> usize {
    let deepest = |fields: &mut dyn Iterator<Item = &DataType>| fields.map(type_depth).max().unwrap_or(0);
    1 + match t {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => type_depth(f.data_type()),
        DataType::Struct(fields) => deepest(&mut fields.iter().map(|f| f.data_type())),
        DataType::Union(fields, _) => deepest(&mut fields.iter().map(|(_, f)| f.data_type())),
        DataType::Dictionary(k, v) => type_depth(k).max(type_depth(v)),
        DataType::RunEndEncoded(a, b) => type_depth(a.data_type()).max(type_depth(b.data_type())),
        _ => 0,
    }
}

/// Refuses a plan whose types (of its columns, casts and literals) nest deeper than `max`, so
/// that no deep type leaves the planning thread for the optimizer, the executor or a drop.
fn check_types(plan: &LogicalPlan, max: usize) -> Result<(), ServeError> {
    let mut deepest = 0;
    plan.apply_with_subqueries(|node| {
        for f in node.schema().fields() {
            deepest = deepest.max(type_depth(f.data_type()));
        }
        node.apply_expressions(|e| {
            e.apply(|e| {
                let t = match e {
                    Expr::Cast(c) => type_depth(c.field.data_type()),
                    Expr::TryCast(c) => type_depth(c.field.data_type()),
                    Expr::Literal(v, _) => type_depth(&v.data_type()),
                    _ => 0,
                };
                deepest = deepest.max(t);
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    if deepest > max {
        return Err(ServeError::Limit(format!(
            "the query's types are nested too deeply: {deepest} levels, over the server's limit of {max} (--max-depth)"
        )));
    }
    Ok(())
}

/// Refuses DataFusion's own non-query statements before planning them, and holds a SQL
/// statement to the limits.
fn check_statement(statement: &DFStatement, limits: &SqlLimits) -> Result<(), ServeError> {
    match statement {
        DFStatement::Statement(s) => {
            let mut shape = Shape { limits, depth: 0, blocks: 0, expressions: 0 };
            match s.visit(&mut shape) {
                ControlFlow::Continue(()) => Ok(()),
                ControlFlow::Break(refusal) => Err(refusal),
            }
        }
        DFStatement::Explain(explain) => check_statement(&explain.statement, limits),
        DFStatement::CreateExternalTable(_) => {
            Err(ServeError::ReadOnly("DDL (CREATE EXTERNAL TABLE)".into()))
        }
        DFStatement::CopyTo(_) => Err(ServeError::ReadOnly("DML (COPY)".into())),
        DFStatement::Reset(_) => Err(ServeError::ReadOnly("the statement RESET".into())),
    }
}

/// Holds a plan to the read-only rule: DataFusion's own verifier with DDL, DML and statements
/// all off, its refusal reworded to name the rule.
pub(crate) fn check_plan(plan: &LogicalPlan) -> Result<(), ServeError> {
    let read_only =
        SQLOptions::new().with_allow_ddl(false).with_allow_dml(false).with_allow_statements(false);
    read_only.verify_plan(plan).map_err(|e| {
        let text = e.find_root().message().into_owned();
        let what = None
            .or_else(|| text.strip_prefix("DDL not supported: ").map(|w| format!("DDL ({w})")))
            .or_else(|| text.strip_prefix("DML not supported: ").map(|w| format!("DML ({w})")))
            .or_else(|| text.strip_prefix("Statement not supported: ").map(|w| format!("the statement {w}")))
            .unwrap_or(text);
        ServeError::ReadOnly(what)
    })
}

/// Walks a statement, counting expression depth, query blocks and expressions; stops at the
/// first limit passed, so the walk itself never goes deeper than the limit. The expressions
/// are counted here too, before planning, because planning a wide projection is what takes
/// the time (the decoded plan is counted again for Substrait).
struct Shape<'a> {
    limits: &'a SqlLimits,
    depth: usize,
    blocks: usize,
    expressions: usize,
}

impl Shape<'_> {
    fn block(&mut self) -> ControlFlow<ServeError> {
        self.blocks += 1;
        if self.blocks > self.limits.max_blocks {
            return ControlFlow::Break(ServeError::Limit(format!(
                "the query has too many query blocks (SELECTs, CTEs, subqueries, tables): over the \
                 server's limit of {} (--max-blocks)",
                self.limits.max_blocks
            )));
        }
        ControlFlow::Continue(())
    }
}

impl Visitor for Shape<'_> {
    type Break = ServeError;

    fn pre_visit_query(&mut self, _query: &Query) -> ControlFlow<ServeError> {
        self.block()
    }

    fn pre_visit_select(&mut self, _select: &Select) -> ControlFlow<ServeError> {
        self.block()
    }

    fn pre_visit_table_factor(&mut self, _table: &TableFactor) -> ControlFlow<ServeError> {
        self.block()
    }

    fn pre_visit_expr(&mut self, expr: &SqlExpr) -> ControlFlow<ServeError> {
        self.expressions += 1;
        if self.expressions > self.limits.max_expressions {
            return ControlFlow::Break(too_wide(self.limits.max_expressions));
        }
        // Parentheses add no depth of their own: the parser bounds them.
        if matches!(expr, SqlExpr::Nested(_)) {
            return ControlFlow::Continue(());
        }
        // A chain of field accesses (`a['x']['y']`) is flat here and as deep as it is long
        // once planned.
        let chain = match expr {
            SqlExpr::CompoundFieldAccess { access_chain, .. } => access_chain.len(),
            _ => 0,
        };
        if chain > self.limits.max_depth {
            return ControlFlow::Break(too_deep(self.limits.max_depth));
        }
        self.depth += 1;
        if self.depth > self.limits.max_depth {
            return ControlFlow::Break(too_deep(self.limits.max_depth));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &SqlExpr) -> ControlFlow<ServeError> {
        if !matches!(expr, SqlExpr::Nested(_)) {
            self.depth -= 1;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    fn limits() -> SqlLimits {
        SqlLimits { max_depth: 64, max_blocks: 32, ..SqlLimits::default() }
    }

    async fn plan(sql: &str) -> Result<LogicalPlan, ServeError> {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t AS VALUES (1, 2.0)").await.unwrap();
        plan_sql(&ctx.state(), sql, &limits()).await
    }

    fn sum(terms: usize) -> String {
        format!("SELECT {}", vec!["1"; terms].join("+"))
    }

    #[tokio::test]
    async fn queries_pass() {
        for sql in [
            "SELECT 1",
            "SELECT * FROM t",
            "EXPLAIN SELECT * FROM t",
            "VALUES (1)",
            "WITH a AS (SELECT 1) SELECT * FROM a",
        ] {
            plan(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        // At the limit: 64 levels (63 additions and the last literal).
        plan(&sum(64)).await.unwrap();
    }

    #[tokio::test]
    async fn everything_but_a_query_is_refused_naming_it() {
        for (sql, what) in [
            (
                "CREATE EXTERNAL TABLE pw (line VARCHAR) STORED AS CSV LOCATION '/etc/passwd'",
                "CREATE EXTERNAL TABLE",
            ),
            ("COPY (SELECT 1 AS a) TO '/tmp/dlframe-never.csv' STORED AS CSV", "COPY"),
            ("CREATE TABLE x AS SELECT 1", "DDL"),
            ("CREATE VIEW v AS SELECT 1", "DDL"),
            ("DROP TABLE t", "DDL"),
            ("INSERT INTO t VALUES (2, 3.0)", "DML"),
            ("DELETE FROM t", "DML"),
            ("SET datafusion.execution.batch_size = 1", "statement"),
            ("EXPLAIN COPY (SELECT 1 AS a) TO '/tmp/dlframe-never.csv' STORED AS CSV", "COPY"),
            ("EXPLAIN CREATE TABLE x AS SELECT 1", "DDL"),
            ("RESET datafusion.execution.batch_size", "RESET"),
        ] {
            match plan(sql).await {
                Err(e @ ServeError::ReadOnly(_)) => {
                    let text = e.to_string();
                    assert!(text.contains("read-only") && text.contains(what), "{sql}: {text}");
                }
                Err(other) => panic!("{sql}: refused for another reason: {other}"),
                Ok(_) => panic!("{sql}: planned"),
            }
        }
        assert!(!std::path::Path::new("/tmp/dlframe-never.csv").exists());
    }

    /// Runs `f` on a thread with the server's worker stack: a refused 100,000-term sum is a
    /// 100,000-deep tree that is dropped recursively, as on the server.
    fn on_a_server_stack(f: impl std::future::Future<Output = ()> + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f))
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn the_shapes_past_the_limits_are_refused_before_planning() {
        on_a_server_stack(shapes_past_the_limits());
    }

    async fn shapes_past_the_limits() {
        let e = plan(&sum(65)).await.unwrap_err();
        assert!(e.to_string().contains("nested too deeply"), "{e}");
        let e = plan(&sum(30_000)).await.unwrap_err();
        assert!(e.to_string().contains("nested too deeply"), "{e}");
        let ands = format!("SELECT 1 WHERE {}", vec!["1=1"; 7_000].join(" AND "));
        assert!(plan(&ands).await.unwrap_err().to_string().contains("nested too deeply"));
        let unions = vec!["SELECT 1 AS a"; 2500].join(" UNION ALL ");
        assert!(plan(&unions).await.unwrap_err().to_string().contains("query blocks"));
        let mut ctes = String::from("WITH c0 AS (SELECT 1 AS a)");
        for i in 1..1000 {
            ctes.push_str(&format!(", c{i} AS (SELECT a FROM c{})", i - 1));
        }
        ctes.push_str(" SELECT a FROM c999");
        assert!(plan(&ctes).await.unwrap_err().to_string().contains("query blocks"));
        // Nesting that the parser takes without a limit of its own, refused after the parse.
        for deep in [
            format!("SELECT {}1{}", "(".repeat(10_000), ")".repeat(10_000)),
            format!("SELECT CAST(NULL AS {}INT{})", "ARRAY<".repeat(5_000), ">".repeat(5_000)),
            format!("SELECT a{} FROM (SELECT 1 AS a)", "['x']".repeat(1_000)),
            format!("SELECT CAST(NULL AS INT{})", "[]".repeat(10_000)),
            format!("SELECT CAST(NULL AS {}INT{})", "STRUCT<a ".repeat(100), ">".repeat(100)),
        ] {
            let e = plan(&deep).await.unwrap_err().to_string();
            assert!(e.contains("nested too deeply"), "{}: {e}", &deep[..40]);
        }
        let long = format!("SELECT 1 {}", " ".repeat(SqlLimits::default().max_sql_bytes));
        assert!(plan(&long).await.unwrap_err().to_string().contains("too long"));
        // Width: a select list, an IN list and a call, each past the limit by one.
        let n = SqlLimits::default().max_expressions;
        let items = |k: usize| (0..k).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        for wide in [
            format!("SELECT {}", items(n + 1)),
            format!("SELECT 1 IN ({})", items(n)),
            format!("SELECT concat({})", items(n)),
        ] {
            let e = plan(&wide).await.unwrap_err().to_string();
            assert!(e.contains("too wide"), "{}: {e}", &wide[..30]);
        }
        plan(&format!("SELECT {}", items(n / 2))).await.unwrap();
    }
}

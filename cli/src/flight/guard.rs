//! What a client may run on `dlframe serve`, written once for the three ways a query arrives:
//! SQL text, a prepared statement (SQL text kept on the server) and a Substrait plan.
//!
//! - SQL text is checked before it is planned: its length, the nesting depth of its
//!   expressions, and the number of query blocks (SELECTs, table references) in it. DataFusion's
//!   own parser refuses deeply nested parentheses and subqueries (its recursion limit); these
//!   limits catch the shapes it parses without recursing (a 100,000-term sum, 3,000 UNION ALLs,
//!   1,000 chained CTEs), whose planning would otherwise take a deep stack and long CPU time.
//! - Every plan, from SQL or Substrait, is then held to the read-only rule: DDL, DML, COPY and
//!   statements (SET, transactions, ...) are refused, naming what was refused. A Substrait
//!   plan's nesting is already bounded by protobuf's decoding limit (100 levels).

use std::ops::ControlFlow;

use datafusion::execution::SessionState;
use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Expr, Query, Select, TableFactor, Visit, Visitor};

use super::error::ServeError;

/// The limits on a query's text and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SqlLimits {
    /// The longest SQL text, in bytes.
    pub max_sql_bytes: usize,
    /// The deepest nesting of expressions (`1+1+1` is 3 deep, `((1))` is 1).
    pub max_depth: usize,
    /// The most query blocks (SELECTs, CTEs, subqueries, table references) in one statement.
    pub max_blocks: usize,
}

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits { max_sql_bytes: 256 * 1024, max_depth: 256, max_blocks: 256 }
    }
}

/// Parses `sql` in `state`'s dialect and holds it to `limits` and the read-only rule; returns
/// the plan, not yet run.
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
    let depth = bracket_depth(sql);
    if depth > limits.max_depth {
        return Err(too_deep(limits.max_depth));
    }
    let dialect = state.config().options().sql_parser.dialect;
    let statement = state.sql_to_statement(sql, &dialect)?;
    check_statement(&statement, limits)?;
    let plan = state.statement_to_plan(statement).await?;
    check_plan(&plan)?;
    Ok(plan)
}

/// The refusal of a query nested past `max` levels.
fn too_deep(max: usize) -> ServeError {
    ServeError::Limit(format!(
        "the query's expressions are nested too deeply: over the server's limit of {max} levels (--max-depth)"
    ))
}

/// The deepest nesting of brackets in `sql`, read from the text before it is parsed, outside
/// quotes and comments: parentheses, square brackets, the angle brackets of a type
/// (`ARRAY<...>`, `STRUCT<...>`, `MAP<...>`) and runs of array suffixes (`INT[][]`). The
/// parser and the planner recurse through each such level (sqlparser's type parser without a
/// recursion limit: 10,000 nested `ARRAY<` overflowed the stack), so they are counted first.
fn bracket_depth(sql: &str) -> usize {
    let bytes = sql.as_bytes();
    let (mut depth, mut deepest, mut angles, mut suffixes) = (0usize, 0usize, 0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\'' | b'"' | b'`' => {
                // A quoted string or name: up to the closing quote (a doubled quote stays inside).
                i += 1;
                while i < bytes.len() && !(bytes[i] == c && bytes.get(i + 1) != Some(&c)) {
                    i += if bytes[i] == c { 2 } else { 1 };
                }
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b'[' if bytes.get(i + 1) == Some(&b']') => {
                // An array suffix: a level of the type, however many follow in a run.
                suffixes += 1;
                i += 1;
            }
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b'<' => {
                let word: Vec<u8> = bytes[..i]
                    .iter()
                    .rev()
                    .skip_while(|b| b.is_ascii_whitespace())
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .map(|b| b.to_ascii_uppercase())
                    .collect();
                let word: Vec<u8> = word.into_iter().rev().collect();
                if matches!(word.as_slice(), b"ARRAY" | b"STRUCT" | b"MAP" | b"NULLABLE" | b"LOWCARDINALITY")
                {
                    depth += 1;
                    angles += 1;
                }
            }
            b'>' if angles > 0 => {
                depth = depth.saturating_sub(1);
                angles -= 1;
            }
            _ => {}
        }
        // A run of array suffixes ends at anything but brackets and whitespace.
        if !(matches!(c, b'[' | b']') || c.is_ascii_whitespace()) {
            suffixes = 0;
        }
        deepest = deepest.max(depth + suffixes);
        i += 1;
    }
    deepest
}

/// Refuses DataFusion's own non-query statements before planning them, and holds a SQL
/// statement to the limits.
fn check_statement(statement: &DFStatement, limits: &SqlLimits) -> Result<(), ServeError> {
    match statement {
        DFStatement::Statement(s) => {
            let mut shape = Shape { limits, depth: 0, blocks: 0 };
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

/// Walks a statement, counting expression depth and query blocks; stops at the first limit
/// passed, so the walk itself never goes deeper than the limit.
struct Shape<'a> {
    limits: &'a SqlLimits,
    depth: usize,
    blocks: usize,
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

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<ServeError> {
        // Parentheses add no depth of their own: the parser bounds them.
        if matches!(expr, Expr::Nested(_)) {
            return ControlFlow::Continue(());
        }
        self.depth += 1;
        if self.depth > self.limits.max_depth {
            return ControlFlow::Break(too_deep(self.limits.max_depth));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &Expr) -> ControlFlow<ServeError> {
        if !matches!(expr, Expr::Nested(_)) {
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
        SqlLimits { max_sql_bytes: 1 << 20, max_depth: 64, max_blocks: 32 }
    }

    async fn plan(sql: &str) -> Result<LogicalPlan, ServeError> {
        let ctx = SessionContext::new();
        ctx.sql("CREATE TABLE t AS VALUES (1, 2.0)").await.unwrap();
        plan_sql(&ctx.state(), sql, &limits()).await
    }

    fn sum(terms: usize) -> String {
        format!("SELECT {}", vec!["1"; terms].join("+"))
    }

    #[test]
    fn brackets_are_counted_outside_quotes_and_comments() {
        assert_eq!(bracket_depth("SELECT ((1)), f(g(x))"), 2);
        assert_eq!(bracket_depth("SELECT '((((' AS \"a(((\" -- ((((\n, 1 /* (((( */"), 0);
        assert_eq!(bracket_depth("SELECT 'it''s (' , (1)"), 1);
        assert_eq!(bracket_depth("SELECT a < b, a > b FROM t WHERE x<(1)"), 1);
        assert_eq!(bracket_depth("CAST(x AS ARRAY<ARRAY<INT>>)"), 3);
        assert_eq!(bracket_depth("CAST(x AS INT[][][])"), 4);
        assert_eq!(bracket_depth("SELECT a[1][2][3]"), 1);
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
        let e = plan(&sum(100_000)).await.unwrap_err();
        assert!(e.to_string().contains("nested too deeply"), "{e}");
        let ands = format!("SELECT 1 WHERE {}", vec!["1=1"; 10_000].join(" AND "));
        assert!(plan(&ands).await.unwrap_err().to_string().contains("nested too deeply"));
        let unions = vec!["SELECT 1 AS a"; 3000].join(" UNION ALL ");
        assert!(plan(&unions).await.unwrap_err().to_string().contains("query blocks"));
        let mut ctes = String::from("WITH c0 AS (SELECT 1 AS a)");
        for i in 1..1000 {
            ctes.push_str(&format!(", c{i} AS (SELECT a FROM c{})", i - 1));
        }
        ctes.push_str(" SELECT a FROM c999");
        assert!(plan(&ctes).await.unwrap_err().to_string().contains("query blocks"));
        // Brackets, counted in the text before it is parsed.
        for deep in [
            format!("SELECT {}1{}", "(".repeat(10_000), ")".repeat(10_000)),
            format!("SELECT CAST(NULL AS {}INT{})", "ARRAY<".repeat(10_000), ">".repeat(10_000)),
            format!("SELECT CAST(NULL AS INT{})", "[]".repeat(10_000)),
            format!("SELECT CAST(NULL AS {}INT{})", "STRUCT<a ".repeat(100), ">".repeat(100)),
        ] {
            let e = plan(&deep).await.unwrap_err().to_string();
            assert!(e.contains("nested too deeply"), "{}: {e}", &deep[..40]);
        }
        let long = format!("SELECT 1 {}", " ".repeat(1 << 20));
        assert!(plan(&long).await.unwrap_err().to_string().contains("too long"));
    }
}

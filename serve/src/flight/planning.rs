//! Parsing, converting and planning on threads of their own, whose stack covers the deepest
//! nesting that the text and plan limits allow, so that no request can overflow a stack.
//!
//! sqlparser's parser recurses once per level of a type (`INT[][]...`, `ARRAY<...>`) with no
//! limit of its own, DataFusion's planner once per level of what it converts, and dropping a
//! deep tree recurses as deep again. The guard checks the shape of what was parsed, and
//! refuses it past the limits; but the parse and the check themselves run at the depth the
//! client chose. So they run here: on [`PLANNERS`] threads, each with a stack of
//! [`stack_for`] the longest text the server takes, measured by the tests at that length for
//! every rule that recurses. Whatever a job builds and refuses is dropped on its thread too.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, OnceLock};

use super::error::ServeError;

/// The planning threads: planning is short, so two serve every client, and they keep the
/// address space the server reserves for stacks at two of [`stack_for`].
pub(crate) const PLANNERS: usize = 2;

/// Stack bytes per byte of SQL text: the deepest recursion per byte of any rule, measured in
/// the debug build (whose frames are the largest) by the test below at the default text limit.
/// The worst rule is a type's `ARRAY<` (7 bytes a level): it overflowed 2,048 bytes per byte of
/// text and held in 8,192; `STRUCT<a ` is alike, `INT[]` held in 2,048.
const STACK_PER_BYTE: usize = 8192;

/// The stack that planning `max_sql_bytes` of text needs, at least 64 MiB: 512 MiB for the
/// default 64 KiB, reserved as address space and used only as deep as a request goes.
pub(crate) fn stack_for(max_sql_bytes: usize) -> usize {
    max_sql_bytes.saturating_mul(STACK_PER_BYTE).max(64 << 20)
}

type Job = Box<dyn FnOnce() + Send>;

/// The planning threads' queue, started on first use with stacks for `max_sql_bytes`.
fn planners(max_sql_bytes: usize) -> Result<&'static Mutex<Sender<Job>>, ServeError> {
    static QUEUE: OnceLock<Result<Mutex<Sender<Job>>, String>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let rx = std::sync::Arc::new(Mutex::new(rx));
        for i in 0..PLANNERS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("dlframe-plan-{i}"))
                .stack_size(stack_for(max_sql_bytes))
                .spawn(move || {
                    loop {
                        let job = rx.lock().map(|r| r.recv());
                        match job {
                            Ok(Ok(job)) => job(),
                            _ => return,
                        }
                    }
                })
                .map_err(|e| format!("could not start a planning thread: {e}"))?;
        }
        Ok(Mutex::new(tx))
    });
    queue.as_ref().map_err(|e| ServeError::BadRequest(e.clone()))
}

thread_local! {
    /// Each planning thread's runtime, for the planner's async steps (catalog lookups).
    static RUNTIME: Result<tokio::runtime::Runtime, String> =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string());
}

/// Runs `work` on a planning thread and returns what it gives. A panic in it is a refusal of
/// the request, not the end of the server.
///
/// # Errors
/// `work`'s error; [`ServeError::BadRequest`] when it panicked or no planning thread runs.
pub(crate) async fn plan<T, F, Fut>(max_sql_bytes: usize, work: F) -> Result<T, ServeError>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, ServeError>>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let out = RUNTIME.with(|rt| match rt {
            Ok(rt) => catch_unwind(AssertUnwindSafe(|| rt.block_on(work()))).unwrap_or_else(|_| {
                Err(ServeError::BadRequest("the request could not be planned (the planner failed)".into()))
            }),
            Err(e) => Err(ServeError::BadRequest(format!("no planning runtime: {e}"))),
        });
        // A client gone: what was built is dropped here, on this stack.
        drop(tx.send(out));
    });
    planners(max_sql_bytes)?
        .lock()
        .map_err(|_| ServeError::BadRequest("the planning queue is gone".into()))?
        .send(job)
        .map_err(|_| ServeError::BadRequest("no planning thread runs".into()))?;
    rx.await.unwrap_or_else(|_| Err(ServeError::BadRequest("the planning thread stopped".into())))
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use super::super::guard::{SqlLimits, plan_sql};

    /// The longest text of each rule that recurses once per level and has no limit in the
    /// parser: each is refused, on the planning thread's stack, without overflowing it. Were
    /// the stack too small for the text limit, this test would end the process.
    #[tokio::test]
    async fn the_deepest_nesting_the_text_limit_allows_is_refused_not_overflowed() {
        let limits = SqlLimits::default();
        let n = |per_level: usize, fixed: usize| (limits.max_sql_bytes - fixed) / per_level;
        let ctx = SessionContext::new();
        let cases = [
            ("INT[] suffixes", format!("SELECT CAST(NULL AS INT{})", "[]".repeat(n(2, 30)))),
            (
                "ARRAY<",
                format!("SELECT CAST(NULL AS {}INT{})", "ARRAY<".repeat(n(7, 30)), ">".repeat(n(7, 30))),
            ),
            (
                "STRUCT<a ",
                format!("SELECT CAST(NULL AS {}INT{})", "STRUCT<a ".repeat(n(10, 30)), ">".repeat(n(10, 30))),
            ),
            ("a sum", format!("SELECT {}1", "1+".repeat(n(2, 10)))),
            ("ANDs", format!("SELECT 1 WHERE {}1", "1 AND ".repeat(n(6, 20)))),
            ("parentheses", format!("SELECT {}1{}", "(".repeat(n(2, 10)), ")".repeat(n(2, 10)))),
            ("unary minus", format!("SELECT {}1", "-".repeat(n(1, 10)))),
            ("NOT", format!("SELECT {}TRUE", "NOT ".repeat(n(4, 10)))),
            (
                "CASE",
                format!("SELECT {}1{}", "CASE WHEN TRUE THEN ".repeat(n(24, 10)), " END".repeat(n(24, 10))),
            ),
            ("subqueries", format!("SELECT {}1{}", "(SELECT ".repeat(n(9, 10)), ")".repeat(n(9, 10)))),
            ("field access", format!("SELECT a{} FROM (SELECT 1 AS a)", "['x']".repeat(n(5, 40)))),
        ];
        for (name, sql) in cases {
            assert!(sql.len() <= limits.max_sql_bytes, "{name}: {} bytes", sql.len());
            let e = plan_sql(&ctx.state(), &sql, &limits).await.expect_err(name);
            assert!(!e.to_string().is_empty(), "{name}");
        }
        // A shallow query at the text limit is refused for its width before it is planned (an
        // IN list of 32,000 values), and one within the width limit plans.
        let wide = format!("SELECT 1 IN ({})", vec!["1"; n(2, 20)].join(","));
        let e = plan_sql(&ctx.state(), &wide, &limits).await.unwrap_err();
        assert!(e.to_string().contains("too wide"), "{e}");
        let within = format!("SELECT 1 IN ({})", vec!["1"; limits.max_expressions - 2].join(","));
        plan_sql(&ctx.state(), &within, &limits).await.unwrap();
    }
}

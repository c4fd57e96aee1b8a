//! A generator of hostile requests against a real `dlframe serve`: nested constructs of every
//! recursive rule of the SQL grammar (types, arrays, casts, subqueries in expressions and in
//! FROM, CTEs, CASE, IN lists, set operations, struct access, calls, unary operators), mixed at
//! random, from a few levels to past the text limit, with comments, quoting styles and
//! whitespace between their tokens; and wide flat shapes (select lists, IN lists, unions,
//! calls of many arguments). They go through SQL statements, prepared statements and
//! Substrait plans. The server must answer each one, with a result or an error, and go on
//! serving: a dropped connection or a stopped process fails the test.
//!
//! The sequence is fixed by a seed (`DLFRAME_HOSTILE_SEED`, printed), so a failure can be run
//! again; `DLFRAME_HOSTILE_REQUESTS` sets how many requests are sent (at least 10,000 in CI).

mod common;

use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use common::served::{Server, count_rows, query, rows_of, substrait_call, substrait_plan};
use tonic::transport::Channel;

/// A small, fixed pseudo-random sequence (xorshift64*): the test must not depend on a crate
/// for it, and the same seed must give the same requests everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// What may stand between two tokens.
const GAPS: &[&str] = &[" ", "  ", "\n", "\t", "/* c */", "/**/", " -- c\n", "\r\n", " /* ( [ < ' */ "];

/// Leaves of expressions, in every quoting style, and the strings that once fooled a second
/// lexer (`$$'$$`, `E'x\''`).
const LEAVES: &[&str] = &[
    "1",
    "value",
    "'x'",
    "E'x\\''",
    "$$x$$",
    "$$'$$",
    "'it''s'",
    "\"value\"",
    "NULL",
    "1e3",
    "2.5",
    "TRUE",
    "DATE '2000-01-01'",
    "X'ff'",
];

/// The recursive rules of expressions: what goes before and after the inner one.
const RULES: &[(&str, &str)] = &[
    ("(", ")"),
    ("CAST(", " AS BIGINT)"),
    ("TRY_CAST(", " AS VARCHAR)"),
    ("-", ""),
    ("NOT ", ""),
    ("abs(", ")"),
    ("coalesce(", ", 1)"),
    ("CASE WHEN ", " IS NULL THEN 1 ELSE 2 END"),
    ("CASE ", " WHEN 1 THEN 2 ELSE 3 END"),
    ("(SELECT ", ")"),
    ("(SELECT ", " FROM generate_series(1, 2) LIMIT 1)"),
    ("ARRAY[", "]"),
    ("make_array(", ", 1)"),
    ("struct(", ")['c0']"),
    ("named_struct('a', ", ").a"),
    ("", " IN (1, 2)"),
    ("", " IN (SELECT 1)"),
    ("", " + 1"),
    ("", " || 'x'"),
    ("EXISTS (SELECT ", ")"),
    ("concat(", ", 'y')"),
    ("[", "][1]"),
];

/// The recursive rules of types.
const TYPE_RULES: &[(&str, &str)] =
    &[("ARRAY<", ">"), ("", "[]"), ("", "[ ]"), ("STRUCT<a ", ">"), ("ARRAY/**/<", ">")];

/// A size: mostly small, often near the limits, sometimes far past them (those are the
/// slow ones to parse in a debug build, so they are few).
fn depth(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..=79 => 1 + rng.below(12),
        80..=94 => 200 + rng.below(120),
        95..=98 => 500 + rng.below(2500),
        _ => 4000 + rng.below(8000),
    }
}

/// Joins `parts` with gaps drawn from [`GAPS`].
fn spaced(rng: &mut Rng, parts: &[&str]) -> String {
    let mut s = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.push_str(rng.pick(GAPS));
        }
        s.push_str(p);
    }
    s
}

/// An expression nested `n` deep, each level a rule drawn at random.
fn nested_expression(rng: &mut Rng, n: usize) -> String {
    let rules: Vec<(&str, &str)> = (0..n).map(|_| RULES[rng.below(RULES.len())]).collect();
    let mut s = String::new();
    for (before, _) in &rules {
        s.push_str(before);
        if rng.below(4) == 0 {
            s.push_str(rng.pick(GAPS));
        }
    }
    s.push_str(rng.pick(LEAVES));
    for (_, after) in rules.iter().rev() {
        if rng.below(4) == 0 {
            s.push_str(rng.pick(GAPS));
        }
        s.push_str(after);
    }
    s
}

/// A query of one of the shapes, of size `n`.
fn request(rng: &mut Rng) -> String {
    let n = depth(rng);
    let from = rng.pick(&["", " FROM generate_series(1, 3)", " FROM t"]);
    match rng.below(12) {
        0..=3 => {
            let e = nested_expression(rng, n);
            spaced(rng, &["SELECT", &e, "AS", "a", from.trim()])
        }
        4 => {
            let (mut before, mut after) = (String::new(), String::new());
            for _ in 0..n {
                let (b, a) = TYPE_RULES[rng.below(TYPE_RULES.len())];
                before.push_str(b);
                after.insert_str(0, a);
                if rng.below(3) == 0 {
                    before.push_str(rng.pick(GAPS));
                }
            }
            // A quoting style before the nesting, as the probes that once passed a lexer.
            let lead = rng.pick(&["", "'$$', ", "$$'$$, ", "E'x\\'', ", "\"a\", "]);
            format!("SELECT {lead}CAST(NULL AS {before}INT{after})")
        }
        5 => {
            // Subqueries in FROM.
            let mut s = "SELECT 1 AS a".to_string();
            for i in 0..n {
                s = spaced(rng, &["SELECT", "*", "FROM", &format!("({s})"), &format!("AS s{i}")]);
            }
            s
        }
        6 => {
            // A chain of CTEs, or CTEs nested in CTEs.
            if rng.below(2) == 0 {
                let mut s = String::from("WITH c0 AS (SELECT 1 AS a)");
                for i in 1..n {
                    s.push_str(&format!(",{}c{i} AS (SELECT a FROM c{})", rng.pick(GAPS), i - 1));
                }
                s + &format!(" SELECT a FROM c{}", n - 1)
            } else {
                let mut s = "SELECT 1 AS a".to_string();
                for i in 0..n {
                    s = format!("WITH w{i} AS ({s}) SELECT a FROM w{i}");
                }
                s
            }
        }
        7 => {
            // Set operations, flat or nested in parentheses.
            let op = rng.pick(&["UNION ALL", "UNION", "EXCEPT", "INTERSECT"]);
            if rng.below(2) == 0 {
                vec!["SELECT 1 AS a"; n].join(&format!(" {op} "))
            } else {
                let mut s = "SELECT 1 AS a".to_string();
                for _ in 0..n {
                    s = format!("(SELECT 1 AS a {op} {s})");
                }
                s
            }
        }
        8 => {
            // Wide IN lists and select lists.
            let items: Vec<String> = (0..n * 4).map(|i| i.to_string()).collect();
            if rng.below(2) == 0 {
                format!("SELECT 1 IN ({}){from}", items.join(","))
            } else {
                format!("SELECT {}{from}", items.join(", "))
            }
        }
        9 => {
            // Calls of many arguments, and calls nested in calls.
            let f = rng.pick(&["concat", "coalesce", "greatest", "make_array", "concat_ws"]);
            if rng.below(2) == 0 {
                format!("SELECT {f}({})", vec!["'a'"; n * 2].join(", "))
            } else {
                format!("SELECT {}'a'{}", format!("{f}(").repeat(n), ", 'b')".repeat(n))
            }
        }
        10 => {
            // A CASE with many arms, or nested in its own arms.
            if rng.below(2) == 0 {
                let arms: String = (0..n).map(|i| format!(" WHEN value = {i} THEN {i}")).collect();
                format!("SELECT CASE{arms} END FROM t")
            } else {
                format!("SELECT {}1{}", "CASE WHEN TRUE THEN ".repeat(n), " END".repeat(n))
            }
        }
        _ => {
            // Struct access and indexes, chained.
            let e = nested_expression(rng, n.min(20));
            format!("SELECT struct({e}){}", "['c0']".repeat(n))
        }
    }
}

/// How one request went.
enum Answer {
    Rows,
    Refused,
    /// The connection failed: the server may have stopped.
    Lost(String),
}

/// Whether an error's text says the call never reached an answer.
fn lost(e: &str) -> bool {
    ["transport error", "connection", "broken pipe", "Unavailable", "h2 protocol"]
        .iter()
        .any(|w| e.contains(w))
}

fn answer(r: Result<usize, String>) -> Answer {
    match r {
        Ok(_) => Answer::Rows,
        Err(e) if lost(&e) => Answer::Lost(e),
        Err(_) => Answer::Refused,
    }
}

/// Sends `sql` by the route `route` picks: a statement, a prepared statement, or a Substrait
/// plan made here (a statement where this process cannot plan it).
async fn send(
    raw: &mut FlightServiceClient<Channel>,
    client: &mut FlightSqlServiceClient<Channel>,
    route: usize,
    sql: &str,
) -> Answer {
    match route {
        0..=5 => answer(count_rows(client, sql).await),
        6..=8 => match client.prepare(sql.to_string(), None).await {
            Ok(mut statement) => match statement.execute().await {
                Ok(info) => answer(rows_of(client, info).await),
                Err(e) => answer(Err(e.to_string())),
            },
            Err(e) => answer(Err(e.to_string())),
        },
        // This process plans without the server's limits: only texts it plans in moments.
        _ if sql.len() > 8192 => answer(count_rows(client, sql).await),
        _ => match plan_here(sql).await {
            Ok(plan) => answer(substrait_call(raw, client, plan).await),
            Err(_) => answer(count_rows(client, sql).await),
        },
    }
}

/// A Substrait plan of `sql` made in this process, on a thread whose stack the deepest
/// request cannot overflow (this process's parser and planner recurse as the server's do).
async fn plan_here(sql: &str) -> Result<Vec<u8>, String> {
    let sql = sql.to_string();
    tokio::task::spawn_blocking(move || {
        std::thread::Builder::new()
            .stack_size(1 << 30)
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let ctx = datafusion::prelude::SessionContext::new();
                rt.block_on(substrait_plan(&ctx, &sql))
            })
            .unwrap()
            .join()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The longest one request may take.
const SLOW: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_of_every_recursive_rule_on_every_route() {
    let seed: u64 =
        std::env::var("DLFRAME_HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_2026);
    let total: usize =
        std::env::var("DLFRAME_HOSTILE_REQUESTS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    println!("seed {seed}, {total} requests (DLFRAME_HOSTILE_SEED, DLFRAME_HOSTILE_REQUESTS)");
    let dir = common::TempDir::new("serve-hostile");
    common::write_parquet(&dir.join("t.parquet"), 0..100, 50);
    let spec = format!("t={}", dir.join("t.parquet").display());
    let mut server = Server::start(&["--table", &spec, "--timeout", "20"]);
    // Four clients at once, as many as the server runs; each its own share of the sequence.
    let clients = 4;
    let mut tasks = vec![];
    for c in 0..clients {
        let channel = server.channel().await;
        tasks.push(tokio::spawn(async move {
            let mut raw = FlightServiceClient::new(channel.clone());
            let mut client = FlightSqlServiceClient::new(channel);
            let mut rng = Rng(seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (mut rows, mut refused, mut slowest) = (0usize, 0usize, (Duration::ZERO, String::new()));
            for i in (c..total).step_by(clients) {
                let sql = request(&mut rng);
                let started = Instant::now();
                let route = rng.below(10);
                let sent = tokio::time::timeout(SLOW, send(&mut raw, &mut client, route, &sql)).await;
                let took = started.elapsed();
                let short: String = sql.chars().take(200).collect();
                match sent {
                    Ok(Answer::Rows) => rows += 1,
                    Ok(Answer::Refused) => refused += 1,
                    Ok(Answer::Lost(e)) => panic!(
                        "request {i} (route {route}, {} bytes) lost the server: {e}\n{short}",
                        sql.len()
                    ),
                    Err(_) => {
                        panic!("request {i} (route {route}, {} bytes) took over {SLOW:?}\n{short}", sql.len())
                    }
                }
                if took > slowest.0 {
                    slowest = (took, format!("{} bytes: {short}", sql.len()));
                }
            }
            (rows, refused, slowest)
        }));
    }
    let (mut rows, mut refused) = (0, 0);
    for t in tasks {
        let (r, f, slowest) = t.await.unwrap();
        rows += r;
        refused += f;
        println!("slowest request of a client: {:?}, {}", slowest.0, slowest.1);
    }
    println!("{total} requests: {rows} answered with rows, {refused} refused with an error");
    assert_eq!(rows + refused, total);
    // The generator reaches both sides of the limits.
    assert!(rows > total / 10 && refused > total / 10, "{rows} results, {refused} errors");
    assert!(matches!(server.process.child.try_wait(), Ok(None)), "the server stopped");
    let mut client = FlightSqlServiceClient::new(server.channel().await);
    assert_eq!(query(&mut client, "SELECT count(*) FROM t").await.unwrap().num_rows(), 1);
}

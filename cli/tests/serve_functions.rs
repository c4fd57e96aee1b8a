//! Every scalar function `dlframe serve` exposes, called with adversarial sizes through SQL,
//! prepared statements and Substrait, against a real server whose address space `prlimit`
//! holds to 2 GB: an allocation the server did not bound would fail inside it and stop the
//! process. Each call must come back as a result or an error, and the server must go on
//! answering. The list comes from `dlframe serve --functions`, so a function added to the
//! allow-list is called here without a change to this file.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use common::served::{Server, count_rows, query, rows_of, substrait_call, substrait_plan};
use tonic::transport::Channel;

/// The address space the server may use.
const ADDRESS_SPACE: u64 = 2 << 30;

/// The planning threads' stacks grow with the longest query text (8,192 bytes of stack a byte),
/// the query threads' with the most blocks (128 KB a block), and an address-space limit counts
/// them whole: 16 KB of text keeps two stacks at 128 MB, and 64 blocks each query thread at
/// 8 MB (four queries at once on every core).
const SMALL_STACKS: [&str; 6] = ["--max-sql-bytes", "16384", "--max-blocks", "64", "--timeout", "30"];

/// The rows each call runs over: one full batch.
const FROM: &str = "FROM generate_series(1, 8192)";

/// Arguments that ask for large results: counts, long text, long lists, a per-row value, and
/// the types the date functions take.
const ARGS: &[&str] = &[
    "1000000000",
    "-1000000000",
    "repeat('x', 50000)",
    "array_repeat(1, 50000)",
    "CAST(value AS VARCHAR)",
    "make_array(value)",
    "'%c%c%c%c%+%+%+%+'",
    "NULL",
    "TIMESTAMP '2000-01-01'",
    "INTERVAL '1 second'",
    "value",
];

/// The second and third arguments tried after each first one.
const THEN: &[&str] = &["1000000000", "repeat('y', 50000)", "0", "''"];

/// The exposed functions, from the server's own list.
fn exposed() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dlframe")).args(["serve", "--functions"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect();
    assert!(names.len() > 150, "only {} functions listed", names.len());
    names
}

/// The calls made of `name`: no argument, each argument alone, and each followed by one or two
/// of [`THEN`].
fn calls(name: &str) -> Vec<String> {
    let mut calls = vec![format!("SELECT {name}() {FROM}")];
    for a in ARGS {
        calls.push(format!("SELECT {name}({a}) {FROM}"));
        for b in THEN {
            calls.push(format!("SELECT {name}({a}, {b}) {FROM}"));
            calls.push(format!("SELECT {name}({a}, {b}, {b}) {FROM}"));
        }
    }
    calls
}

/// The longest a call may take before it is reported as one that holds the server's CPU.
const SLOW: Duration = Duration::from_secs(15);

/// What the calls of one client came to.
#[derive(Default)]
struct Sent {
    results: usize,
    slowest: (Duration, String),
    /// Calls that took longer than [`SLOW`].
    slow: Vec<String>,
}

/// Sends `sqls` one after another on one client.
async fn send(mut client: FlightSqlServiceClient<Channel>, sqls: Vec<String>) -> Sent {
    let mut sent = Sent::default();
    for sql in sqls {
        let t = Instant::now();
        match tokio::time::timeout(SLOW, count_rows(&mut client, &sql)).await {
            Ok(r) => sent.results += usize::from(r.is_ok()),
            Err(_) => sent.slow.push(sql.clone()),
        }
        if t.elapsed() > sent.slowest.0 {
            sent.slowest = (t.elapsed(), sql);
        }
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exposed_function_with_adversarial_sizes_on_every_route() {
    let Some(mut server) = Server::start_limited(&SMALL_STACKS, ADDRESS_SPACE) else { return };
    let names = exposed();
    let sqls: Vec<String> = names.iter().flat_map(|n| calls(n)).collect();
    assert!(sqls.len() >= 10_000, "{} calls", sqls.len());
    // Four clients at once, as many as the server runs.
    let clients = 4;
    let mut tasks = vec![];
    for i in 0..clients {
        let share: Vec<String> = sqls.iter().skip(i).step_by(clients).cloned().collect();
        let client = FlightSqlServiceClient::new(server.channel().await);
        tasks.push(tokio::spawn(send(client, share)));
    }
    let (mut ok, mut slow) = (0, vec![]);
    for t in tasks {
        let sent = t.await.unwrap();
        ok += sent.results;
        slow.extend(sent.slow);
        println!("slowest call: {:?}: {}", sent.slowest.0, sent.slowest.1);
    }
    assert!(slow.is_empty(), "calls that held the server for over {SLOW:?}: {slow:#?}");
    println!("{} calls of {} functions: {ok} results, {} errors", sqls.len(), names.len(), sqls.len() - ok);
    assert!(matches!(server.process.child.try_wait(), Ok(None)), "the server stopped");
    // Some calls are ordinary and run.
    assert!(ok > 1000, "only {ok} calls gave results");

    // The same calls as Substrait plans and prepared statements, where this process can plan
    // them (its DataFusion has every function; the server has the exposed ones).
    let ctx = datafusion::prelude::SessionContext::new();
    dlframe_datafusion::register(&ctx);
    let mut client = FlightSqlServiceClient::new(server.channel().await);
    let (mut substrait, mut prepared) = (0, 0);
    for name in &names {
        for sql in calls(name).into_iter().filter(|s| s.contains("1000000000") || s.contains("50000")).take(6)
        {
            if let Ok(plan) = substrait_plan(&ctx, &sql).await {
                let mut raw = FlightServiceClient::new(server.channel().await);
                let _ = substrait_call(&mut raw, &mut client, plan).await;
                substrait += 1;
            }
            if let Ok(mut statement) = client.prepare(sql.clone(), None).await {
                if let Ok(info) = statement.execute().await {
                    let _ = rows_of(&mut client, info).await;
                }
                prepared += 1;
            }
        }
    }
    println!("{substrait} Substrait plans, {prepared} prepared statements");
    assert!(substrait > 100 && prepared > 100, "{substrait} Substrait plans, {prepared} prepared statements");
    assert!(matches!(server.process.child.try_wait(), Ok(None)), "the server stopped");
    assert_eq!(
        query(&mut client, "SELECT count(*) FROM generate_series(1, 10)").await.unwrap().num_rows(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_function_results_fail_and_the_server_answers() {
    let Some(mut server) = Server::start_limited(&SMALL_STACKS, ADDRESS_SPACE) else { return };
    let mut client = FlightSqlServiceClient::new(server.channel().await);
    let v = "CAST(value AS VARCHAR)";
    for sql in [
        "SELECT array_repeat(1, 1000000000)".to_string(),
        "SELECT array_resize(make_array(1), 1000000000, 0)".to_string(),
        "SELECT cardinality(array_repeat(value, 100000)) FROM generate_series(1, 8192)".to_string(),
        "SELECT range(0, 1000000000)".to_string(),
        // Each repeat builds 400 MB, within a call's limit; together they pass the query's.
        format!("SELECT concat(repeat({v}, 10000), repeat({v}, 10000)) FROM generate_series(1, 8192)"),
        format!("SELECT repeat({v}, 10000) || repeat({v}, 10000) FROM generate_series(1, 8192)"),
        format!("SELECT make_array(repeat({v}, 10000), repeat({v}, 10000)) FROM generate_series(1, 8192)"),
        // A constant folded into one large value that every row would copy.
        format!("SELECT {} FROM generate_series(1, 8192)", vec!["repeat('x', 20000)"; 40].join(" || ")),
        // Constants within a query's limit, but not four queries' at once.
        "SELECT repeat('x', 50000), repeat('y', 50000) FROM generate_series(1, 8192)".to_string(),
    ] {
        let e = query(&mut client, &sql).await.expect_err(&sql);
        assert!(e.to_lowercase().contains("resources exhausted"), "{sql}: {e}");
        assert!(matches!(server.process.child.try_wait(), Ok(None)), "{sql} stopped the server");
    }
    // Within the limits, the same functions answer.
    let b = query(
        &mut client,
        &format!("SELECT repeat({v}, 3) || 'z', array_repeat(value, 2) FROM generate_series(1, 3)"),
    )
    .await
    .unwrap();
    assert_eq!(b.num_rows(), 3);
    let e = query(&mut client, "SELECT input_file_name()").await.unwrap_err();
    assert!(e.contains("input_file_name"), "{e}");
}

//! `dlframe serve`: an Arrow Flight SQL server over DataFusion with every dlframe function
//! registered, so any Flight SQL client (ADBC, pyarrow.flight, JDBC) runs `SELECT to_tensor(...)`
//! and gets tensor columns as `arrow.fixed_shape_tensor`.
//!
//! This file reads the command line, registers the tables, and starts the service (`flight/`)
//! with its bounds: read-only, a token, TLS, and limits on queries and connections. It refuses
//! to listen beyond loopback without both a token and TLS, unless `--insecure` says so.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use tonic::transport::Server;

use crate::flight::auth::{Bearer, check_token};
use crate::flight::calls::CountCalls;
use crate::flight::conn::{ConnLimits, incoming, raise_open_files};
use crate::flight::error::Scrub;
use crate::flight::guard::SqlLimits;
use crate::flight::run::{RunLimits, Runner, query_stack_for};
use crate::flight::service::Served;
use crate::service::{command_main, parse_listen, say, stop_signal};
use crate::tls::{Flags, TlsFiles, TlsFlags, server_config, with_causes};
use dlframe_datafusion::files::{parse_table, register_file};

pub(crate) const USAGE: &str = "\
usage: dlframe serve [--table NAME=PATH]... [--listen ADDR] [--token TOKEN]
                     [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]] [--insecure]
                     [--memory BYTES] [--query-memory BYTES] [--max-queries N] [--max-queued N]
                     [--timeout SECS] [--max-sql-bytes N] [--max-depth N] [--max-blocks N]
                     [--max-expressions N]
                     [--max-connections N] [--max-connections-per-peer N]
                     [--idle-timeout SECS] [--partitions N]
       dlframe serve --functions

Serves SQL with dlframe's tensor functions over Arrow Flight SQL, for ADBC, pyarrow.flight or
any Flight SQL client. A tensor column (to_tensor, to_tensor_fill, ...) reaches the client as
an arrow.fixed_shape_tensor column, which dlframe.to_dlpack turns into a tensor. The server is
read-only: queries run; DDL, DML, COPY and SET are refused. Prints 'listening on ADDR' once it
accepts connections, and one line per query; stops on SIGINT or SIGTERM.

  --table NAME=PATH      register a .csv, .csv.gz or .parquet file, or a directory of one of
                         these kinds, as NAME (extensions in any case)
  --listen ADDR          the address to listen on (default 127.0.0.1:50051; port 0 picks a free
                         one). An address beyond loopback needs --token and TLS, or --insecure
  --token TOKEN          require 'authorization: Bearer TOKEN' on every call; the environment
                         variable DLFRAME_TOKEN does the same and keeps the token out of `ps`
  --tls-cert FILE        serve TLS (1.2 or 1.3) with this PEM certificate chain ...
  --tls-key FILE         ... and this PEM private key
  --tls-client-ca FILE   require client certificates signed by this PEM CA (mutual TLS)
  --insecure             allow an address beyond loopback without a token or without TLS
  --memory BYTES         memory for all queries together (default 1G; K, M, G suffixes)
  --query-memory BYTES   memory for one query (default 512M); past it a query fails with
                         'Resources exhausted' where DataFusion cannot spill
  --max-queries N        queries running at once (default 4); the others wait
  --max-queued N         queries waiting (default 64); past it a query is refused as busy
  --timeout SECS         a query's longest run, waiting included (default 300)
  --max-sql-bytes N      the longest query text (default 65536)
  --max-depth N          the deepest nesting of expressions (default 256)
  --max-blocks N         the most SELECTs, CTEs, subqueries and tables in a query (default 256)
  --max-expressions N    the most expressions in a query's plan: its width, as select lists,
                         IN lists, arguments and CASE arms (default 4096)
  --max-connections N    connections open at once (default 256). When the cap, or a peer's
                         cap, is reached, a new connection takes the place of one with no call
                         open: first one that has not authenticated, else the one quiet the
                         longest; it is closed only when all in its way are busy
  --max-connections-per-peer N
                         connections open at once from one address (default 128)
  --idle-timeout SECS    close a connection without an authenticated call after this (default 10)
  --partitions N         plan each query in N partitions and answer with one endpoint per
                         partition of its plan, so that several readers fetch disjoint parts
                         of one result in parallel (default: one endpoint for the result)
  --functions            print the scalar functions the server exposes, each with the rule that
                         bounds its result before it is built, and exit
  -h, --help             print this help

Scalar functions are an allow-list: a function outside it (a new one in DataFusion, or one
that reveals the server's files) is refused, and every call's result is worked out from its
arguments first and charged to its query's memory while it lives, so that a call such as
repeat('x', 1000000000) fails with 'Resources exhausted' rather than taking the memory.

Without ORDER BY, rows of a table of several files come in the order DataFusion's partitions
finish, as from any DataFusion service.";

/// The default listening address: loopback only, on Flight SQL's customary port.
const DEFAULT_LISTEN: &str = "127.0.0.1:50051";

/// The environment variable that sets the bearer token when `--token` is not given.
pub(crate) const TOKEN_ENV: &str = "DLFRAME_TOKEN";

/// How long a stop signal waits for calls in flight before the server exits anyway.
const GRACE: Duration = Duration::from_secs(5);

/// The most calls one connection has open at once.
const CALLS_PER_CONNECTION: u32 = 32;

/// The most spill files a server writes, in bytes, where DataFusion spills.
const SPILL_BYTES: u64 = 4 << 30;

/// How `dlframe serve` names its TLS files: the certificate, the key, the clients' CA.
const TLS_FLAGS: Flags<'static> = ("--tls-cert", "--tls-key", "--tls-client-ca");

/// What `dlframe serve` was asked to do.
#[derive(Debug)]
pub(crate) struct ServeArgs {
    tables: Vec<(String, PathBuf)>,
    listen: SocketAddr,
    token: Option<String>,
    tls: Option<TlsFiles>,
    insecure: bool,
    sql: SqlLimits,
    run: RunLimits,
    conn: ConnLimits,
    partitions: Option<usize>,
    /// `--functions`: print the exposed functions and exit.
    functions: bool,
}

/// A count: a positive integer.
fn count(flag: &str, v: &str) -> Result<usize, String> {
    v.parse().ok().filter(|n| *n > 0).ok_or_else(|| format!("{flag} {v}: expected a positive number"))
}

/// A size in bytes, with an optional K, M or G suffix (powers of 1024).
fn bytes(flag: &str, v: &str) -> Result<usize, String> {
    let bad = || format!("{flag} {v}: expected a size such as 512M or 2G");
    let (digits, shift) = match v.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&v[..v.len() - 1], 10),
        Some('M') => (&v[..v.len() - 1], 20),
        Some('G') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).filter(|n| *n > 0).ok_or_else(bad)
}

/// Reads `serve`'s arguments (after the word `serve`); `Ok(None)` asks for the help.
/// `env_token` is [`TOKEN_ENV`]'s value, which `--token` overrides.
pub(crate) fn parse(
    mut it: impl Iterator<Item = String>,
    env_token: Option<String>,
) -> Result<Option<ServeArgs>, String> {
    let mut args = ServeArgs {
        tables: vec![],
        listen: DEFAULT_LISTEN.parse().expect("a valid default address"),
        token: env_token,
        tls: None,
        insecure: false,
        sql: SqlLimits::default(),
        run: RunLimits::default(),
        conn: ConnLimits::default(),
        partitions: None,
        functions: false,
    };
    let mut tls = TlsFlags::new(TLS_FLAGS);
    let mut query_memory_set = false;
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--table" => args.tables.push(parse_table(&value("--table")?)?),
            "--listen" => args.listen = parse_listen(&value("--listen")?)?,
            "--token" => args.token = Some(value("--token")?),
            "--insecure" => args.insecure = true,
            "--functions" => args.functions = true,
            "--partitions" => args.partitions = Some(count("--partitions", &value("--partitions")?)?),
            "--memory" => args.run.memory = bytes("--memory", &value("--memory")?)?,
            "--query-memory" => {
                args.run.query_memory = bytes("--query-memory", &value("--query-memory")?)?;
                query_memory_set = true;
            }
            "--max-queries" => args.run.max_queries = count("--max-queries", &value("--max-queries")?)?,
            "--max-queued" => args.run.max_queued = count("--max-queued", &value("--max-queued")?)?,
            "--timeout" => {
                args.run.timeout = Duration::from_secs(count("--timeout", &value("--timeout")?)? as u64)
            }
            "--max-sql-bytes" => {
                args.sql.max_sql_bytes = count("--max-sql-bytes", &value("--max-sql-bytes")?)?
            }
            "--max-depth" => args.sql.max_depth = count("--max-depth", &value("--max-depth")?)?,
            "--max-blocks" => args.sql.max_blocks = count("--max-blocks", &value("--max-blocks")?)?,
            "--max-expressions" => {
                args.sql.max_expressions = count("--max-expressions", &value("--max-expressions")?)?;
            }
            "--max-connections" => {
                args.conn.max_connections = count("--max-connections", &value("--max-connections")?)?;
            }
            "--max-connections-per-peer" => {
                args.conn.max_per_peer =
                    count("--max-connections-per-peer", &value("--max-connections-per-peer")?)?;
            }
            "--idle-timeout" => {
                args.conn.idle =
                    Duration::from_secs(count("--idle-timeout", &value("--idle-timeout")?)? as u64);
            }
            other => {
                if !tls.flag(other, &mut value)? {
                    return Err(format!("serve: unexpected argument {other}"));
                }
            }
        }
    }
    if let Some(t) = &args.token {
        check_token(t).map_err(|e| format!("serve: --token or {TOKEN_ENV}: {e}"))?;
    }
    if !query_memory_set {
        args.run.query_memory = args.run.query_memory.min(args.run.memory);
    }
    if args.run.query_memory > args.run.memory {
        return Err("serve: --query-memory is larger than --memory".into());
    }
    args.run.query_stack = query_stack_for(args.sql.max_blocks);
    args.tls = tls.files("serve", false)?;
    if !args.listen.ip().is_loopback() && !args.insecure && (args.token.is_none() || args.tls.is_none()) {
        return Err(format!(
            "serve: --listen {} takes connections from other machines, so it needs both a token \
             (--token or {TOKEN_ENV}) and TLS (--tls-cert, --tls-key); --insecure serves it without",
            args.listen
        ));
    }
    Ok(Some(args))
}

/// Registers the tables and serves until a stop signal, printing `listening on ADDR` (with the
/// port the system picked, for port 0) once connections are accepted.
async fn serve(args: ServeArgs) -> Result<(), String> {
    let mut id = [0u8; 1];
    getrandom::fill(&mut id).map_err(|e| format!("the system has no random source for handles: {e}"))?;
    let runtime = RuntimeEnvBuilder::new()
        .with_max_temp_directory_size(SPILL_BYTES)
        .build_arc()
        .map_err(|e| e.to_string())?;
    let mut config = SessionConfig::new();
    if let Some(n) = args.partitions {
        config = config.with_target_partitions(n);
        // Each endpoint runs one partition alone: a scan partition must read its own files, not
        // take over its idle siblings' (DataFusion's default, which would give every endpoint
        // the whole result).
        config.options_mut().execution.enable_file_stream_work_stealing = false;
    }
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime)
        .build();
    let ctx = SessionContext::new_with_state(state);
    dlframe_datafusion::register(&ctx);
    let (rules, removed) =
        crate::flight::functions::expose(&ctx, args.run.query_memory).map_err(|e| e.to_string())?;
    if args.functions {
        let mut text: String =
            crate::flight::functions::exposed().map(|(name, growth)| format!("{name}\t{growth}\n")).collect();
        text.push_str(&format!("# not exposed: {}\n", removed.join(", ")));
        // A reader that stops early (`| head`) is no error.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
        return Ok(());
    }
    // Decompressed `.csv.gz` copies live as long as the server.
    let mut staging = Vec::new();
    for (name, path) in &args.tables {
        register_file(&ctx, name, path, &mut staging).await.map_err(|e| e.to_string())?;
    }
    let scrub = Scrub::new(args.tables.iter().map(|(n, p)| (n.as_str(), p.as_path())));
    let files = raise_open_files();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot read the listening address: {e}"))?;
    let runner = Arc::new(Runner::new(args.run));
    let service = FlightServiceServer::with_interceptor(
        Served::new(ctx.state(), args.sql, runner, rules, scrub, args.partitions.is_some()),
        Bearer(args.token.as_deref().map(Arc::from)),
    );
    // Calls at once on one connection, and keepalives that find a peer that vanished.
    let mut builder = Server::builder()
        .layer(CountCalls)
        .max_concurrent_streams(Some(CALLS_PER_CONNECTION))
        .concurrency_limit_per_connection(CALLS_PER_CONNECTION as usize)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_keepalive(Some(Duration::from_secs(60)));
    if let Some(files) = &args.tls {
        builder = builder
            .tls_config(server_config(files, TLS_FLAGS, true)?)
            .map_err(|e| format!("TLS: {}", with_causes(&e)))?;
    }
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server =
        builder.add_service(service).serve_with_incoming_shutdown(incoming(listener, args.conn), async {
            stop_signal().await;
            let _ = stopping_tx.send(());
        });
    let names: Vec<&str> = args.tables.iter().map(|(n, _)| n.as_str()).collect();
    let auth = if args.token.is_some() { "bearer token required" } else { "no token" };
    let tls = match &args.tls {
        Some(TlsFiles { ca: Some(_), .. }) => "mutual TLS",
        Some(_) => "TLS",
        None => "no TLS",
    };
    say(&format!("dlframe serve: tables [{}], {auth}, {tls}, read-only", names.join(", ")));
    if !args.listen.ip().is_loopback() && (args.token.is_none() || args.tls.is_none()) {
        say(&format!(
            "dlframe serve: WARNING: --insecure: {addr} is reachable from other machines with {auth} and {tls}"
        ));
    }
    let r = &args.run;
    say(&format!(
        "dlframe serve: limits: {} queries at once ({} waiting), {} s each, {} MB per query, {} MB in all, \
         {} connections ({} per peer), open files {}",
        r.max_queries,
        r.max_queued,
        r.timeout.as_secs(),
        r.query_memory >> 20,
        r.memory >> 20,
        args.conn.max_connections,
        args.conn.max_per_peer,
        files.map_or_else(|| "unknown".to_string(), |f| f.to_string())
    ));
    say(&format!("dlframe serve: listening on {addr}"));
    // After a stop signal, calls in flight get GRACE to finish; then the server exits anyway.
    let deadline = async {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = server => served.map_err(|e| format!("serving on {addr}: {e}"))?,
        () = deadline => {}
    }
    drop(staging);
    say("dlframe serve: stopped");
    Ok(())
}

/// `dlframe serve ...`: the exit code after serving, or after a bad command line (2).
pub fn serve_main(args: impl Iterator<Item = String>) -> ExitCode {
    command_main("serve", USAGE, parse(args, std::env::var(TOKEN_ENV).ok()), serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(args: &[&str], env: Option<&str>) -> Result<Option<ServeArgs>, String> {
        parse(args.iter().map(|s| s.to_string()), env.map(String::from))
    }

    #[test]
    fn defaults_to_loopback_no_token_and_safe_limits() {
        let a = parse_all(&[], None).unwrap().unwrap();
        assert_eq!(a.listen.to_string(), DEFAULT_LISTEN);
        assert!(a.token.is_none() && a.tables.is_empty() && a.tls.is_none() && !a.insecure);
        assert_eq!(a.run, RunLimits::default());
        assert_eq!(a.sql, SqlLimits::default());
        assert!(a.run.memory <= 1 << 30 && a.run.max_queries <= 4);
    }

    #[test]
    fn the_flag_overrides_the_environment_token() {
        let a = parse_all(&["--token", "flag"], Some("env")).unwrap().unwrap();
        assert_eq!(a.token.as_deref(), Some("flag"));
        let a = parse_all(&[], Some("env")).unwrap().unwrap();
        assert_eq!(a.token.as_deref(), Some("env"));
    }

    #[test]
    fn limits_are_read() {
        let a = parse_all(
            &[
                "--memory",
                "2G",
                "--query-memory",
                "300M",
                "--max-queries",
                "3",
                "--timeout",
                "9",
                "--max-depth",
                "50",
                "--partitions",
                "4",
            ],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!((a.run.memory, a.run.query_memory), (2 << 30, 300 << 20));
        assert_eq!((a.run.max_queries, a.run.timeout, a.sql.max_depth), (3, Duration::from_secs(9), 50));
        assert_eq!(a.partitions, Some(4));
        let a = parse_all(&["--memory", "100M"], None).unwrap().unwrap();
        assert_eq!(a.run.query_memory, 100 << 20, "the query's share follows a smaller server limit");
        for bad in
            [&["--memory", "lots"][..], &["--max-queries", "0"], &["--memory", "1M", "--query-memory", "2M"]]
        {
            assert!(parse_all(bad, None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_arguments_are_named() {
        let e = parse_all(&["--listen", "nowhere"], None).unwrap_err();
        assert!(e.contains("--listen nowhere"), "{e}");
        let e = parse_all(&["--table", "t"], None).unwrap_err();
        assert!(e.contains("NAME=PATH"), "{e}");
        let e = parse_all(&["SELECT 1"], None).unwrap_err();
        assert!(e.contains("unexpected argument SELECT 1"), "{e}");
        let e = parse_all(&[], Some("")).unwrap_err();
        assert!(e.contains("empty token"), "{e}");
        let e = parse_all(&["--token", "tok\n"], None).unwrap_err();
        assert!(e.contains("character"), "{e}");
        assert!(parse_all(&["--token"], None).unwrap_err().contains("needs a value"));
        let e = parse_all(&["--tls-cert", "c.pem"], None).unwrap_err();
        assert!(e.contains("go together"), "{e}");
        let e = parse_all(&["--tls-client-ca", "ca.pem"], None).unwrap_err();
        assert!(e.contains("needs --tls-cert"), "{e}");
    }

    #[test]
    fn listening_beyond_loopback_needs_a_token_and_tls_or_insecure() {
        let tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem"];
        for args in [
            &["--listen", "0.0.0.0:0"][..],
            &["--listen", "0.0.0.0:0", "--token", "t"],
            &["--listen", "0.0.0.0:0", tls[0], tls[1], tls[2], tls[3]],
        ] {
            let e = parse_all(args, None).unwrap_err();
            assert!(e.contains("needs both a token") && e.contains("--insecure"), "{args:?}: {e}");
        }
        assert!(
            parse_all(&["--listen", "0.0.0.0:0", "--token", "t", tls[0], tls[1], tls[2], tls[3]], None)
                .is_ok()
        );
        assert!(parse_all(&["--listen", "0.0.0.0:0", "--insecure"], None).is_ok());
        assert!(parse_all(&["--listen", "[::1]:0"], None).is_ok());
        assert!(parse_all(&["--listen", "127.0.0.2:0"], None).is_ok());
    }
}

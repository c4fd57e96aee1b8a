//! `dlframe serve`: an Arrow Flight SQL server over DataFusion with every dlframe function
//! registered, so any Flight SQL client (ADBC, pyarrow.flight, JDBC) runs `SELECT to_tensor(...)`
//! and gets tensor columns as `arrow.fixed_shape_tensor`.
//!
//! The Flight SQL service is datafusion-flight-sql-server's; this file adds the tables, the
//! functions, an optional bearer token, the listening socket and the shutdown on SIGINT/SIGTERM.
//! Query errors (bad SQL, an unknown table, a `to_tensor` error while running) go to the client
//! as Flight errors carrying DataFusion's message, and the server keeps serving.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::prelude::SessionContext;
use datafusion_flight_sql_server::service::FlightSqlService;
use tonic::service::Interceptor;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Status};

use crate::register::{parse_table, register_file};
use crate::service::{command_main, parse_listen, say, stop_signal};

pub(crate) const USAGE: &str = "\
usage: dlframe serve [--table NAME=PATH]... [--listen ADDR] [--token TOKEN]

Serves SQL with dlframe's tensor functions over Arrow Flight SQL, for ADBC, pyarrow.flight or
any Flight SQL client. A tensor column (to_tensor, to_tensor_fill, ...) reaches the client as
an arrow.fixed_shape_tensor column, which dlframe.to_dlpack turns into a tensor. Prints
'listening on ADDR' once it accepts connections; stops on SIGINT or SIGTERM.

  --table NAME=PATH  register a .csv, .csv.gz or .parquet file, or a directory of one of
                     these kinds, as NAME (extensions in any case)
  --listen ADDR      the address to listen on (default 127.0.0.1:50051; port 0 picks a free one)
  --token TOKEN      require 'authorization: Bearer TOKEN' on every call; the environment
                     variable DLFRAME_TOKEN does the same and keeps the token out of `ps`
  -h, --help         print this help

Without ORDER BY, rows of a table of several files come in the order DataFusion's partitions
finish, as from any DataFusion service.";

/// The default listening address: loopback only, on Flight SQL's customary port.
const DEFAULT_LISTEN: &str = "127.0.0.1:50051";

/// The environment variable that sets the bearer token when `--token` is not given.
pub(crate) const TOKEN_ENV: &str = "DLFRAME_TOKEN";

/// How long a stop signal waits for calls in flight before the server exits anyway.
const GRACE: Duration = Duration::from_secs(5);

/// What `dlframe serve` was asked to do.
#[derive(Debug)]
pub(crate) struct ServeArgs {
    tables: Vec<(String, PathBuf)>,
    listen: SocketAddr,
    token: Option<String>,
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
    };
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--table" => args.tables.push(parse_table(&value("--table")?)?),
            "--listen" => args.listen = parse_listen(&value("--listen")?)?,
            "--token" => args.token = Some(value("--token")?),
            other => return Err(format!("serve: unexpected argument {other}")),
        }
    }
    if args.token.as_deref() == Some("") {
        return Err(format!("serve: an empty token (--token or {TOKEN_ENV}) would let anyone in"));
    }
    Ok(Some(args))
}

/// Refuses every call that lacks `authorization: Bearer <token>`, when a token is set.
#[derive(Clone)]
struct Bearer(Option<Arc<str>>);

impl Interceptor for Bearer {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else { return Ok(request) };
        let given = request
            .metadata()
            .get("authorization")
            .ok_or_else(|| Status::unauthenticated("dlframe serve: this server needs a bearer token"))?;
        let given = given.as_bytes().strip_prefix(b"Bearer ").unwrap_or_default();
        if same_bytes(given, token.as_bytes()) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("dlframe serve: wrong bearer token"))
        }
    }
}

/// Compares two byte strings in time that depends on their lengths only, not on where they differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Registers the tables and serves until a stop signal, printing `listening on ADDR` (with the
/// port the system picked, for port 0) once connections are accepted.
async fn serve(args: ServeArgs) -> Result<(), String> {
    let ctx = SessionContext::new();
    dlframe_datafusion::register(&ctx);
    // Decompressed `.csv.gz` copies live as long as the server.
    let mut staging = Vec::new();
    for (name, path) in &args.tables {
        register_file(&ctx, name, path, &mut staging).await.map_err(|e| e.to_string())?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot read the listening address: {e}"))?;
    let service = FlightServiceServer::with_interceptor(
        FlightSqlService::new(ctx.state()),
        Bearer(args.token.as_deref().map(Arc::from)),
    );
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, async {
        stop_signal().await;
        let _ = stopping_tx.send(());
    });
    let names: Vec<&str> = args.tables.iter().map(|(n, _)| n.as_str()).collect();
    let auth = if args.token.is_some() { "bearer token required" } else { "no token" };
    say(&format!("dlframe serve: tables [{}], {auth}", names.join(", ")));
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
pub(crate) fn main(args: impl Iterator<Item = String>) -> ExitCode {
    command_main("serve", USAGE, parse(args, std::env::var(TOKEN_ENV).ok()), serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(args: &[&str], env: Option<&str>) -> Result<Option<ServeArgs>, String> {
        parse(args.iter().map(|s| s.to_string()), env.map(String::from))
    }

    #[test]
    fn defaults_to_loopback_and_no_token() {
        let a = parse_all(&[], None).unwrap().unwrap();
        assert_eq!(a.listen.to_string(), DEFAULT_LISTEN);
        assert!(a.token.is_none() && a.tables.is_empty());
    }

    #[test]
    fn the_flag_overrides_the_environment_token() {
        let a = parse_all(&["--token", "flag"], Some("env")).unwrap().unwrap();
        assert_eq!(a.token.as_deref(), Some("flag"));
        let a = parse_all(&[], Some("env")).unwrap().unwrap();
        assert_eq!(a.token.as_deref(), Some("env"));
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
        assert!(parse_all(&["--token"], None).unwrap_err().contains("needs a value"));
    }

    #[test]
    fn the_bearer_check() {
        let with = |header: Option<&str>| {
            let mut r = Request::new(());
            if let Some(h) = header {
                r.metadata_mut().insert("authorization", h.parse().unwrap());
            }
            r
        };
        let mut open = Bearer(None);
        assert!(open.call(with(None)).is_ok());
        let mut closed = Bearer(Some(Arc::from("s3cret")));
        assert!(closed.call(with(Some("Bearer s3cret"))).is_ok());
        for bad in [None, Some("Bearer s3cre"), Some("Bearer s3cret2"), Some("s3cret"), Some("Basic s3cret")]
        {
            let e = closed.call(with(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }
}

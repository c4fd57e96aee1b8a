//! What the long-running subcommands (`serve`, `scheduler`, `executor`) share: how they start
//! and end (the help, a bad command line, a runtime, the exit code), the stop signal, and the
//! lines they print for whoever started them.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

/// A `--listen` value: an IP address and a port (0 lets the system pick one). A host name is
/// refused, since the address is also what the process prints and hands to others.
pub(crate) fn parse_listen(v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| format!("--listen {v}: expected IP:PORT, such as 127.0.0.1:0"))
}

/// The stack of each runtime thread, in bytes (reserved, not committed, until used).
const WORKER_STACK: usize = 64 << 20;

/// A subcommand's exit code: its help (0), a bad command line (2), or `run` on a new
/// multi-threaded runtime (0, or 1 with its error).
pub(crate) fn command_main<A, F>(
    what: &str,
    usage: &str,
    parsed: Result<Option<A>, String>,
    run: impl FnOnce(A) -> F,
) -> ExitCode
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let args = match parsed {
        Ok(Some(a)) => a,
        Ok(None) => {
            say(usage);
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            crate::complain(&format!("dlframe: {msg}\n\n{usage}"));
            return ExitCode::from(2);
        }
    };
    // Deep trees (a long expression's AST being dropped, DataFusion's walks) recurse: the
    // workers get room for what the query limits let through.
    let outcome = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(WORKER_STACK)
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
        .and_then(|runtime| runtime.block_on(run(args)));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            crate::complain(&format!("dlframe {what}: {msg}"));
            ExitCode::FAILURE
        }
    }
}

/// Waits for SIGINT or SIGTERM.
pub(crate) async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Prints `line` on stdout and flushes it at once: a test or a script waits for these lines.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

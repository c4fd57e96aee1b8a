//! dlframe's services, which the `dlframe` command runs when it is built with its feature
//! `serve` (`dlframe-cli`, `cli/`):
//! - `dlframe serve` ([`serve_main`], `serve.rs`, the service in `flight/`): an Arrow Flight SQL
//!   server over DataFusion with every dlframe function registered, read-only and bounded
//!   against its clients;
//! - `dlframe scheduler` and `dlframe executor` ([`scheduler_main`], [`executor_main`], in
//!   `cluster/`): the two processes of an Apache Ballista cluster, with the same functions.
//!
//! What they share (how they start and stop, the lines they print) is in `service.rs`; the
//! tables they read (`--table`, `--data`) come from `dlframe_datafusion::files`, as the
//! command's do. The crate is its own so that the command's SQL-to-file path builds without
//! Arrow Flight, tonic, Ballista and Substrait.

mod cluster;
mod flight;
mod serve;
mod service;
mod tls;

pub use cluster::{executor_main, scheduler_main};
pub use serve::serve_main;

/// Writes a message to stderr, ignoring a closed stderr.
fn complain(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

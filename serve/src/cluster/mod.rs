//! `dlframe scheduler` and `dlframe executor`: the two processes of an Apache Ballista cluster,
//! with every dlframe function registered, so a Ballista client runs `SELECT to_tensor(...)` and
//! the work is split over the executors.
//!
//! Ballista sends query plans between processes and finds a function again by its name, so each
//! process holds the same functions: the scheduler's sessions (it plans), every executor's
//! registry (it runs the tasks), and the client's session (see docs/serve.md). Ballista's own
//! session setup replaces the function list (`with_scalar_functions`), so the functions are added
//! after each session is built, never before.
//!
//! Nothing here copies data: the functions run inside the executors as in any DataFusion process.
//!
//! Both processes check a token on every call, the clients' or the executors' own, and each
//! call is held to its caller's role (`auth`); the scheduler holds every job to the read-only
//! rule and to its data directories before accepting it (`plans`), and a call about a job to
//! the connection that made it (`jobs`); the executors serve results only by well-formed job
//! ids (`fetch`). The command lines and their rules are in `args`, the scheduler's TLS
//! listener in `listener`. The executors pull their tasks from the scheduler, so they open no
//! task port that anyone could call.

mod args;
mod auth;
mod fetch;
mod jobs;
mod listener;
mod plans;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::utils::default_session_builder;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_executor::health::ExecutorHealth;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::create_scheduler;
use datafusion::execution::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use self::args::{ExecutorArgs, SchedulerArgs, TLS_FLAGS, parse_executor, parse_scheduler};
use self::auth::endpoint_hook;
use self::plans::{DataRoots, PlanGuard, serve_scheduler};
use crate::service::{command_main, say, stop_signal};
use crate::tls::{client_config, rustls_server, server_config, with_causes};

pub(crate) const SCHEDULER_USAGE: &str = "\
usage: dlframe scheduler --token TOKEN --executor-token TOKEN [--listen ADDR] [--data DIR]...
                         [--tls-cert FILE --tls-key FILE --tls-ca FILE]
                         [--executor-timeout SECS] [--insecure]

Runs an Apache Ballista scheduler that knows dlframe's functions (to_tensor and friends), so
Ballista clients can use them in SQL and the work runs on `dlframe executor` processes. Jobs
are read-only: DDL, DML, COPY and SET are refused, and files are read only under --data.
Prints 'listening on ADDR' once it accepts connections; stops on SIGINT or SIGTERM.

  --listen ADDR             the address to listen on (default 127.0.0.1:50050; port 0 picks a
                            free one); beyond loopback it needs TLS, or --insecure
  --data DIR                a directory whose files jobs may read (repeat for more); without
                            one, jobs read no files
  --token TOKEN             the clients' token: running jobs and following them takes it;
                            DLFRAME_CLUSTER_TOKEN does the same, out of `ps`
  --executor-token TOKEN    the executors' token, another than the clients': asking for work
                            and reporting it takes it; DLFRAME_EXECUTOR_TOKEN does the same
  --tls-cert FILE           serve TLS with this PEM certificate chain ...
  --tls-key FILE            ... and this PEM private key ...
  --tls-ca FILE             ... and trust this PEM CA, which signed the executors' certificates,
                            when calling them; clients then connect with TLS
  --insecure                run without tokens (anyone may run jobs and ask for work), or
                            listen beyond loopback without TLS, where tokens travel in clear text
  --executor-timeout SECS   an executor silent this long is taken as lost, and its tasks run
                            again elsewhere (default 180)
  -h, --help                print this help";

pub(crate) const EXECUTOR_USAGE: &str = "\
usage: dlframe executor --scheduler HOST:PORT --token TOKEN --executor-token TOKEN
                        [--tls-cert FILE --tls-key FILE --tls-ca FILE]
                        [--listen ADDR] [--work-dir DIR] [--slots N] [--insecure]

Runs an Apache Ballista executor with dlframe's functions registered. It registers with the
scheduler, asks it for tasks, runs them, and serves their results to the other executors and
to the client. Prints 'ready' once the scheduler has answered; stops on SIGINT or SIGTERM,
after the tasks it is running.

  --scheduler HOST:PORT  the scheduler (a `dlframe scheduler`); waited for up to 30 s
  --listen ADDR          where the results are served (default 127.0.0.1:50051; port 0 picks a
                         free one); the host is the one the scheduler hands to the others;
                         beyond loopback it needs TLS, or --insecure
  --work-dir DIR         where task results are written (default: a new temporary directory)
  --slots N              tasks run at once (default: the number of cores)
  --token TOKEN          the clients' token (as the scheduler's), which their fetches of
                         results carry; DLFRAME_CLUSTER_TOKEN does the same, out of `ps`
  --executor-token TOKEN the executors' token (as the scheduler's), this executor's
                         credential; DLFRAME_EXECUTOR_TOKEN does the same
  --tls-cert FILE        serve results over TLS with this PEM certificate chain ...
  --tls-key FILE         ... and this PEM private key, and call the scheduler and the other
  --tls-ca FILE          executors over TLS, trusting this PEM CA (the cluster's)
  --insecure             run without tokens, or listen beyond loopback without TLS, where
                         tokens travel in clear text
  -h, --help             print this help";

/// How long an executor waits for its scheduler to answer before it gives up.
const CONNECT_SECS: u16 = 30;

/// The largest gRPC message the executors' Flight servers take or send (Ballista's default).
const MAX_MESSAGE: usize = 16 << 20;

/// Ballista's default session for the scheduler, with dlframe's functions added after it is built
/// (Ballista's builder replaces the function list, so adding them before would lose them).
fn scheduler_session(config: SessionConfig) -> datafusion::common::Result<SessionState> {
    let mut state = default_session_builder(config)?;
    dlframe_datafusion::register_all(&mut state)?;
    Ok(state)
}

/// Ballista's default executor registry with dlframe's functions, under their names and aliases.
pub(crate) fn executor_registry() -> BallistaFunctionRegistry {
    let mut registry = BallistaFunctionRegistry::default();
    for udf in dlframe_datafusion::functions() {
        for name in std::iter::once(udf.name()).chain(udf.aliases().iter().map(String::as_str)) {
            registry.scalar_functions.insert(name.to_string(), udf.clone());
        }
    }
    registry
}

/// A free port on `ip`, for Ballista's executor, which tells the scheduler the port it was given
/// rather than the one it got: the port is taken and released here, so another process could
/// take it in between, which is as likely as with any port picked by hand.
fn free_port(ip: std::net::IpAddr) -> Result<u16, String> {
    let l = StdListener::bind((ip, 0)).map_err(|e| format!("cannot find a free port on {ip}: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("cannot read a free port: {e}"))
}

async fn run_scheduler(args: SchedulerArgs) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot read the listening address: {e}"))?;
    let mut config = SchedulerConfig::default();
    config.bind_host = addr.ip().to_string();
    config.external_host = addr.ip().to_string();
    config.bind_port = addr.port();
    config.executor_timeout_seconds = args.executor_timeout;
    config.no_executors_grace_period_seconds = args.executor_timeout;
    config.expire_dead_executor_interval_seconds =
        config.expire_dead_executor_interval_seconds.min(args.executor_timeout / 2).max(1);
    config.override_session_builder = Some(Arc::new(scheduler_session));
    // A job's id is the capability to read its results (see `jobs`): random, not Ballista's snowflakes.
    config.job_id_generator = Some(Arc::new(jobs::RandomJobIds));
    // The executors ask for tasks: the scheduler never calls them, so they open no task port.
    config.scheduling_policy = TaskSchedulingPolicy::PullStaged;
    let auth = args.tokens.auth();
    let tls_server = args.tls.as_ref().map(|f| rustls_server(f, TLS_FLAGS)).transpose()?;
    let tls_client = args.tls.as_ref().map(|f| client_config(f, TLS_FLAGS)).transpose()?;
    // Where the scheduler calls out (to executors), it is cluster infrastructure.
    config.override_create_grpc_client_endpoint = endpoint_hook(auth.executor.clone(), tls_client);
    config.validate().map_err(|e| e.to_string())?;
    let roots = DataRoots::new(&args.data)?;
    let decode = SessionContext::new_with_state(
        scheduler_session(SessionConfig::new_with_ballista()).map_err(|e| e.to_string())?,
    );
    let cluster = BallistaCluster::new_from_config(&config).await.map_err(|e| e.to_string())?;
    let scheduler = create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::new(config))
        .await
        .map_err(|e| e.to_string())?;
    let data: Vec<String> = args.data.iter().map(|d| d.display().to_string()).collect();
    let tokens =
        if auth.client.is_some() { "client and executor tokens required" } else { "open: no tokens" };
    let tls = if tls_server.is_some() { "TLS" } else { "no TLS" };
    say(&format!("dlframe scheduler: data [{}], {tokens}, {tls}, read-only jobs", data.join(", ")));
    say(&format!("dlframe scheduler: listening on {addr}"));
    let guard = PlanGuard::new(scheduler, decode, roots);
    tokio::select! {
        served = serve_scheduler(listener, tls_server, guard, auth) => {
            served.map_err(|e| format!("serving on {addr}: {e}"))?;
        }
        () = stop_signal() => {}
    }
    say("dlframe scheduler: stopped");
    Ok(())
}

async fn run_executor(args: ExecutorArgs) -> Result<(), String> {
    let ip = args.listen.ip();
    let port = if args.listen.port() == 0 { free_port(ip)? } else { args.listen.port() };
    let health = ExecutorHealth::new();
    let auth = args.tokens.auth();
    let tls_client = args.tls.as_ref().map(|f| client_config(f, TLS_FLAGS)).transpose()?;
    let tls_server = args.tls.as_ref().map(|f| server_config(f, TLS_FLAGS, false)).transpose()?;
    if let Some(c) = &tls_server {
        // Built here too, so that a bad key is an error at start, not in the server's task.
        tonic::transport::Server::builder()
            .tls_config(c.clone())
            .map_err(|e| format!("TLS: {}", with_causes(&e)))?;
    }
    // Every channel the executor opens (to the scheduler, to other executors' results) carries
    // the executors' token, over TLS when the cluster has it; its own result server takes the
    // clients' and the executors'.
    let use_tls = args.tls.is_some();
    let endpoint = endpoint_hook(auth.executor.clone(), tls_client);
    let task_endpoint = endpoint.clone();
    let config = ExecutorProcessConfig {
        bind_host: ip.to_string(),
        external_host: Some(ip.to_string()),
        port,
        scheduler_host: args.scheduler.0.clone(),
        scheduler_port: args.scheduler.1,
        scheduler_connect_timeout_seconds: CONNECT_SECS,
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        vcores: args.slots,
        work_dir: args.work_dir.as_ref().map(|d| d.display().to_string()),
        override_function_registry: Some(Arc::new(executor_registry())),
        override_create_grpc_client_endpoint: endpoint,
        override_config_producer: Some(Arc::new(move || {
            // `use_tls`: fetches of other executors' results go to `https://`.
            let config = SessionConfig::new_with_ballista().with_ballista_use_tls(use_tls);
            match &task_endpoint {
                Some(e) => config.with_ballista_override_create_grpc_client_endpoint(e.clone()),
                None => config,
            }
        })),
        override_arrow_flight_service: Some(fetch::flight_server(auth.clone(), tls_server, MAX_MESSAGE)),
        health: health.clone(),
        ..ExecutorProcessConfig::default()
    };
    let id = config.executor_id.clone();
    let addr = SocketAddr::new(ip, port);
    let (host, sport) = &args.scheduler;
    let tokens = if auth.client.is_some() { "tokens required" } else { "open: no tokens" };
    let tls = if use_tls { "TLS" } else { "no TLS" };
    say(&format!("dlframe executor {id}: serving on {addr}, scheduler {host}:{sport}, {tokens}, {tls}"));
    let ready = async {
        while !health.is_ready() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        say(&format!("dlframe executor {id}: ready"));
        std::future::pending::<()>().await;
    };
    // Ballista's executor stops itself on SIGINT and SIGTERM, after its running tasks.
    tokio::select! {
        ran = start_executor_process(Arc::new(config)) => ran.map_err(|e| e.to_string())?,
        () = ready => {}
    }
    say(&format!("dlframe executor {id}: stopped"));
    Ok(())
}

/// `dlframe scheduler ...`: the exit code after serving, or after a bad command line (2).
pub fn scheduler_main(args: impl Iterator<Item = String>) -> ExitCode {
    command_main(
        "scheduler",
        SCHEDULER_USAGE,
        parse_scheduler(args, |name| std::env::var(name).ok()),
        run_scheduler,
    )
}

/// `dlframe executor ...`: the exit code after serving, or after a bad command line (2).
pub fn executor_main(args: impl Iterator<Item = String>) -> ExitCode {
    command_main(
        "executor",
        EXECUTOR_USAGE,
        parse_executor(args, |name| std::env::var(name).ok()),
        run_executor,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_is_in_the_executor_registry_and_the_scheduler_session() {
        let registry = executor_registry();
        let state = scheduler_session(SessionConfig::new()).unwrap();
        for udf in dlframe_datafusion::functions() {
            assert!(registry.scalar_functions.contains_key(udf.name()), "{}", udf.name());
            assert!(state.scalar_functions().contains_key(udf.name()), "{}", udf.name());
        }
        // Ballista's own functions are still there: adding ours replaced nothing.
        let ballista = BallistaFunctionRegistry::default();
        assert!(ballista.scalar_functions.keys().all(|k| registry.scalar_functions.contains_key(k)));
        assert!(state.scalar_functions().contains_key("abs"));
    }

    #[test]
    fn a_free_port_is_not_zero() {
        assert_ne!(free_port("127.0.0.1".parse().unwrap()).unwrap(), 0);
    }
}

//! The command lines of `dlframe scheduler` and `dlframe executor`, and the rules both hold
//! them to: the two tokens, the TLS files, and `--insecure` for an open cluster or one beyond
//! loopback without TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::auth::{CLUSTER_TOKEN_ENV, ClusterAuth, EXECUTOR_TOKEN_ENV};
use crate::flight::auth::check_token;
use crate::service::parse_listen;
use crate::tls::{Flags, TlsFiles, TlsFlags};

/// What `dlframe scheduler` was asked to do.
#[derive(Debug)]
pub(crate) struct SchedulerArgs {
    pub(crate) listen: SocketAddr,
    pub(crate) executor_timeout: u64,
    pub(crate) data: Vec<PathBuf>,
    pub(crate) tokens: Tokens,
    pub(crate) tls: Option<TlsFiles>,
}

/// What `dlframe executor` was asked to do.
#[derive(Debug)]
pub(crate) struct ExecutorArgs {
    pub(crate) scheduler: (String, u16),
    pub(crate) listen: SocketAddr,
    pub(crate) work_dir: Option<PathBuf>,
    pub(crate) slots: usize,
    pub(crate) tokens: Tokens,
    pub(crate) tls: Option<TlsFiles>,
}

/// The clients' token and the executors' token: both, or neither with `--insecure`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tokens {
    client: Option<String>,
    executor: Option<String>,
}

impl Tokens {
    /// The tokens from the environment, before the command line overrides them.
    fn from_env(env: &impl Fn(&str) -> Option<String>) -> Tokens {
        Tokens { client: env(CLUSTER_TOKEN_ENV), executor: env(EXECUTOR_TOKEN_ENV) }
    }

    /// Reads `--token` and `--executor-token`; false for another flag.
    fn flag(
        &mut self,
        flag: &str,
        value: &mut dyn FnMut(&str) -> Result<String, String>,
    ) -> Result<bool, String> {
        match flag {
            "--token" => self.client = Some(value(flag)?),
            "--executor-token" => self.executor = Some(value(flag)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    pub(crate) fn auth(&self) -> ClusterAuth {
        ClusterAuth {
            client: self.client.as_deref().map(Arc::from),
            executor: self.executor.as_deref().map(Arc::from),
        }
    }
}

/// How the cluster's processes name their TLS files: their certificate and key, and the CA that
/// signed the cluster's certificates, which they trust when they call each other.
pub(crate) const TLS_FLAGS: Flags<'static> = ("--tls-cert", "--tls-key", "--tls-ca");

/// The rules both processes share: both tokens are ones a header can carry, and they differ; a
/// cluster without them, or listening beyond loopback without TLS (`tls`), takes `--insecure`.
fn check_exposure(
    what: &str,
    listen: &SocketAddr,
    tokens: &Tokens,
    tls: bool,
    insecure: bool,
) -> Result<(), String> {
    let named = [
        (&tokens.client, "--token", CLUSTER_TOKEN_ENV, "anyone could run jobs"),
        (&tokens.executor, "--executor-token", EXECUTOR_TOKEN_ENV, "anyone could ask for work and report it"),
    ];
    for (token, flag, env, open) in named {
        match token {
            Some(t) => check_token(t).map_err(|e| format!("{what}: {flag} or {env}: {e}"))?,
            None if !insecure => {
                return Err(format!(
                    "{what}: {flag} TOKEN (or {env}) is required: without it {open}; --insecure runs an open \
                     cluster"
                ));
            }
            None => {}
        }
    }
    if tokens.client.is_some() != tokens.executor.is_some() {
        return Err(format!("{what}: give both --token and --executor-token, or neither (with --insecure)"));
    }
    if tokens.client.is_some() && tokens.client == tokens.executor {
        return Err(format!(
            "{what}: --executor-token must differ from --token, or a client could act as an executor"
        ));
    }
    if !listen.ip().is_loopback() && !tls && !insecure {
        return Err(format!(
            "{what}: --listen {listen} takes connections from other machines, so the tokens would cross the \
             network in clear text without TLS (--tls-cert, --tls-key, --tls-ca); --insecure serves it anyway"
        ));
    }
    Ok(())
}

fn parse_number<T: std::str::FromStr + PartialOrd + Default>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .ok()
        .filter(|n| *n > T::default())
        .ok_or_else(|| format!("{flag} {v}: expected a positive number"))
}

/// Reads `dlframe scheduler`'s arguments; `Ok(None)` asks for the help.
pub(crate) fn parse_scheduler(
    mut it: impl Iterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<SchedulerArgs>, String> {
    let mut args = SchedulerArgs {
        listen: "127.0.0.1:50050".parse().expect("an address"),
        executor_timeout: 180,
        data: vec![],
        tokens: Tokens::from_env(&env),
        tls: None,
    };
    let mut insecure = false;
    let mut tls = TlsFlags::new(TLS_FLAGS);
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--listen" => args.listen = parse_listen(&value("--listen")?)?,
            "--data" => args.data.push(PathBuf::from(value("--data")?)),
            "--insecure" => insecure = true,
            "--executor-timeout" => {
                args.executor_timeout = parse_number("--executor-timeout", &value("--executor-timeout")?)?;
            }
            other => {
                if !args.tokens.flag(other, &mut value)? && !tls.flag(other, &mut value)? {
                    return Err(format!("scheduler: unexpected argument {other}"));
                }
            }
        }
    }
    args.tls = tls.files("scheduler", true)?;
    check_exposure("scheduler", &args.listen, &args.tokens, args.tls.is_some(), insecure)?;
    Ok(Some(args))
}

/// Reads `dlframe executor`'s arguments; `Ok(None)` asks for the help.
pub(crate) fn parse_executor(
    mut it: impl Iterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<ExecutorArgs>, String> {
    let mut scheduler = None;
    let mut insecure = false;
    let mut args = ExecutorArgs {
        scheduler: (String::new(), 0),
        listen: "127.0.0.1:50051".parse().expect("an address"),
        work_dir: None,
        slots: std::thread::available_parallelism().map_or(1, |n| n.get()),
        tokens: Tokens::from_env(&env),
        tls: None,
    };
    let mut tls = TlsFlags::new(TLS_FLAGS);
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--scheduler" => {
                let v = value("--scheduler")?;
                let bad = || format!("--scheduler {v}: expected HOST:PORT, such as 127.0.0.1:50050");
                let (host, port) = v.rsplit_once(':').ok_or_else(bad)?;
                let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?;
                if host.is_empty() {
                    return Err(bad());
                }
                scheduler = Some((host.trim_matches(['[', ']']).to_string(), port));
            }
            "--listen" => args.listen = parse_listen(&value("--listen")?)?,
            "--work-dir" => args.work_dir = Some(PathBuf::from(value("--work-dir")?)),
            "--slots" => args.slots = parse_number("--slots", &value("--slots")?)?,
            "--insecure" => insecure = true,
            other => {
                if !args.tokens.flag(other, &mut value)? && !tls.flag(other, &mut value)? {
                    return Err(format!("executor: unexpected argument {other}"));
                }
            }
        }
    }
    args.scheduler = scheduler.ok_or("executor: --scheduler HOST:PORT is required")?;
    if args.listen.ip().is_unspecified() {
        // The host is what the scheduler tells the other executors and the client to connect to.
        return Err(format!(
            "--listen {}: give the address the others reach this executor at, not a wildcard",
            args.listen
        ));
    }
    args.tls = tls.files("executor", true)?;
    check_exposure("executor", &args.listen, &args.tokens, args.tls.is_some(), insecure)?;
    Ok(Some(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> impl Iterator<Item = String> {
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>().into_iter()
    }

    /// The environment of these tests: both tokens set, as most runs set them.
    fn env(name: &str) -> Option<String> {
        match name {
            CLUSTER_TOKEN_ENV => Some("client-tok".into()),
            EXECUTOR_TOKEN_ENV => Some("executor-tok".into()),
            _ => None,
        }
    }

    fn parse_scheduler(a: impl Iterator<Item = String>) -> Result<Option<SchedulerArgs>, String> {
        super::parse_scheduler(a, env)
    }

    fn parse_executor(a: impl Iterator<Item = String>) -> Result<Option<ExecutorArgs>, String> {
        super::parse_executor(a, env)
    }

    #[test]
    fn a_cluster_needs_both_tokens_unless_it_is_insecure() {
        fn scheduler(a: &[&str]) -> Result<(), String> {
            super::parse_scheduler(args(a), |_: &str| None).map(|_| ())
        }
        fn executor(a: &[&str]) -> Result<(), String> {
            super::parse_executor(args(a), |_: &str| None).map(|_| ())
        }
        type Parse = fn(&[&str]) -> Result<(), String>;
        let parsers: [(Parse, &[&str]); 2] = [(scheduler, &[]), (executor, &["--scheduler", "h:1"])];
        for (parse, base) in parsers {
            let with = |extra: &[&str]| parse(&[base, extra].concat());
            let e = with(&[]).unwrap_err();
            assert!(
                e.contains("--token TOKEN") && e.contains("is required") && e.contains("--insecure"),
                "{e}"
            );
            let e = with(&["--token", "a"]).unwrap_err();
            assert!(e.contains("--executor-token TOKEN") && e.contains("is required"), "{e}");
            let e = with(&["--token", "a", "--executor-token", "a"]).unwrap_err();
            assert!(e.contains("must differ"), "{e}");
            let e = with(&["--token", "a", "--insecure"]).unwrap_err();
            assert!(e.contains("both"), "{e}");
            assert!(with(&["--token", "a", "--executor-token", "b"]).is_ok());
            assert!(with(&["--insecure"]).is_ok());
        }
        let a = super::parse_scheduler(args(&[]), env).unwrap().unwrap();
        assert_eq!(a.tokens.client.as_deref(), Some("client-tok"));
        assert_eq!(a.tokens.executor.as_deref(), Some("executor-tok"));
    }

    #[test]
    fn scheduler_arguments() {
        let a = parse_scheduler(args(&[])).unwrap().unwrap();
        assert!(a.data.is_empty());
        assert_eq!(a.listen.to_string(), "127.0.0.1:50050");
        assert_eq!(a.executor_timeout, 180);
        let a =
            parse_scheduler(args(&["--listen", "127.0.0.1:0", "--executor-timeout", "5"])).unwrap().unwrap();
        assert_eq!((a.listen.port(), a.executor_timeout), (0, 5));
        assert!(parse_scheduler(args(&["--help"])).unwrap().is_none());
        let e = parse_scheduler(args(&["--executor-timeout", "0"])).unwrap_err();
        assert!(e.contains("positive"), "{e}");
        let e = parse_scheduler(args(&["--listen", "localhost"])).unwrap_err();
        assert!(e.contains("--listen localhost"), "{e}");
        let e = parse_scheduler(args(&["SELECT 1"])).unwrap_err();
        assert!(e.contains("unexpected argument SELECT 1"), "{e}");
        let e = parse_scheduler(args(&["--listen", "0.0.0.0:0", "--token", "t"])).unwrap_err();
        assert!(e.contains("without TLS") && e.contains("--insecure"), "{e}");
        // With TLS, beyond loopback is allowed; the three files go together.
        let tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"];
        let a = parse_scheduler(args(&[&["--listen", "0.0.0.0:0"][..], &tls].concat())).unwrap().unwrap();
        assert_eq!(a.tls.map(|t| t.ca), Some(Some(PathBuf::from("ca.pem"))));
        let e = parse_scheduler(args(&tls[..4])).unwrap_err();
        assert!(e.contains("need --tls-ca"), "{e}");
        let e = parse_executor(args(&[&["--scheduler", "h:1"][..], &tls[2..]].concat())).unwrap_err();
        assert!(e.contains("--tls-ca needs --tls-cert"), "{e}");
        let a =
            parse_executor(args(&[&["--scheduler", "h:1", "--listen", "10.1.2.3:5000"][..], &tls].concat()));
        assert!(a.unwrap().unwrap().tls.is_some());
        let a =
            parse_scheduler(args(&["--listen", "0.0.0.0:0", "--insecure", "--data", "/d", "--data", "/e"]))
                .unwrap()
                .unwrap();
        assert_eq!(a.data, [PathBuf::from("/d"), PathBuf::from("/e")]);
    }

    #[test]
    fn executor_arguments() {
        let e = parse_executor(args(&[])).unwrap_err();
        assert!(e.contains("--scheduler HOST:PORT is required"), "{e}");
        let a = parse_executor(args(&[
            "--scheduler",
            "localhost:7000",
            "--listen",
            "127.0.0.1:0",
            "--slots",
            "2",
            "--work-dir",
            "/tmp/w",
            "--token",
            "tok",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(a.scheduler, ("localhost".to_string(), 7000));
        assert_eq!((a.listen.port(), a.slots, a.tokens.client.as_deref()), (0, 2, Some("tok")));
        assert_eq!(a.work_dir, Some(PathBuf::from("/tmp/w")));
        let a = parse_executor(args(&["--scheduler", "[::1]:7000"])).unwrap().unwrap();
        assert_eq!(a.scheduler.0, "::1");
        for bad in ["7000", "host:", ":7000", "host:0", "host:x"] {
            let e = parse_executor(args(&["--scheduler", bad])).unwrap_err();
            assert!(e.contains("expected HOST:PORT"), "{bad}: {e}");
        }
        let e = parse_executor(args(&["--scheduler", "h:1", "--listen", "0.0.0.0:5000"])).unwrap_err();
        assert!(e.contains("not a wildcard"), "{e}");
        let e = parse_executor(args(&["--scheduler", "h:1", "--listen", "10.1.2.3:5000"])).unwrap_err();
        assert!(e.contains("--insecure"), "{e}");
        assert!(
            parse_executor(args(&["--scheduler", "h:1", "--listen", "10.1.2.3:5000", "--insecure"])).is_ok()
        );
        let e = parse_executor(args(&["--scheduler", "h:1", "--token", "a b"])).unwrap_err();
        assert!(e.contains("character"), "{e}");
        let a = parse_executor(args(&["--scheduler", "h:1"])).unwrap().unwrap();
        assert_eq!(a.tokens.client.as_deref(), Some("client-tok"));
        let e = parse_executor(args(&["--scheduler", "h:1", "--slots", "0"])).unwrap_err();
        assert!(e.contains("positive"), "{e}");
    }
}

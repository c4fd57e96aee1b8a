//! Who may call `dlframe scheduler` and `dlframe executor`: clients with the cluster token, and
//! executors with a token of their own, so that a client cannot ask for work or report results.
//!
//! Ballista's own outgoing channels (executor to scheduler, executor to executor, client to
//! executor) can only be customised through their tonic `Endpoint`, which sets no header but
//! the user agent. So a token travels either as `authorization: Bearer TOKEN` (what a client
//! sends to the scheduler) or as a user agent whose first word is `dlframe-token/TOKEN` (what
//! Ballista's channels send). The same hook puts those channels on TLS when the cluster has it
//! (see `endpoint_hook`); without TLS, tokens cross the network in clear text, so beyond
//! loopback that takes `--insecure` (see docs/serve.md).

use std::sync::Arc;

use ballista_core::extension::EndpointOverrideFn;
use ballista_core::utils::{GrpcClientConfig, create_grpc_client_endpoint};
use tonic::service::Interceptor;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::flight::auth::{bearer, same_bytes};

/// The environment variable that sets the cluster token when `--token` is not given.
pub(crate) const CLUSTER_TOKEN_ENV: &str = "DLFRAME_CLUSTER_TOKEN";

/// The environment variable that sets the executors' token when `--executor-token` is not given.
pub(crate) const EXECUTOR_TOKEN_ENV: &str = "DLFRAME_EXECUTOR_TOKEN";

/// The user agent's first word that carries the token.
const AGENT_PREFIX: &[u8] = b"dlframe-token/";

/// Who a call comes from, as its token says; put into the call's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A client: it runs jobs and reads their results.
    Client,
    /// An executor: it asks for work, reports it, and reads other executors' results.
    Executor,
    /// Any caller of an open cluster (`--insecure`, no tokens).
    Open,
}

impl Role {
    /// Refuses a call that only `want` may make.
    pub(crate) fn need<T>(request: &Request<T>, want: Role) -> Result<(), Status> {
        match request.extensions().get::<Role>() {
            Some(Role::Open) => Ok(()),
            Some(r) if *r == want => Ok(()),
            _ => Err(Status::permission_denied(match want {
                Role::Executor => {
                    "dlframe cluster: only an executor, with the executors' token, makes this call"
                }
                _ => "dlframe cluster: only a client, with the cluster token, makes this call",
            })),
        }
    }
}

/// The tokens a cluster's processes check: the clients' and the executors'. Both or neither.
#[derive(Clone)]
pub(crate) struct ClusterAuth {
    pub(crate) client: Option<Arc<str>>,
    pub(crate) executor: Option<Arc<str>>,
}

impl Interceptor for ClusterAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let role = if self.client.is_none() && self.executor.is_none() {
            Role::Open
        } else {
            let md = request.metadata();
            let bearer = bearer(md, "dlframe cluster")?;
            let agent = md
                .get("user-agent")
                .and_then(|v| v.as_bytes().split(|b| *b == b' ').next())
                .and_then(|w| w.strip_prefix(AGENT_PREFIX));
            let given = || [bearer, agent].into_iter().flatten();
            let is = |token: &Option<Arc<str>>| {
                token.as_ref().is_some_and(|t| given().any(|g| same_bytes(g, t.as_bytes())))
            };
            if is(&self.executor) {
                Role::Executor
            } else if is(&self.client) {
                Role::Client
            } else {
                return Err(Status::unauthenticated("dlframe cluster: this process needs the cluster token"));
            }
        };
        request.extensions_mut().insert(role);
        Ok(request)
    }
}

/// An endpoint hook for every channel Ballista opens with it: with `tls`, the channel goes over
/// TLS (Ballista names the scheduler `http://`, which tonic never encrypts, so the endpoint is
/// made again as `https://` with Ballista's default channel settings); with `token`, the token
/// goes into its user agent. `None` when there is neither.
pub(crate) fn endpoint_hook(
    token: Option<Arc<str>>,
    tls: Option<ClientTlsConfig>,
) -> Option<EndpointOverrideFn> {
    if token.is_none() && tls.is_none() {
        return None;
    }
    Some(Arc::new(move |endpoint: Endpoint| -> Result<Endpoint, Box<dyn std::error::Error + Send + Sync>> {
        let mut endpoint = endpoint;
        if let Some(tls) = &tls {
            if endpoint.uri().scheme_str() != Some("https") {
                let authority = endpoint.uri().authority().ok_or("an endpoint without a host")?.as_str();
                endpoint = create_grpc_client_endpoint(
                    format!("https://{authority}"),
                    Some(&GrpcClientConfig::default()),
                )?;
            }
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        if let Some(token) = &token {
            endpoint = endpoint.user_agent(format!("dlframe-token/{token}"))?;
        }
        Ok(endpoint)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(headers: &[(&'static str, &str)]) -> Request<()> {
        let mut r = Request::new(());
        for (k, v) in headers {
            r.metadata_mut().append(*k, v.parse().unwrap());
        }
        r
    }

    fn auth(client: &str, executor: &str) -> ClusterAuth {
        ClusterAuth { client: Some(Arc::from(client)), executor: Some(Arc::from(executor)) }
    }

    fn role(auth: &mut ClusterAuth, headers: &[(&'static str, &str)]) -> Result<Role, tonic::Code> {
        auth.call(with(headers)).map(|r| *r.extensions().get::<Role>().unwrap()).map_err(|e| e.code())
    }

    #[test]
    fn a_token_comes_as_a_bearer_header_or_in_the_user_agent_and_names_the_role() {
        let mut a = auth("tok", "exe");
        assert_eq!(role(&mut a, &[("authorization", "Bearer tok")]), Ok(Role::Client));
        assert_eq!(role(&mut a, &[("user-agent", "dlframe-token/tok tonic/0.14.5")]), Ok(Role::Client));
        assert_eq!(role(&mut a, &[("user-agent", "dlframe-token/exe tonic/0.14.5")]), Ok(Role::Executor));
        assert_eq!(role(&mut a, &[("authorization", "Bearer exe")]), Ok(Role::Executor));
        for bad in [
            &[][..],
            &[("authorization", "Bearer to")],
            &[("user-agent", "tonic/0.14.5 dlframe-token/tok")],
            &[("user-agent", "dlframe-token/tokk tonic/0.14.5")],
            &[("authorization", "Bearer tok"), ("authorization", "Bearer tok")],
        ] {
            assert_eq!(role(&mut a, bad), Err(tonic::Code::Unauthenticated), "{bad:?}");
        }
        let mut open = ClusterAuth { client: None, executor: None };
        assert_eq!(role(&mut open, &[]), Ok(Role::Open));
    }

    #[test]
    fn each_role_makes_only_its_own_calls() {
        let with_role = |r: Role| {
            let mut q = Request::new(());
            q.extensions_mut().insert(r);
            q
        };
        assert!(Role::need(&with_role(Role::Executor), Role::Executor).is_ok());
        assert!(Role::need(&with_role(Role::Client), Role::Client).is_ok());
        assert!(Role::need(&with_role(Role::Open), Role::Executor).is_ok());
        let e = Role::need(&with_role(Role::Client), Role::Executor).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(Role::need(&with_role(Role::Executor), Role::Client).is_err());
        assert!(Role::need(&Request::new(()), Role::Client).is_err());
    }

    #[test]
    fn the_endpoint_hook_sets_the_user_agent_and_moves_to_https_with_tls() {
        assert!(endpoint_hook(None, None).is_none());
        let hook = endpoint_hook(Some(Arc::from("tok")), None).unwrap();
        let e = hook(Endpoint::from_static("http://127.0.0.1:1")).unwrap();
        assert_eq!(e.uri().scheme_str(), Some("http"));
        let hook = endpoint_hook(None, Some(ClientTlsConfig::new())).unwrap();
        let e = hook(Endpoint::from_static("http://127.0.0.1:1")).unwrap();
        assert_eq!(e.uri().to_string(), "https://127.0.0.1:1/");
    }
}

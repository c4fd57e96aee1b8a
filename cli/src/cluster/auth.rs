//! The cluster token of `dlframe scheduler` and `dlframe executor`: every call to either
//! process must carry it, and every call they make carries it.
//!
//! Ballista's own outgoing channels (executor to scheduler, executor to executor, client to
//! executor) can only be customised through their tonic `Endpoint`, which sets no header but
//! the user agent. So the token travels either as `authorization: Bearer TOKEN` (what a client
//! sends to the scheduler) or as a user agent whose first word is `dlframe-token/TOKEN` (what
//! Ballista's channels send). The cluster has no TLS yet, so the token crosses the network in
//! clear text: beyond loopback that takes `--insecure` (see docs/serve.md).

use std::sync::Arc;

use ballista_core::extension::EndpointOverrideFn;
use tonic::service::Interceptor;
use tonic::transport::Endpoint;
use tonic::{Request, Status};

use crate::flight::auth::{bearer, same_bytes};

/// The environment variable that sets the cluster token when `--token` is not given.
pub(crate) const CLUSTER_TOKEN_ENV: &str = "DLFRAME_CLUSTER_TOKEN";

/// The user agent's first word that carries the token.
const AGENT_PREFIX: &[u8] = b"dlframe-token/";

/// Refuses every call without the cluster token (when one is set).
#[derive(Clone)]
pub(crate) struct ClusterAuth(pub(crate) Option<Arc<str>>);

impl Interceptor for ClusterAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else { return Ok(request) };
        let md = request.metadata();
        let bearer = bearer(md, "dlframe cluster")?;
        let agent = md
            .get("user-agent")
            .and_then(|v| v.as_bytes().split(|b| *b == b' ').next())
            .and_then(|w| w.strip_prefix(AGENT_PREFIX));
        if [bearer, agent].into_iter().flatten().any(|t| same_bytes(t, token.as_bytes())) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("dlframe cluster: this process needs the cluster token"))
        }
    }
}

/// An endpoint hook that puts the token into the user agent of every channel Ballista opens
/// with it.
pub(crate) fn token_endpoint(token: Arc<str>) -> EndpointOverrideFn {
    Arc::new(move |endpoint: Endpoint| -> Result<Endpoint, Box<dyn std::error::Error + Send + Sync>> {
        Ok(endpoint.user_agent(format!("dlframe-token/{token}"))?)
    })
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

    #[test]
    fn the_token_comes_as_a_bearer_header_or_in_the_user_agent() {
        let mut auth = ClusterAuth(Some(Arc::from("tok")));
        assert!(auth.call(with(&[("authorization", "Bearer tok")])).is_ok());
        assert!(auth.call(with(&[("user-agent", "dlframe-token/tok tonic/0.14.5")])).is_ok());
        for bad in [
            &[][..],
            &[("authorization", "Bearer to")],
            &[("user-agent", "tonic/0.14.5 dlframe-token/tok")],
            &[("user-agent", "dlframe-token/tokk tonic/0.14.5")],
            &[("authorization", "Bearer tok"), ("authorization", "Bearer tok")],
        ] {
            assert_eq!(auth.call(with(bad)).unwrap_err().code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
        assert!(ClusterAuth(None).call(with(&[])).is_ok());
    }

    #[test]
    fn the_endpoint_hook_sets_the_user_agent() {
        let hook = token_endpoint(Arc::from("tok"));
        assert!(hook(Endpoint::from_static("http://127.0.0.1:1")).is_ok());
    }
}

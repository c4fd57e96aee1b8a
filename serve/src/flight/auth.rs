//! Who may call `dlframe serve`: the bearer token, checked on every call in constant time, and
//! the token's own rules at start (no empty token, no whitespace or control characters, which
//! no client could send in a header).

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::transport::server::TlsConnectInfo;
use tonic::{Request, Status};

use super::conn::{Caller, ConnInfo};

/// Checks a token given at start: refuses an empty one and one with whitespace or control
/// characters.
pub(crate) fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("an empty token would let anyone in".into());
    }
    if let Some(c) = token.chars().find(|c| c.is_whitespace() || c.is_control() || !c.is_ascii()) {
        return Err(format!(
            "the token has the character {c:?}: a token is printable ASCII without spaces, as an HTTP \
             header carries it"
        ));
    }
    Ok(())
}

/// Refuses every call that lacks exactly one `authorization: Bearer <token>`, when a token is
/// set, and marks the connection authenticated once a call passes.
#[derive(Clone)]
pub(crate) struct Bearer(pub Option<Arc<str>>);

impl Interceptor for Bearer {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            let given = bearer(request.metadata(), "dlframe serve")?
                .ok_or_else(|| Status::unauthenticated("dlframe serve: this server needs a bearer token"))?;
            if !same_bytes(given, token.as_bytes()) {
                return Err(Status::unauthenticated("dlframe serve: wrong bearer token"));
            }
        }
        if let Some(conn) = conn_info(request.extensions()) {
            conn.state.authenticate();
        }
        Ok(request)
    }
}

/// The token of the one `authorization` header of a call: what follows `Bearer ` (empty for
/// another scheme), or None without the header. Several headers are refused, so no check can
/// read one and a proxy another; `who` names the service in the refusal.
pub(crate) fn bearer<'a>(
    metadata: &'a tonic::metadata::MetadataMap,
    who: &str,
) -> Result<Option<&'a [u8]>, Status> {
    let mut given = metadata.get_all("authorization").iter();
    let first = given.next();
    if given.next().is_some() {
        return Err(Status::unauthenticated(format!("{who}: send one authorization header, not several")));
    }
    Ok(first.map(|v| v.as_bytes().strip_prefix(b"Bearer ").unwrap_or_default()))
}

/// The connection a call came on, through TLS or not, from the call's extensions.
pub(crate) fn conn_info(extensions: &tonic::Extensions) -> Option<&ConnInfo> {
    extensions.get::<ConnInfo>().or_else(|| extensions.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
}

/// Compares two byte strings in time that depends on their lengths only, not on where they differ.
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The caller of a call: its connection's id (None only where no connection info is kept).
pub(crate) fn caller<T>(request: &Request<T>) -> Option<Caller> {
    conn_info(request.extensions()).map(|c| c.caller)
}

/// The peer of a call, from its connection.
pub(crate) fn peer<T>(request: &Request<T>) -> Option<std::net::SocketAddr> {
    conn_info(request.extensions()).and_then(|c| c.tcp.remote_addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(headers: &[&str]) -> Request<()> {
        let mut r = Request::new(());
        for h in headers {
            r.metadata_mut().append("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn the_bearer_check() {
        let mut open = Bearer(None);
        assert!(open.call(with(&[])).is_ok());
        let mut closed = Bearer(Some(Arc::from("s3cret")));
        assert!(closed.call(with(&["Bearer s3cret"])).is_ok());
        for bad in [
            &[][..],
            &["Bearer s3cre"],
            &["Bearer s3cret2"],
            &["s3cret"],
            &["Basic s3cret"],
            &["Bearer s3cret", "Bearer s3cret"],
            &["Bearer s3cret", "Bearer wrong"],
            &["Bearer wrong", "Bearer s3cret"],
        ] {
            let e = closed.call(with(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn tokens_that_no_header_carries_are_refused() {
        assert!(check_token("t0k-en_1.2").is_ok());
        for bad in ["", "tok\n", "tok en", " tok", "tok\t", "tök"] {
            assert!(check_token(bad).is_err(), "{bad:?}");
        }
    }
}

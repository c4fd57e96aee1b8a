//! The calls open on each connection of `dlframe serve`, counted by a layer around the whole
//! service from a call's start until its response's body ends or is dropped. A connection with
//! a call open (a query streaming, or waiting for its slot) never gives way to a new one
//! (`conn.rs`); one without may.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http;
use tower::{Layer, Service};

use super::auth::conn_info;
use super::conn::OpenCall;

/// Wraps a service so that each call counts as open on its connection.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CountCalls;

impl<S> Layer<S> for CountCalls {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted(inner)
    }
}

/// A service whose calls are counted (see [`CountCalls`]).
#[derive(Debug, Clone)]
pub(crate) struct Counted<S>(S);

impl<S, B, R> Service<http::Request<B>> for Counted<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<CountedBody<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let open = conn_info(request.extensions()).map(|c| c.state.open_call());
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| CountedBody { body: Box::pin(body), _open: open }))
        })
    }
}

/// A response body that keeps its call counted as open until it ends or is dropped.
pub(crate) struct CountedBody<R> {
    body: Pin<Box<R>>,
    _open: Option<OpenCall>,
}

impl<R: Body> Body for CountedBody<R> {
    type Data = R::Data;
    type Error = R::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = self.body.as_mut().poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // The call has ended, though hyper may keep the body a while.
            self._open = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

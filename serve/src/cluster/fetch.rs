//! The executor's Flight server, which serves task results to the other executors and to the
//! client: Ballista's own service behind the cluster token, with the job id of every fetch
//! checked first.
//!
//! Ballista 55 builds the path of a fetched file from the work directory and the job id the
//! caller sends, without checking the id: `../outside` or an absolute id reads `data.arrow`
//! files outside the work directory. A job id here must be what Ballista makes (letters,
//! digits, `-` and `_`), so the path stays inside. Only the fetch actions are served; the
//! handshake (whose token nothing checks) and the calls Ballista leaves unimplemented are
//! refused. Ballista's errors name the work directory's files and dump the system's error in
//! Rust's debug form: the caller reads which result failed and whether it exists, and the
//! executor's log keeps Ballista's words.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo,
    SchemaResult, Ticket,
};
use ballista_core::error::BallistaError;
use ballista_core::serde::decode_protobuf;
use ballista_core::serde::scheduler::Action as BallistaAction;
use ballista_core::utils::{GrpcServerConfig, create_grpc_server};
use ballista_executor::ArrowFlightServerProvider;
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::shutdown::Shutdown;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::ServerTlsConfig;
use tonic::{Request, Response, Status, Streaming};

use futures::StreamExt;

use super::auth::ClusterAuth;
use crate::service::say;

type Inner = BallistaFlightService;

/// Ballista's Flight service with every fetch's job id checked.
#[derive(Clone)]
struct CheckedFlight(Inner);

/// Refuses a fetch whose job id could name a path: only letters, digits, `-` and `_`. Returns
/// what the fetch names, for messages.
fn check_fetch(bytes: &[u8]) -> Result<String, Status> {
    let action =
        decode_protobuf(bytes).map_err(|e| Status::invalid_argument(format!("a malformed fetch: {e}")))?;
    let BallistaAction::FetchPartition { job_id, stage_id, partition_id, .. } = &action;
    let id = job_id.as_str();
    let plain = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        Ok(format!("job {id}, stage {stage_id}, partition {partition_id}"))
    } else {
        Err(Status::invalid_argument(format!("job id {id:?}: a job id is letters, digits, '-' and '_'")))
    }
}

/// Ballista's error `e` in fetching `what`, as the caller reads it: with its code, without the
/// work directory's paths or the system's error in debug form, which go to the log.
fn scrub(what: &str, e: Status) -> Status {
    say(&format!("dlframe executor: the fetch of {what} failed: {}", e.message()));
    if e.message().contains("kind: NotFound") {
        return Status::not_found(format!("this executor holds no result of {what}"));
    }
    Status::new(e.code(), format!("this executor could not read the result of {what} (its log says why)"))
}

/// `stream`, with each error scrubbed as by [`scrub`].
fn scrubbed<T: Send + 'static>(
    what: String,
    stream: std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>> {
    Box::pin(stream.map(move |item| item.map_err(|e| scrub(&what, e))))
}

#[tonic::async_trait]
impl FlightService for CheckedFlight {
    type HandshakeStream = <Inner as FlightService>::HandshakeStream;
    type ListFlightsStream = <Inner as FlightService>::ListFlightsStream;
    type DoGetStream = <Inner as FlightService>::DoGetStream;
    type DoPutStream = <Inner as FlightService>::DoPutStream;
    type DoActionStream = <Inner as FlightService>::DoActionStream;
    type ListActionsStream = <Inner as FlightService>::ListActionsStream;
    type DoExchangeStream = <Inner as FlightService>::DoExchangeStream;

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let what = check_fetch(&request.get_ref().ticket)?;
        let answer = self.0.do_get(request).await.map_err(|e| scrub(&what, e))?;
        Ok(answer.map(|stream| scrubbed(what, stream)))
    }

    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        if request.get_ref().r#type != "IO_BLOCK_TRANSPORT" {
            return Err(Status::unimplemented(format!("action {:?}", request.get_ref().r#type)));
        }
        let what = check_fetch(&request.get_ref().body)?;
        let answer = self.0.do_action(request).await.map_err(|e| scrub(&what, e))?;
        Ok(answer.map(|stream| scrubbed(what, stream)))
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.0.list_actions(request).await
    }

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("handshake: send the cluster token with every call"))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("list_flights"))
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("get_flight_info"))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("get_schema"))
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        Err(Status::unimplemented("do_put"))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("do_exchange"))
    }
}

/// The executor's Flight server: [`CheckedFlight`] behind `auth`, over TLS with `tls`, with Ballista's message
/// size limits (`max_message`, in bytes, both ways).
pub(crate) fn flight_server(
    auth: ClusterAuth,
    tls: Option<ServerTlsConfig>,
    max_message: usize,
) -> Arc<ArrowFlightServerProvider> {
    Arc::new(move |work_dir: String, addr: SocketAddr, mut shutdown: Shutdown, grpc: GrpcServerConfig| {
        let (auth, tls) = (auth.clone(), tls.clone());
        tokio::spawn(async move {
            let service = FlightServiceServer::new(CheckedFlight(BallistaFlightService::new(work_dir)))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message);
            let mut server = create_grpc_server(&grpc);
            if let Some(tls) = tls {
                server = server.tls_config(tls).map_err(BallistaError::TonicError)?;
            }
            server
                .add_service(InterceptedService::new(service, auth))
                .serve_with_shutdown(addr, shutdown.recv())
                .await
                .map_err(BallistaError::TonicError)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballista_core::serde::protobuf;
    use prost::Message;

    fn fetch(job_id: &str) -> Vec<u8> {
        let action = protobuf::Action {
            action_type: Some(protobuf::action::ActionType::FetchPartition(protobuf::FetchPartition {
                job_id: job_id.into(),
                stage_id: 1,
                partition_id: 0,
                host: "127.0.0.1".into(),
                port: 1,
                ..Default::default()
            })),
            settings: vec![],
        };
        action.encode_to_vec()
    }

    #[test]
    fn job_ids_that_could_name_a_path_are_refused() {
        assert_eq!(check_fetch(&fetch("aB3xK9_q-1")).unwrap(), "job aB3xK9_q-1, stage 1, partition 0");
        for bad in ["../outside", "/etc", "a/b", ".", "", "..", "a b"] {
            let e = check_fetch(&fetch(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        assert!(check_fetch(b"\xff\xff").is_err());
    }

    #[test]
    fn ballista_errors_keep_their_code_and_lose_their_paths() {
        let missing = Status::internal(
            "Failed to open partition file at \"/tmp/w/j1/1/0/data.arrow\": Os { code: 2, kind: NotFound, message: \"No such file or directory\" }",
        );
        let e = scrub("job j1, stage 1, partition 0", missing);
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert_eq!(e.message(), "this executor holds no result of job j1, stage 1, partition 0");
        let other = scrub("job j1, stage 1, partition 0", Status::out_of_range("seek \"/tmp/w/j1\": bad"));
        assert_eq!(other.code(), tonic::Code::OutOfRange);
        assert!(!other.message().contains("/tmp/w"), "{}", other.message());
    }
}

//! A `dlframe serve` process on `127.0.0.1:0` and a gRPC channel to it, for the Flight SQL
//! tests; the process is killed on drop unless it was stopped.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_flight::FlightInfo;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::compute::concat_batches;
use futures::TryStreamExt;
use tonic::transport::Channel;

use super::process::{LIMIT, Process};

/// A `dlframe serve` process and its address.
pub struct Server {
    pub process: Process,
    pub addr: String,
}

impl Server {
    /// Starts `dlframe serve --listen 127.0.0.1:0 ARGS...` and waits for its address.
    pub fn start(args: &[&str]) -> Server {
        let mut process = Process::start(&[&["serve", "--listen", "127.0.0.1:0"], args].concat());
        let addr = process.address("listening on ");
        Server { process, addr }
    }

    /// A plain-text channel to the server, every call bounded by [`LIMIT`].
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(LIMIT)
            .timeout(LIMIT)
            .connect()
            .await
            .unwrap()
    }
}

/// The endpoints of `info`, read with arrow-flight's Flight SQL client, as one batch.
pub async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<RecordBatch, String> {
    let schema = Arc::new(info.clone().try_decode_schema().map_err(|e| e.to_string())?);
    let mut batches = vec![];
    for endpoint in info.endpoint {
        let stream = client.do_get(endpoint.ticket.expect("a ticket")).await.map_err(|e| e.to_string())?;
        batches.extend(stream.try_collect::<Vec<_>>().await.map_err(|e| e.to_string())?);
    }
    Ok(concat_batches(&schema, &batches).unwrap())
}

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

    /// As [`Server::start`], under an address-space limit of `bytes` (`Process::start_limited`).
    pub fn start_limited(args: &[&str], bytes: u64) -> Option<Server> {
        let mut process =
            Process::start_limited(&[&["serve", "--listen", "127.0.0.1:0"], args].concat(), bytes)?;
        let addr = process.address("listening on ");
        Some(Server { process, addr })
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

/// Runs `sql` as a statement and reads its result without keeping it: the number of rows, or
/// the error's text.
pub async fn count_rows(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<usize, String> {
    let info = client.execute(sql.to_string(), None).await.map_err(|e| e.to_string())?;
    rows_of(client, info).await
}

/// The rows of every endpoint of `info`, read and dropped.
pub async fn rows_of(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<usize, String> {
    let mut rows = 0;
    for endpoint in info.endpoint {
        let mut stream =
            client.do_get(endpoint.ticket.expect("a ticket")).await.map_err(|e| e.to_string())?;
        while let Some(batch) = stream.try_next().await.map_err(|e| e.to_string())? {
            rows += batch.num_rows();
        }
    }
    Ok(rows)
}

/// Runs `sql` as a statement: the result, or the error's text.
pub async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<RecordBatch, String> {
    let call = async {
        let info = client.execute(sql.to_string(), None).await.map_err(|e| e.to_string())?;
        fetch(client, info).await
    };
    tokio::time::timeout(LIMIT, call).await.expect("the call finished in time")
}

/// A Substrait plan of `sql`, made by DataFusion in `ctx`, encoded.
pub async fn substrait_plan(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Result<Vec<u8>, String> {
    use prost::Message;
    // Not optimized here: that would fold the constants, and build whatever they make.
    let plan = ctx.sql(sql).await.map_err(|e| e.to_string())?.into_unoptimized_plan();
    let plan = datafusion_substrait::logical_plan::producer::to_substrait_plan(&plan, &ctx.state())
        .map_err(|e| e.to_string())?;
    Ok(plan.encode_to_vec())
}

/// Runs an encoded Substrait plan, planned through `raw` and read through `client`: its
/// result's row count, or the error's text.
pub async fn substrait_call(
    raw: &mut arrow_flight::flight_service_client::FlightServiceClient<Channel>,
    client: &mut FlightSqlServiceClient<Channel>,
    plan: Vec<u8>,
) -> Result<usize, String> {
    use arrow_flight::FlightDescriptor;
    use arrow_flight::sql::{CommandStatementSubstraitPlan, ProstMessageExt, SubstraitPlan};
    use prost::Message;
    let cmd = CommandStatementSubstraitPlan {
        plan: Some(SubstraitPlan { plan: plan.into(), version: "0.63".into() }),
        transaction_id: None,
    };
    let descriptor = FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec());
    let info = raw.get_flight_info(descriptor).await.map_err(|e| e.to_string())?.into_inner();
    rows_of(client, info).await
}

//! `dlframe serve` as a real process on an ephemeral loopback port, driven by arrow-flight's
//! Flight SQL client: tensor results equal to a local DataFusion run, errors with the local
//! message and a server that keeps serving, the bearer token, and a clean stop on SIGTERM.
//! Every wait is bounded, and the server is killed if a test fails before stopping it.

mod common;

use std::sync::Arc;

use arrow_array::RecordBatch;

use arrow_flight::FlightDescriptor;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandStatementQuery, ProstMessageExt};
use common::process::LIMIT;
use common::served::{Server, fetch};
use common::{TempDir, local, write_parquet};
use datafusion::arrow::compute::concat_batches;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use tonic::transport::Channel;

impl Server {
    async fn client(&self, token: Option<&str>) -> Client {
        Client { inner: FlightServiceClient::new(self.channel().await), token: token.map(String::from) }
    }

    fn sigterm(&self) {
        self.process.signal("TERM");
    }

    fn wait_exit(mut self) -> std::process::ExitStatus {
        self.process.wait_exit()
    }

    fn line_with(&mut self, text: &str) -> String {
        self.process.line_with(text)
    }
}

/// A Flight client (gRPC, the Flight SQL commands by hand) that sends `token` as a bearer
/// token, if any.
struct Client {
    inner: FlightServiceClient<Channel>,
    token: Option<String>,
}

impl Client {
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    }

    /// Runs `sql` (GetFlightInfo, then DoGet on each endpoint) as one batch, or the server's
    /// Status as it came.
    async fn query(&mut self, sql: &str) -> Result<RecordBatch, tonic::Status> {
        let call = async {
            let command = CommandStatementQuery { query: sql.to_string(), transaction_id: None };
            let descriptor = FlightDescriptor::new_cmd(command.as_any().encode_to_vec());
            let info = self.inner.get_flight_info(self.request(descriptor)).await?.into_inner();
            let schema = Arc::new(info.clone().try_decode_schema().unwrap());
            let mut batches = vec![];
            for endpoint in info.endpoint {
                let ticket = endpoint.ticket.expect("a ticket");
                let data = self.inner.do_get(self.request(ticket)).await?.into_inner();
                let mut stream =
                    FlightRecordBatchStream::new_from_flight_data(data.map_err(FlightError::from));
                while let Some(batch) = stream.next().await {
                    batches.push(batch.map_err(|e| match e {
                        FlightError::Tonic(status) => *status,
                        other => tonic::Status::internal(other.to_string()),
                    })?);
                }
            }
            Ok(concat_batches(&schema, &batches).unwrap())
        };
        tokio::time::timeout(LIMIT, call).await.expect("the call finished in time")
    }
}

/// A table of two Parquet files, 0..3000 and 3000..5000, in one directory.
fn two_files() -> TempDir {
    let dir = TempDir::new("serve");
    std::fs::create_dir(dir.join("t")).unwrap();
    write_parquet(&dir.join("t/part-0.parquet"), 0..3000, 1000);
    write_parquet(&dir.join("t/part-1.parquet"), 3000..5000, 1000);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensor_results_equal_a_local_run_and_errors_keep_the_server_up() {
    let dir = two_files();
    let table = dir.join("t");
    let spec = format!("t={}", table.display());
    let server = Server::start(&["--table", &spec]);
    let mut client = server.client(None).await;

    let sql = "SELECT to_tensor_fill(0, id, x, CASE WHEN id % 7 = 0 THEN NULL ELSE x END) AS f \
               FROM t ORDER BY id";
    let got = client.query(sql).await.unwrap();
    let want = local(&table, sql).await.unwrap();
    assert_eq!(got.num_rows(), 5000);
    assert_eq!(got.schema().field(0).extension_type_name(), Some("arrow.fixed_shape_tensor"));
    assert_eq!(got.schema().field(0).metadata(), want.schema().field(0).metadata());
    assert_eq!(
        got.column(0).as_ref(),
        want.column(0).as_ref(),
        "the served tensor differs from the local one"
    );

    // Each error reaches the client with the local message, and the server keeps serving.
    for bad in [
        "SELEC to_tensor(x) FROM t",
        "SELECT to_tensor(x) FROM nope",
        "SELECT to_tensor(id, CASE WHEN id = 4321 THEN NULL ELSE x END) FROM t",
        "SELECT to_tensor(CAST(x AS VARCHAR)) FROM t",
    ] {
        let local_err = local(&table, bad).await.expect_err(bad);
        let remote_err = client.query(bad).await.expect_err(bad);
        // The server sends DataFusion's root error as Display text: the local message as
        // written, with no Rust debug form around it (a parse error's is sqlparser's text,
        // where DataFusion's own Display shows `ParserError("...")`).
        let message = match local_err.find_root() {
            datafusion::error::DataFusionError::SQL(p, _) => format!("SQL error: {p}"),
            root => root.to_string(),
        };
        assert_eq!(remote_err.message(), message, "{bad}");
        assert!(!remote_err.message().contains("Error(\""), "{bad}: {}", remote_err.message());
    }
    let after = client.query("SELECT count(*) AS n FROM t").await.unwrap();
    assert_eq!(after.num_rows(), 1);

    server.sigterm();
    let status = server.wait_exit();
    assert!(status.success(), "dlframe serve exited with {status} on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrow_flights_flight_sql_client_runs_statements_and_prepared_statements() {
    let dir = two_files();
    let table = dir.join("t");
    let spec = format!("t={}", table.display());
    let server = Server::start(&["--table", &spec, "--token", "s3cret"]);
    let sql =
        "SELECT to_tensor_fill(-1, x, CASE WHEN id % 5 = 0 THEN NULL ELSE id END) AS f FROM t ORDER BY id";
    let want = local(&table, sql).await.unwrap();

    let mut client = FlightSqlServiceClient::new(server.channel().await);
    let refused = client.execute(sql.to_string(), None).await.expect_err("no token");
    assert!(refused.to_string().contains("bearer token"), "{refused}");
    client.set_token("s3cret".to_string());

    let call = async {
        // A statement, as a SQL client sends it.
        let info = client.execute(sql.to_string(), None).await.unwrap();
        let statement = fetch(&mut client, info).await.unwrap();
        // A prepared statement, as ADBC and JDBC send it.
        let mut prepared = client.prepare(sql.to_string(), None).await.unwrap();
        let info = prepared.execute().await.unwrap();
        let prepared_result = fetch(&mut client, info).await.unwrap();
        prepared.close().await.unwrap();
        // An error, with the local message.
        let bad = "SELECT to_tensor(id, CASE WHEN id = 4321 THEN NULL ELSE x END) FROM t";
        let err = match client.execute(bad.to_string(), None).await {
            Err(e) => e.to_string(),
            Ok(info) => fetch(&mut client, info).await.expect_err(bad),
        };
        (statement, prepared_result, err)
    };
    let (statement, prepared, err) = tokio::time::timeout(LIMIT, call).await.expect("in time");
    for got in [&statement, &prepared] {
        assert_eq!(got.schema().field(0).metadata(), want.schema().field(0).metadata());
        assert_eq!(
            got.column(0).as_ref(),
            want.column(0).as_ref(),
            "the served tensor differs from the local one"
        );
    }
    assert!(err.contains("null(s); fill them in the same pass"), "{err}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_required_once_set() {
    let dir = two_files();
    let spec = format!("t={}", dir.join("t").display());
    let server = Server::start(&["--table", &spec, "--token", "s3cret"]);
    let sql = "SELECT to_tensor(id, x) AS f FROM t";
    for token in [None, Some("wrong"), Some("s3cre")] {
        let err = server.client(token).await.query(sql).await.expect_err("refused");
        assert!(err.message().contains("bearer token"), "{token:?}: {}", err.message());
    }
    let ok = server.client(Some("s3cret")).await.query(sql).await.unwrap();
    assert_eq!(ok.num_rows(), 5000);
    drop(server); // killed, not stopped: the next test checks the stop
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_it_with_a_client_connected() {
    let mut server = Server::start(&[]);
    let mut client = server.client(None).await;
    let one = client.query("SELECT tensor_ndim(to_tensor(1.5, 2.5)) AS n").await.unwrap();
    assert_eq!(one.num_rows(), 1);
    server.sigterm();
    server.line_with("stopped");
    let status = server.wait_exit();
    assert!(status.success(), "{status}");
    drop(client);
}

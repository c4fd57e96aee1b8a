//! dlframe's functions on Apache Ballista: an in-process (standalone) cluster, and a cluster of
//! real processes on loopback ports (`dlframe scheduler` and two `dlframe executor`s) that a
//! Ballista client reaches as any user would. Results are compared value for value with a local
//! DataFusion run over the same files; the executors' work directories show that both ran tasks;
//! and an executor killed in the middle of a query gives the client an error or the right
//! result, within a bounded time. The cluster checks its token on every call, refuses plans
//! that write or read outside its data directory, and fetches by well-formed job ids only.
//! Every process is killed when its test ends.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use common::process::{LIMIT, Process};
use common::{TempDir, certificate_files, collect_one, local, register_table, write_parquet};
use datafusion::execution::{FunctionRegistry, SessionStateBuilder};
use datafusion::prelude::{SessionConfig, SessionContext};
use tonic::transport::{Certificate, ClientTlsConfig};

/// Files of `rows` rows each, in `dir/t`, read by every process of the cluster (one machine).
fn table(dir: &TempDir, files: i64, rows: i64) -> PathBuf {
    let t = dir.join("t");
    std::fs::create_dir(&t).unwrap();
    for f in 0..files {
        write_parquet(&t.join(format!("part-{f:02}.parquet")), f * rows..(f + 1) * rows, 4096);
    }
    t
}

/// The cluster (clients') token of the process tests.
const TOKEN: &str = "cluster-s3cret";

/// The executors' token of the process tests.
const EXECUTOR_TOKEN: &str = "executor-s3cret";

/// A session configuration that splits a scan of `files` files into one partition per file,
/// whatever the machine's core count.
fn config(files: usize) -> SessionConfig {
    SessionConfig::new().with_target_partitions(files)
}

/// [`config`] for a client of a cluster with `token`: the header to the scheduler, and the
/// user agent on the channels Ballista opens to the executors. With `ca` (a PEM CA), every
/// channel goes over TLS and trusts that CA: Ballista names the scheduler `http://`, so the
/// endpoint is made again as `https://`, as docs/serve.md shows.
fn client_config(files: usize, token: Option<&str>, ca: Option<&str>) -> SessionConfig {
    let config =
        SessionConfig::new_with_ballista().with_target_partitions(files).with_ballista_use_tls(ca.is_some());
    let Some(token) = token else { return config };
    let agent = format!("dlframe-token/{token}");
    let tls = ca.map(|ca| ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)));
    let endpoint: ballista_core::extension::EndpointOverrideFn =
        Arc::new(move |e: tonic::transport::Endpoint| {
            let mut e = e;
            if let Some(tls) = &tls {
                if e.uri().scheme_str() == Some("http") {
                    let at = e.uri().authority().expect("a host").to_string();
                    e = tonic::transport::Endpoint::from_shared(format!("https://{at}"))?;
                }
                e = e.tls_config(tls.clone())?;
            }
            Ok(e.user_agent(agent.clone())?)
        });
    config
        .with_ballista_grpc_metadata(HashMap::from([(
            "authorization".to_string(),
            format!("Bearer {token}"),
        )]))
        .with_ballista_override_create_grpc_client_endpoint(endpoint)
}

/// Asserts that `got` equals `want`: the same schema (the tensor column's extension metadata
/// included) and the same values.
fn assert_same(got: &RecordBatch, want: &RecordBatch) {
    assert_eq!(got.num_rows(), want.num_rows());
    for (g, w) in got.schema().fields().iter().zip(want.schema().fields()) {
        assert_eq!(g.data_type(), w.data_type(), "{}", w.name());
        assert_eq!(g.metadata(), w.metadata(), "{}", w.name());
    }
    for (i, (g, w)) in got.columns().iter().zip(want.columns()).enumerate() {
        assert_eq!(g.as_ref(), w.as_ref(), "column {i} differs from the local run");
    }
}

/// The query of the issue: three columns (one with nulls) into one float64 tensor per row.
const SQL: &str = "SELECT id, to_tensor_fill(0, id, x, CASE WHEN id % 7 = 0 THEN NULL ELSE x END) AS f \
                   FROM t ORDER BY id";

/// Registers `table` in `ctx`, runs the query (bounded), and checks the result against a local
/// run: the tensor column's type, every value, and the `(rows, 3)` tensor dlframe makes of it,
/// as of a local result.
async fn check_query(ctx: &SessionContext, table: &Path, rows: i64) {
    register_table(ctx, table).await;
    let got = tokio::time::timeout(LIMIT, collect_one(ctx, SQL)).await.expect("in time").unwrap();
    let want = local(table, SQL).await.unwrap();
    assert_eq!(got.schema().field(1).extension_type_name(), Some("arrow.fixed_shape_tensor"));
    assert_same(&got, &want);
    let tensor = dlframe_datafusion::collect_tensor(&got.schema(), std::slice::from_ref(&got), "f").unwrap();
    assert_eq!(tensor.shape(), [rows, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_ballista_runs_the_functions() {
    let dir = TempDir::new("ballista-standalone");
    let t = table(&dir, 4, 3000);
    // The in-process scheduler and executor take their functions from the state given here;
    // the client's session is rebuilt from it with Ballista's function list, which replaces
    // the state's, so the functions go into the client's session again once it is built.
    let mut state = SessionStateBuilder::new().with_default_features().with_config(config(4)).build();
    dlframe_datafusion::register_all(&mut state).unwrap();
    let ctx = SessionContext::standalone_with_state(state).await.unwrap();
    assert!(
        ctx.udf("to_tensor_fill").is_err(),
        "Ballista kept the functions: this test's setup can be simpler"
    );
    dlframe_datafusion::register(&ctx);
    check_query(&ctx, &t, 12_000).await;
}

/// A scheduler and executors as real processes on loopback ports.
struct Cluster {
    scheduler: Process,
    address: String,
    executors: Vec<(Process, PathBuf)>,
    /// Where each executor serves its results.
    served_at: Vec<String>,
}

impl Cluster {
    /// Starts a scheduler that gives up on a silent executor after `timeout` seconds and lets
    /// jobs read the files under `dir`, and `n` executors of one task slot each, each with a
    /// work directory under `dir`, all with the cluster token. Returns once every executor has
    /// been answered by the scheduler.
    fn start(dir: &TempDir, n: usize, timeout: u64) -> Cluster {
        Cluster::start_with(dir, n, timeout, &[])
    }

    /// [`Cluster::start`], with `extra` arguments for every process.
    fn start_with(dir: &TempDir, n: usize, timeout: u64, extra: &[&str]) -> Cluster {
        let mut scheduler = Process::start(
            &[
                &[
                    "scheduler",
                    "--listen",
                    "127.0.0.1:0",
                    "--executor-timeout",
                    &timeout.to_string(),
                    "--data",
                    dir.path().to_str().unwrap(),
                    "--token",
                    TOKEN,
                    "--executor-token",
                    EXECUTOR_TOKEN,
                ][..],
                extra,
            ]
            .concat(),
        );
        let address = scheduler.address("listening on ");
        let mut served_at = vec![];
        let executors = (0..n)
            .map(|i| {
                let work = dir.join(&format!("executor-{i}"));
                std::fs::create_dir(&work).unwrap();
                let mut e = Process::start(
                    &[
                        &[
                            "executor",
                            "--scheduler",
                            &address,
                            "--listen",
                            "127.0.0.1:0",
                            "--slots",
                            "1",
                            "--token",
                            TOKEN,
                            "--executor-token",
                            EXECUTOR_TOKEN,
                            "--work-dir",
                            work.to_str().unwrap(),
                        ][..],
                        extra,
                    ]
                    .concat(),
                );
                served_at.push(e.address("serving on "));
                e.line_with("ready");
                (e, work)
            })
            .collect();
        Cluster { scheduler, address, executors, served_at }
    }

    /// A Ballista client session on this cluster, with the token, and with dlframe's functions
    /// added after it is built.
    async fn client(&self, files: usize) -> SessionContext {
        self.client_with(files, Some(TOKEN)).await
    }

    async fn client_with(&self, files: usize, token: Option<&str>) -> SessionContext {
        self.try_client(files, token, None).await.unwrap()
    }

    /// A client session with `token`, over TLS trusting `ca` when given.
    async fn try_client(
        &self,
        files: usize,
        token: Option<&str>,
        ca: Option<&str>,
    ) -> datafusion::common::Result<SessionContext> {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(client_config(files, token, ca))
            .build();
        let ctx = SessionContext::remote_with_state(&format!("df://{}", self.address), state).await?;
        dlframe_datafusion::register(&ctx);
        Ok(ctx)
    }
}

/// The regular files under `dir`, at any depth.
fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map_while(Result::ok)
                .map(|e| if e.path().is_dir() { files_under(&e.path()) } else { 1 })
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_executor_cluster_splits_to_tensor_and_matches_a_local_run() {
    let dir = TempDir::new("ballista-cluster");
    let t = table(&dir, 6, 5000);
    let mut cluster = Cluster::start(&dir, 2, 180);
    let ctx = cluster.client(6).await;
    check_query(&ctx, &t, 30_000).await;

    // Each executor wrote the output of the tasks it ran into its own work directory.
    for (i, (_, work)) in cluster.executors.iter().enumerate() {
        assert!(files_under(work) > 0, "executor {i} ran no task ({} is empty)", work.display());
    }

    // A query that fails in the functions fails on the cluster too, with dlframe's message.
    let bad = "SELECT to_tensor(id, CASE WHEN id = 4321 THEN NULL ELSE x END) AS f FROM t";
    let err = tokio::time::timeout(LIMIT, collect_one(&ctx, bad)).await.expect("in time").unwrap_err();
    assert!(err.to_string().contains("null"), "{err}");

    for (e, _) in &mut cluster.executors {
        e.signal("TERM");
        assert!(e.wait_exit().success());
    }
    cluster.scheduler.signal("TERM");
    cluster.scheduler.line_with("stopped");
    assert!(cluster.scheduler.wait_exit().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_mid_query_gives_an_error_or_the_right_result() {
    let dir = TempDir::new("ballista-kill");
    let files = 12;
    let t = table(&dir, files, 20_000);
    let cluster = Cluster::start(&dir, 2, 5);
    let ctx = cluster.client(files as usize).await;
    let want = local(&t, SQL).await.unwrap();

    register_table(&ctx, &t).await;
    let query = tokio::spawn(async move { collect_one(&ctx, SQL).await });
    // Kill the second executor as soon as it has finished its first task: the query has more
    // tasks than the two slots can run at once, and its last stage needs every earlier output.
    let (victim, work) = &cluster.executors[1];
    let start = Instant::now();
    while files_under(work) == 0 {
        assert!(start.elapsed() < LIMIT, "executor 1 ran no task within {LIMIT:?}");
        assert!(!query.is_finished(), "the query ended before executor 1 ran a task");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!query.is_finished(), "the query ended before the executor could be killed");
    victim.signal("KILL");

    // Ballista runs the lost work again on the other executor, or fails the query: either is
    // fine, a hang or different data is not.
    let outcome = tokio::time::timeout(2 * LIMIT, query).await.expect("no hang after the kill").unwrap();
    match outcome {
        Ok(got) => {
            assert_same(&got, &want);
            eprintln!("the lost work ran again after the kill, and the result matched the local run");
        }
        Err(e) => eprintln!("the query failed after the kill, as it may: {e}"),
    }
}

/// A job as a client sends it: `sql`'s logical plan in `ctx`, as protobuf.
async fn job(ctx: &SessionContext, sql: &str) -> ballista_core::serde::protobuf::ExecuteQueryParams {
    use ballista_core::serde::protobuf;
    use datafusion_proto::logical_plan::{AsLogicalPlan, DefaultLogicalExtensionCodec};
    use datafusion_proto::protobuf::LogicalPlanNode;
    let plan = ctx.state().create_logical_plan(sql).await.unwrap();
    let mut bytes = vec![];
    LogicalPlanNode::try_from_logical_plan(&plan, &DefaultLogicalExtensionCodec {})
        .unwrap()
        .try_encode(&mut bytes)
        .unwrap();
    protobuf::ExecuteQueryParams {
        query: Some(protobuf::execute_query_params::Query::LogicalPlan(bytes)),
        ..Default::default()
    }
}

/// A raw gRPC request with the cluster token as a bearer header.
fn with_token<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

/// A job's request as a Ballista 55 client sends it: the token and the client's version.
fn as_ballista_client<T>(message: T) -> tonic::Request<T> {
    let mut r = with_token(message);
    r.metadata_mut().insert("ballista-version", "55.0.0".parse().unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_checks_its_token_its_plans_and_its_fetches() {
    use ballista_core::serde::protobuf;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    use datafusion_proto::logical_plan::AsLogicalPlan;
    use datafusion_proto::protobuf::LogicalPlanNode;

    let dir = TempDir::new("ballista-guard");
    let t = table(&dir, 2, 1000);
    let mut cluster = Cluster::start(&dir, 1, 180);

    // Without the token, a client's query is refused.
    let ctx = cluster.client_with(2, None).await;
    register_table(&ctx, &t).await;
    let e = tokio::time::timeout(LIMIT, collect_one(&ctx, "SELECT count(*) FROM t")).await.expect("in time");
    let e = e.expect_err("a client without the token");
    assert!(e.to_string().contains("cluster token"), "{e}");
    // With it, a query over the data directory runs.
    let ctx = cluster.client(2).await;
    register_table(&ctx, &t).await;
    let n =
        tokio::time::timeout(LIMIT, collect_one(&ctx, "SELECT count(*) AS n FROM t")).await.unwrap().unwrap();
    assert_eq!(n.num_rows(), 1);
    // A table outside the data directory is refused by the scheduler.
    let outside = TempDir::new("ballista-outside");
    let o = table(&outside, 1, 10);
    ctx.register_parquet("o", o.to_str().unwrap(), Default::default()).await.unwrap();
    let e =
        tokio::time::timeout(LIMIT, collect_one(&ctx, "SELECT count(*) FROM o")).await.unwrap().unwrap_err();
    assert!(e.to_string().contains("data directories"), "{e}");

    // Plans that write or change the catalog, sent as a client would send them: refused before
    // the scheduler accepts a job; no file appears.
    let local = SessionContext::new();
    let out = dir.join("copied.csv");
    let mut scheduler = SchedulerGrpcClient::connect(format!("http://{}", cluster.address)).await.unwrap();
    for sql in [
        format!("COPY (SELECT 1 AS a) TO '{}' STORED AS CSV", out.display()),
        "CREATE EXTERNAL TABLE pw (line VARCHAR) STORED AS CSV LOCATION '/etc/passwd'".to_string(),
    ] {
        let params = job(&local, &sql).await;
        let e = scheduler.execute_query(with_token(params.clone())).await.expect_err(&sql);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{sql}: {e}");
        assert!(e.message().contains("read-only"), "{sql}: {e}");
        let e = scheduler.execute_query(tonic::Request::new(params)).await.expect_err(&sql);
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{sql}: {e}");
    }
    assert!(!out.exists(), "COPY wrote a file");
    // A flat union of 100,000 inputs (2 MB of protobuf): refused before it is converted (it
    // overflowed the scheduler's stack, or held it for minutes); the scheduler goes on.
    {
        use datafusion_proto::protobuf::logical_plan_node::LogicalPlanType;
        use datafusion_proto::protobuf::{EmptyRelationNode, UnionNode};
        let empty = LogicalPlanNode {
            logical_plan_type: Some(LogicalPlanType::EmptyRelation(EmptyRelationNode {
                produce_one_row: true,
            })),
        };
        let union = LogicalPlanNode {
            logical_plan_type: Some(LogicalPlanType::Union(UnionNode { inputs: vec![empty; 100_000] })),
        };
        let mut bytes = vec![];
        union.try_encode(&mut bytes).unwrap();
        let params = protobuf::ExecuteQueryParams {
            query: Some(protobuf::execute_query_params::Query::LogicalPlan(bytes)),
            ..Default::default()
        };
        // As a Ballista 55 client sends it, so that only the plan's size can refuse it.
        let e = tokio::time::timeout(LIMIT, scheduler.execute_query(as_ballista_client(params)))
            .await
            .expect("answered in time")
            .expect_err("a 100,000-input union");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(e.message().contains("too large"), "{e}");
        let n = tokio::time::timeout(LIMIT, collect_one(&ctx, "SELECT count(*) AS n FROM t"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.num_rows(), 1);
    }

    // A client's token asks for no work: a made-up executor id with it gets no task, and
    // reports nothing (before, it received another job's task).
    let registration = protobuf::ExecutorRegistration {
        id: "made-up".into(),
        host: Some("127.0.0.1".into()),
        port: 1,
        grpc_port: 2,
        specification: Some(protobuf::ExecutorSpecification { resources: vec![] }),
        os_info: Some(Default::default()),
        ballista_protocol_version: ballista_core::BALLISTA_PROTOCOL_VERSION,
    };
    let poll = protobuf::PollWorkParams {
        metadata: Some(registration.clone()),
        num_free_vcores: 4,
        task_status: vec![],
    };
    let e = scheduler.poll_work(with_token(poll)).await.expect_err("a client polling for work");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let register = protobuf::RegisterExecutorParams { metadata: Some(registration) };
    let e = scheduler.register_executor(with_token(register)).await.expect_err("a client registering");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let update = protobuf::UpdateTaskStatusParams { executor_id: "made-up".into(), task_status: vec![] };
    let e = scheduler.update_task_status(with_token(update)).await.expect_err("a client reporting");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");

    // A job belongs to the connection that made it: on another, its status, its cancellation
    // and its data are as of a job that does not exist (before, CleanJobData deleted it).
    let job_id = submit(&mut scheduler, job(&local, "SELECT 1 AS a").await).await;
    let mut other = SchedulerGrpcClient::connect(format!("http://{}", cluster.address)).await.unwrap();
    let status = protobuf::GetJobStatusParams { job_id: job_id.clone() };
    let e = other.get_job_status(with_token(status.clone())).await.expect_err("another's job status");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let cancel = protobuf::CancelJobParams { job_id: job_id.clone() };
    let e = other.cancel_job(with_token(cancel)).await.expect_err("another's cancel");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let clean = protobuf::CleanJobDataParams { job_id: job_id.clone(), remove_stage_ids: vec![] };
    let e = other.clean_job_data(with_token(clean)).await.expect_err("another's clean");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let unknown = protobuf::GetJobStatusParams { job_id: "nosuchjob".into() };
    let e2 = other.get_job_status(with_token(unknown)).await.unwrap_err();
    assert_eq!(
        e2.message().replace("nosuchjob", &job_id),
        e.message(),
        "another's job and no job read alike"
    );
    // On its own connection, the job is known.
    let own = scheduler.get_job_status(with_token(status)).await.unwrap().into_inner();
    assert_eq!(own.status.unwrap().job_id, job_id);

    // The executor's result server: the token, and no job id that leaves the work directory.
    let flight = cluster.served_at[0].clone();
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{flight}")).unwrap().connect().await.unwrap();
    let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
    // A job id that is well formed but unknown: an error that names neither the work directory
    // nor a debug dump of the system's error.
    let work = cluster.executors[0].1.to_str().unwrap().to_string();
    for (job, code) in [
        ("../outside", tonic::Code::InvalidArgument),
        ("/etc", tonic::Code::InvalidArgument),
        ("nosuchjob", tonic::Code::NotFound),
    ] {
        let action = protobuf::Action {
            action_type: Some(protobuf::action::ActionType::FetchPartition(protobuf::FetchPartition {
                job_id: job.into(),
                stage_id: 1,
                partition_id: 0,
                host: "127.0.0.1".into(),
                port: 1,
                ..Default::default()
            })),
            settings: vec![],
        };
        let ticket = arrow_flight::Ticket { ticket: prost::Message::encode_to_vec(&action).into() };
        let e = client.do_get(with_token(ticket.clone())).await.expect_err(job);
        assert_eq!(e.code(), code, "{job}: {e}");
        assert!(!e.message().contains(&work) && !e.message().contains("Os {"), "{job}: {e}");
        let e = client.do_get(tonic::Request::new(ticket)).await.expect_err(job);
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{job}: {e}");
    }
    for (e, _) in &mut cluster.executors {
        e.signal("TERM");
    }
}

/// A job made with `params` on `scheduler`, as a Ballista 55 client sends it: its id.
async fn submit(
    scheduler: &mut SchedulerClient,
    params: ballista_core::serde::protobuf::ExecuteQueryParams,
) -> String {
    use ballista_core::serde::protobuf::execute_query_result::Result as Made;
    match scheduler.execute_query(as_ballista_client(params)).await.unwrap().into_inner().result {
        Some(Made::Success(made)) => made.job_id,
        other => panic!("the job was not accepted: {other:?}"),
    }
}

type SchedulerClient =
    ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient<tonic::transport::Channel>;

/// An executor's answer to a fetch of `(job, stage, partition)` with the cluster token: the
/// bytes of its Flight data, or the error.
async fn fetch(
    client: &mut arrow_flight::flight_service_client::FlightServiceClient<tonic::transport::Channel>,
    job: &str,
    location: &ballista_core::serde::protobuf::PartitionLocation,
) -> Result<usize, tonic::Status> {
    use ballista_core::serde::protobuf;
    use futures::TryStreamExt;
    let id = location.partition_id.as_ref().unwrap();
    let layout = if location.is_sort_shuffle {
        protobuf::ShuffleLayout::Sort
    } else {
        protobuf::ShuffleLayout::Passthrough
    };
    let action = protobuf::Action {
        action_type: Some(protobuf::action::ActionType::FetchPartition(protobuf::FetchPartition {
            job_id: job.into(),
            stage_id: id.stage_id,
            partition_id: id.partition_id,
            host: "127.0.0.1".into(),
            port: 1,
            file_id: location.file_id,
            layout: layout as i32,
            ..Default::default()
        })),
        settings: vec![],
    };
    let ticket = arrow_flight::Ticket { ticket: prost::Message::encode_to_vec(&action).into() };
    let data: Vec<arrow_flight::FlightData> =
        client.do_get(with_token(ticket)).await?.into_inner().try_collect().await?;
    Ok(data.iter().map(|d| d.data_body.len() + d.data_header.len()).sum())
}

/// Crockford's base32 digits, in which Ballista 55 writes its job ids.
const CROCKFORD: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A Ballista 55 job id, a snowflake (48 bits of milliseconds, 16 of a count, in Crockford's
/// base32), as its number; None for any other id.
fn snowflake(id: &str) -> Option<u64> {
    if id.len() != 13 {
        return None;
    }
    id.bytes().try_fold(0u64, |n, c| Some((n << 5) | CROCKFORD.iter().position(|&d| d == c)? as u64))
}

/// The snowflake job id of `n`.
fn snowflake_id(n: u64) -> String {
    (0..13).rev().map(|i| CROCKFORD[((n >> (5 * i)) & 31) as usize] as char).collect()
}

/// Issue 54, the cluster's last hole: an executor serves a job's results to any caller with the
/// cluster token who names the job. Ballista's ids were snowflakes, so a client that made a job
/// just before and just after another client's could list the ids between, fetch each, and read
/// that client's results (this test did, before the scheduler made random ids). Now the id,
/// told only to the connection that made the job, is the capability to read its results: the
/// same search finds nothing, while the job's maker reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_job_cannot_be_found_from_ones_own_ids() {
    use ballista_core::serde::protobuf;
    use ballista_core::serde::protobuf::job_status::Status;

    let dir = TempDir::new("ballista-ids");
    let mut cluster = Cluster::start(&dir, 1, 180);
    let local = SessionContext::new();
    let connect = || SchedulerClient::connect(format!("http://{}", cluster.address));
    let (mut attacker, mut victim) = (connect().await.unwrap(), connect().await.unwrap());
    let before = submit(&mut attacker, job(&local, "SELECT 41 AS a").await).await;
    let secret = submit(&mut victim, job(&local, "SELECT 'the victim''s row' AS a").await).await;
    let after = submit(&mut attacker, job(&local, "SELECT 43 AS a").await).await;
    for id in [&before, &secret, &after] {
        assert_eq!(id.len(), 32, "not the scheduler's random id: {id}");
    }

    // The victim's job finishes; it reads its result from the executor by its id.
    let deadline = Instant::now() + LIMIT;
    let location = loop {
        let status = protobuf::GetJobStatusParams { job_id: secret.clone() };
        let status = victim.get_job_status(with_token(status)).await.unwrap().into_inner();
        match status.status.and_then(|s| s.status) {
            Some(Status::Successful(done)) => break done.partition_location[0].clone(),
            Some(Status::Failed(f)) => panic!("the victim's job failed: {f:?}"),
            _ => assert!(Instant::now() < deadline, "the victim's job did not finish in time"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", cluster.served_at[0]))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut executor = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
    let read = fetch(&mut executor, &secret, &location).await.expect("the maker reads its result");
    assert!(read > 0);

    // The attacker lists every id that could lie between its own two and fetches each: with
    // snowflakes, the victim's is among them.
    let mut candidates = vec![];
    if let (Some(a), Some(b)) = (snowflake(&before), snowflake(&after)) {
        for ms in (a >> 16)..=(b >> 16).min((a >> 16) + 10_000) {
            candidates.extend((0..4).map(|count| snowflake_id((ms << 16) | count)));
        }
    }
    let mut found = vec![];
    for id in candidates.iter().filter(|id| **id != before && **id != after) {
        if fetch(&mut executor, id, &location).await.is_ok() {
            found.push(id.clone());
        }
    }
    assert!(found.is_empty(), "the attacker read the results of {found:?} (the victim's is {secret})");
    for (e, _) in &mut cluster.executors {
        e.signal("TERM");
    }
}

/// A cluster over TLS (row 15's other half: the scheduler and the executors' result servers).
/// The real Ballista client, trusting the cluster's CA, runs the query across two executors and
/// gets the local result; a client without TLS is refused by the scheduler, and plain text to an
/// executor's result server gets nothing. A socket that never finishes its handshake holds up
/// nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_runs_the_query_and_refuses_plain_text() {
    let dir = TempDir::new("ballista-tls");
    let t = table(&dir, 4, 2000);
    let (ca_path, cert, key, ca) = certificate_files(dir.path());
    let tls = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-ca",
        ca_path.to_str().unwrap(),
    ];
    let mut cluster = Cluster::start_with(&dir, 2, 180, &tls);
    let stalled = std::net::TcpStream::connect(&cluster.address).unwrap();

    let ctx = cluster.try_client(4, Some(TOKEN), Some(&ca)).await.unwrap();
    check_query(&ctx, &t, 8000).await;
    for (i, (_, work)) in cluster.executors.iter().enumerate() {
        assert!(files_under(work) > 0, "executor {i} ran no task over TLS");
    }
    drop(stalled);

    // The same client without TLS: the scheduler does not answer it.
    let plain = match cluster.try_client(4, Some(TOKEN), None).await {
        Err(_) => true,
        Ok(ctx) => {
            register_table(&ctx, &t).await;
            tokio::time::timeout(LIMIT, collect_one(&ctx, "SELECT count(*) FROM t"))
                .await
                .expect("in time")
                .is_err()
        }
    };
    assert!(plain, "a plain-text client ran a query on a TLS scheduler");
    // Plain text to an executor's result server, with the token: no answer.
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", cluster.served_at[0])).unwrap();
    let refused = match tokio::time::timeout(LIMIT, channel.connect()).await.expect("in time") {
        Err(_) => true,
        Ok(channel) => {
            let mut client = arrow_flight::flight_service_client::FlightServiceClient::new(channel);
            let ticket = arrow_flight::Ticket { ticket: b"x".to_vec().into() };
            client.do_get(with_token(ticket)).await.is_err()
        }
    };
    assert!(refused, "an executor's result server answered plain text");

    for (e, _) in &mut cluster.executors {
        e.signal("TERM");
        assert!(e.wait_exit().success());
    }
    cluster.scheduler.signal("TERM");
    assert!(cluster.scheduler.wait_exit().success());
}

/// A TLS file that is not one names itself, and the process exits at start.
#[test]
fn a_bad_tls_file_is_named_at_start() {
    let dir = TempDir::new("ballista-tls-bad");
    let (ca, cert, _, _) = certificate_files(dir.path());
    let (ca, cert) = (ca.to_str().unwrap(), cert.to_str().unwrap());
    for what in ["scheduler", "executor"] {
        let mut args = vec![what, "--insecure", "--listen", "127.0.0.1:0"];
        if what == "executor" {
            args.extend(["--scheduler", "127.0.0.1:1"]);
        }
        // The certificate given as the key.
        args.extend(["--tls-cert", cert, "--tls-key", cert, "--tls-ca", ca]);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlframe")).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} started with a certificate as its key");
        assert!(
            err.contains("--tls-key") && err.contains("cert.pem") && err.contains("PRIVATE KEY"),
            "{what}: {err}"
        );
    }
}

//! The scheduler's door: every job is held to the same read-only rule as `dlframe serve`, and
//! its file scans to the data directories the operator named, before the scheduler accepts it.
//! Each call is held to its caller's role (a client's calls, an executor's calls: `auth`), and
//! a call about a job to the connection that made it (`jobs`).
//!
//! A Ballista client sends its plan, with the tables it registered (their paths included), as
//! protobuf. The check decodes it once more with the scheduler's own functions and codec:
//! - DDL, DML, COPY and statements are refused (`flight::guard::check_plan`, the rule written
//!   once for both services);
//! - a scan of files must lie under one of `--data DIR`; with none given, no file is scanned;
//! - only logical plans are accepted: a physical plan would skip both checks.
//!
//! Everything else goes to Ballista's scheduler unchanged.

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::serve::ListenerExt;
use ballista_core::serde::protobuf::execute_query_params::Query;
use ballista_core::serde::protobuf::scheduler_grpc_server::{SchedulerGrpc, SchedulerGrpcServer};
use ballista_core::serde::protobuf::{self as pb};
use ballista_scheduler::scheduler_server::SchedulerServer;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion_proto::logical_plan::AsLogicalPlan;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};
use futures::StreamExt;
use tonic::service::RoutesBuilder;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::auth::{ClusterAuth, Role};
use super::jobs::{Jobs, peer};
use super::listener::TlsListener;
use crate::flight::guard::check_plan;

type Inner = SchedulerServer<LogicalPlanNode, PhysicalPlanNode>;

/// The directories a job may scan, canonical.
#[derive(Debug, Clone, Default)]
pub(crate) struct DataRoots(Vec<PathBuf>);

impl DataRoots {
    /// The roots `dirs`, each of which must exist.
    pub(crate) fn new(dirs: &[PathBuf]) -> Result<DataRoots, String> {
        let roots = dirs
            .iter()
            .map(|d| std::fs::canonicalize(d).map_err(|e| format!("--data {}: {e}", d.display())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DataRoots(roots))
    }

    /// Whether `path` (absolute, from a file URL) lies under a root.
    fn allows(&self, path: &Path) -> bool {
        if path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
            return false;
        }
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        self.0.iter().any(|root| real.starts_with(root))
    }
}

/// Refuses a plan that writes, changes the catalog, sets options, or scans files outside
/// `roots`.
pub(crate) fn check_job(plan: &LogicalPlan, roots: &DataRoots) -> Result<(), String> {
    check_plan(plan).map_err(|e| e.to_string())?;
    let mut refused = None;
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let listing = source_as_provider(&scan.source).ok();
            let listing = listing.as_ref().and_then(|p| p.downcast_ref::<ListingTable>());
            for url in listing.map(|l| l.table_paths().as_slice()).unwrap_or_default() {
                let path = PathBuf::from(format!("/{}", url.prefix()));
                if url.scheme() != "file" || !roots.allows(&path) {
                    refused = Some(format!(
                        "this cluster reads files only under its data directories (dlframe scheduler --data \
                         DIR); table {} reads {}",
                        scan.table_name,
                        url.as_str()
                    ));
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    refused.map_or(Ok(()), Err)
}

/// The most relations (plan nodes, subqueries' included) a job's plan may hold. DataFusion
/// builds a union of n inputs as n - 1 nested unions, which every later pass recurses through:
/// a flat union of 400,000 inputs (9 MB of protobuf) overflowed the scheduler's stack, and one
/// of 200,000 held it for minutes.
const MAX_PLAN_NODES: usize = 1024;

/// The relations of a decoded plan, counted up to `max + 1` without converting it: prost's
/// Debug form names each `LogicalPlanNode`, and the sink only counts the names, keeping
/// nothing. Protobuf's decoder bounds the nesting (100 levels), so the formatting's recursion
/// is bounded too, and it stops at the first name past `max`.
fn relations(node: &LogicalPlanNode, max: usize) -> usize {
    struct Count {
        tail: String,
        found: usize,
        max: usize,
    }
    const NAME: &str = "LogicalPlanNode {";
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.tail.push_str(s);
            self.found += self.tail.matches(NAME).count();
            if self.found > self.max {
                return Err(std::fmt::Error);
            }
            // Keep only what may begin a name that the next piece ends.
            let mut keep = self.tail.len().saturating_sub(NAME.len() - 1);
            while !self.tail.is_char_boundary(keep) {
                keep -= 1;
            }
            self.tail.drain(..keep);
            Ok(())
        }
    }
    let mut count = Count { tail: String::new(), found: 0, max };
    let _ = std::fmt::write(&mut count, format_args!("{node:?}"));
    count.found
}

/// Ballista's scheduler service with every submitted job checked first.
#[derive(Clone)]
pub(crate) struct PlanGuard {
    inner: Inner,
    decode: Arc<SessionContext>,
    roots: Arc<DataRoots>,
    jobs: Arc<Jobs>,
}

impl PlanGuard {
    /// `decode`: a session with the scheduler's functions, to decode plans with.
    pub(crate) fn new(inner: Inner, decode: SessionContext, roots: DataRoots) -> PlanGuard {
        PlanGuard { inner, decode: Arc::new(decode), roots: Arc::new(roots), jobs: Arc::default() }
    }

    /// Refuses a call about job `job_id` unless a client makes it on the connection that made
    /// the job (`same_host`: or from that connection's address; see [`Jobs::check`]).
    fn own<T>(&self, r: &Request<T>, job_id: &str, same_host: bool) -> Result<(), Status> {
        Role::need(r, Role::Client)?;
        self.jobs.check(job_id, peer(r), same_host)
    }

    fn check(&self, params: &pb::ExecuteQueryParams) -> Result<(), Status> {
        let bytes = match &params.query {
            Some(Query::LogicalPlan(bytes)) => bytes,
            Some(_) => {
                return Err(Status::permission_denied(
                    "this cluster takes logical plans only: a physical or Substrait plan would skip its checks",
                ));
            }
            None => return Err(Status::invalid_argument("a job without a plan")),
        };
        let decode_error = |e: datafusion::error::DataFusionError| {
            Status::invalid_argument(format!("cannot decode the plan: {}", e.find_root()))
        };
        let node = LogicalPlanNode::try_decode(bytes).map_err(decode_error)?;
        if relations(&node, MAX_PLAN_NODES) > MAX_PLAN_NODES {
            return Err(Status::invalid_argument(format!(
                "the plan is too large: over this cluster's limit of {MAX_PLAN_NODES} relations (a union \
                 counts each of its inputs)"
            )));
        }
        let plan = node
            .try_into_logical_plan(&self.decode.task_ctx(), self.inner.state.codec.logical_extension_codec())
            .map_err(decode_error)?;
        check_job(&plan, &self.roots).map_err(Status::permission_denied)
    }
}

#[tonic::async_trait]
impl SchedulerGrpc for PlanGuard {
    type ExecuteQueryPushStream = <Inner as SchedulerGrpc>::ExecuteQueryPushStream;

    async fn execute_query(
        &self,
        r: Request<pb::ExecuteQueryParams>,
    ) -> Result<Response<pb::ExecuteQueryResult>, Status> {
        Role::need(&r, Role::Client)?;
        self.check(r.get_ref())?;
        let from = peer(&r);
        let answer = <Inner as SchedulerGrpc>::execute_query(&self.inner, r).await?;
        if let Some(pb::execute_query_result::Result::Success(ok)) = &answer.get_ref().result {
            self.jobs.made(&ok.job_id, from);
        }
        Ok(answer)
    }

    async fn execute_query_push(
        &self,
        r: Request<pb::ExecuteQueryParams>,
    ) -> Result<Response<Self::ExecuteQueryPushStream>, Status> {
        Role::need(&r, Role::Client)?;
        self.check(r.get_ref())?;
        let from = peer(&r);
        let jobs = self.jobs.clone();
        let answer = <Inner as SchedulerGrpc>::execute_query_push(&self.inner, r).await?;
        // The job's id first reaches the client in the stream's statuses: each is recorded
        // before the client reads it, so its cancel on this connection is its own.
        Ok(answer.map(|statuses| {
            let recorded: Self::ExecuteQueryPushStream = Box::pin(statuses.inspect(move |item| {
                if let Ok(pb::GetJobStatusResult { status: Some(status), .. }) = item {
                    jobs.made(&status.job_id, from);
                }
            }));
            recorded
        }))
    }

    async fn poll_work(
        &self,
        r: Request<pb::PollWorkParams>,
    ) -> Result<Response<pb::PollWorkResult>, Status> {
        Role::need(&r, Role::Executor)?;
        <Inner as SchedulerGrpc>::poll_work(&self.inner, r).await
    }

    async fn register_executor(
        &self,
        r: Request<pb::RegisterExecutorParams>,
    ) -> Result<Response<pb::RegisterExecutorResult>, Status> {
        Role::need(&r, Role::Executor)?;
        complete(r.get_ref().metadata.as_ref())?;
        <Inner as SchedulerGrpc>::register_executor(&self.inner, r).await
    }

    async fn heart_beat_from_executor(
        &self,
        r: Request<pb::HeartBeatParams>,
    ) -> Result<Response<pb::HeartBeatResult>, Status> {
        Role::need(&r, Role::Executor)?;
        if let Some(m) = r.get_ref().metadata.as_ref() {
            complete(Some(m))?;
        }
        <Inner as SchedulerGrpc>::heart_beat_from_executor(&self.inner, r).await
    }

    async fn update_task_status(
        &self,
        r: Request<pb::UpdateTaskStatusParams>,
    ) -> Result<Response<pb::UpdateTaskStatusResult>, Status> {
        Role::need(&r, Role::Executor)?;
        <Inner as SchedulerGrpc>::update_task_status(&self.inner, r).await
    }

    async fn create_update_session(
        &self,
        r: Request<pb::CreateUpdateSessionParams>,
    ) -> Result<Response<pb::CreateUpdateSessionResult>, Status> {
        Role::need(&r, Role::Client)?;
        <Inner as SchedulerGrpc>::create_update_session(&self.inner, r).await
    }

    async fn remove_session(
        &self,
        r: Request<pb::RemoveSessionParams>,
    ) -> Result<Response<pb::RemoveSessionResult>, Status> {
        Role::need(&r, Role::Client)?;
        <Inner as SchedulerGrpc>::remove_session(&self.inner, r).await
    }

    async fn get_job_status(
        &self,
        r: Request<pb::GetJobStatusParams>,
    ) -> Result<Response<pb::GetJobStatusResult>, Status> {
        self.own(&r, &r.get_ref().job_id, false)?;
        <Inner as SchedulerGrpc>::get_job_status(&self.inner, r).await
    }

    async fn get_job_metrics(
        &self,
        r: Request<pb::GetJobMetricsParams>,
    ) -> Result<Response<pb::GetJobMetricsResult>, Status> {
        // Ballista's client asks for metrics (EXPLAIN ANALYZE) on a connection of their own.
        self.own(&r, &r.get_ref().job_id, true)?;
        <Inner as SchedulerGrpc>::get_job_metrics(&self.inner, r).await
    }

    async fn executor_stopped(
        &self,
        r: Request<pb::ExecutorStoppedParams>,
    ) -> Result<Response<pb::ExecutorStoppedResult>, Status> {
        Role::need(&r, Role::Executor)?;
        <Inner as SchedulerGrpc>::executor_stopped(&self.inner, r).await
    }

    async fn cancel_job(
        &self,
        r: Request<pb::CancelJobParams>,
    ) -> Result<Response<pb::CancelJobResult>, Status> {
        self.own(&r, &r.get_ref().job_id, false)?;
        <Inner as SchedulerGrpc>::cancel_job(&self.inner, r).await
    }

    async fn clean_job_data(
        &self,
        r: Request<pb::CleanJobDataParams>,
    ) -> Result<Response<pb::CleanJobDataResult>, Status> {
        self.own(&r, &r.get_ref().job_id, false)?;
        <Inner as SchedulerGrpc>::clean_job_data(&self.inner, r).await
    }
}

/// Refuses an executor's registration that lacks a field Ballista's scheduler unwraps (its
/// host, specification or OS information), which would panic in the middle of the call.
fn complete(metadata: Option<&pb::ExecutorRegistration>) -> Result<(), Status> {
    let m = metadata.ok_or_else(|| Status::invalid_argument("an executor call without its registration"))?;
    if m.host.is_none() || m.specification.is_none() || m.os_info.is_none() {
        return Err(Status::invalid_argument(
            "an executor registration without its host, specification or OS information",
        ));
    }
    Ok(())
}

/// Serves the scheduler on `listener`, over TLS with `tls`: [`PlanGuard`] behind `auth`,
/// through axum as Ballista does (its handlers read the peer's address from axum's connection
/// info).
pub(crate) async fn serve_scheduler(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    guard: PlanGuard,
    auth: ClusterAuth,
) -> std::io::Result<()> {
    let config = guard.inner.state.config.clone();
    let grpc = SchedulerGrpcServer::new(guard)
        .max_encoding_message_size(config.grpc_server_max_encoding_message_size as usize)
        .max_decoding_message_size(config.grpc_server_max_decoding_message_size as usize);
    let mut routes = RoutesBuilder::default();
    routes.add_service(InterceptedService::new(grpc, auth));
    let app = routes.routes().into_axum_router().into_make_service_with_connect_info::<SocketAddr>();
    match tls {
        // axum gives the connection info of a listener that is not its own through `tap_io`.
        Some(config) => axum::serve(TlsListener::new(listener, config)?.tap_io(|_| {}), app).await,
        None => axum::serve(listener, app).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn plan(ctx: &SessionContext, sql: &str) -> LogicalPlan {
        ctx.state().create_logical_plan(sql).await.unwrap()
    }

    #[tokio::test]
    async fn jobs_are_read_only_and_read_only_under_the_data_directories() {
        let dir = std::env::temp_dir().join(format!("dlframe-plans-{}", std::process::id()));
        let inside = dir.join("data");
        let outside = dir.join("other");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(inside.join("a.csv"), "x\n1\n").unwrap();
        std::fs::write(outside.join("b.csv"), "x\n2\n").unwrap();
        let roots = DataRoots::new(std::slice::from_ref(&inside)).unwrap();
        let ctx = SessionContext::new();
        ctx.register_csv("a", inside.join("a.csv").to_str().unwrap(), Default::default()).await.unwrap();
        ctx.register_csv("b", outside.join("b.csv").to_str().unwrap(), Default::default()).await.unwrap();
        check_job(&plan(&ctx, "SELECT x FROM a").await, &roots).unwrap();
        check_job(&plan(&ctx, "SELECT 1").await, &DataRoots::default()).unwrap();
        let e = check_job(&plan(&ctx, "SELECT x FROM b").await, &roots).unwrap_err();
        assert!(e.contains("data directories") && e.contains("table b"), "{e}");
        let e =
            check_job(&plan(&ctx, "SELECT x FROM a WHERE x IN (SELECT x FROM b)").await, &roots).unwrap_err();
        assert!(e.contains("table b"), "{e}");
        assert!(check_job(&plan(&ctx, "SELECT x FROM a").await, &DataRoots::default()).is_err());
        for sql in [
            "COPY (SELECT 1 AS a) TO '/tmp/dlframe-never.csv' STORED AS CSV",
            "CREATE EXTERNAL TABLE pw (line VARCHAR) STORED AS CSV LOCATION '/etc/passwd'",
            "INSERT INTO a VALUES (3)",
        ] {
            let e = check_job(&plan(&ctx, sql).await, &roots).unwrap_err();
            assert!(e.contains("read-only"), "{sql}: {e}");
        }
        assert!(!roots.allows(&inside.join("../other/b.csv")));
        // Relations are counted in the protobuf before it is converted, nested ones too.
        let mut bytes = vec![];
        let sql = "SELECT x FROM (SELECT x FROM a UNION ALL SELECT 1 UNION ALL SELECT 2) AS s";
        let node = LogicalPlanNode::try_from_logical_plan(
            &plan(&ctx, sql).await,
            &datafusion_proto::logical_plan::DefaultLogicalExtensionCodec {},
        )
        .unwrap();
        node.try_encode(&mut bytes).unwrap();
        let n = relations(&LogicalPlanNode::try_decode(&bytes).unwrap(), 100);
        assert!(n >= 6, "{n} relations");
        assert!(DataRoots::new(&[dir.join("missing")]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_flat_union_is_counted_without_being_converted_and_the_count_stops_past_the_limit() {
        use datafusion_proto::protobuf::logical_plan_node::LogicalPlanType;
        use datafusion_proto::protobuf::{EmptyRelationNode, UnionNode};
        let empty = LogicalPlanNode {
            logical_plan_type: Some(LogicalPlanType::EmptyRelation(EmptyRelationNode {
                produce_one_row: true,
            })),
        };
        let union = |n: usize| LogicalPlanNode {
            logical_plan_type: Some(LogicalPlanType::Union(UnionNode { inputs: vec![empty.clone(); n] })),
        };
        assert_eq!(relations(&union(10), 100), 11);
        assert_eq!(relations(&union(1000), MAX_PLAN_NODES), 1001);
        // 400,000 inputs: counting stops at the first past the limit.
        let started = std::time::Instant::now();
        assert!(relations(&union(400_000), MAX_PLAN_NODES) > MAX_PLAN_NODES);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}

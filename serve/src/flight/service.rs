//! The Flight SQL service of `dlframe serve`: statements, prepared statements, Substrait plans
//! and the catalog calls, on arrow-flight's Flight SQL dispatch.
//!
//! - Every query, however it arrives, goes through [`guard`](super::guard): the limits on its
//!   text and shape, then the read-only rule. Nothing a client sends changes the catalog.
//! - Tickets and prepared-statement handles are the server's: a ticket carries a random query
//!   id and what to run (checked again when it runs); a handle is a random id into the
//!   server's own table of prepared statements, whose SQL and parameters the client never
//!   holds. Parameters are checked (one row, a bounded size) before they are kept.
//! - A query runs under [`run`](super::run)'s bounds: slots, memory, deadline, cancellation.
//! - Errors go out through [`error`](super::error), as Display text without server paths.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::metadata::SqlInfoData;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionBeginSavepointRequest, ActionBeginSavepointResult, ActionBeginTransactionRequest,
    ActionBeginTransactionResult, ActionCancelQueryRequest, ActionCancelQueryResult,
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, ActionCreatePreparedSubstraitPlanRequest, CommandGetCatalogs,
    CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementIngest,
    CommandStatementQuery, CommandStatementSubstraitPlan, CommandStatementUpdate,
    DoPutPreparedStatementResult, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, IpcMessage, SchemaAsIpc, Ticket,
};
use arrow_schema::Schema;
use datafusion::common::ParamValues;
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlanProperties;
use futures::{FutureExt, Stream, TryStreamExt};
use prost::Message;
use prost::bytes::Bytes;
use tonic::{Request, Response, Status, Streaming};

use super::auth::caller;
use super::bounded::Rules;
use super::catalog;
use super::conn::Owner;
use super::error::{Scrub, ServeError};
use super::guard::{self, SqlLimits};
use super::planning;
use super::prepared::{PARAMETER_TIME, PreparedStatements, parameter_schema, read_parameters};
use super::run::{Runner, new_id};
use super::ticket::TicketBody;

mod query;

type DoGetStream = <Served as FlightService>::DoGetStream;

/// The Flight SQL service.
pub(crate) struct Served {
    state: SessionState,
    limits: SqlLimits,
    runner: Arc<Runner>,
    /// The exposed functions' bounds, applied to each plan before it runs.
    rules: Arc<Rules>,
    prepared: PreparedStatements,
    scrub: Scrub,
    sql_info: SqlInfoData,
    /// Whether a FlightInfo lists one endpoint per partition of the plan.
    partitioned: bool,
}

impl Served {
    /// A service over `state`'s tables and functions.
    /// `partitioned`: a FlightInfo lists one endpoint per partition of the query's plan, for
    /// readers in parallel, instead of one endpoint for the whole result.
    pub(crate) fn new(
        state: SessionState,
        limits: SqlLimits,
        runner: Arc<Runner>,
        rules: Arc<Rules>,
        scrub: Scrub,
        partitioned: bool,
    ) -> Served {
        Served {
            state,
            limits,
            runner,
            rules,
            prepared: PreparedStatements::default(),
            scrub,
            sql_info: catalog::sql_info(),
            partitioned,
        }
    }

    fn status(&self, e: ServeError) -> Status {
        e.to_status(&self.scrub)
    }

    /// Plans `sql` (checked), with `params` bound.
    async fn plan_sql(
        &self,
        state: &SessionState,
        sql: &str,
        params: Option<ParamValues>,
    ) -> Result<LogicalPlan, ServeError> {
        let plan = guard::plan_sql(state, sql, &self.limits).await?;
        Ok(match params {
            Some(p) => plan.with_param_values(p)?,
            None => plan,
        })
    }

    /// Plans a Substrait plan (checked), on a planning thread (`planning.rs`). DataFusion 55's
    /// consumer unwraps some missing fields (a join or cross relation without an input, a sort
    /// without an expression): a panic there is refused as a malformed plan.
    async fn plan_substrait(&self, state: &SessionState, bytes: &[u8]) -> Result<LogicalPlan, ServeError> {
        let (state, bytes, limits) = (state.clone(), bytes.to_vec(), self.limits);
        planning::plan(limits.max_sql_bytes, move || async move {
            let plan = datafusion_substrait::serializer::deserialize_bytes(&bytes)?;
            let consume = datafusion_substrait::logical_plan::consumer::from_substrait_plan(&state, &plan);
            let plan = std::panic::AssertUnwindSafe(consume).catch_unwind().await.map_err(|_| {
                ServeError::BadRequest(
                    "a malformed Substrait plan (a relation lacks a required field)".into(),
                )
            })??;
            guard::check_decoded(&plan, &limits)?;
            Ok(plan)
        })
        .await
    }

    /// Plans what `body` asks for.
    async fn plan_ticket(
        &self,
        state: &SessionState,
        body: &TicketBody,
    ) -> Result<(LogicalPlan, String), ServeError> {
        match (&body.sql, &body.prepared, &body.substrait) {
            (Some(sql), None, None) => Ok((self.plan_sql(state, sql, None).await?, sql.clone())),
            (None, Some(handle), None) => {
                let p = self.prepared.get(handle, &body.asked_by())?;
                Ok((self.plan_sql(state, &p.sql, p.params).await?, p.sql))
            }
            (None, None, Some(bytes)) => {
                Ok((self.plan_substrait(state, bytes).await?, "<substrait plan>".into()))
            }
            _ => Err(ServeError::BadRequest("a malformed ticket".into())),
        }
    }

    /// A FlightInfo for `plan`: its schema and its endpoints, whose tickets carry `body`, each
    /// with an id of its own: one endpoint, or one per partition of the plan when the server is
    /// partitioned.
    async fn flight_info(
        &self,
        plan: &LogicalPlan,
        mut body: TicketBody,
        descriptor: FlightDescriptor,
        asked: Instant,
        owner: Owner,
    ) -> Result<FlightInfo, Status> {
        let partitions = if self.partitioned {
            let physical = self.state.create_physical_plan(plan).await.map_err(|e| self.status(e.into()))?;
            // A plan with a shuffle would run its whole input again for every endpoint, and
            // hold or spill the other partitions' rows: such a result comes as one endpoint.
            (!has_shuffle(&physical)).then(|| physical.output_partitioning().partition_count())
        } else {
            None
        };
        body.waited_ms = Some(asked.elapsed().as_millis() as u64);
        body.owner = owner.map(|o| o.to_vec());
        let info = body.endpoints(partitions).fold(FlightInfo::new(), FlightInfo::with_endpoint);
        let schema = plan.schema().as_arrow().clone();
        info.with_descriptor(descriptor)
            .try_with_schema(&schema)
            .map_err(|e| Status::internal(format!("cannot encode the result's schema: {e}")))
    }
}

/// One record batch as a DoGet stream.
fn one_batch(batch: arrow_flight::error::Result<RecordBatch>) -> Result<Response<DoGetStream>, Status> {
    let batch = batch.map_err(|e| Status::internal(e.to_string()))?;
    let schema = batch.schema();
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(futures::stream::once(async { Ok(batch) }))
        .map_err(|e| Status::internal(e.to_string()));
    Ok(Response::new(Box::pin(stream)))
}

/// Whether `plan` repartitions rows anywhere (a shuffle between its partitions).
fn has_shuffle(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> bool {
    plan.name() == "RepartitionExec" || plan.children().into_iter().any(has_shuffle)
}

/// A schema as Flight sends it in a prepared statement's result.
fn schema_bytes(schema: &Schema) -> Result<Bytes, Status> {
    let options = datafusion::arrow::ipc::writer::IpcWriteOptions::default();
    let IpcMessage(bytes) = SchemaAsIpc::new(schema, &options)
        .try_into()
        .map_err(|e: arrow_schema::ArrowError| Status::internal(e.to_string()))?;
    Ok(bytes)
}

#[tonic::async_trait]
impl FlightSqlService for Served {
    type FlightService = Served;

    async fn do_handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>, Status> {
        Err(Status::unimplemented(
            "dlframe serve has no handshake: send the token in the header 'authorization: Bearer TOKEN'",
        ))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let asked = Instant::now();
        let owner = caller(&request);
        // Planning takes a slot as running does: the limits on running queries bound it too.
        let _slot = self.runner.slot(asked).await.map_err(|e| self.status(e))?;
        let plan = self.plan_sql(&self.state, &query.query, None).await.map_err(|e| self.status(e))?;
        let body = TicketBody { sql: Some(query.query), ..TicketBody::default() };
        Ok(Response::new(self.flight_info(&plan, body, request.into_inner(), asked, owner).await?))
    }

    async fn get_flight_info_substrait_plan(
        &self,
        query: CommandStatementSubstraitPlan,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let asked = Instant::now();
        let owner = caller(&request);
        let bytes = query.plan.map(|p| p.plan).unwrap_or_default();
        // Planning takes a slot as running does: the limits on running queries bound it too.
        let _slot = self.runner.slot(asked).await.map_err(|e| self.status(e))?;
        let plan = self.plan_substrait(&self.state, &bytes).await.map_err(|e| self.status(e))?;
        let body = TicketBody { substrait: Some(bytes.to_vec()), ..TicketBody::default() };
        Ok(Response::new(self.flight_info(&plan, body, request.into_inner(), asked, owner).await?))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let asked = Instant::now();
        let owner = caller(&request);
        // Planning takes a slot as running does: the limits on running queries bound it too.
        let _slot = self.runner.slot(asked).await.map_err(|e| self.status(e))?;
        let p = self.prepared.get(&cmd.prepared_statement_handle, &owner).map_err(|e| self.status(e))?;
        let plan = self.plan_sql(&self.state, &p.sql, p.params).await.map_err(|e| self.status(e))?;
        let body =
            TicketBody { prepared: Some(cmd.prepared_statement_handle.to_vec()), ..TicketBody::default() };
        Ok(Response::new(self.flight_info(&plan, body, request.into_inner(), asked, owner).await?))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let body = TicketBody::decode(ticket.statement_handle)
            .map_err(|_| self.status(ServeError::BadRequest("a malformed ticket".into())))?;
        let stream = self.run(body, super::auth::peer(&request)).await.map_err(|e| self.status(e))?;
        Ok(Response::new(stream))
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let body = TicketBody {
            id: new_id().to_vec(),
            prepared: Some(query.prepared_statement_handle.to_vec()),
            ..TicketBody::default()
        };
        let stream = self.run(body, super::auth::peer(&request)).await.map_err(|e| self.status(e))?;
        Ok(Response::new(stream))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        catalog::command_info(query, &schema, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one_batch(catalog::catalogs(&self.state, query))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        catalog::command_info(query, &schema, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one_batch(catalog::schemas(&self.state, query))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        catalog::command_info(query, &schema, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one_batch(catalog::tables(&self.state, query).await?)
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        catalog::command_info(query, &schema, request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one_batch(catalog::table_types(query))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        catalog::command_info(query, &schema, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        one_batch(query.into_builder(&self.sql_info).build())
    }

    async fn do_put_statement_update(
        &self,
        _c: CommandStatementUpdate,
        _r: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.status(ServeError::ReadOnly("an update statement (CommandStatementUpdate)".into())))
    }

    async fn do_put_statement_ingest(
        &self,
        _c: CommandStatementIngest,
        _r: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.status(ServeError::ReadOnly("bulk ingestion (CommandStatementIngest)".into())))
    }

    async fn do_put_prepared_statement_update(
        &self,
        _c: CommandPreparedStatementUpdate,
        _r: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.status(ServeError::ReadOnly("a prepared update (CommandPreparedStatementUpdate)".into())))
    }

    async fn do_put_substrait_plan(
        &self,
        _c: CommandStatementSubstraitPlan,
        _r: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(self.status(ServeError::ReadOnly("a Substrait update (DoPut)".into())))
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let handle = query.prepared_statement_handle;
        let owner = caller(&request);
        self.prepared.get(&handle, &owner).map_err(|e| self.status(e))?;
        let params = tokio::time::timeout(PARAMETER_TIME, read_parameters(request.into_inner()))
            .await
            .map_err(|_| {
                self.status(ServeError::BadRequest("prepared statement parameters: sent too slowly".into()))
            })?
            .map_err(|e| self.status(e))?;
        self.prepared.bind(&handle, &owner, params).map_err(|e| self.status(e))?;
        Ok(DoPutPreparedStatementResult { prepared_statement_handle: Some(handle) })
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        // Planning takes a slot as running does: the limits on running queries bound it too.
        let _slot = self.runner.slot(Instant::now()).await.map_err(|e| self.status(e))?;
        let plan = self.plan_sql(&self.state, &query.query, None).await.map_err(|e| self.status(e))?;
        let parameters = parameter_schema(&plan).map_err(|e| self.status(e))?;
        let dataset = plan.schema().as_arrow().clone();
        let handle = self.prepared.insert(query.query, caller(&request));
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.to_vec().into(),
            dataset_schema: schema_bytes(&dataset)?,
            parameter_schema: schema_bytes(&parameters)?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        self.prepared.close(&query.prepared_statement_handle, &caller(&request));
        Ok(())
    }

    async fn do_action_create_prepared_substrait_plan(
        &self,
        _query: ActionCreatePreparedSubstraitPlanRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        Err(Status::unimplemented("prepared Substrait plans are not supported: send the plan as a statement"))
    }

    async fn do_action_begin_transaction(
        &self,
        _query: ActionBeginTransactionRequest,
        _request: Request<Action>,
    ) -> Result<ActionBeginTransactionResult, Status> {
        Err(self.status(ServeError::ReadOnly("a transaction".into())))
    }

    async fn do_action_begin_savepoint(
        &self,
        _query: ActionBeginSavepointRequest,
        _request: Request<Action>,
    ) -> Result<ActionBeginSavepointResult, Status> {
        Err(self.status(ServeError::ReadOnly("a savepoint".into())))
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let info =
            FlightInfo::decode(query.info).map_err(|_| Status::invalid_argument("a malformed FlightInfo"))?;
        // The deprecated action's result codes: CANCEL_RESULT_CANCELLED (1) and
        // CANCEL_RESULT_NOT_CANCELLABLE (3), which arrow-flight does not export by name.
        let result = match self.cancel_all(&info, &caller(&request)) {
            CancelStatus::Cancelled => 1,
            _ => 3,
        };
        Ok(ActionCancelQueryResult { result })
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<<Self as FlightService>::DoActionStream>, Status> {
        let owner = caller(&request);
        let action = request.into_inner();
        if action.r#type != "CancelFlightInfo" {
            return Err(Status::invalid_argument(format!("unknown action {:?}", action.r#type)));
        }
        let req = CancelFlightInfoRequest::decode(action.body)
            .map_err(|_| Status::invalid_argument("a malformed CancelFlightInfoRequest"))?;
        let info =
            req.info.ok_or_else(|| Status::invalid_argument("CancelFlightInfo without a FlightInfo"))?;
        let result = CancelFlightInfoResult { status: self.cancel_all(&info, &owner).into() };
        let out = arrow_flight::Result { body: result.encode_to_vec().into() };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(out)]))))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

impl Served {
    /// Cancels the running queries of `info`'s tickets that `caller` asked for.
    fn cancel_all(&self, info: &FlightInfo, caller: &Owner) -> CancelStatus {
        let ids = TicketBody::ids_of(info);
        if ids.is_empty() {
            return CancelStatus::NotCancellable;
        }
        let mut any = false;
        for id in &ids {
            any |= self.runner.cancel(id, caller);
        }
        if any { CancelStatus::Cancelled } else { CancelStatus::NotCancellable }
    }
}

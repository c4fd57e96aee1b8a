//! One query of the Flight SQL service, run within the server's bounds: a session of its own
//! whose memory pool its functions charge, its plan optimized, its calls bounded and its
//! constants counted, every operator paced to the deadline, and its batches encoded as they come
//! from the runner's threads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_schema::SchemaRef;
use datafusion::execution::SessionState;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_plan::{ExecutionPlanProperties, execute_stream};
use futures::{StreamExt, TryStreamExt};
use tonic::Status;

use super::super::bounded::QueryMemory;
use super::super::error::ServeError;
use super::super::functions::{bound_plan, check_constants};
use super::super::paced::pace;
use super::super::run::{QueryId, QueryLog};
use super::super::ticket::TicketBody;
use super::{DoGetStream, Served};

impl Served {
    /// A session for one query: the server's tables and functions, with the query's own
    /// memory pool.
    fn query_state(&self) -> Result<SessionState, ServeError> {
        let pool = self.runner.query_pool();
        let runtime = RuntimeEnvBuilder::from_runtime_env(self.state.runtime_env())
            .with_memory_pool(pool.clone())
            .build_arc()?;
        // The functions it calls charge their results to the same pool (`bounded`).
        // (The server's catalog exists: a fresh default one would hide its tables.)
        let mut config = self.state.config().clone().with_create_default_catalog_and_schema(false);
        config.options_mut().extensions.insert(QueryMemory(pool));
        Ok(SessionStateBuilder::new_from_existing(self.state.clone())
            .with_config(config)
            .with_runtime_env(runtime)
            .build())
    }

    /// Runs what `body` asks for, within the server's bounds.
    pub(super) async fn run(
        &self,
        body: TicketBody,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<DoGetStream, ServeError> {
        // The deadline counts the time its GetFlightInfo call already spent waiting.
        let now = Instant::now();
        let waited = Duration::from_millis(body.waited_ms.unwrap_or(0)).min(self.runner.limits().timeout);
        let started = now.checked_sub(waited).unwrap_or(now);
        let id: QueryId =
            body.id.as_slice().try_into().map_err(|_| ServeError::BadRequest("a malformed ticket".into()))?;
        let mut log = QueryLog::new(peer, body.sql.as_deref().unwrap_or("<prepared or substrait>"), started);
        log.partition = body.partition.map(|i| (i.saturating_add(1), body.partitions));
        let body_owner = body.asked_by();
        let outcome = async {
            let slot = self.runner.slot(started).await?;
            let state = self.query_state()?;
            let (plan, sql) = self.plan_ticket(&state, &body).await?;
            let schema: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
            // Optimized, its calls bounded, then planned (with no second optimization).
            let plan = bound_plan(state.optimize(&plan)?, &self.rules)?;
            let physical = state.query_planner().create_physical_plan(&plan, &state).await?;
            let options = state.config_options();
            let constants = check_constants(
                &physical,
                options.execution.batch_size.get(),
                self.runner.limits().query_memory,
            )?;
            // Every operator yields often and ends at the deadline, however little it emits.
            let physical = pace(physical, started + self.runner.limits().timeout)?;
            // The rows' copies of the constants are the query's memory while it runs.
            let held = MemoryConsumer::new("constants").register(&state.runtime_env().memory_pool);
            held.try_grow(constants as usize)?;
            if let Some(i) = body.partition {
                let n = physical.output_partitioning().partition_count();
                if n != body.partitions as usize || i as usize >= n {
                    return Err(ServeError::BadRequest(format!(
                        "the query's plan has {n} partitions now, not the {} of its FlightInfo (the \
                         tables changed): ask for the FlightInfo again",
                        body.partitions
                    )));
                }
            }
            // Executed on the runner's threads, where the tasks it spawns run too.
            let task = state.task_ctx();
            let start = move || {
                let stream = match body.partition {
                    None => execute_stream(physical, task)?,
                    Some(i) => physical.execute(i as usize, task)?,
                };
                Ok(stream.map(move |batch| {
                    let _constants = &held;
                    batch
                }))
            };
            Ok::<_, ServeError>((slot, sql, schema, start))
        }
        .await;
        let (slot, sql, schema, start) = match outcome {
            Ok(x) => x,
            Err(e) => {
                log.error = Some(e.to_string());
                log.write();
                return Err(e);
            }
        };
        log.what = QueryLog::new(peer, &sql, started).what;
        let watched = self.runner.run(id, body_owner, start, slot, log);
        let scrub = self.scrub.clone();
        let batches = watched.map_err(move |e| FlightError::Tonic(Box::new(e.to_status(&scrub))));
        let data = FlightDataEncoderBuilder::new().with_schema(schema).build(batches).map_err(|e| match e {
            FlightError::Tonic(status) => *status,
            other => Status::internal(other.to_string()),
        });
        Ok(Box::pin(data))
    }
}

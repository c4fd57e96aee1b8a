//! The prepared statements of `dlframe serve`: kept on the server under random handles, with
//! their SQL and their bound parameters, which the client never holds; and the reading of
//! parameters a client binds, bounded before anything is decoded or kept.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use arrow_array::RecordBatch;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_schema::{DataType, Field, Schema};
use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::scalar::ScalarValue;
use futures::{StreamExt, TryStreamExt};

use super::error::ServeError;
use super::run::{QueryId, new_id};

/// The most prepared statements the server holds; past it, the oldest is dropped.
const MAX_PREPARED: usize = 1024;
/// The most parameters one prepared statement takes.
const MAX_PARAMETERS: usize = 1024;
/// The most bytes of parameter values one prepared statement keeps.
const MAX_PARAMETER_BYTES: usize = 1 << 20;
/// The most messages a client may send to bind parameters.
const MAX_PARAMETER_MESSAGES: usize = 64;
/// How long a client may take to send its parameters.
pub(crate) const PARAMETER_TIME: std::time::Duration = std::time::Duration::from_secs(60);

/// A prepared statement the server holds for a client.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub sql: String,
    pub params: Option<ParamValues>,
}

/// The prepared statements, by handle, with the order they were made in (for eviction).
#[derive(Default)]
struct Table {
    by_handle: HashMap<QueryId, Prepared>,
    order: VecDeque<QueryId>,
}

/// The server's prepared statements: at most [`MAX_PREPARED`], the oldest dropped past that.
#[derive(Default)]
pub(crate) struct PreparedStatements(Mutex<Table>);

impl PreparedStatements {
    /// The statement under `handle`.
    pub(crate) fn get(&self, handle: &[u8]) -> Result<Prepared, ServeError> {
        let key: QueryId = handle.try_into().map_err(|_| ServeError::UnknownHandle)?;
        self.0.lock().expect("not poisoned").by_handle.get(&key).cloned().ok_or(ServeError::UnknownHandle)
    }

    /// Keeps `sql` (already checked) and returns its new handle.
    pub(crate) fn insert(&self, sql: String) -> QueryId {
        let handle = new_id();
        let mut table = self.0.lock().expect("not poisoned");
        while table.by_handle.len() >= MAX_PREPARED {
            let Some(oldest) = table.order.pop_front() else { break };
            table.by_handle.remove(&oldest);
        }
        table.by_handle.insert(handle, Prepared { sql, params: None });
        table.order.push_back(handle);
        handle
    }

    /// Binds `params` to the statement under `handle`.
    pub(crate) fn bind(&self, handle: &[u8], params: Option<ParamValues>) -> Result<(), ServeError> {
        let key: QueryId = handle.try_into().map_err(|_| ServeError::UnknownHandle)?;
        let mut table = self.0.lock().expect("not poisoned");
        table.by_handle.get_mut(&key).ok_or(ServeError::UnknownHandle)?.params = params;
        Ok(())
    }

    /// Drops the statement under `handle`, if the server holds one.
    pub(crate) fn close(&self, handle: &[u8]) {
        if let Ok(key) = QueryId::try_from(handle) {
            let mut table = self.0.lock().expect("not poisoned");
            if table.by_handle.remove(&key).is_some() {
                table.order.retain(|k| *k != key);
            }
        }
    }
}

/// Reads bound parameters: one row of at most [`MAX_PARAMETERS`] values, of at most
/// [`MAX_PARAMETER_BYTES`], checked before any value is taken from them.
pub(crate) async fn read_parameters(
    stream: PeekableFlightDataStream,
) -> Result<Option<ParamValues>, ServeError> {
    let bad = |m: String| ServeError::BadRequest(format!("prepared statement parameters: {m}"));
    // Every message counts, dictionaries included, before it is decoded.
    let (mut messages, mut bytes) = (0usize, 0usize);
    let counted = stream.map_err(FlightError::from).map(move |data| {
        let data = data?;
        messages += 1;
        bytes += data.data_header.len() + data.data_body.len() + data.app_metadata.len();
        if messages > MAX_PARAMETER_MESSAGES || bytes > 2 * MAX_PARAMETER_BYTES {
            return Err(FlightError::ProtocolError(format!(
                "more than {MAX_PARAMETER_MESSAGES} messages or {} bytes",
                2 * MAX_PARAMETER_BYTES
            )));
        }
        Ok(data)
    });
    let mut batches = FlightRecordBatchStream::new_from_flight_data(counted);
    let mut row: Option<RecordBatch> = None;
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        if batch.num_rows() == 0 {
            continue;
        }
        if batch.num_rows() > 1 || row.is_some() {
            return Err(bad(
                "one row of values is taken; several rows (a batch of executions) are not".into()
            ));
        }
        if batch.num_columns() > MAX_PARAMETERS {
            return Err(bad(format!("{} values, over the limit of {MAX_PARAMETERS}", batch.num_columns())));
        }
        let size = batch.get_array_memory_size();
        if size > MAX_PARAMETER_BYTES {
            return Err(bad(format!("{size} bytes, over the limit of {MAX_PARAMETER_BYTES}")));
        }
        row = Some(batch);
    }
    let Some(row) = row else { return Ok(None) };
    let values = row
        .columns()
        .iter()
        .map(|c| ScalarValue::try_from_array(c, 0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    Ok(Some(ParamValues::List(values.into_iter().map(Into::into).collect())))
}

/// The parameters of `plan` as a schema, `$1`, `$2`, ... in order.
pub(crate) fn parameter_schema(plan: &LogicalPlan) -> Result<Schema, ServeError> {
    let mut params: Vec<(String, Option<DataType>)> = plan.get_parameter_types()?.into_iter().collect();
    params.sort_by_key(|(name, _)| name.trim_start_matches('$').parse::<usize>().unwrap_or(usize::MAX));
    Ok(Schema::new(
        params
            .into_iter()
            .map(|(name, t)| Field::new(name, t.unwrap_or(DataType::Null), true))
            .collect::<Vec<_>>(),
    ))
}

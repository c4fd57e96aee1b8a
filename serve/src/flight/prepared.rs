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

use super::conn::Owner;
use super::error::ServeError;
use super::run::{QueryId, new_id};

/// The most prepared statements the server holds; past it, the oldest of the caller that
/// holds the most is dropped.
const MAX_PREPARED: usize = 1024;
/// The most prepared statements one caller (connection) holds; past it, its oldest is dropped.
const MAX_PER_CALLER: usize = 128;
/// The most parameters one prepared statement takes.
const MAX_PARAMETERS: usize = 1024;
/// The most bytes of parameter values one prepared statement keeps.
const MAX_PARAMETER_BYTES: usize = 1 << 20;
/// The most bytes of parameter values all prepared statements keep together.
const MAX_ALL_PARAMETER_BYTES: usize = 64 << 20;
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

/// One statement, its owner, and the bytes of its bound parameters.
struct Entry {
    prepared: Prepared,
    owner: Owner,
    bytes: usize,
}

/// The prepared statements, by handle, with the order they were made in (for eviction) and
/// the bytes of their parameters.
#[derive(Default)]
struct Table {
    by_handle: HashMap<QueryId, Entry>,
    order: VecDeque<QueryId>,
    bytes: usize,
}

impl Table {
    fn remove(&mut self, key: &QueryId) {
        if let Some(e) = self.by_handle.remove(key) {
            self.bytes -= e.bytes;
            self.order.retain(|k| k != key);
        }
    }

    /// The oldest statement of `owner`.
    fn oldest_of(&self, owner: &Owner) -> Option<QueryId> {
        self.order.iter().find(|k| self.by_handle.get(*k).is_some_and(|e| e.owner == *owner)).copied()
    }

    /// The statement under `handle`, if `owner` holds it: another's is as unknown as none.
    fn owned(&mut self, handle: &[u8], owner: &Owner) -> Result<&mut Entry, ServeError> {
        let key: QueryId = handle.try_into().map_err(|_| ServeError::UnknownHandle)?;
        self.by_handle.get_mut(&key).filter(|e| e.owner == *owner).ok_or(ServeError::UnknownHandle)
    }
}

/// The server's prepared statements, each held by the caller that made it and usable by it
/// alone: at most [`MAX_PER_CALLER`] each and [`MAX_PREPARED`] in all, where the caller that
/// holds the most loses its oldest, so a caller that makes thousands evicts only its own.
#[derive(Default)]
pub(crate) struct PreparedStatements(Mutex<Table>);

impl PreparedStatements {
    /// The statement under `handle`, if `owner` holds it.
    pub(crate) fn get(&self, handle: &[u8], owner: &Owner) -> Result<Prepared, ServeError> {
        Ok(self.0.lock().expect("not poisoned").owned(handle, owner)?.prepared.clone())
    }

    /// Keeps `sql` (already checked) for `owner` and returns its new handle.
    pub(crate) fn insert(&self, sql: String, owner: Owner) -> QueryId {
        let handle = new_id();
        let mut table = self.0.lock().expect("not poisoned");
        let own = table.by_handle.values().filter(|e| e.owner == owner).count();
        if own >= MAX_PER_CALLER
            && let Some(oldest) = table.oldest_of(&owner)
        {
            table.remove(&oldest);
        }
        while table.by_handle.len() >= MAX_PREPARED {
            let mut counts: HashMap<Owner, usize> = HashMap::new();
            for e in table.by_handle.values() {
                *counts.entry(e.owner).or_default() += 1;
            }
            let most = counts.into_iter().max_by_key(|&(_, n)| n).map(|(o, _)| o);
            let Some(oldest) = most.and_then(|o| table.oldest_of(&o)) else { break };
            table.remove(&oldest);
        }
        table.by_handle.insert(handle, Entry { prepared: Prepared { sql, params: None }, owner, bytes: 0 });
        table.order.push_back(handle);
        handle
    }

    /// Binds `params` to `owner`'s statement under `handle`.
    ///
    /// # Errors
    /// [`ServeError::UnknownHandle`] for a handle `owner` does not hold; [`ServeError::Limit`]
    /// when the parameters of all statements would pass [`MAX_ALL_PARAMETER_BYTES`].
    pub(crate) fn bind(
        &self,
        handle: &[u8],
        owner: &Owner,
        params: Option<ParamValues>,
    ) -> Result<(), ServeError> {
        let bytes = params.as_ref().map_or(0, param_bytes);
        let mut table = self.0.lock().expect("not poisoned");
        let held = table.bytes;
        let entry = table.owned(handle, owner)?;
        let after = held - entry.bytes + bytes;
        if after > MAX_ALL_PARAMETER_BYTES {
            return Err(ServeError::Limit(format!(
                "the prepared statements' parameters would take {after} bytes, past the server's \
                 {MAX_ALL_PARAMETER_BYTES}: close statements you no longer need"
            )));
        }
        entry.prepared.params = params;
        entry.bytes = bytes;
        table.bytes = after;
        Ok(())
    }

    /// Drops `owner`'s statement under `handle`, if it holds one.
    pub(crate) fn close(&self, handle: &[u8], owner: &Owner) {
        let mut table = self.0.lock().expect("not poisoned");
        if table.owned(handle, owner).is_ok()
            && let Ok(key) = QueryId::try_from(handle)
        {
            table.remove(&key);
        }
    }
}

/// The bytes bound parameters keep.
fn param_bytes(params: &ParamValues) -> usize {
    match params {
        ParamValues::List(values) => values.iter().map(|v| v.value.size()).sum(),
        ParamValues::Map(values) => values.iter().map(|(k, v)| k.len() + v.value.size()).sum(),
    }
}

/// The bytes an IPC message's body holds once decoded: each buffer's length, or for a
/// compressed one the uncompressed length its 8-byte prefix says, read before anything is
/// decoded (a prefix that says 800 GB would otherwise be allocated by the decompressor).
///
/// # Errors
/// A header that is no IPC message, or a buffer outside the body.
fn decoded_size(header: &[u8], body: &[u8]) -> Result<u64, String> {
    use datafusion::arrow::ipc::{MessageHeader, root_as_message};
    let message = root_as_message(header).map_err(|e| format!("not an Arrow IPC message: {e}"))?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message.header_as_dictionary_batch().and_then(|d| d.data()),
        _ => None,
    };
    let Some(batch) = batch else { return Ok(0) };
    let compressed = batch.compression().is_some();
    let mut total = 0u64;
    for b in batch.buffers().into_iter().flatten() {
        let (at, len) = (usize::try_from(b.offset()), usize::try_from(b.length()));
        let (Ok(at), Ok(len)) = (at, len) else {
            return Err("a buffer with a negative offset or length".into());
        };
        let bytes =
            at.checked_add(len).and_then(|end| body.get(at..end)).ok_or("a buffer outside the body")?;
        total = total.saturating_add(match bytes.first_chunk::<8>() {
            // -1: stored uncompressed after the prefix.
            Some(prefix) if compressed => match i64::from_le_bytes(*prefix) {
                -1 => (len - 8) as u64,
                n => u64::try_from(n).map_err(|_| format!("a compressed buffer of length {n}"))?,
            },
            _ => len as u64,
        });
    }
    Ok(total)
}

/// Reads bound parameters: one row of at most [`MAX_PARAMETERS`] values, of at most
/// [`MAX_PARAMETER_BYTES`], checked before any value is taken from them: every message's size
/// on the wire and once decoded (decompressed) counts before it is decoded.
pub(crate) async fn read_parameters(
    stream: PeekableFlightDataStream,
) -> Result<Option<ParamValues>, ServeError> {
    let bad = |m: String| ServeError::BadRequest(format!("prepared statement parameters: {m}"));
    // Every message counts, dictionaries included, before it is decoded.
    let (mut messages, mut bytes, mut decoded) = (0usize, 0u64, 0u64);
    let limit = 2 * MAX_PARAMETER_BYTES as u64;
    let counted = stream.map_err(FlightError::from).map(move |data| {
        let data = data?;
        messages += 1;
        let size = decoded_size(&data.data_header, &data.data_body).map_err(FlightError::ProtocolError)?;
        decoded = decoded.saturating_add(size);
        bytes += (data.data_header.len() + data.data_body.len() + data.app_metadata.len()) as u64;
        if messages > MAX_PARAMETER_MESSAGES || bytes > limit || decoded > limit {
            return Err(FlightError::ProtocolError(format!(
                "more than {MAX_PARAMETER_MESSAGES} messages or {limit} bytes (sent, or once decompressed)"
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array};
    use datafusion::arrow::ipc::writer::{
        DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
    };
    use datafusion::arrow::ipc::{CompressionType, root_as_message};

    use super::*;

    #[test]
    fn a_caller_that_makes_thousands_evicts_its_own_and_parameters_have_a_budget() {
        let store = PreparedStatements::default();
        let (a, b): (Owner, Owner) = (Some([1; 16]), Some([2; 16]));
        let mine: Vec<QueryId> = (0..10).map(|i| store.insert(format!("SELECT {i}"), a)).collect();
        let theirs: Vec<QueryId> = (0..5000).map(|_| store.insert("SELECT 1".into(), b)).collect();
        // B keeps its newest MAX_PER_CALLER; A keeps all of its own.
        assert!(mine.iter().all(|h| store.get(h, &a).is_ok()));
        let kept = theirs.iter().filter(|h| store.get(*h, &b).is_ok()).count();
        assert_eq!(kept, MAX_PER_CALLER);
        assert!(store.get(&theirs[4999], &b).is_ok() && store.get(&theirs[0], &b).is_err());
        // Another's handle is unknown, for reading, binding and closing.
        assert!(matches!(store.get(&mine[0], &b), Err(ServeError::UnknownHandle)));
        assert!(matches!(store.bind(&mine[0], &b, None), Err(ServeError::UnknownHandle)));
        store.close(&mine[0], &b);
        assert!(store.get(&mine[0], &a).is_ok());
        // 1 MB of parameters each: the 65th statement's would pass the server's 64 MB.
        let big = || {
            let value = ScalarValue::Utf8(Some("x".repeat(MAX_PARAMETER_BYTES - 200)));
            Some(ParamValues::List(vec![value.into()]))
        };
        let handles: Vec<QueryId> = (0..70).map(|_| store.insert("SELECT $1".into(), a)).collect();
        let bound = handles.iter().take_while(|h| store.bind(*h, &a, big()).is_ok()).count();
        assert_eq!(bound, MAX_ALL_PARAMETER_BYTES / MAX_PARAMETER_BYTES);
        assert!(matches!(store.bind(&handles[bound], &a, big()), Err(ServeError::Limit(_))));
        // Rebinding smaller, or closing, gives the bytes back.
        store.bind(&handles[0], &a, None).unwrap();
        store.bind(&handles[bound], &a, big()).unwrap();
        store.close(&handles[1], &a);
        store.bind(&handles[bound + 1], &a, big()).unwrap();
    }

    /// A record batch of `n` int64 values as an IPC message, LZ4-compressed when asked.
    fn encoded(n: i64, lz4: bool) -> (Vec<u8>, Vec<u8>) {
        let batch =
            RecordBatch::try_from_iter([("$1", Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef)])
                .unwrap();
        let mut options = IpcWriteOptions::default();
        if lz4 {
            options = options.try_with_compression(Some(CompressionType::LZ4_FRAME)).unwrap();
        }
        let mut tracker = DictionaryTracker::new(false);
        let mut context = IpcWriteContext::default();
        let (_, data) =
            IpcDataGenerator::default().encode(&batch, &mut tracker, &options, &mut context).unwrap();
        (data.ipc_message, data.arrow_data)
    }

    #[test]
    fn a_body_is_measured_as_it_would_be_decoded_before_it_is() {
        // 8,000 bytes of values and a validity bitmap of 125 bytes, which the writer writes in full.
        let (header, body) = encoded(1000, false);
        assert_eq!(decoded_size(&header, &body).unwrap(), 8125);
        let (header, mut body) = encoded(1000, true);
        assert!(body.len() < 8000, "compressed: {}", body.len());
        assert_eq!(decoded_size(&header, &body).unwrap(), 8125);
        // The values buffer's prefix now says 800 GB: measured, not allocated.
        let message = root_as_message(&header).unwrap();
        let buffers = message.header_as_record_batch().unwrap().buffers().unwrap();
        let values = buffers.get(buffers.len() - 1);
        let at = values.offset() as usize;
        body[at..at + 8].copy_from_slice(&800_000_000_000i64.to_le_bytes());
        assert_eq!(decoded_size(&header, &body).unwrap(), 800_000_000_125);
        assert!(decoded_size(&header, &body[..at]).unwrap_err().contains("outside the body"));
        assert!(decoded_size(b"not flatbuffers", &body).is_err());
    }
}

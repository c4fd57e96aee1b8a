//! A ticket of `dlframe serve`: what a FlightInfo's endpoint asks the server to run, encoded
//! into a standard `TicketStatementQuery`'s handle. The server writes it and reads it back; a
//! client may change it, so everything in it is checked again when it runs.

use arrow_flight::sql::{Any, ProstMessageExt, TicketStatementQuery};
use arrow_flight::{FlightEndpoint, FlightInfo, Ticket};
use prost::Message;

use super::conn::Owner;
use super::run::{QueryId, new_id};

/// What a ticket asks for: the query's id and what to run.
#[derive(Clone, PartialEq, Message)]
pub(super) struct TicketBody {
    #[prost(bytes = "vec", tag = "1")]
    pub id: Vec<u8>,
    #[prost(string, optional, tag = "2")]
    pub sql: Option<String>,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub prepared: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub substrait: Option<Vec<u8>>,
    /// The one partition of the plan to run, for a partitioned result.
    #[prost(uint32, optional, tag = "5")]
    pub partition: Option<u32>,
    /// How many partitions the plan had when the FlightInfo was made.
    #[prost(uint32, tag = "6")]
    pub partitions: u32,
    /// Milliseconds the query already spent waiting and planning in its GetFlightInfo call,
    /// which its run's deadline counts. A client that changes it can only shorten its own.
    #[prost(uint64, optional, tag = "7")]
    pub waited_ms: Option<u64>,
    /// The caller that asked for the FlightInfo: its prepared statement is the one the ticket
    /// runs, and it alone may cancel the query.
    #[prost(bytes = "vec", optional, tag = "8")]
    pub owner: Option<Vec<u8>>,
}

impl TicketBody {
    /// The caller the ticket was made for.
    pub fn asked_by(&self) -> Owner {
        self.owner.as_deref().and_then(|o| o.try_into().ok())
    }

    /// The endpoints that run this body: one, or one per partition of the plan, each with a
    /// query id of its own.
    pub fn endpoints(mut self, partitions: Option<usize>) -> impl Iterator<Item = FlightEndpoint> {
        (0..partitions.unwrap_or(1)).map(move |partition| {
            self.id = new_id().to_vec();
            self.partition = partitions.map(|_| partition as u32);
            self.partitions = partitions.unwrap_or(1) as u32;
            let ticket = TicketStatementQuery { statement_handle: self.encode_to_vec().into() };
            FlightEndpoint::new().with_ticket(Ticket { ticket: ticket.as_any().encode_to_vec().into() })
        })
    }

    /// The query ids named by the tickets of `info`.
    pub fn ids_of(info: &FlightInfo) -> Vec<QueryId> {
        info.endpoint
            .iter()
            .filter_map(|e| e.ticket.as_ref())
            .filter_map(|t| Any::decode(t.ticket.clone()).ok())
            .filter_map(|any| any.unpack::<TicketStatementQuery>().ok().flatten())
            .filter_map(|t| TicketBody::decode(t.statement_handle).ok())
            .filter_map(|b| QueryId::try_from(b.id.as_slice()).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_names_its_partition_and_an_id_of_its_own() {
        let body = TicketBody { sql: Some("SELECT 1".into()), ..TicketBody::default() };
        let info = body.clone().endpoints(Some(3)).fold(FlightInfo::new(), FlightInfo::with_endpoint);
        let ids = TicketBody::ids_of(&info);
        assert_eq!(ids.len(), 3);
        assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
        let one = body.endpoints(None).fold(FlightInfo::new(), FlightInfo::with_endpoint);
        assert_eq!(TicketBody::ids_of(&one).len(), 1);
    }
}

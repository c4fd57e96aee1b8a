//! The catalog calls of `dlframe serve` (catalogs, schemas, tables, table types, SQL info):
//! each answer is one record batch of what the server serves, sorted, and its FlightInfo's one
//! ticket is the command itself. Reads the session's catalog only.

use arrow_array::RecordBatch;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetTableTypes, CommandGetTables, ProstMessageExt, SqlInfo,
};
use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use arrow_schema::Schema;
use datafusion::datasource::TableType;
use datafusion::execution::SessionState;
use prost::Message;
use tonic::{Response, Status};

type Batch = arrow_flight::error::Result<RecordBatch>;

/// What the server says of itself to `GetSqlInfo`.
pub(super) fn sql_info() -> SqlInfoData {
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "dlframe serve");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    info.append(SqlInfo::FlightSqlServerArrowVersion, "59");
    info.append(SqlInfo::FlightSqlServerReadOnly, true);
    info.append(SqlInfo::FlightSqlServerSql, true);
    info.append(SqlInfo::FlightSqlServerSubstrait, true);
    info.append(SqlInfo::FlightSqlServerTransaction, 0i32);
    info.append(SqlInfo::FlightSqlServerCancel, true);
    info.build().expect("static SQL info")
}

/// A FlightInfo whose one ticket is `command` itself.
pub(super) fn command_info(
    command: impl ProstMessageExt,
    schema: &Schema,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let ticket = Ticket { ticket: command.as_any().encode_to_vec().into() };
    let info = FlightInfo::new()
        .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
        .with_descriptor(descriptor)
        .try_with_schema(schema)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(info))
}

/// The catalogs' names.
pub(super) fn catalogs(state: &SessionState, query: CommandGetCatalogs) -> Batch {
    let mut b = query.into_builder();
    let mut names = state.catalog_list().catalog_names();
    names.sort();
    names.into_iter().for_each(|c| b.append(c));
    b.build()
}

/// Every (catalog, schema) pair.
pub(super) fn schemas(state: &SessionState, query: CommandGetDbSchemas) -> Batch {
    let mut b = query.into_builder();
    let catalogs = state.catalog_list();
    let mut pairs = vec![];
    for c in catalogs.catalog_names() {
        if let Some(catalog) = catalogs.catalog(&c) {
            pairs.extend(catalog.schema_names().into_iter().map(|s| (c.clone(), s)));
        }
    }
    pairs.sort();
    pairs.into_iter().for_each(|(c, s)| b.append(c, s));
    b.build()
}

/// Every table, with its kind and schema.
pub(super) async fn tables(state: &SessionState, query: CommandGetTables) -> Result<Batch, Status> {
    let mut b = query.into_builder();
    let catalogs = state.catalog_list();
    for (c, s, t) in names(state) {
        let Some(schema) = catalogs.catalog(&c).and_then(|cat| cat.schema(&s)) else { continue };
        let Ok(Some(table)) = schema.table(&t).await else { continue };
        b.append(&c, &s, &t, kind(table.table_type()), table.schema().as_ref())
            .map_err(|e| Status::internal(e.to_string()))?;
    }
    Ok(b.build())
}

/// The table types, in their sorted order: a name for each of DataFusion's kinds.
pub(super) fn table_types(query: CommandGetTableTypes) -> Batch {
    let mut b = query.into_builder();
    [TableType::Temporary, TableType::Base, TableType::View].into_iter().for_each(|t| b.append(kind(t)));
    b.build()
}

/// The name Flight SQL gives a kind of table.
fn kind(t: TableType) -> &'static str {
    match t {
        TableType::Base => "TABLE",
        TableType::View => "VIEW",
        TableType::Temporary => "LOCAL TEMPORARY",
    }
}

/// Every (catalog, schema, table) the server serves, sorted.
fn names(state: &SessionState) -> Vec<(String, String, String)> {
    let catalogs = state.catalog_list();
    let mut out = vec![];
    for c in catalogs.catalog_names() {
        let Some(catalog) = catalogs.catalog(&c) else { continue };
        for s in catalog.schema_names() {
            let Some(schema) = catalog.schema(&s) else { continue };
            for t in schema.table_names() {
                out.push((c.clone(), s.clone(), t));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;

    use super::*;

    #[test]
    fn the_table_types_are_the_names_of_the_kinds_sorted() {
        let batch = table_types(CommandGetTableTypes {}).unwrap();
        let names: Vec<&str> = batch.column(0).as_string::<i32>().iter().flatten().collect();
        assert_eq!(names, ["LOCAL TEMPORARY", "TABLE", "VIEW"]);
        assert_eq!(kind(TableType::View), "VIEW");
    }
}

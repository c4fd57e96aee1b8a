//! Every error `dlframe serve` sends, mapped to a gRPC status in this one place.
//!
//! A client reads Display text, never a Rust debug dump: DataFusion's error is reduced to its
//! root and written with `Display`, and the paths of the served tables are replaced by the
//! table's name, so an error does not tell a client where the server keeps its files.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;
use tonic::Status;

/// Why a call failed.
#[derive(Debug)]
pub(crate) enum ServeError {
    /// A statement that is not a query: `what` names it (`DDL (CreateExternalTable)`, `COPY`).
    ReadOnly(String),
    /// A limit of the query's text or shape (`--max-sql-bytes`, `--max-depth`, ...).
    Limit(String),
    /// A malformed request: a ticket, a handle, parameters.
    BadRequest(String),
    /// A prepared statement that this server does not hold (closed, evicted, or never made).
    UnknownHandle,
    /// More queries waiting than `--max-queued`.
    Busy { running: usize, waiting: usize },
    /// The query ran past `--timeout`.
    Timeout(u64),
    /// The client cancelled the query (CancelFlightInfo).
    Cancelled,
    /// DataFusion's own error, while planning or running.
    Query(DataFusionError),
}

impl From<DataFusionError> for ServeError {
    fn from(e: DataFusionError) -> Self {
        ServeError::Query(e)
    }
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::ReadOnly(what) => write!(
                f,
                "this server is read-only: {what} is refused; only queries run (SELECT, WITH, VALUES, EXPLAIN)"
            ),
            ServeError::Limit(msg) | ServeError::BadRequest(msg) => f.write_str(msg),
            ServeError::UnknownHandle => {
                f.write_str("no such prepared statement on this server (closed, expired, or never made)")
            }
            ServeError::Busy { running, waiting } => write!(
                f,
                "the server is busy: {running} queries running and {waiting} waiting; try again later"
            ),
            ServeError::Timeout(secs) => write!(f, "the query ran past the server's timeout of {secs} s"),
            ServeError::Cancelled => f.write_str("the query was cancelled"),
            ServeError::Query(e) => match e.find_root() {
                // sqlparser's own text, not its Debug form (`ParserError("...")`).
                DataFusionError::SQL(p, _) => write!(f, "SQL error: {p}"),
                root => write!(f, "{root}"),
            },
        }
    }
}

impl ServeError {
    /// The gRPC status for this error, with `scrub` applied to its text, cut to
    /// [`MAX_MESSAGE`] bytes.
    pub(crate) fn to_status(&self, scrub: &Scrub) -> Status {
        let text = cut(scrub.apply(&self.to_string()));
        match self {
            ServeError::ReadOnly(_) => Status::permission_denied(text),
            ServeError::Limit(_) | ServeError::BadRequest(_) => Status::invalid_argument(text),
            ServeError::UnknownHandle => Status::not_found(text),
            ServeError::Busy { .. } => Status::resource_exhausted(text),
            ServeError::Timeout(_) => Status::deadline_exceeded(text),
            ServeError::Cancelled => Status::cancelled(text),
            ServeError::Query(e) => match e.find_root() {
                DataFusionError::ResourcesExhausted(_) => Status::resource_exhausted(text),
                DataFusionError::Plan(_)
                | DataFusionError::SQL(..)
                | DataFusionError::SchemaError(..)
                | DataFusionError::NotImplemented(_)
                | DataFusionError::Substrait(_) => Status::invalid_argument(text),
                // Values the query itself cannot take: a client's error, not the server's.
                DataFusionError::ArrowError(a, _)
                    if matches!(
                        **a,
                        ArrowError::CastError(_)
                            | ArrowError::ParseError(_)
                            | ArrowError::InvalidArgumentError(_)
                            | ArrowError::DivideByZero
                            | ArrowError::ArithmeticOverflow(_)
                    ) =>
                {
                    Status::invalid_argument(text)
                }
                _ => Status::internal(text),
            },
        }
    }
}

/// The longest message a client reads. The message travels in an HTTP/2 trailer, and gRPC
/// clients refuse a header list past 16 KB with a protocol error in place of the status:
/// DataFusion writes whole expressions in debug form into some errors (15 KB were seen).
pub(crate) const MAX_MESSAGE: usize = 4096;

/// `text`, cut to [`MAX_MESSAGE`] bytes at a character boundary, saying how much was cut.
fn cut(text: String) -> String {
    if text.len() <= MAX_MESSAGE {
        return text;
    }
    let mut end = MAX_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes cut)", &text[..end], text.len() - end)
}

/// Replaces the served tables' paths in error text by the tables' names.
#[derive(Debug, Default, Clone)]
pub(crate) struct Scrub {
    /// (path as the server spells it, what the client sees instead), longest path first.
    pairs: Vec<(String, String)>,
}

impl Scrub {
    /// `tables`: (name, path) of each served table.
    pub(crate) fn new<'a>(tables: impl IntoIterator<Item = (&'a str, &'a std::path::Path)>) -> Scrub {
        let mut pairs = vec![];
        for (name, path) in tables {
            let shown = format!("<table {name}>");
            let mut spellings = vec![path.display().to_string()];
            if let Ok(full) = std::fs::canonicalize(path) {
                spellings.push(full.display().to_string());
            }
            for s in spellings {
                let s = s.trim_end_matches('/').to_string();
                if !s.is_empty() {
                    // Object store URLs spell the path without its leading slash.
                    if let Some(rel) = s.strip_prefix('/') {
                        pairs.push((rel.to_string(), shown.clone()));
                    }
                    pairs.push((s, shown.clone()));
                }
            }
        }
        // The longest first, so that a path is replaced before a prefix of it.
        pairs.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        pairs.dedup();
        Scrub { pairs }
    }

    /// `text` with every served path replaced.
    pub(crate) fn apply(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (path, shown) in &self.pairs {
            if out.contains(path.as_str()) {
                out = out.replace(path.as_str(), shown);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE);
        let s = ServeError::BadRequest(long.clone()).to_status(&Scrub::default());
        assert!(s.message().len() < MAX_MESSAGE + 40, "{}", s.message().len());
        // 2-byte characters: the cut falls on a boundary, at MAX_MESSAGE bytes.
        assert!(s.message().starts_with(&long[..MAX_MESSAGE]), "cut inside a character");
        assert!(s.message().ends_with(&format!("... ({} more bytes cut)", long.len() - MAX_MESSAGE)));
        let short = ServeError::BadRequest("x".into()).to_status(&Scrub::default());
        assert!(!short.message().contains("cut"));
    }

    #[test]
    fn errors_are_display_text_with_the_right_code() {
        let scrub = Scrub::new([("t", std::path::Path::new("/srv/data/t"))]);
        let e = ServeError::Query(DataFusionError::Context(
            "while reading".into(),
            Box::new(DataFusionError::Execution("cannot open /srv/data/t/part-0.parquet".into())),
        ));
        let s = e.to_status(&scrub);
        assert_eq!(s.code(), tonic::Code::Internal);
        assert_eq!(s.message(), "Execution error: cannot open <table t>/part-0.parquet");
        let s = ServeError::Query(DataFusionError::ResourcesExhausted("over".into())).to_status(&scrub);
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        let s = ServeError::ReadOnly("COPY".into()).to_status(&scrub);
        assert_eq!(s.code(), tonic::Code::PermissionDenied);
        assert!(s.message().contains("read-only: COPY is refused"), "{}", s.message());
        let s = ServeError::Query(DataFusionError::Plan("table 'x' not found".into())).to_status(&scrub);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(!s.message().contains("Plan("), "{}", s.message());
        // A parse error is sqlparser's text, not its Debug form.
        let parse =
            datafusion::sql::sqlparser::parser::ParserError::ParserError("Expected: ), found: EOF".into());
        let s = ServeError::Query(DataFusionError::SQL(Box::new(parse), None)).to_status(&scrub);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(s.message(), "SQL error: sql parser error: Expected: ), found: EOF");
        // A value the query cannot cast is the client's error.
        let cast = ArrowError::CastError("Cannot cast string 'x' to value of Int32 type".into());
        let s = ServeError::Query(DataFusionError::ArrowError(Box::new(cast), None)).to_status(&scrub);
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{}", s.message());
    }

    #[test]
    fn the_object_store_spelling_of_a_path_is_scrubbed_too() {
        let scrub = Scrub::new([("t", std::path::Path::new("/srv/data/t/"))]);
        assert_eq!(
            scrub.apply("Object at location srv/data/t/a.csv not found"),
            "Object at location <table t>/a.csv not found"
        );
    }
}

//! `dlframe`: run SQL with the tensor UDFs over CSV and Parquet files and write the result as
//! a tensor to `.npy` or `.safetensors`. With no arguments it runs a demo query on a built-in
//! dataset.
//!
//! Rows keep the files' order unless the query sorts them (see `collect_in_order`). The result
//! becomes a tensor by the rule Python's `dlframe.to_dlpack` uses (see `collect_result`), or,
//! with `--column`, one column alone. The output file is written before anything is printed,
//! and a closed stdout (`| head`) ends the printing quietly.
//!
//! With the feature `serve`, `dlframe serve` serves the same functions and tables over Arrow
//! Flight SQL instead, and `dlframe scheduler` and `dlframe executor` run them on an Apache
//! Ballista cluster (the crate `dlframe-serve`, `serve/`). Without it, those subcommands say how
//! to build them.

mod write;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use arrow_array::{BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::catalog::MemTable;
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use dlframe::options::Inexact;
use dlframe_datafusion::{collect_in_order, collect_result, collect_tensor};

use dlframe_datafusion::files::{parse_table, register_file};
use write::{write_npy, write_safetensors};

const USAGE: &str = "\
usage: dlframe [--table NAME=PATH]... [--column NAME] [--out PATH] [--key NAME] [--rows N]
               [--inexact round] [SQL]
       dlframe serve [--table NAME=PATH]... [--listen ADDR] [--token TOKEN]   (dlframe serve --help)
       dlframe scheduler [--listen ADDR]                            (dlframe scheduler --help)
       dlframe executor --scheduler HOST:PORT [--listen ADDR]       (dlframe executor --help)
       dlframe --help | --version
(serve, scheduler and executor are in a build with the feature `serve`)

Runs SQL with dlframe's tensor functions (to_tensor, to_tensor_fill, to_tensor_as,
to_tensor_padded, tensor_shape, tensor_ndim, tensor_dtype, tensor_reshape, tensor_element) and collects the
result into one tensor, printing its shape, dtype and first rows. Without ORDER BY, rows keep
the order of the files (files by path).

The result becomes a tensor as in Python's dlframe.to_dlpack: one tensor or list column is
that column's tensor, (rows, *cell_shape); otherwise all columns are stacked into a
(rows, columns) matrix of their common dtype, so SELECT a, b gives (n, 2) and SELECT a (n, 1).

  --table NAME=PATH  register a .csv, .csv.gz or .parquet file, or a directory of one of
                     these kinds, as NAME (extensions in any case)
  --column NAME      collect only this result column: (rows,) for a plain column
  --out PATH         write the tensor to PATH (.npy or .safetensors)
  --key NAME         the tensor's name in a .safetensors file (default: the result column's
                     name when it is a plain name such as an alias, else 'tensor')
  --rows N           rows to print (default 5)
  --inexact MODE     what a cast to a float dtype does with an integer the float cannot
                     hold exactly (int64 2^53 + 1 into float64): 'error' (default, names the
                     row and column) or 'round' (as numpy rounds); SQL's SET
                     dlframe.inexact = 'round' does the same for to_tensor
  -h, --help         print this help
  -V, --version      print the version

With no arguments, runs a demo query on a built-in sensor dataset.";

const DEMO_SQL: &str = "SELECT to_tensor_fill(0, temperature, humidity, pressure) AS features \
                        FROM sensors WHERE healthy ORDER BY id";

/// The safetensors key of a result that names none.
const DEFAULT_KEY: &str = "tensor";

/// The file formats `--out` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Npy,
    Safetensors,
}

struct Args {
    tables: Vec<(String, PathBuf)>,
    sql: Option<String>,
    column: Option<String>,
    out: Option<(PathBuf, Format)>,
    key: Option<String>,
    rows: usize,
    inexact: Inexact,
}

/// What the command line asks for.
enum Command {
    Run(Args),
    Help,
    Version,
}

/// The format of an `--out` path, from its extension (in any case).
fn out_format(path: &Path) -> std::result::Result<Format, String> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("npy") => Ok(Format::Npy),
        Some("safetensors") => Ok(Format::Safetensors),
        _ => Err(format!("--out {}: expected a .npy or .safetensors path", path.display())),
    }
}

/// Reads the command line. Any argument starting with `-` is an option (SQL never does), so an
/// unknown one is an error that names it.
fn parse_args(mut it: impl Iterator<Item = String>) -> std::result::Result<Command, String> {
    let mut args = Args {
        tables: vec![],
        sql: None,
        column: None,
        out: None,
        key: None,
        rows: 5,
        inexact: Inexact::Error,
    };
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--table" => args.tables.push(parse_table(&value("--table")?)?),
            "--column" => args.column = Some(value("--column")?),
            "--out" => {
                let path = PathBuf::from(value("--out")?);
                let format = out_format(&path)?;
                args.out = Some((path, format));
            }
            "--key" => args.key = Some(value("--key")?),
            "--inexact" => {
                args.inexact = Inexact::parse(&value("--inexact")?).map_err(|e| format!("--inexact: {e}"))?;
            }
            "--rows" => {
                let v = value("--rows")?;
                args.rows = v.parse().map_err(|_| format!("--rows {v}: expected a number"))?;
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ if args.sql.is_some() => {
                return Err(format!("a second query {a:?}; quote the SQL as one argument"));
            }
            _ => args.sql = Some(a),
        }
    }
    if args.key.is_some() && !matches!(args.out, Some((_, Format::Safetensors))) {
        return Err("--key names the tensor in a .safetensors file; give --out PATH.safetensors".into());
    }
    Ok(Command::Run(args))
}

/// The built-in dataset: 10,000 sensor readings with a few missing temperatures.
fn demo_table() -> Result<MemTable> {
    let n = 10_000i64;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("temperature", DataType::Float32, true),
        Field::new("humidity", DataType::Float64, false),
        Field::new("pressure", DataType::Int32, false),
        Field::new("healthy", DataType::Boolean, false),
    ]));
    let ids = 0..n;
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(Float32Array::from_iter(
                ids.clone().map(|i| (i % 7 != 3).then_some(15.0 + (i % 20) as f32 * 0.5)),
            )),
            Arc::new(Float64Array::from_iter_values(ids.clone().map(|i| 0.3 + (i % 50) as f64 / 100.0))),
            Arc::new(Int32Array::from_iter_values(ids.clone().map(|i| 1000 + (i % 30) as i32))),
            Arc::new(BooleanArray::from_iter(ids.map(|i| Some(i % 10 != 0)))),
        ],
    )?;
    MemTable::try_new(schema, vec![vec![batch]])
}

/// The safetensors key of a result column: its name when that is a plain name (a column or an
/// alias), else [`DEFAULT_KEY`] (an unnamed expression's name is its SQL text).
fn default_key(name: Option<&str>) -> String {
    match name {
        Some(n)
            if n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
        {
            n.to_string()
        }
        _ => DEFAULT_KEY.to_string(),
    }
}

/// Runs the query, writes `--out`, and appends what to print to `report`.
async fn run(args: Args, report: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    let ctx = SessionContext::new();
    dlframe_datafusion::register(&ctx);
    if args.inexact == Inexact::Round {
        ctx.sql("SET dlframe.inexact = 'round'").await?;
    }
    let sql = match &args.sql {
        Some(sql) => sql.clone(),
        None if args.tables.is_empty() => {
            ctx.register_table("sensors", Arc::new(demo_table()?))?;
            let _ =
                writeln!(report, "demo: 10,000 built-in sensor readings, temperatures missing every 7th row");
            let _ = writeln!(report, "query: {DEMO_SQL}\n");
            DEMO_SQL.to_string()
        }
        None => return Err(DataFusionError::Plan("give a query to run over the tables".into())),
    };
    let mut staging = Vec::new();
    for (name, path) in &args.tables {
        register_file(&ctx, name, path, &mut staging).await?;
    }
    let df = ctx.sql(&sql).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let batches = collect_in_order(df).await?;
    drop(staging);
    let (tensor, shown): (_, Vec<usize>) = match &args.column {
        Some(c) => (collect_tensor(&schema, &batches, c)?, vec![schema.index_of(c)?]),
        None => (collect_result(&schema, &batches, args.inexact)?, (0..schema.fields().len()).collect()),
    };
    let names: Vec<&str> = shown.iter().map(|&i| schema.field(i).name().as_str()).collect();
    if let Some((out, format)) = &args.out {
        let written = match format {
            Format::Npy => write_npy(&tensor, out),
            Format::Safetensors => {
                let key = args
                    .key
                    .clone()
                    .unwrap_or_else(|| default_key(names.first().filter(|_| names.len() == 1).copied()));
                let _ = writeln!(report, "key: {key}");
                write_safetensors(&tensor, &key, out)
            }
        };
        written.map_err(dlframe_datafusion::to_df_err)?;
    }
    let label = if names.len() == 1 { "column" } else { "columns" };
    let _ = writeln!(report, "{label}: {}", names.join(", "));
    let _ = writeln!(report, "shape: {:?}", tensor.shape());
    let _ = writeln!(report, "dtype: {}", tensor.dtype());
    let mut head = Vec::new();
    let mut left = args.rows;
    for b in &batches {
        if left == 0 {
            break;
        }
        let take = left.min(b.num_rows());
        head.push(b.project(&shown)?.slice(0, take));
        left -= take;
    }
    let _ = writeln!(report, "{}", pretty_format_batches(&head)?);
    if let Some((out, _)) = &args.out {
        let _ = writeln!(report, "wrote {}", out.display());
    }
    Ok(())
}

/// Writes `text` to stdout. A reader that has gone away (`| head`) ends the output quietly; other
/// errors are reported.
fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes a message to stderr, ignoring a closed stderr.
fn complain(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1).peekable();
    if let Some(code) = service(&mut argv) {
        return code;
    }
    let args = match parse_args(argv) {
        Ok(Command::Run(a)) => a,
        Ok(Command::Help) => return finish(print(&format!("{USAGE}\n")), ExitCode::SUCCESS),
        Ok(Command::Version) => {
            return finish(print(&format!("dlframe {}\n", env!("CARGO_PKG_VERSION"))), ExitCode::SUCCESS);
        }
        Err(msg) => {
            complain(&format!("dlframe: {msg}\n\n{USAGE}"));
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            complain(&format!("dlframe: cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let mut report = String::new();
    let result = runtime.block_on(run(args, &mut report));
    let printed = print(&report);
    match result {
        Ok(()) => finish(printed, ExitCode::SUCCESS),
        Err(e) => {
            complain(&format!("dlframe: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// `dlframe serve`, `scheduler` or `executor`: the service's exit code, or `None` for any other
/// command line.
#[cfg(feature = "serve")]
fn service(argv: &mut std::iter::Peekable<impl Iterator<Item = String>>) -> Option<ExitCode> {
    let run = match argv.peek().map(String::as_str) {
        Some("serve") => dlframe_serve::serve_main,
        Some("scheduler") => dlframe_serve::scheduler_main,
        Some("executor") => dlframe_serve::executor_main,
        _ => return None,
    };
    Some(run(argv.skip(1)))
}

/// `dlframe serve`, `scheduler` or `executor` in a build without them: an error (2) that says how
/// to build them, or `None` for any other command line.
#[cfg(not(feature = "serve"))]
fn service(argv: &mut std::iter::Peekable<impl Iterator<Item = String>>) -> Option<ExitCode> {
    let name = argv.peek().filter(|a| SERVICES.contains(&a.as_str()))?;
    complain(&format!(
        "dlframe {name}: this dlframe is built without its services; build it with the feature \
         `serve` (cargo install --locked --path cli --features serve)"
    ));
    Some(ExitCode::from(2))
}

/// The subcommands of the feature `serve`.
#[cfg(not(feature = "serve"))]
const SERVICES: &[&str] = &["serve", "scheduler", "executor"];

/// The exit code after printing: `code`, or a failure when stdout could not be written.
fn finish(printed: std::io::Result<()>, code: ExitCode) -> ExitCode {
    match printed {
        Ok(()) => code,
        Err(e) => {
            complain(&format!("dlframe: writing to stdout: {e}"));
            ExitCode::FAILURE
        }
    }
}

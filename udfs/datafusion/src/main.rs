//! `dlframe`: run SQL with the tensor UDFs over CSV and Parquet files and write a tensor column
//! to `.npy` or `.safetensors`. With no arguments it runs a demo query on a built-in dataset.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use arrow_array::{BooleanArray, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::catalog::MemTable;
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use dlframe_datafusion::{collect_tensor, write_npy, write_safetensors};

const USAGE: &str = "\
usage: dlframe [--table NAME=PATH]... [--column NAME] [--out PATH] [--rows N] [SQL]

Runs SQL with dlframe's tensor functions (to_tensor, to_tensor_fill, to_tensor_as,
tensor_shape, tensor_ndim, tensor_dtype, tensor_reshape, tensor_element) and collects one
result column into a tensor, printing its shape, dtype and first rows.

  --table NAME=PATH  register a .csv or .parquet file (or a directory of them) as NAME
  --column NAME      the result column to collect (default: the only, or the first tensor, column)
  --out PATH         write the tensor to PATH (.npy or .safetensors)
  --rows N           rows to print (default 5)

With no arguments, runs a demo query on a built-in sensor dataset.";

const DEMO_SQL: &str = "SELECT to_tensor_fill(0, temperature, humidity, pressure) AS features \
                        FROM sensors WHERE healthy ORDER BY id";

struct Args {
    tables: Vec<(String, PathBuf)>,
    sql: Option<String>,
    column: Option<String>,
    out: Option<PathBuf>,
    rows: usize,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> std::result::Result<Args, String> {
    let mut args = Args { tables: vec![], sql: None, column: None, out: None, rows: 5 };
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--table" => {
                let v = value("--table")?;
                let (name, path) =
                    v.split_once('=').ok_or_else(|| format!("--table {v}: expected NAME=PATH"))?;
                args.tables.push((name.to_string(), PathBuf::from(path)));
            }
            "--column" => args.column = Some(value("--column")?),
            "--out" => args.out = Some(PathBuf::from(value("--out")?)),
            "--rows" => {
                let v = value("--rows")?;
                args.rows = v.parse().map_err(|_| format!("--rows {v}: expected a number"))?;
            }
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            _ if args.sql.is_some() => {
                return Err(format!("a second query {a:?}; quote the SQL as one argument"));
            }
            _ => args.sql = Some(a),
        }
    }
    Ok(args)
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

async fn register_file(ctx: &SessionContext, name: &str, path: &std::path::Path) -> Result<()> {
    let p = path.to_str().ok_or_else(|| DataFusionError::Plan(format!("{} is not UTF-8", path.display())))?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("csv") => ctx.register_csv(name, p, CsvReadOptions::new()).await,
        Some("parquet") => ctx.register_parquet(name, p, ParquetReadOptions::default()).await,
        _ if path.is_dir() => ctx.register_parquet(name, p, ParquetReadOptions::default()).await,
        _ => Err(DataFusionError::Plan(format!("{}: expected a .csv or .parquet file", path.display()))),
    }
}

async fn run(args: Args) -> Result<()> {
    let ctx = SessionContext::new();
    dlframe_datafusion::register(&ctx);
    let sql = match &args.sql {
        Some(sql) => sql.clone(),
        None if args.tables.is_empty() => {
            ctx.register_table("sensors", Arc::new(demo_table()?))?;
            println!("demo: 10,000 built-in sensor readings, temperatures missing every 7th row");
            println!("query: {DEMO_SQL}\n");
            DEMO_SQL.to_string()
        }
        None => return Err(DataFusionError::Plan("give a query to run over the tables".into())),
    };
    for (name, path) in &args.tables {
        register_file(&ctx, name, path).await?;
    }
    let df = ctx.sql(&sql).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let column = match &args.column {
        Some(c) => c.clone(),
        None => {
            let fields = schema.fields();
            let pick = fields
                .iter()
                .find(|f| matches!(f.data_type(), DataType::FixedSizeList(..)))
                .or(fields.first())
                .ok_or_else(|| DataFusionError::Plan("the query returns no columns".into()))?;
            pick.name().clone()
        }
    };
    let batches = df.collect().await?;
    let tensor = collect_tensor(&schema, &batches, &column)?;
    println!("column: {column}");
    println!("shape: {:?}", tensor.shape());
    println!("dtype: {}", tensor.dtype());
    let index = schema.index_of(&column)?;
    let mut head = Vec::new();
    let mut left = args.rows;
    for b in &batches {
        if left == 0 {
            break;
        }
        let take = left.min(b.num_rows());
        head.push(b.project(&[index])?.slice(0, take));
        left -= take;
    }
    println!("{}", pretty_format_batches(&head)?);
    if let Some(out) = &args.out {
        let written = match out.extension().and_then(|e| e.to_str()) {
            Some("npy") => write_npy(&tensor, out),
            Some("safetensors") => write_safetensors(&tensor, &column, out),
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "{}: expected .npy or .safetensors",
                    out.display()
                )));
            }
        };
        written.map_err(dlframe_datafusion::to_df_err)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("dlframe: {msg}\n");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if msg.is_empty() { 0 } else { 2 });
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dlframe: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlframe: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `--table NAME=PATH`: a CSV, gzipped CSV or Parquet file, or a directory of one of these kinds,
//! registered as a table of a `SessionContext` (the `dlframe` command's and its servers').
//!
//! Files are read in path order (see [`collect_in_order`](crate::collect_in_order)). `.csv.gz` files are decompressed into a
//! temporary directory first (copies), which is removed when its [`Staging`] is dropped.

use std::path::{Path, PathBuf};

use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};

/// The kinds of file `--table` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Csv,
    CsvGz,
    Parquet,
}

impl Kind {
    /// The kind a file name ends in (in any case), and that ending as written.
    fn of(name: &str) -> Option<(Kind, &str)> {
        let lower = name.to_ascii_lowercase();
        [(".csv.gz", Kind::CsvGz), (".csv", Kind::Csv), (".parquet", Kind::Parquet)]
            .into_iter()
            .find(|(suffix, _)| lower.len() > suffix.len() && lower.ends_with(suffix))
            // The ending is ASCII, so it starts at a character boundary of `name` too.
            .map(|(suffix, kind)| (kind, &name[name.len() - suffix.len()..]))
    }

    fn describe(self) -> &'static str {
        match self {
            Kind::Csv => ".csv",
            Kind::CsvGz => ".csv.gz",
            Kind::Parquet => ".parquet",
        }
    }
}

fn plan_err(msg: String) -> DataFusionError {
    DataFusionError::Plan(msg)
}

fn io_err(path: &Path, e: std::io::Error) -> DataFusionError {
    plan_err(format!("{}: {e}", path.display()))
}

/// Reads a `--table NAME=PATH` value (the `dlframe` command's and `dlframe serve`'s).
pub fn parse_table(v: &str) -> std::result::Result<(String, PathBuf), String> {
    let (name, path) = v.split_once('=').ok_or_else(|| format!("--table {v}: expected NAME=PATH"))?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// The data files under `dir` (recursively, as DataFusion lists them), skipping hidden and
/// `_`-prefixed names such as `_SUCCESS`.
fn data_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let path = entry.map_err(|e| io_err(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        if path.is_dir() {
            data_files(&path, out)?;
        } else if Kind::of(name).is_some() {
            out.push(path);
        }
    }
    Ok(())
}

/// The one kind of data file in `dir`, and the ending its files share; an error for none, for a
/// mix of kinds, or for one kind written in two cases (DataFusion matches endings exactly).
fn directory_kind(dir: &Path) -> Result<(Kind, String, Vec<PathBuf>)> {
    let mut files = Vec::new();
    data_files(dir, &mut files)?;
    files.sort();
    let mut seen: Vec<(Kind, String)> = Vec::new();
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if let Some((kind, ending)) = Kind::of(name)
            && !seen.iter().any(|(k, e)| *k == kind && e == ending)
        {
            seen.push((kind, ending.to_string()));
        }
    }
    match seen.as_slice() {
        [] => {
            Err(plan_err(format!("{}: no .csv, .csv.gz or .parquet files in this directory", dir.display())))
        }
        [(kind, ending)] => Ok((*kind, ending.clone(), files)),
        [(a, x), (b, y), ..] if a == b => Err(plan_err(format!(
            "{}: the {} files end in both {x} and {y}; give them one spelling",
            dir.display(),
            a.describe()
        ))),
        [(a, _), (b, _), ..] => Err(plan_err(format!(
            "{}: the directory mixes {} and {} files; give each kind its own directory and --table",
            dir.display(),
            a.describe(),
            b.describe()
        ))),
    }
}

/// A directory that holds decompressed copies of `.csv.gz` files while the query runs, and is
/// removed afterwards.
pub struct Staging(PathBuf);

impl Staging {
    fn new(index: usize) -> Result<Staging> {
        let dir = std::env::temp_dir().join(format!("dlframe-{}-{index}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        Ok(Staging(dir))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Decompresses a gzip file (all its members) to `to` (copies).
fn gunzip(from: &Path, to: &Path) -> Result<()> {
    let file = std::fs::File::open(from).map_err(|e| io_err(from, e))?;
    let mut reader = flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file));
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
    }
    let mut out = std::fs::File::create(to).map_err(|e| io_err(to, e))?;
    std::io::copy(&mut reader, &mut out).map_err(|e| io_err(from, e))?;
    Ok(())
}

fn utf8(path: &Path) -> Result<&str> {
    path.to_str().ok_or_else(|| plan_err(format!("{} is not UTF-8", path.display())))
}

/// Registers a file or directory as table `name`. `.csv.gz` files are decompressed into
/// `staging` first (this build of DataFusion reads no compressed CSV), keeping their paths'
/// order.
pub async fn register_file(
    ctx: &SessionContext,
    name: &str,
    path: &Path,
    staging: &mut Vec<Staging>,
) -> Result<()> {
    let (kind, ending, files) = if path.is_dir() {
        directory_kind(path)?
    } else {
        let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        match Kind::of(file_name) {
            Some((kind, ending)) if path.is_file() => (kind, ending.to_string(), vec![path.to_path_buf()]),
            Some(_) => return Err(plan_err(format!("{}: no such file or directory", path.display()))),
            None => {
                return Err(plan_err(format!(
                    "{}: expected a .csv, .csv.gz or .parquet file, or a directory of them",
                    path.display()
                )));
            }
        }
    };
    match kind {
        Kind::Csv => ctx.register_csv(name, utf8(path)?, CsvReadOptions::new().file_extension(&ending)).await,
        Kind::Parquet => {
            ctx.register_parquet(name, utf8(path)?, ParquetReadOptions::default().file_extension(&ending))
                .await
        }
        Kind::CsvGz => {
            let stage = Staging::new(staging.len())?;
            for f in &files {
                let relative = f.strip_prefix(path).unwrap_or(f.as_path());
                let base = if relative.as_os_str().is_empty() {
                    f.file_name().map(Path::new)
                } else {
                    Some(relative)
                };
                let base = utf8(base.unwrap_or(relative))?;
                let csv = format!("{}.csv", &base[..base.len() - ending.len()]);
                gunzip(f, &stage.0.join(csv))?;
            }
            let dir = utf8(&stage.0)?.to_string();
            staging.push(stage);
            ctx.register_csv(name, &dir, CsvReadOptions::new().file_extension(".csv")).await
        }
    }
}

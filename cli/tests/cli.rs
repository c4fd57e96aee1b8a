//! The `dlframe` binary, run as a user runs it, on files each test makes: help and version,
//! bad options, row order, output files and their shape and key, table kinds, and a reader that
//! closes the pipe early.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, Float64Array, Int64Array};
use arrow_schema::{DataType, Field, FieldRef};
use common::{TempDir, write_csv, write_parquet, x_of};
use dlframe::arrow::columns_to_tensor;
use dlframe::options::ExportOptions;

/// The longest any one run of the binary may take.
const LIMIT: Duration = Duration::from_secs(120);

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Waits for `child` (killing it past [`LIMIT`]) while draining its pipes.
fn finish(mut child: Child) -> Run {
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("dlframe ran longer than {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run { code: status.code().unwrap_or(-1), stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

fn dlframe(args: &[&str]) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_dlframe"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child)
}

/// Runs and expects success.
fn ok(args: &[&str]) -> Run {
    let r = dlframe(args);
    assert_eq!(r.code, 0, "dlframe {args:?}\nstdout: {}\nstderr: {}", r.stdout, r.stderr);
    r
}

/// A `.npy` file's dtype string, shape and data bytes.
struct Npy {
    descr: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn read_npy(path: &Path) -> Npy {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "npy magic");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    let field = |key: &str| {
        let at = header.find(key).unwrap_or_else(|| panic!("{key} in {header}")) + key.len();
        header[at..].trim_start().to_string()
    };
    let descr = field("'descr':");
    let descr = descr.split('\'').nth(1).unwrap().to_string();
    let shape = field("'shape':");
    let shape = &shape[1..shape.find(')').unwrap()];
    let shape =
        shape.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    Npy { descr, shape, data: bytes[10 + len..].to_vec() }
}

impl Npy {
    fn i64s(&self) -> Vec<i64> {
        assert_eq!(self.descr, "<i8");
        self.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn f64s(&self) -> Vec<f64> {
        assert_eq!(self.descr, "<f8");
        self.data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
    }
}

/// The tensor names in a `.safetensors` file.
fn safetensors_keys(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let mut keys: Vec<String> =
        header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
    keys.sort();
    keys
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn help_and_version_go_to_stdout_and_unknown_options_are_named() {
    for flag in ["--help", "-h"] {
        let r = ok(&[flag]);
        assert!(r.stdout.starts_with("usage: dlframe"), "{flag}: {}", r.stdout);
        assert!(r.stderr.is_empty(), "{flag}: {}", r.stderr);
    }
    for flag in ["--version", "-V"] {
        let r = ok(&[flag]);
        assert_eq!(r.stdout, format!("dlframe {}\n", env!("CARGO_PKG_VERSION")), "{flag}");
    }
    for flag in ["--bogus", "-x", "-"] {
        let r = dlframe(&[flag, "SELECT 1"]);
        assert_eq!(r.code, 2, "{flag}: {}", r.stderr);
        assert!(r.stderr.contains(&format!("unknown option {flag}\n")), "{flag}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
}

#[test]
fn an_unwritable_output_format_is_refused_before_the_query_runs() {
    let dir = TempDir::new("cli-out");
    let out = dir.join("x.csv");
    // The table does not exist: registering it would fail if the query got that far.
    let r = dlframe(&["--table", "t=/nonexistent/t.parquet", "--out", path(&out), "SELECT * FROM t"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("x.csv: expected a .npy or .safetensors path"), "{}", r.stderr);
    assert!(!out.exists());
    let r = dlframe(&["--out", path(&dir.join("x.npy")), "--key", "k", "SELECT 1"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--key"), "{}", r.stderr);
}

#[test]
fn rows_keep_the_file_order_across_row_groups() {
    let dir = TempDir::new("cli-order");
    let n = 400_000;
    let table = dir.join("t.parquet");
    write_parquet(&table, 0..n, 50_000);
    let out = dir.join("ids.npy");
    for run in 0..5 {
        ok(&["--table", &format!("t={}", path(&table)), "--out", path(&out), "SELECT id FROM t"]);
        let ids = read_npy(&out).i64s();
        assert_eq!(ids.len() as i64, n);
        let first_out_of_place = ids.iter().zip(0..).position(|(&v, i)| v != i);
        assert_eq!(first_out_of_place, None, "run {run}: rows out of file order");
    }
}

#[test]
fn a_closed_stdout_ends_quietly_after_the_file_is_written() {
    let dir = TempDir::new("cli-pipe");
    let table = dir.join("t.parquet");
    write_parquet(&table, 0..1000, 1000);
    let out = dir.join("y.npy");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlframe"))
        .args(["--table", &format!("t={}", path(&table)), "--out", path(&out), "--rows", "500"])
        .arg("SELECT to_tensor(id, x) AS f FROM t")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -0`: the reader goes away before dlframe prints anything.
    drop(child.stdout.take());
    let r = finish(child);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    let npy = read_npy(&out);
    assert_eq!(npy.shape, vec![1000, 2]);
    let want: Vec<f64> = (0..1000).flat_map(|i| [i as f64, x_of(i)]).collect();
    assert_eq!(npy.f64s(), want);
}

/// What Python's `dlframe.to_dlpack(table)` computes for columns `id` and `x` of rows `0..n`:
/// `columns_to_tensor` over the columns named.
fn python_matrix(names: &[&str], n: i64) -> (Vec<usize>, Vec<f64>) {
    let fields: Vec<FieldRef> = names
        .iter()
        .map(|&c| {
            let dt = if c == "id" { DataType::Int64 } else { DataType::Float64 };
            Arc::new(Field::new(c, dt, true))
        })
        .collect();
    let columns: Vec<Vec<ArrayRef>> = names
        .iter()
        .map(|&c| {
            let a: ArrayRef = if c == "id" {
                Arc::new(Int64Array::from_iter_values(0..n))
            } else {
                Arc::new(Float64Array::from_iter_values((0..n).map(x_of)))
            };
            vec![a]
        })
        .collect();
    let t = columns_to_tensor(&fields, &columns, &ExportOptions::default()).unwrap().values;
    let values = match t.dtype() {
        dlframe::DType::Float64 => t.as_slice::<f64>().unwrap().to_vec(),
        dlframe::DType::Int64 => t.as_slice::<i64>().unwrap().iter().map(|&v| v as f64).collect(),
        other => panic!("{other}"),
    };
    (t.shape().iter().map(|&d| d as usize).collect(), values)
}

#[test]
fn a_result_becomes_a_tensor_by_pythons_rule() {
    let dir = TempDir::new("cli-shape");
    let n = 300;
    let table = dir.join("t.parquet");
    write_parquet(&table, 0..n, 100);
    let t = format!("t={}", path(&table));
    let out = dir.join("o.npy");
    let run = |sql: &str, extra: &[&str]| {
        let mut args = vec!["--table", &t, "--out", path(&out)];
        args.extend_from_slice(extra);
        args.push(sql);
        let r = ok(&args);
        (r.stdout, read_npy(&out))
    };
    // Several plain columns: one (n, k) matrix of the common dtype, as Python stacks them.
    let (stdout, npy) = run("SELECT id, x FROM t", &[]);
    let (shape, values) = python_matrix(&["id", "x"], n);
    assert_eq!((npy.shape.clone(), npy.f64s()), (shape, values));
    assert!(stdout.contains("columns: id, x") && stdout.contains("shape: [300, 2]"), "{stdout}");
    // One plain column: (n, 1), as in Python.
    let (_, npy) = run("SELECT id FROM t", &[]);
    let (shape, values) = python_matrix(&["id"], n);
    assert_eq!(npy.shape, shape);
    assert_eq!(npy.shape, vec![300, 1]);
    assert_eq!(npy.i64s().iter().map(|&v| v as f64).collect::<Vec<_>>(), values);
    // One tensor column: that column's tensor.
    let (_, npy) = run("SELECT to_tensor(id, x) AS f FROM t", &[]);
    assert_eq!(npy.shape, vec![300, 2]);
    // SELECT * is the matrix of every column.
    let (_, npy) = run("SELECT * FROM t", &[]);
    assert_eq!(npy.shape, vec![300, 2]);
    // --column: one column alone.
    let (_, npy) = run("SELECT id, x FROM t", &["--column", "x"]);
    assert_eq!((npy.shape.clone(), npy.f64s()), (vec![300], (0..n).map(x_of).collect()));
    // A tensor column next to another cannot be stacked: the error says what to do.
    let r = dlframe(&["--table", &t, "SELECT to_tensor(id, x) AS f, id FROM t"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("'f' is a list or tensor column") && r.stderr.contains("by name"),
        "{}",
        r.stderr
    );
}

#[test]
fn safetensors_keys_come_from_the_alias_or_the_key_option() {
    let dir = TempDir::new("cli-key");
    let table = dir.join("t.parquet");
    write_parquet(&table, 0..10, 10);
    let t = format!("t={}", path(&table));
    let out = dir.join("o.safetensors");
    let o = path(&out);
    ok(&["--table", &t, "--out", o, "SELECT to_tensor_fill(0, t.id, t.x) FROM t"]);
    assert_eq!(safetensors_keys(&out), ["tensor"]);
    ok(&["--table", &t, "--out", o, "SELECT to_tensor_fill(0, id, x) AS features FROM t"]);
    assert_eq!(safetensors_keys(&out), ["features"]);
    ok(&["--table", &t, "--out", o, "--key", "X_train", "SELECT to_tensor(id, x) AS f FROM t"]);
    assert_eq!(safetensors_keys(&out), ["X_train"]);
    ok(&["--table", &t, "--out", o, "SELECT id, x FROM t"]);
    assert_eq!(safetensors_keys(&out), ["tensor"]);
}

/// Writes rows `0..n` as `files` CSV files under `dir`, named so that path order is row order.
fn csv_parts(dir: &Path, n: i64, files: i64, ending: &str) {
    let per = n / files;
    for k in 0..files {
        write_csv(&dir.join(format!("part-{k}{ending}")), k * per..(k + 1) * per);
    }
}

fn gzip(from: &Path, to: &Path) {
    let mut enc =
        flate2::write::GzEncoder::new(std::fs::File::create(to).unwrap(), flate2::Compression::fast());
    std::io::copy(&mut std::fs::File::open(from).unwrap(), &mut enc).unwrap();
    enc.finish().unwrap();
    std::fs::remove_file(from).unwrap();
}

#[test]
fn tables_from_csv_directories_gzip_and_any_case_of_extension() {
    let dir = TempDir::new("cli-kinds");
    let n = 3000;
    let check = |spec: &str, what: &str| {
        let out = dir.join("ids.npy");
        ok(&["--table", &format!("t={spec}"), "--out", path(&out), "SELECT id FROM t"]);
        assert_eq!(read_npy(&out).i64s(), (0..n).collect::<Vec<_>>(), "{what}");
    };
    let csv_dir = dir.join("csv");
    std::fs::create_dir(&csv_dir).unwrap();
    csv_parts(&csv_dir, n, 3, ".csv");
    check(path(&csv_dir), "a directory of CSV files");

    let upper = dir.join("T.CSV");
    write_csv(&upper, 0..n);
    check(path(&upper), "an upper-case .CSV");
    let upper = dir.join("T.PARQUET");
    write_parquet(&upper, 0..n, 1000);
    check(path(&upper), "an upper-case .PARQUET");

    let gz = dir.join("t.csv.gz");
    write_csv(&dir.join("plain.csv"), 0..n);
    gzip(&dir.join("plain.csv"), &gz);
    check(path(&gz), "a .csv.gz file");
    let gz_dir = dir.join("gz");
    std::fs::create_dir(&gz_dir).unwrap();
    csv_parts(&gz_dir, n, 3, ".csv");
    for k in 0..3 {
        let f = gz_dir.join(format!("part-{k}.csv"));
        gzip(&f, &gz_dir.join(format!("part-{k}.csv.gz")));
    }
    check(path(&gz_dir), "a directory of .csv.gz files");

    let mixed = dir.join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    write_csv(&mixed.join("a.csv"), 0..10);
    write_parquet(&mixed.join("b.parquet"), 10..20, 10);
    let r = dlframe(&["--table", &format!("t={}", path(&mixed)), "SELECT id FROM t"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("mixes .csv and .parquet files"), "{}", r.stderr);
    let r = dlframe(&["--table", &format!("t={}", path(&dir.join("notes.txt"))), "SELECT 1"]);
    assert!(r.stderr.contains("expected a .csv, .csv.gz or .parquet file"), "{}", r.stderr);
}

#[test]
fn an_inexact_value_is_named_by_its_row_of_the_result_and_the_advice_works_here() {
    let dir = TempDir::new("cli-inexact");
    let table = dir.join("t.parquet");
    write_parquet(&table, 0..5000, 300);
    let t = format!("t={}", path(&table));
    let out = dir.join("m.npy");
    let big = "SELECT CASE WHEN id = 3001 THEN 9007199254740993 ELSE id END AS v, x FROM t";
    // The result's rows are collected in file order: row 3001 across row groups of 300.
    let r = dlframe(&["--table", &t, "--out", path(&out), big]);
    assert!(r.code != 0 && r.stderr.contains("9007199254740993 at row 3001 of column 'v'"), "{}", r.stderr);
    assert!(r.stderr.contains("--inexact round"), "{}", r.stderr);
    // A SQL function sees one batch at a time, and says so.
    let sql = format!("SELECT to_tensor_as('float64', v, x) FROM ({big})");
    let r = dlframe(&["--table", &t, "--out", path(&out), &sql]);
    assert!(r.code != 0 && r.stderr.contains("at row 1 of a batch of 300 rows, column "), "{}", r.stderr);
    // Each remedy the messages give works on this route.
    ok(&["--table", &t, "--out", path(&out), "--inexact", "round", big]);
    assert_eq!(read_npy(&out).f64s()[3001 * 2], 9007199254740992.0);
    let cast = format!("SELECT to_tensor_as('float64', CAST(v AS DOUBLE), x) FROM ({big})");
    ok(&["--table", &t, "--out", path(&out), &cast]);
    assert_eq!(read_npy(&out).f64s()[3001 * 2], 9007199254740992.0);
}

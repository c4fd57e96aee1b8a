//! Files the integration tests make for themselves: a temporary directory that removes itself,
//! and Parquet and CSV files of an `id` column (0, 1, ...) and an `x` column derived from it;
//! the local DataFusion run that served and distributed results are compared with; and
//! `dlframe` processes (`process`).

#![allow(dead_code)]

pub mod process;
pub mod served;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::{ParquetReadOptions, SessionContext};

/// A fresh directory under the system temp dir, removed with everything in it on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("dlframe-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `x` value of row `id`: scrambled, so Parquet cannot compress it away and files stay
/// large enough to be split into several scan partitions.
pub fn x_of(id: i64) -> f64 {
    (id.wrapping_mul(2_654_435_761) % 1_000_003) as f64 / 7.0
}

/// Rows `ids` as a batch of `id` (int64) and `x` (float64).
pub fn rows(ids: std::ops::Range<i64>) -> RecordBatch {
    let id: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.clone()));
    let x: ArrayRef = Arc::new(Float64Array::from_iter_values(ids.map(x_of)));
    RecordBatch::try_from_iter([("id", id), ("x", x)]).unwrap()
}

/// Writes rows `ids` as a Parquet file with row groups of `group_rows` rows.
pub fn write_parquet(path: &Path, ids: std::ops::Range<i64>, group_rows: usize) {
    let props = WriterProperties::builder().set_max_row_group_row_count(Some(group_rows)).build();
    let batch = rows(ids);
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Writes rows `ids` as a CSV file with a header line.
pub fn write_csv(path: &Path, ids: std::ops::Range<i64>) {
    let mut text = String::from("id,x\n");
    for i in ids {
        text.push_str(&format!("{i},{}\n", x_of(i)));
    }
    std::fs::write(path, text).unwrap();
}

/// Registers the Parquet file or directory `table` as `t` in `ctx`.
pub async fn register_table(ctx: &SessionContext, table: &Path) {
    ctx.register_parquet("t", table.to_str().unwrap(), ParquetReadOptions::default()).await.unwrap();
}

/// Runs `sql` in `ctx` and returns the whole result as one batch.
pub async fn collect_one(ctx: &SessionContext, sql: &str) -> datafusion::error::Result<RecordBatch> {
    let df = ctx.sql(sql).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    Ok(concat_batches(&schema, &df.collect().await?)?)
}

/// `sql` over `table` (as `t`) in this process, with plain DataFusion and dlframe's functions:
/// what a served or distributed run must equal.
pub async fn local(table: &Path, sql: &str) -> datafusion::error::Result<RecordBatch> {
    let ctx = SessionContext::new();
    dlframe_datafusion::register(&ctx);
    register_table(&ctx, table).await;
    collect_one(&ctx, sql).await
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and a client certificate signed by
/// it, as PEM: (ca, server cert, server key, client cert, client key).
pub fn certificates() -> (String, String, String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(vec![]).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let client =
        CertificateParams::new(vec!["client".into()]).unwrap().signed_by(&client_key, &issuer).unwrap();
    (ca.pem(), server.pem(), server_key.serialize_pem(), client.pem(), client_key.serialize_pem())
}

/// [`certificates`]' CA, server certificate and key written into `dir` as `ca.pem`, `cert.pem`
/// and `key.pem`: their paths, and the CA's PEM.
pub fn certificate_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf, String) {
    let (ca, cert, key, _, _) = certificates();
    for (name, text) in [("ca.pem", &ca), ("cert.pem", &cert), ("key.pem", &key)] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"), ca)
}

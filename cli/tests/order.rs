//! Without ORDER BY, a query over CSV and Parquet files collects its rows in file order: across
//! row groups, byte-range splits of one file, and several files of a table (by path), however
//! many partitions read them in parallel.

mod common;

use common::{TempDir, register_table, write_csv, write_parquet, x_of};
use datafusion::prelude::{CsvReadOptions, SessionConfig, SessionContext};
use dlframe_datafusion::{register, sql_to_tensor};

const ROWS: i64 = 200_000;

fn ctx() -> SessionContext {
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(8));
    register(&ctx);
    ctx
}

async fn assert_file_order(ctx: &SessionContext, table: &str) {
    for run in 0..5 {
        let ids = sql_to_tensor(ctx, &format!("SELECT id FROM {table}"), None).await.unwrap();
        let ids = ids.as_slice::<i64>().unwrap();
        assert_eq!(ids.len() as i64, ROWS);
        let first_out_of_place = ids.iter().zip(0..).position(|(&v, i)| v != i);
        assert_eq!(first_out_of_place, None, "{table}, run {run}: rows out of file order");
        let sql = format!("SELECT to_tensor(id, x) FROM {table} WHERE id % 3 <> 1");
        let t = sql_to_tensor(ctx, &sql, None).await.unwrap();
        let pairs = t.as_slice::<f64>().unwrap();
        let want: Vec<f64> = (0..ROWS).filter(|i| i % 3 != 1).flat_map(|i| [i as f64, x_of(i)]).collect();
        assert!(pairs == want.as_slice(), "{table}, run {run}: to_tensor rows out of file order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_parquet_file_of_many_row_groups_keeps_its_order() {
    let dir = TempDir::new("order-one");
    let path = dir.join("t.parquet");
    write_parquet(&path, 0..ROWS, 10_000);
    let ctx = ctx();
    register_table(&ctx, &path).await;
    let plan = ctx.sql("EXPLAIN SELECT id FROM t").await.unwrap().collect().await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan).unwrap().to_string();
    assert!(text.contains("file_groups={8 groups"), "the file is read by 8 partitions:\n{text}");
    assert_file_order(&ctx, "t").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_of_several_files_keeps_path_order() {
    let dir = TempDir::new("order-many");
    // Written out of path order, with names that sort as the rows run.
    for k in [2, 0, 3, 1] {
        let rows = ROWS / 4;
        write_parquet(&dir.join(&format!("part-{k}.parquet")), k * rows..(k + 1) * rows, 7_000);
    }
    let ctx = ctx();
    register_table(&ctx, dir.path()).await;
    assert_file_order(&ctx, "t").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_csv_file_split_by_byte_range_keeps_its_order() {
    let dir = TempDir::new("order-csv");
    let path = dir.join("t.csv");
    write_csv(&path, 0..ROWS);
    let ctx = ctx();
    ctx.register_csv("t", path.to_str().unwrap(), CsvReadOptions::new()).await.unwrap();
    assert_file_order(&ctx, "t").await;
}

//! Parquet files as one source of units for `dlframe.batches`: the row groups of each file,
//! file after file (the order in which a plan numbers them), and a pass's reads of them. Each
//! read takes the next few units of one file, as many as the pool has threads (within
//! [`GROUP_BYTES`]), and decodes them by the direct path into one array of rows
//! ([`ParquetFile::read_rows`]); a batch within it shares it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_schema::{Field, FieldRef};

use super::{ParquetFile, Route};
use crate::batches::BatchOptions;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::options::ExportOptions;
use crate::table::Columns;

/// The most bytes of values one read decodes at once, unless one unit alone is more: enough
/// units to keep every thread busy, few enough to keep memory near a few row groups.
pub const GROUP_BYTES: u64 = 64 << 20;

/// Parquet files of one schema, their footers read.
pub struct ParquetFiles {
    files: Vec<ParquetFile>,
    /// The first unit of each file, in the units of all.
    first: Vec<usize>,
}

impl ParquetFiles {
    /// Opens `paths` (memory-mapped, footers read; see [`ParquetFile::open`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no paths; [`Error::InvalidParquet`] naming the file that
    /// cannot be read, or whose columns (names and types) are not the first file's.
    pub fn open(paths: &[PathBuf]) -> Result<ParquetFiles> {
        if paths.is_empty() {
            return Err(Error::InvalidArgument("no Parquet files".into()));
        }
        let files = paths.iter().map(|p| ParquetFile::open(p)).collect::<Result<Vec<_>>>()?;
        if let Some(odd) = files.iter().find(|f| f.fields() != files[0].fields()) {
            return Err(odd.bad(format!("its columns are not those of {}", files[0].name)));
        }
        let mut first = Vec::with_capacity(files.len());
        let mut at = 0;
        for f in &files {
            first.push(at);
            at += f.meta.num_row_groups();
        }
        Ok(ParquetFiles { files, first })
    }

    /// The rows of every unit (every file's row groups, file after file).
    pub fn units(&self) -> Vec<u64> {
        self.files.iter().flat_map(|f| f.units()).collect()
    }

    /// How batches of `options` would be read: [`Route::Direct`] when every row group of every
    /// file takes the direct path and the batches are matrices on the CPU; else the first
    /// reason, with its file.
    pub fn route(&self, options: &BatchOptions) -> Route {
        if options.columns != Columns::Stack {
            return Route::Arrow("columns='dict'".into());
        }
        if options.device != Device::Cpu {
            return Route::Arrow(format!("batches on {}", options.device));
        }
        if let Err(why) = super::direct_options(&options.export) {
            return Route::Arrow(why);
        }
        for f in &self.files {
            let all: Vec<usize> = (0..f.meta.num_row_groups()).collect();
            if let Route::Arrow(why) = f.route(&all, &options.export) {
                return Route::Arrow(format!("{}: {why}", f.name));
            }
        }
        Route::Direct
    }

    /// The reads of `units` (indices into [`ParquetFiles::units`]), in this order, as arrays of
    /// rows (see [`ParquetFile::read_rows`]) with the field of their column.
    pub fn reads(self: &Arc<Self>, units: impl IntoIterator<Item = usize>, export: ExportOptions) -> Reads {
        Reads { files: self.clone(), units: units.into_iter().collect(), export, field: None }
    }

    /// The file of unit `u`, and its row group there.
    fn locate(&self, u: usize) -> Result<(usize, usize)> {
        let f = self.first.partition_point(|&s| s <= u).saturating_sub(1);
        let local = u - self.first[f];
        match local < self.files[f].meta.num_row_groups() {
            true => Ok((f, local)),
            false => {
                Err(Error::InvalidArgument(format!("no unit {u} in these files ({})", self.units().len())))
            }
        }
    }
}

/// A pass's reads: the units left, a group at a time.
pub struct Reads {
    files: Arc<ParquetFiles>,
    units: VecDeque<usize>,
    export: ExportOptions,
    field: Option<FieldRef>,
}

impl Reads {
    /// The next group of units of one file (at least one), as [`GROUP_BYTES`] and the pool's
    /// threads allow.
    fn group(&mut self) -> Result<(usize, Vec<usize>)> {
        let first = self.units.pop_front().expect("a unit left");
        let (f, local) = self.files.locate(first)?;
        let file = &self.files.files[f];
        let width = file.fields.first().and_then(|f| f.data_type().primitive_width()).unwrap_or(8);
        let row_bytes = (file.fields.len() * width) as u64;
        let mut group = vec![local];
        let mut rows = file.unit_rows(local);
        while group.len() < crate::kernels::pool::threads()
            && let Some(&next) = self.units.front()
            && let Ok((g, l)) = self.files.locate(next)
            && g == f
            && (rows + file.unit_rows(l)) * row_bytes <= GROUP_BYTES
        {
            rows += file.unit_rows(l);
            group.push(l);
            self.units.pop_front();
        }
        Ok((f, group))
    }
}

impl Iterator for Reads {
    type Item = Result<(FieldRef, ArrayRef)>;

    /// The next group's rows (a copy: decoded from the file), None after the last.
    fn next(&mut self) -> Option<Self::Item> {
        if self.units.is_empty() {
            return None;
        }
        let read = self.group().and_then(|(f, group)| self.files.files[f].read_rows(&group, &self.export));
        Some(read.map(|rows| {
            let field = self
                .field
                .get_or_insert_with(|| Arc::new(Field::new("rows", rows.data_type().clone(), false)))
                .clone();
            (field, rows)
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use arrow_array::{Float32Array, RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::batches::pass::{Setup, produce};
    use crate::options::{NullPolicy, Scalar};
    use crate::table::TableTensors;

    /// A file of three float32 columns, `first`, `first + 1`, ... down each, in row groups of
    /// 300 rows (300, 300, 300, 100); its path.
    fn write(dir: &std::path::Path, name: &str, first: f32, strings: bool) -> PathBuf {
        let n = 1000;
        let col = |j: f32| {
            Arc::new(Float32Array::from_iter_values((0..n).map(|i| first + i as f32 + j))) as ArrayRef
        };
        let mut cols = vec![("a", col(0.0)), ("b", col(0.5)), ("c", col(0.25))];
        if strings {
            cols[2] = ("c", Arc::new(StringArray::from_iter_values((0..n).map(|i| i.to_string()))));
        }
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(300)).build();
        let path = dir.join(name);
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    }

    fn dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dlframe-files-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn export() -> ExportOptions {
        ExportOptions { nulls: NullPolicy::Fill(Scalar::Float(0.0)), ..ExportOptions::default() }
    }

    /// The values of an array of rows.
    fn values(rows: &ArrayRef) -> Vec<f32> {
        let list = rows.as_any().downcast_ref::<arrow_array::FixedSizeListArray>().unwrap();
        assert_eq!(list.value_length(), 3);
        let v = list.values().as_any().downcast_ref::<Float32Array>().unwrap();
        v.values()[list.value_offset(0) as usize..][..list.len() * 3].to_vec()
    }

    #[test]
    fn the_units_of_several_files_are_read_in_their_order_each_group_from_one_file() {
        let d = dir("order");
        let files = Arc::new(
            ParquetFiles::open(&[write(&d, "a.parquet", 0.0, false), write(&d, "b.parquet", 5000.0, false)])
                .unwrap(),
        );
        assert_eq!(files.units(), [300, 300, 300, 100, 300, 300, 300, 100]);
        let order = [7, 0, 1, 2, 5, 4, 4, 3];
        let mut got = Vec::new();
        let mut arrays = 0;
        for r in files.reads(order, export()) {
            let (field, rows) = r.unwrap();
            assert_eq!(field.data_type(), rows.data_type());
            got.extend(values(&rows));
            arrays += 1;
        }
        // Each unit's rows, one file's matrix at a time.
        let mut want = Vec::new();
        for u in order {
            let (f, local) = if u < 4 { (0, u) } else { (1, u - 4) };
            let m = files.files[f].read(&[local], &export()).unwrap();
            want.extend_from_slice(m.values.as_slice::<f32>().unwrap());
        }
        assert_eq!(got, want);
        // The file changes three times; no more groups than units.
        assert!((4..=order.len()).contains(&arrays), "{arrays}");
        let mut past = files.reads([8], export());
        assert!(past.next().unwrap().unwrap_err().to_string().contains("no unit 8"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_of_other_columns_are_refused_and_other_batches_are_routed_with_their_reason() {
        let d = dir("route");
        let a = write(&d, "a.parquet", 0.0, false);
        let s = write(&d, "s.parquet", 0.0, true);
        let e = ParquetFiles::open(&[a.clone(), s.clone()]).err().unwrap();
        assert!(e.to_string().contains("s.parquet") && e.to_string().contains("not those of"), "{e}");
        assert!(ParquetFiles::open(&[]).is_err());
        let files = ParquetFiles::open(&[a.clone(), a]).unwrap();
        let mut options = BatchOptions::new(10).unwrap();
        options.export = export();
        assert_eq!(files.route(&options), Route::Direct);
        let dict = BatchOptions { columns: Columns::Dict, ..options };
        assert_eq!(files.route(&dict), Route::Arrow("columns='dict'".into()));
        let mask = BatchOptions { export: ExportOptions { nulls: NullPolicy::Mask, ..export() }, ..options };
        assert_eq!(files.route(&mask), Route::Arrow("nulls='mask'".into()));
        let strings = ParquetFiles::open(&[s]).unwrap();
        assert!(matches!(strings.route(&options), Route::Arrow(why) if why.contains("column 'c' is Utf8")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_batch_within_a_group_shares_its_rows_and_one_across_groups_is_joined() {
        let d = dir("share");
        let files = Arc::new(ParquetFiles::open(&[write(&d, "a.parquet", 0.0, false)]).unwrap());
        // Unit by unit (groups of one, whatever the pool), so that batches of 200 cross units.
        let mut reads = [0, 1, 2, 3].into_iter().map(|u| files.reads([u], export()).next().unwrap());
        let mut firsts = Vec::new();
        let mut next = || {
            let r = reads.next()?;
            if let Ok((_, rows)) = &r {
                firsts.push(rows.to_data().child_data()[0].buffers()[0].as_ptr());
            }
            Some(r)
        };
        let mut batches = Vec::new();
        let stop = AtomicBool::new(false);
        produce(
            &mut next,
            Setup::in_order(BatchOptions::new(200).unwrap()),
            2,
            |b| {
                batches.push(b.unwrap());
                true
            },
            &stop,
        );
        let matrix = files.files[0].read(&[0, 1, 2, 3], &export()).unwrap();
        let all = matrix.values.as_slice::<f32>().unwrap();
        assert_eq!(batches.len(), 5);
        for (i, b) in batches.iter().enumerate() {
            let TableTensors::One(c) = b else { panic!("one matrix") };
            assert_eq!(c.values.shape(), [200, 3]);
            assert_eq!(c.values.as_slice::<f32>().unwrap(), &all[i * 600..(i + 1) * 600]);
        }
        // Rows 0..200 lie in unit 0: the batch is its memory. Rows 200..400 span two units.
        let TableTensors::One(first) = &batches[0] else { unreachable!() };
        assert_eq!(first.values.data_ptr(), firsts[0]);
        assert!(!first.values.copied());
        let TableTensors::One(second) = &batches[1] else { unreachable!() };
        assert!(second.values.copied());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_batch_across_two_units_of_one_group_shares_its_rows() {
        let d = dir("units");
        let files = ParquetFiles::open(&[write(&d, "a.parquet", 0.0, false)]).unwrap();
        // Units 0 and 1 read as one group; the plan routes each unit as a run of its own.
        let group = files.files[0].read_rows(&[0, 1], &export()).unwrap();
        let base = group.to_data().child_data()[0].buffers()[0].as_ptr();
        let field = Arc::new(Field::new("rows", group.data_type().clone(), false));
        let mut input: Option<Result<(FieldRef, ArrayRef)>> = Some(Ok((field, group)));
        let mut next = || input.take();
        let setup = Setup {
            router: Some(crate::batches::Router::new([(0, 300, 0), (0, 300, 0)])),
            ..Setup::in_order(BatchOptions::new(200).unwrap())
        };
        let mut batches = Vec::new();
        let keep = |b: Result<TableTensors>| {
            batches.push(b.unwrap());
            true
        };
        produce(&mut next, setup, 2, keep, &AtomicBool::new(false));
        assert_eq!(batches.len(), 3);
        // Rows 200..400 span the units' boundary at row 300: still one slice of the group.
        let TableTensors::One(second) = &batches[1] else { panic!("one matrix") };
        assert!(!second.values.copied());
        assert_eq!(second.values.data_ptr(), base.wrapping_add(200 * 3 * 4));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

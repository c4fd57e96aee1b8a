//! Parquet files read straight into a matrix (issue 56's reader, its first part): the footer is
//! read once, then only the row groups asked for. For flat columns of one fixed-width type
//! stored PLAIN or dictionary-encoded, uncompressed or in snappy, zstd or lz4, each page's values
//! are written into their rows and column of the `(rows, columns)` matrix in one pass after the
//! codec's, the null fill in the same pass, one row group per thread ([`Route::Direct`]).
//! Anything else goes through arrow-rs's reader and the table conversion ([`Route::Arrow`],
//! which says why). A local file is memory-mapped: an uncompressed page is read in place.
//!
//! A malformed file (a truncated footer, page sizes or offsets that lie, indices past a
//! dictionary) is an [`Error::InvalidParquet`] naming the file, never a read past the data.

pub mod chunk;
pub mod files;
pub mod headers;
pub mod hybrid;
pub mod pages;

use std::path::Path;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_buffer::Buffer;
use arrow_schema::{DataType, FieldRef};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, Encoding, Type as Physical};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use rayon::prelude::*;

use crate::arrow::Converted;
use crate::decide::{Cause, decide};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{Element, HostBuffer, fill_bits};
use crate::options::{ExportOptions, NullPolicy, Order};
use crate::table::{Columns, TableTensors, table_on};
use crate::tensor::Tensor;

use chunk::Chunk;
use pages::{Cursor, OnNull, Plain};

/// Rows of every column written before the next rows: a tile of 1,024 rows of 8 columns of
/// f32 is 32 KB, which stays in the first or second level cache while it is written.
const TILE: usize = 1024;

/// How a read is carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Pages written straight into the matrix.
    Direct,
    /// arrow-rs's reader, then the table conversion; the reason the direct path does not apply.
    Arrow(String),
}

/// Why options of any file keep a read off the direct path: a mask or F order (the table
/// conversion makes them).
fn direct_options(opts: &ExportOptions) -> std::result::Result<(), String> {
    if !matches!(opts.nulls, NullPolicy::Error | NullPolicy::Fill(_) | NullPolicy::Nan) {
        return Err("nulls='mask'".into());
    }
    if opts.order != Order::C {
        return Err("order='F'".into());
    }
    Ok(())
}

/// A Parquet file, its footer read and checked.
pub struct ParquetFile {
    name: String,
    data: Bytes,
    meta: Arc<ParquetMetaData>,
    fields: Vec<FieldRef>,
}

impl ParquetFile {
    /// Opens `path`: memory-mapped, its footer read (no data page is read).
    ///
    /// # Errors
    /// [`Error::InvalidParquet`] naming the file: not readable, or not Parquet (a truncated
    /// footer, metadata that does not parse or whose schema Arrow cannot take).
    pub fn open(path: &Path) -> Result<ParquetFile> {
        let name = path.display().to_string();
        let bad = |why: String| Error::InvalidParquet { file: name.clone(), why };
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        let len = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        if len < 12 {
            return Err(bad(format!("{len} bytes, fewer than a Parquet file's magic and footer")));
        }
        // SAFETY: the map is read-only and private; a file changed by another process while it
        // is mapped is outside what this reader (or any reader of the file) can guard against, as
        // arrow-rs's and pyarrow's memory-mapped reads say too.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        Self::from_bytes(name, Bytes::from_owner(map))
    }

    /// A Parquet file already in memory, named `name` in errors.
    ///
    /// # Errors
    /// As [`ParquetFile::open`].
    pub fn from_bytes(name: String, data: Bytes) -> Result<ParquetFile> {
        let bad = |why: String| Error::InvalidParquet { file: name.clone(), why };
        let meta = ParquetMetaDataReader::new().parse_and_finish(&data).map_err(|e| bad(e.to_string()))?;
        let schema = parquet::arrow::parquet_to_arrow_schema(
            meta.file_metadata().schema_descr(),
            meta.file_metadata().key_value_metadata(),
        )
        .map_err(|e| bad(e.to_string()))?;
        for rg in meta.row_groups() {
            for c in rg.columns() {
                let (start, len) = c.byte_range();
                if start.checked_add(len).is_none_or(|end| end > data.len() as u64) {
                    return Err(bad(format!(
                        "column chunk '{}' claims bytes {start}..+{len} of {}",
                        c.column_path(),
                        data.len()
                    )));
                }
            }
        }
        let fields = schema.fields().iter().cloned().collect();
        Ok(ParquetFile { name, data, meta: Arc::new(meta), fields })
    }

    /// The rows of each row group: the units a plan assigns.
    pub fn units(&self) -> Vec<u64> {
        (0..self.meta.num_row_groups()).map(|u| self.unit_rows(u)).collect()
    }

    /// The rows of row group `u` (which the file has).
    fn unit_rows(&self, u: usize) -> u64 {
        self.meta.row_group(u).num_rows().max(0) as u64
    }

    /// The columns, as Arrow fields.
    pub fn fields(&self) -> &[FieldRef] {
        &self.fields
    }

    /// How [`ParquetFile::read`] would read `units` with `opts`.
    pub fn route(&self, units: &[usize], opts: &ExportOptions) -> Route {
        match self.direct_dtype(units, opts) {
            Ok(_) => Route::Direct,
            Err(why) => Route::Arrow(why),
        }
    }

    /// The rows of `units` (row groups, in this order) as one `(rows, columns)` matrix, as
    /// `to_dlpack` makes a table of them (a copy: values are decoded from the file).
    ///
    /// # Errors
    /// [`Error::InvalidParquet`] for a malformed file or a unit it lacks; the conversion's
    /// errors (nulls under `nulls="error"`, a fill that does not fit); under `copy=False` the
    /// refusal of a copy.
    pub fn read(&self, units: &[usize], opts: &ExportOptions) -> Result<Converted> {
        self.asked(units, opts)?;
        self.matrix(units, opts)
    }

    /// The rows of `units` as `to_dlpack` makes a table of them on `device`: one matrix
    /// ([`Columns::Stack`]: on the CPU by [`ParquetFile::read`], elsewhere read through Arrow and
    /// moved as a table is) or one tensor per column ([`Columns::Dict`], through Arrow). A copy.
    ///
    /// # Errors
    /// As [`ParquetFile::read`] and [`table_on`].
    pub fn read_table(
        &self,
        units: &[usize],
        layout: Columns,
        opts: &ExportOptions,
        device: Device,
    ) -> Result<TableTensors> {
        self.asked(units, opts)?;
        if layout == Columns::Stack && device == Device::Cpu {
            return Ok(TableTensors::One(self.matrix(units, opts)?));
        }
        let columns = self.arrow_columns(units)?;
        table_on(&self.fields, &columns, layout, opts, device)
    }

    /// Whether a read of `units` may be made: a copy (values are decoded), of row groups the
    /// file has.
    fn asked(&self, units: &[usize], opts: &ExportOptions) -> Result<()> {
        decide(opts.copy, Some(Cause::Decoded))?;
        match units.iter().find(|&&u| u >= self.meta.num_row_groups()) {
            Some(u) => {
                Err(self.bad(format!("no row group {u} (the file has {})", self.meta.num_row_groups())))
            }
            None => Ok(()),
        }
    }

    /// The rows of `units` as one array of rows, each a `FixedSizeList` of the columns' values:
    /// the `(rows, columns)` matrix that [`ParquetFile::read`] makes, as Arrow holds it, for a
    /// batcher to slice (a batch within it shares it) and gather. Only the direct path makes
    /// it. A copy: values are decoded from the file.
    ///
    /// # Errors
    /// As [`ParquetFile::read`]; [`Error::InvalidArgument`] with the reason where
    /// [`ParquetFile::route`] is not [`Route::Direct`].
    pub fn read_rows(&self, units: &[usize], opts: &ExportOptions) -> Result<ArrayRef> {
        self.asked(units, opts)?;
        let dtype = self
            .direct_dtype(units, opts)
            .map_err(|why| Error::InvalidArgument(format!("{} is not read row-wise: {why}", self.name)))?;
        let (buffer, rows) = self.decoded(dtype, units, opts)?;
        crate::arrow::rows_array(dtype.to_arrow(), self.fields.len(), rows, buffer)
    }

    /// [`ParquetFile::read`] of units already checked: the direct path where it applies.
    fn matrix(&self, units: &[usize], opts: &ExportOptions) -> Result<Converted> {
        let Ok(dtype) = self.direct_dtype(units, opts) else { return self.through_arrow(units, opts) };
        let (buffer, rows) = self.decoded(dtype, units, opts)?;
        let shape = vec![rows as i64, self.fields.len() as i64];
        let values = Tensor::from_buffer(buffer, 0, shape, None, dtype)?.with_copied(true);
        Ok(Converted { values, mask: None, index: None })
    }

    /// The direct path's matrix of `units` in `dtype` (as `direct_dtype` gave it): its bytes and
    /// its rows.
    fn decoded(&self, dtype: DType, units: &[usize], opts: &ExportOptions) -> Result<(Buffer, usize)> {
        match dtype {
            DType::Float32 => self.direct::<f32>(units, opts),
            DType::Float64 => self.direct::<f64>(units, opts),
            DType::Int32 => self.direct::<i32>(units, opts),
            DType::Int64 => self.direct::<i64>(units, opts),
            d => unreachable!("the direct path reads no {d}"),
        }
    }

    fn bad(&self, why: String) -> Error {
        Error::InvalidParquet { file: self.name.clone(), why }
    }

    /// The one dtype of the direct path's matrix, or why it does not apply.
    fn direct_dtype(&self, units: &[usize], opts: &ExportOptions) -> std::result::Result<DType, String> {
        let schema = self.meta.file_metadata().schema_descr();
        if self.fields.is_empty() || schema.num_columns() != self.fields.len() {
            return Err("nested or no columns".into());
        }
        direct_options(opts)?;
        let mut dtype = None;
        for (i, f) in self.fields.iter().enumerate() {
            let d = match (f.data_type(), schema.column(i).physical_type()) {
                (DataType::Int32, Physical::INT32) => DType::Int32,
                (DataType::Int64, Physical::INT64) => DType::Int64,
                (DataType::Float32, Physical::FLOAT) => DType::Float32,
                (DataType::Float64, Physical::DOUBLE) => DType::Float64,
                (t, _) => return Err(format!("column '{}' is {t}", f.name())),
            };
            if schema.column(i).max_def_level() > 1 || schema.column(i).max_rep_level() > 0 {
                return Err(format!("column '{}' is nested", f.name()));
            }
            if *dtype.get_or_insert(d) != d {
                return Err("columns of different types".into());
            }
        }
        let dtype = dtype.expect("a column");
        if opts.dtype.is_some_and(|d| d != dtype) {
            return Err(format!("a cast from {dtype}"));
        }
        if matches!(opts.nulls, NullPolicy::Nan) && !matches!(dtype, DType::Float32 | DType::Float64) {
            return Err(format!("nulls='nan' into {dtype}"));
        }
        for &u in units {
            for c in self.meta.row_groups().get(u).map_or(&[][..], |rg| rg.columns()) {
                if !chunk::takes(c.compression()) {
                    return Err(format!("column chunk '{}' is {}", c.column_path(), c.compression()));
                }
                let plain =
                    [Encoding::PLAIN, Encoding::PLAIN_DICTIONARY, Encoding::RLE_DICTIONARY, Encoding::RLE];
                if let Some(e) = c.encodings().find(|e| !plain.contains(e)) {
                    return Err(format!("column chunk '{}' is encoded {e}", c.column_path()));
                }
            }
        }
        Ok(dtype)
    }

    /// The direct path: each unit's block of rows decoded on its own thread, every column of
    /// it written into its place. The matrix's bytes, and its rows.
    fn direct<T: Plain + Element>(&self, units: &[usize], opts: &ExportOptions) -> Result<(Buffer, usize)> {
        let k = self.fields.len();
        let rows: Vec<usize> = units.iter().map(|&u| self.unit_rows(u) as usize).collect();
        let total: usize = rows.iter().sum();
        let on_null = match opts.nulls {
            NullPolicy::Error => OnNull::Refuse,
            p => OnNull::Fill(T::from_word(fill_bits(T::DTYPE, p.fill(), opts.inexact)?)),
        };
        // Every cell is written before the matrix is handed out (a chunk short of its rows is
        // an error), so a recycled buffer will do; a row count that no memory holds is refused.
        let cells = total.checked_mul(k).filter(|c| c.checked_mul(T::SIZE).is_some());
        let cells = cells.ok_or_else(|| self.bad(format!("{total} rows of {k} columns")))?;
        let mut buf = HostBuffer::for_overwrite(cells * T::SIZE)?;
        let mut blocks = Vec::with_capacity(units.len());
        let mut rest = buf.typed_mut::<T>();
        for &n in &rows {
            let (block, after) = rest.split_at_mut(n * k);
            blocks.push(block);
            rest = after;
        }
        let work = blocks.into_par_iter().zip(units.par_iter().zip(&rows));
        let nulls = crate::kernels::install(|| {
            work.map(|(block, (&u, &n))| self.unit_into(u, n, block, on_null)).collect::<Result<Vec<_>>>()
        })?;
        for (j, f) in self.fields.iter().enumerate() {
            let null_count: usize = nulls.iter().map(|per| per[j]).sum();
            opts.nulls.admit(null_count, || format!("'{}'", f.name()))?;
        }
        Ok((buf.into_buffer(), total))
    }

    /// Row group `u` (`n` rows) into `block`, a tile of [`TILE`] rows at a time: every column's
    /// rows of the tile are written while the tile is in cache. The nulls of each column.
    fn unit_into<T: Plain>(
        &self,
        u: usize,
        n: usize,
        block: &mut [T],
        on_null: OnNull<T>,
    ) -> Result<Vec<usize>> {
        let rg = self.meta.row_group(u);
        let k = self.fields.len();
        let named = |j: usize, why: String| {
            self.bad(format!("row group {u}, column '{}': {why}", self.fields[j].name()))
        };
        let mut cursors = Vec::with_capacity(k);
        // A page holds at most the row group's values, levels and a little framing: one that
        // says more is refused before anything is allocated for it.
        let limit = (n as u64).saturating_mul(T::SIZE as u64 + 8).saturating_add(64 << 10);
        for (j, chunk) in rg.columns().iter().enumerate() {
            let (start, len) = chunk.byte_range();
            let pages = Chunk::new(self.data.clone(), start, len, chunk.compression(), limit)
                .map_err(|why| named(j, why))?;
            cursors.push(Cursor::new(pages, n, chunk.column_descr().max_def_level(), on_null));
        }
        for start in (0..n).step_by(TILE) {
            let rows = TILE.min(n - start);
            let tile = &mut block[start * k..(start + rows) * k];
            // The tile's rows a whole row at a time where no column has a null or a page's end
            // in them; otherwise those columns' rows are written column by column.
            let mut whole = Vec::with_capacity(k);
            let mut rest = Vec::new();
            for (j, cursor) in cursors.iter_mut().enumerate() {
                match cursor.rows(rows).map_err(|why| named(j, why))? {
                    Some(r) => whole.push((j, r)),
                    None => rest.push(j),
                }
            }
            if rest.is_empty() {
                let cols: Vec<_> = whole.into_iter().map(|(_, r)| r).collect();
                pages::rows_into(&cols, tile);
                continue;
            }
            whole.iter().for_each(|(j, r)| r.column_into(&mut tile[*j..], k));
            drop(whole);
            for j in rest {
                cursors[j].fill(tile, k, j, rows).map_err(|why| named(j, why))?;
            }
        }
        let nulls = cursors.iter().map(|c| c.nulls).collect();
        for (j, cursor) in cursors.into_iter().enumerate() {
            cursor.finish().map_err(|why| named(j, why))?;
        }
        Ok(nulls)
    }

    /// The columns of `units` as arrow-rs's reader decodes them, in chunks, once their pages'
    /// sizes are checked ([`ParquetFile::declared`]).
    fn arrow_columns(&self, units: &[usize]) -> Result<Vec<Vec<ArrayRef>>> {
        self.declared(units)?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(self.data.clone())
            .and_then(|b| b.with_row_groups(units.to_vec()).build())
            .map_err(|e| self.bad(e.to_string()))?;
        let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); self.fields.len()];
        for batch in reader {
            let batch = batch.map_err(|e| self.bad(e.to_string()))?;
            for (col, array) in columns.iter_mut().zip(batch.columns()) {
                col.push(array.clone());
            }
        }
        Ok(columns)
    }

    /// Refuses a compressed page of `units` that declares more bytes uncompressed than the
    /// footer says its whole column chunk holds, before arrow-rs's reader allocates that much
    /// for it (up to 2 GB a page, where a failed allocation aborts the process). Reads only the
    /// page headers, in place.
    fn declared(&self, units: &[usize]) -> Result<()> {
        for &u in units {
            for c in self.meta.row_group(u).columns() {
                if c.compression() == Compression::UNCOMPRESSED {
                    continue; // read as stored, never allocated by its declared size
                }
                let (start, len) = c.byte_range();
                let (mut at, end) = (start as usize, (start + len) as usize);
                let total = usize::try_from(c.uncompressed_size()).unwrap_or(0);
                let named = |why: String| self.bad(format!("column chunk '{}': {why}", c.column_path()));
                while at < end {
                    let (h, stored) = headers::page_at(&self.data, at, end).map_err(named)?;
                    if h.uncompressed > total {
                        return Err(named(format!(
                            "the page at byte {at} declares {} bytes uncompressed, more than its column \
                             chunk's {total}",
                            h.uncompressed
                        )));
                    }
                    at = stored.end;
                }
            }
        }
        Ok(())
    }

    /// arrow-rs's reader over `units`, then the table conversion of its columns.
    fn through_arrow(&self, units: &[usize], opts: &ExportOptions) -> Result<Converted> {
        let columns = self.arrow_columns(units)?;
        match table_on(&self.fields, &columns, Columns::Stack, opts, Device::Cpu)? {
            TableTensors::One(c) => Ok(c),
            TableTensors::Dict(_) => unreachable!("Columns::Stack gives one tensor"),
        }
    }
}

#[cfg(test)]
mod tests;

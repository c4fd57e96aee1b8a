//! Exact-size tensor batches from a stream of Arrow batches of any sizes, for results larger
//! than memory: only the input batches that the next output batch needs are held.
//!
//! [`Batcher`] cuts and joins the input at the output's boundaries without copying (Arrow
//! slices), then converts each window with [`crate::table::table_on`]: one window that is a
//! single zero-copy slice stays zero-copy, and a window over several input batches is joined in
//! the same one fused pass that casts, interleaves and fills. [`Batches`] drives it over any
//! iterator of record batches (an arrow [`RecordBatchReader`](arrow_array::RecordBatchReader));
//! `dlframe-datafusion` drives it over a DataFusion stream. A driver that reads ahead (the
//! Python binding's background thread) cuts [`Window`]s and hands them to [`Ahead`], which
//! converts several at once on dlframe's pool while the next input is read, and gives them back
//! in order.
//!
//! ```
//! use std::sync::Arc;
//! use arrow_array::{ArrayRef, Float32Array, RecordBatch};
//! use dlframe::batches::{BatchOptions, Batches};
//! use dlframe::table::TableTensors;
//!
//! let col = |v: Vec<f32>| Arc::new(Float32Array::from(v)) as ArrayRef;
//! let input = [vec![1.0, 2.0, 3.0], vec![4.0, 5.0], vec![6.0, 7.0, 8.0, 9.0]]
//!     .map(|v| RecordBatch::try_from_iter([("x", col(v.clone())), ("y", col(v))]));
//! let schema = input[0].as_ref().unwrap().schema();
//! let options = BatchOptions::new(4)?;
//! let shapes: Vec<Vec<i64>> = Batches::new(schema, input.into_iter(), options)
//!     .map(|b| match b? {
//!         TableTensors::One(c) => Ok(c.values.shape().to_vec()),
//!         TableTensors::Dict(_) => unreachable!("stacked"),
//!     })
//!     .collect::<dlframe::Result<_>>()?;
//! assert_eq!(shapes, [vec![4, 2], vec![4, 2], vec![1, 2]]);
//! # Ok::<(), dlframe::Error>(())
//! ```
//!
//! Training jobs shard, shuffle and resume: [`TrainingPlan`] (`plan.rs`) cuts an epoch into
//! splits and says which rows each rank makes at each global step and which units it reads,
//! the same for every world size that divides the splits; [`State`] (`state.rs`) is the saved
//! form of a position and the rule for continuing from it; [`Router`] (`select.rs`) sends the
//! rows of the units read to the rank's splits, and the [`Batcher`] (`batcher.rs`) permutes them
//! in blocks with the generators of `shuffle.rs` and cuts the batches, skipping the ones before
//! a resumed start and the ones of other DataLoader workers. `ahead.rs` is [`Ahead`]. [`pass`] is
//! one pass of a stream read ahead: the epoch's setup, a table's row ranges held in memory, and
//! the loop that feeds the batcher and hands the batches on in order (Python's
//! `dlframe.batches` runs it on a background thread). [`stream`] runs a pass on one of the
//! process's reader threads ([`readers`]) and hands its batches to a consumer through a channel.
//!
//! Layers: above [`crate::table`] and [`crate::transfer`].

mod ahead;
mod batcher;
mod origin;
pub mod pass;
pub mod plan;
pub mod readers;
mod select;
pub mod shuffle;
pub mod state;
pub mod stream;

pub use ahead::Ahead;
pub use batcher::{Batcher, InputColumns, Window};
pub use origin::Runs;
pub use plan::{Course, Even, Layout, Rank, Read, Shuffle, SlotCourse, Training, TrainingPlan};
pub use select::Router;
pub use state::{Resume, State};

use arrow_array::RecordBatch;
use arrow_schema::{ArrowError, SchemaRef};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::options::ExportOptions;
use crate::table::{Columns, TableTensors};

/// What the batches look like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchOptions {
    /// Rows per batch; the last batch is shorter unless `drop_last`.
    pub batch_size: usize,
    /// Drop a last batch shorter than `batch_size`.
    pub drop_last: bool,
    /// One matrix per batch, or one tensor per column.
    pub columns: Columns,
    /// Nulls, copy, dtype and order, as for one conversion.
    pub export: ExportOptions,
    /// Where the tensors go.
    pub device: Device,
    /// Make only every `worker.1`-th batch, starting at batch `worker.0` (the others are cut and
    /// skipped, not converted): the share of one of `worker.1` DataLoader worker processes.
    pub worker: (usize, usize),
}

impl BatchOptions {
    /// Batches of `batch_size` rows, stacked, with the default conversion options, on the CPU.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a batch size of 0.
    pub fn new(batch_size: usize) -> Result<Self> {
        if batch_size == 0 {
            return Err(Error::InvalidArgument("batch_size must be at least 1".into()));
        }
        Ok(BatchOptions {
            batch_size,
            drop_last: false,
            columns: Columns::Stack,
            export: ExportOptions::default(),
            device: Device::Cpu,
            worker: (0, 1),
        })
    }

    /// The share of DataLoader worker `index` of `count`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `index < count`.
    pub fn for_worker(mut self, index: usize, count: usize) -> Result<Self> {
        if index >= count {
            return Err(Error::InvalidArgument(format!(
                "worker {index} of {count}: expected 0 <= index < count"
            )));
        }
        self.worker = (index, count);
        Ok(self)
    }
}

/// Exact-size batches over an iterator of record batches (an arrow `RecordBatchReader`, or
/// any other), converted one by one as they are asked for: a result larger than memory streams
/// through with only the current window's input held.
pub struct Batches<I> {
    source: I,
    batcher: Batcher,
}

impl<I: Iterator<Item = std::result::Result<RecordBatch, ArrowError>>> Batches<I> {
    /// Batches of the table `schema` read from `source`.
    pub fn new(schema: SchemaRef, source: I, options: BatchOptions) -> Self {
        let fields = schema.fields().iter().cloned().collect();
        let batcher = Batcher::new(fields, true, options).expect("a table takes any number of fields");
        Batches { source, batcher }
    }
}

impl<R: arrow_array::RecordBatchReader> Batches<R> {
    /// Batches of everything `reader` yields.
    pub fn from_reader(reader: R, options: BatchOptions) -> Self {
        Batches::new(reader.schema(), reader, options)
    }
}

impl<I: Iterator<Item = std::result::Result<RecordBatch, ArrowError>>> Iterator for Batches<I> {
    type Item = Result<TableTensors>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(ready) = self.batcher.next_ready() {
                return Some(ready);
            }
            if self.batcher.ended() {
                return None;
            }
            let input = self.source.next().map(|b| b.map(|b| b.columns().to_vec()).map_err(Error::from));
            if let Err(e) = self.batcher.feed(input) {
                return Some(Err(e));
            }
        }
    }
}

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
//! Layers: above [`crate::table`] and [`crate::transfer`].

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc::{Receiver, sync_channel};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, FieldRef, SchemaRef};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::options::ExportOptions;
use crate::table::{Columns, TableTensors, table_on};
use crate::transfer;

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
    /// Make only every `shard.1`-th batch, starting at batch `shard.0` (the others are cut and
    /// skipped, not converted): the share of one of `shard.1` worker processes.
    pub shard: (usize, usize),
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
            shard: (0, 1),
        })
    }

    /// The share of worker `index` of `count`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `index < count`.
    pub fn sharded(mut self, index: usize, count: usize) -> Result<Self> {
        if index >= count {
            return Err(Error::InvalidArgument(format!(
                "worker {index} of {count}: expected 0 <= index < count"
            )));
        }
        self.shard = (index, count);
        Ok(self)
    }
}

/// The columns of one input batch, all of the same length.
pub type InputColumns = Vec<ArrayRef>;

/// Cuts a stream of input batches into exact-size windows and converts them: push input with
/// [`Batcher::push`], say when it ended with [`Batcher::end`], and take finished batches with
/// [`Batcher::next_ready`].
#[derive(Debug)]
pub struct Batcher {
    fields: Vec<FieldRef>,
    /// A table's columns (stacked or by name), or one column as itself (a 1-D or N-d tensor).
    table: bool,
    options: BatchOptions,
    pending: VecDeque<InputColumns>,
    /// Rows of the front input batch already handed out.
    offset: usize,
    /// Rows pending after `offset`.
    buffered: usize,
    /// Windows cut so far, converted or skipped.
    cut: usize,
    ended: bool,
}

impl Batcher {
    /// A batcher for a table of `fields` (`table`), or for the one column `fields[0]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a column source with other than one field.
    pub fn new(fields: Vec<FieldRef>, table: bool, options: BatchOptions) -> Result<Self> {
        if !table && fields.len() != 1 {
            return Err(Error::InvalidArgument(format!(
                "a column source has one field, not {}",
                fields.len()
            )));
        }
        Ok(Batcher {
            fields,
            table,
            options,
            pending: VecDeque::new(),
            offset: 0,
            buffered: 0,
            cut: 0,
            ended: false,
        })
    }

    /// The fields of every input batch.
    pub fn fields(&self) -> &[FieldRef] {
        &self.fields
    }

    /// Rows received and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// True once [`Batcher::end`] was called.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Takes one input batch (no copy: its arrays are kept until the batches over them are
    /// made). Empty batches are ignored.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for columns of different lengths or the wrong number of them,
    /// [`Error::InvalidArgument`] for a column whose type is not its field's.
    pub fn push(&mut self, columns: InputColumns) -> Result<()> {
        if columns.len() != self.fields.len() {
            return Err(Error::LengthMismatch {
                what: "an input batch's column count".into(),
                expected: self.fields.len(),
                found: columns.len(),
            });
        }
        let rows = columns.first().map_or(0, |c| c.len());
        for (f, c) in self.fields.iter().zip(&columns) {
            if c.data_type() != f.data_type() {
                return Err(Error::InvalidArgument(format!(
                    "column '{}' of an input batch is {}, but the stream's schema says {}",
                    f.name(),
                    c.data_type(),
                    f.data_type()
                )));
            }
            if c.len() != rows {
                return Err(Error::LengthMismatch {
                    what: format!("column '{}' of an input batch", f.name()),
                    expected: rows,
                    found: c.len(),
                });
            }
        }
        if rows > 0 {
            self.pending.push_back(columns);
            self.buffered += rows;
        }
        Ok(())
    }

    /// Says that no more input comes: the rows left make the last, shorter batch.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// One step of a source: an input batch is pushed, the end of the input ends it, and an
    /// error (the source's, or [`Batcher::push`]'s) is returned after [`Batcher::abandon`].
    ///
    /// # Errors
    /// The source's error, or [`Batcher::push`]'s.
    pub fn feed(&mut self, input: Option<Result<InputColumns>>) -> Result<()> {
        let pushed = match input {
            None => {
                self.end();
                Ok(())
            }
            Some(columns) => columns.and_then(|c| self.push(c)),
        };
        if pushed.is_err() {
            self.abandon();
        }
        pushed
    }

    /// Ends the input and drops what is pending: after an error, no batch follows.
    pub fn abandon(&mut self) {
        self.ended = true;
        self.pending.clear();
        self.buffered = 0;
        self.offset = 0;
    }

    /// The next batch of this shard when enough input is buffered (the last, shorter one only
    /// after [`Batcher::end`], and not under `drop_last`), converted; None when more input is
    /// needed or everything was handed out. Windows of other shards are skipped here.
    ///
    /// # Errors
    /// The conversion's errors (nulls under the error policy, values that do not fit a cast).
    pub fn next_ready(&mut self) -> Option<Result<TableTensors>> {
        self.next_window().map(|w| w.convert())
    }

    /// The next batch of this shard, as [`Batcher::next_ready`] cuts it, not yet converted (no
    /// copy: slices of the input).
    pub fn next_window(&mut self) -> Option<Window> {
        let size = self.options.batch_size;
        loop {
            let rows = match self.buffered {
                b if b >= size => size,
                b if b > 0 && self.ended && !self.options.drop_last => b,
                _ => return None,
            };
            let (index, count) = self.options.shard;
            let mine = self.cut % count == index;
            self.cut += 1;
            let columns = self.take(rows, mine);
            if mine {
                let fields = self.fields.clone();
                return Some(Window { fields, table: self.table, options: self.options, columns });
            }
        }
    }

    /// Cuts the next `rows` rows off the pending input: per column, the slices (no copy) of the
    /// input batches they span, or nothing when `keep` is false.
    fn take(&mut self, rows: usize, keep: bool) -> Vec<Vec<ArrayRef>> {
        let mut window = vec![Vec::new(); if keep { self.fields.len() } else { 0 }];
        let mut left = rows;
        while left > 0 {
            let front = self.pending.front().expect("buffered rows are pending");
            let len = front[0].len();
            let n = left.min(len - self.offset);
            for (w, c) in window.iter_mut().zip(front) {
                w.push(if self.offset == 0 && n == len { c.clone() } else { c.slice(self.offset, n) });
            }
            left -= n;
            self.offset += n;
            if self.offset == len {
                self.pending.pop_front();
                self.offset = 0;
            }
        }
        self.buffered -= rows;
        window
    }
}

/// One batch's rows, cut from the input (slices, no copy) and not yet converted.
#[derive(Debug)]
pub struct Window {
    fields: Vec<FieldRef>,
    table: bool,
    options: BatchOptions,
    columns: Vec<Vec<ArrayRef>>,
}

impl Window {
    /// The batch, converted: zero-copy when it is one slice that allows it, else one fused copy.
    ///
    /// # Errors
    /// The conversion's errors (nulls under the error policy, values that do not fit a cast).
    pub fn convert(&self) -> Result<TableTensors> {
        let BatchOptions { columns, export, device, .. } = &self.options;
        if self.table {
            table_on(&self.fields, &self.columns, *columns, export, *device)
        } else {
            transfer::column_on(&self.fields[0], &self.columns[0], export, *device).map(TableTensors::One)
        }
    }
}

/// A converted window, or the panic of its conversion.
type Done = std::thread::Result<Result<TableTensors>>;

/// Windows converted ahead, up to `depth` at once, on dlframe's pool: their conversions overlap
/// each other and whatever the caller does meanwhile (reading the next input). They come back
/// in the order they went in. Each holds its output until [`Ahead::pop`] hands it over, so at
/// most `depth` converted batches are held here. Drive it from a thread of your own, not from
/// inside dlframe's pool: `pop` blocks its thread until the pool has made the batch.
#[derive(Debug)]
pub struct Ahead {
    pending: VecDeque<Receiver<Done>>,
    depth: usize,
}

impl Ahead {
    /// Room for `depth` conversions at once (at least one).
    pub fn new(depth: usize) -> Self {
        Ahead { pending: VecDeque::new(), depth: depth.max(1) }
    }

    /// True when `depth` conversions are under way or done and not handed out.
    pub fn is_full(&self) -> bool {
        self.pending.len() >= self.depth
    }

    /// True when nothing is under way or waiting.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Starts converting `window` on the pool (on this thread when no pool can start).
    pub fn push(&mut self, window: Window) {
        let (tx, rx) = sync_channel(1);
        crate::kernels::spawn(move || {
            // A panic goes back to the caller of `pop`, not through the pool (which would abort).
            let done = catch_unwind(AssertUnwindSafe(|| window.convert()));
            // The receiver is gone only when the caller stopped: the batch is not wanted.
            let _ = tx.send(done);
        });
        self.pending.push_back(rx);
    }

    /// The oldest window's batch, waiting for its conversion; None when nothing was pushed.
    /// A panic in the conversion resumes here.
    ///
    /// # Errors
    /// The conversion's errors.
    pub fn pop(&mut self) -> Option<Result<TableTensors>> {
        let rx = self.pending.pop_front()?;
        match rx.recv() {
            Ok(Ok(done)) => Some(done),
            Ok(Err(panic)) => resume_unwind(panic),
            Err(_) => unreachable!("a spawned conversion always sends, or its panic is caught"),
        }
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

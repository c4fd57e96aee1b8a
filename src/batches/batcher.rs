//! [`Batcher`]: cuts a stream of input batches into exact-size windows (slices, no copy), from
//! the rank's splits in blocks of steps whose rows are permuted when shuffling; [`Window`]: one
//! batch's rows, converted on demand in one pass (a gather when shuffled).

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_schema::FieldRef;

use super::BatchOptions;
use super::origin::Runs;
use super::plan::Course;
use super::select::Router;
use super::shuffle::{Rng, deal, derive};
use crate::device::Device;
use crate::error::{Error, Result, Rows};
use crate::table::{Columns, TableTensors, table_on};
use crate::transfer;

/// The columns of one input batch, all of the same length.
pub type InputColumns = Vec<ArrayRef>;

/// The rows of one of the rank's splits received and not yet cut into a block.
#[derive(Debug, Default)]
struct Queue {
    /// Input batches, each with the stream's row number of its first row.
    pending: VecDeque<(u64, InputColumns)>,
    /// Rows of the front input batch already cut.
    offset: usize,
    /// Rows pending after `offset`.
    buffered: usize,
    /// Rows still to come from the input; None: until it ends.
    left: Option<u64>,
}

/// A shuffled block of steps being handed out step by step: its rows (slices of the input,
/// the splits' blocks one after another), and for each split its first row in the block, which
/// of its rows each step takes (in increasing order), and the seed of the block.
#[derive(Debug)]
struct Group {
    columns: Arc<Vec<Vec<ArrayRef>>>,
    /// The stream's row of each row of the block.
    origin: Arc<Runs>,
    slots: Vec<(u32, Vec<Vec<u32>>, u64)>,
    first_step: u64,
    steps: usize,
    next: usize,
}

/// Where each picked row goes in its batch: the splits' parts one after another, each in the
/// order of its own seed; or positions given.
#[derive(Debug, Clone)]
enum Order {
    Segments(Vec<(u32, u64)>),
    Given(Vec<u32>),
}

impl Order {
    fn positions(&self) -> Vec<u32> {
        match self {
            Order::Given(to) => to.clone(),
            Order::Segments(segments) => {
                let mut to = Vec::with_capacity(segments.iter().map(|s| s.0 as usize).sum());
                for &(len, seed) in segments {
                    let base = to.len() as u32;
                    let at = to.len();
                    to.extend(base..base + len);
                    Rng::new(seed).shuffle(&mut to[at..]);
                }
                to
            }
        }
    }
}

/// A shuffled batch's rows of its block (increasing), and where each goes in the batch.
#[derive(Debug, Clone)]
struct Picks {
    rows: Vec<u32>,
    order: Order,
}

/// Whether step `k` of the epoch is this worker's to make: from `course.start` on, every
/// `count`-th from `index` ([`BatchOptions::worker`]).
fn mine(course: &Course, options: &BatchOptions, k: u64) -> bool {
    let (index, count) = options.worker;
    k >= course.start && (k - course.start) % count as u64 == index as u64
}

/// Cuts a stream of input batches into exact-size windows and converts them: push input with
/// [`Batcher::push`], say when it ended with [`Batcher::end`], and take finished batches with
/// [`Batcher::next_ready`].
///
/// The input's rows go to the rank's splits ([`Course::slots`]; a [`Router`] says which rows go
/// where, and without one every row goes to the one split). Steps come in blocks of
/// [`Course::block_steps`]: each split gives a block its rows of those steps, and a shuffled
/// split deals them out to the steps with a generator seeded by its seed and the block's index;
/// each step orders its rows of each split with a seed of its own ([`super::shuffle::deal`]),
/// so a block made again (on resuming, or on another world size) is the same. A step's batch is
/// its rows of each split, in split order, or for a stream the positions [`Course::cut`] of
/// them. Step `k` is made when [`mine`] says so; the others are cut and skipped without being
/// converted.
#[derive(Debug)]
pub struct Batcher {
    fields: Vec<FieldRef>,
    /// A table's columns (stacked or by name), or one column as itself (a 1-D or N-d tensor).
    table: bool,
    options: BatchOptions,
    course: Course,
    router: Option<Router>,
    slots: Vec<Queue>,
    /// Rows of the input still to skip (a resumed stream).
    skip: u64,
    /// Rows of the input pushed so far, skipped ones included.
    seen: u64,
    /// The source's row of each row of the input (the stream's units are some of the source's).
    sources: Arc<Runs>,
    /// The index of the next block to cut.
    block: u64,
    group: Option<Group>,
    ended: bool,
}

impl Batcher {
    /// A batcher for a table of `fields` (`table`), or for the one column `fields[0]`, from
    /// the start of an unshuffled stream.
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
        let course = Course::in_order(options.batch_size);
        Ok(Batcher {
            fields,
            table,
            options,
            slots: vec![Queue::default()],
            course,
            router: None,
            skip: 0,
            seen: 0,
            sources: Arc::new(Runs::identity()),
            block: 0,
            group: None,
            ended: false,
        })
    }

    /// The same, on `course`: the rank's splits, blocks from `course.first_block` on, and steps
    /// from `course.start` on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a course without splits or blocks, whose splits do not
    /// make a batch of `batch_size` rows, or whose start is before its first block.
    pub fn on_course(mut self, course: Course) -> Result<Self> {
        let size = self.options.batch_size;
        let per_step = match course.cut {
            Some((lo, hi)) => hi.checked_sub(lo).filter(|_| course.slots.len() == 1),
            None => Some(course.slots.iter().map(|s| s.per_step).sum()),
        };
        if course.slots.is_empty() || course.block_steps == 0 || per_step != Some(size) {
            return Err(Error::InvalidArgument(format!(
                "a course of {} split(s) and blocks of {} step(s) does not make batches of {size}",
                course.slots.len(),
                course.block_steps
            )));
        }
        if course.start < course.first_block * course.block_steps {
            return Err(Error::InvalidArgument(format!(
                "step {} is before block {}",
                course.start, course.first_block
            )));
        }
        self.slots = course.slots.iter().map(|s| Queue { left: s.rows, ..Queue::default() }).collect();
        self.block = course.first_block;
        self.skip = course.skip_rows;
        self.course = course;
        Ok(self)
    }

    /// The same, sending the rows of the input that `router` keeps to the splits it names; the
    /// input ends when the last of them has come.
    pub fn routing(mut self, router: Router) -> Self {
        self.ended = router.done();
        self.router = Some(router);
        self
    }

    /// The same, the input's rows being the source's rows that `sources` maps them to, so that
    /// errors name the source's row.
    pub fn from_source(mut self, sources: Runs) -> Self {
        self.sources = Arc::new(sources);
        self
    }

    /// The fields of every input batch.
    pub fn fields(&self) -> &[FieldRef] {
        &self.fields
    }

    /// Rows received and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.slots.iter().map(|q| q.buffered).sum()
    }

    /// True once the input has ended ([`Batcher::end`], or every routed row came).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Takes one input batch (no copy: its arrays, or the slices of them that the router keeps,
    /// are kept until the batches over them are made). Empty batches are ignored, and so is
    /// input after the routing is complete.
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
        let skipped = self.skip.min(rows as u64) as usize;
        self.skip -= skipped as u64;
        let at = self.seen;
        self.seen += rows as u64;
        match self.router.as_mut() {
            None if skipped == 0 => self.keep(0, at, columns, rows),
            None => self.keep(
                0,
                at + skipped as u64,
                columns.iter().map(|c| c.slice(skipped, rows - skipped)).collect(),
                rows - skipped,
            ),
            Some(_) if self.ended => {}
            Some(router) => {
                let parts = router.cut(rows);
                let done = router.done();
                for (offset, len, slot) in parts {
                    let part = if offset == 0 && len == rows {
                        columns.clone()
                    } else {
                        columns.iter().map(|c| c.slice(offset, len)).collect()
                    };
                    self.keep(slot, at + offset as u64, part, len);
                }
                self.ended = done;
            }
        }
        Ok(())
    }

    /// Queues `columns` (`rows` rows from the stream's row `at`) for split `slot`.
    fn keep(&mut self, slot: usize, at: u64, columns: InputColumns, rows: usize) {
        if rows > 0 {
            let q = &mut self.slots[slot];
            q.pending.push_back((at, columns));
            q.buffered += rows;
            q.left = q.left.map(|l| l.saturating_sub(rows as u64));
        }
    }

    /// Says that no more input comes: the rows left make the last, shorter batch.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// One step of a source: an input batch is pushed, the end of the input ends it, and an
    /// error (the source's, or [`Batcher::push`]'s) is returned after [`Batcher::abandon`].
    ///
    /// # Errors
    /// The source's error, or [`Batcher::push`]'s; and [`Error::InvalidArgument`] when the
    /// input ends before every row that the router keeps has come (the source is shorter
    /// than the plan says).
    pub fn feed(&mut self, input: Option<Result<InputColumns>>) -> Result<()> {
        let pushed = match input {
            None if self.ended => Ok(()),
            None => match &self.router {
                Some(s) => {
                    let (kept, left) = s.counts();
                    Err(Error::InvalidArgument(format!(
                        "the source ended after {kept} of the {} rows that the plan reads from it: \
                         it is shorter than its units said (was it changed?)",
                        kept + left
                    )))
                }
                None => {
                    self.end();
                    Ok(())
                }
            },
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
        self.slots.iter_mut().for_each(|q| *q = Queue::default());
        self.group = None;
    }

    /// The next batch of this worker when enough input is buffered (the last, shorter one
    /// only after the input ended, and not under `drop_last`), converted; None when more input
    /// is needed or everything was handed out. Other workers' batches are skipped here.
    ///
    /// # Errors
    /// The conversion's errors (nulls under the error policy, values that do not fit a cast).
    pub fn next_ready(&mut self) -> Option<Result<TableTensors>> {
        self.next_window().map(|w| w.convert())
    }

    /// The next batch of this worker, as [`Batcher::next_ready`] cuts it, not yet converted
    /// (no copy: slices of the input, and the order of its rows when shuffled).
    pub fn next_window(&mut self) -> Option<Window> {
        let bs = self.course.block_steps as usize;
        loop {
            if let Some(w) = self.next_of_group() {
                return Some(w);
            }
            // Rows each split gives to the next block: a block's share, or what is left at the end.
            let mut takes = Vec::with_capacity(self.slots.len());
            for (q, c) in self.slots.iter().zip(&self.course.slots) {
                let want = c.per_step * bs;
                let complete = self.ended || q.left == Some(0);
                if q.buffered < want && !complete {
                    return None;
                }
                takes.push(want.min(q.buffered));
            }
            if takes.iter().all(|&t| t == 0) {
                return None;
            }
            let index = self.block;
            self.block += 1;
            let first_step = index * bs as u64;
            let steps = takes
                .iter()
                .zip(&self.course.slots)
                .map(|(&t, c)| if c.per_step == 0 { 0 } else { t.div_ceil(c.per_step) })
                .max()
                .unwrap_or(0);
            let wanted = (0..steps as u64).any(|i| mine(&self.course, &self.options, first_step + i));
            // The splits' rows one after another, and the stream's row of each.
            let mut origin = Runs::identity();
            let mut block_rows = 0u64;
            let blocks: Vec<Vec<Vec<ArrayRef>>> = (0..self.slots.len())
                .map(|s| {
                    let (columns, runs) = self.take(s, takes[s], wanted);
                    for (len, at) in runs {
                        origin.push(block_rows, at);
                        block_rows += len;
                    }
                    columns
                })
                .collect();
            if !wanted {
                continue;
            }
            let origin = Arc::new(origin);
            // The splits' rows one after another, per column.
            let columns: Vec<Vec<ArrayRef>> = (0..self.fields.len())
                .map(|c| blocks.iter().flat_map(|b| b[c].iter().cloned()).collect())
                .collect();
            if self.course.slots.iter().all(|s| s.seed.is_none()) {
                // Unshuffled, a block is one step, its rows in order.
                let total: usize = takes.iter().sum();
                let (lo, hi) = self.course.cut.map_or((0, total), |(lo, hi)| (lo.min(total), hi.min(total)));
                if hi == lo || (self.options.drop_last && hi - lo < self.options.batch_size) {
                    continue;
                }
                let columns =
                    if (lo, hi) == (0, total) { columns } else { slice_chunks(&columns, lo, hi - lo) };
                return Some(self.window(Arc::new(columns), origin, lo as u64, None));
            }
            let mut offset = 0u32;
            let mut slots = Vec::with_capacity(takes.len());
            for (&rows, c) in takes.iter().zip(&self.course.slots) {
                let seed = derive(c.seed.unwrap_or(0), &[index]);
                let sizes: Vec<usize> = match c.per_step {
                    0 => Vec::new(),
                    g => (0..rows.div_ceil(g)).map(|i| g.min(rows - i * g)).collect(),
                };
                // A block of one step needs no dealing: the step takes every row.
                let parts = match sizes.len() {
                    0 => Vec::new(),
                    1 => vec![(0..rows as u32).collect()],
                    _ => deal(&sizes, &mut Rng::new(seed)),
                };
                slots.push((offset, parts, seed));
                offset += rows as u32;
            }
            self.group =
                Some(Group { columns: Arc::new(columns), origin, slots, first_step, steps, next: 0 });
        }
    }

    /// The next batch of this worker from the shuffled block being handed out.
    fn next_of_group(&mut self) -> Option<Window> {
        loop {
            let group = self.group.as_mut()?;
            let t = group.next;
            if t >= group.steps {
                self.group = None;
                return None;
            }
            group.next += 1;
            if !mine(&self.course, &self.options, group.first_step + t as u64) {
                continue;
            }
            let mut rows = Vec::new();
            let mut segments = Vec::new();
            for (offset, parts, seed) in &group.slots {
                if let Some(p) = parts.get(t) {
                    rows.extend(p.iter().map(|r| r + offset));
                    segments.push((p.len() as u32, derive(*seed, &[t as u64])));
                }
            }
            let order = match self.course.cut {
                None => Order::Segments(segments),
                Some((lo, hi)) => {
                    // A stream's step: the rank's positions lo..hi of its rows, in their order.
                    let to = Order::Segments(segments).positions();
                    let (mut kept, mut at) = (Vec::new(), Vec::new());
                    for (&r, &d) in rows.iter().zip(&to) {
                        if (lo..hi).contains(&(d as usize)) {
                            kept.push(r);
                            at.push(d - lo as u32);
                        }
                    }
                    rows = kept;
                    Order::Given(at)
                }
            };
            if rows.is_empty() || (self.options.drop_last && rows.len() < self.options.batch_size) {
                continue;
            }
            let (columns, origin) = (group.columns.clone(), group.origin.clone());
            return Some(self.window(columns, origin, 0, Some(Picks { rows, order })));
        }
    }

    /// A window over `columns` (a block), whose row 0 is the block's row `first` unless `rows`
    /// picks them; `origin` gives the stream's row of each of the block's.
    fn window(
        &self,
        columns: Arc<Vec<Vec<ArrayRef>>>,
        origin: Arc<Runs>,
        first: u64,
        rows: Option<Picks>,
    ) -> Window {
        let rows_of = Origin { block: origin, sources: self.sources.clone(), first };
        Window {
            fields: self.fields.clone(),
            table: self.table,
            options: self.options,
            columns,
            rows,
            rows_of,
        }
    }

    /// Cuts the next `rows` rows off split `slot`'s pending input: per column, the slices (no
    /// copy) of the input batches they span, or nothing when `keep` is false; and the runs of
    /// them, `(rows, stream's row of the first)`.
    fn take(&mut self, slot: usize, rows: usize, keep: bool) -> (Vec<Vec<ArrayRef>>, Vec<(u64, u64)>) {
        let q = &mut self.slots[slot];
        let mut window = vec![Vec::new(); if keep { self.fields.len() } else { 0 }];
        let mut runs = Vec::new();
        let mut left = rows;
        while left > 0 {
            let (at, front) = q.pending.front().expect("buffered rows are pending");
            let len = front[0].len();
            let n = left.min(len - q.offset);
            runs.push((n as u64, at + q.offset as u64));
            for (w, c) in window.iter_mut().zip(front) {
                w.push(if q.offset == 0 && n == len { c.clone() } else { c.slice(q.offset, n) });
            }
            left -= n;
            q.offset += n;
            if q.offset == len {
                q.pending.pop_front();
                q.offset = 0;
            }
        }
        q.buffered -= rows;
        (window, runs)
    }
}

/// Rows `at..at + len` of chunked columns, as slices of the chunks (no copy).
fn slice_chunks(columns: &[Vec<ArrayRef>], at: usize, len: usize) -> Vec<Vec<ArrayRef>> {
    columns
        .iter()
        .map(|chunks| {
            let (mut start, mut out) = (0usize, Vec::new());
            for c in chunks {
                let (lo, hi) = (at.max(start), (at + len).min(start + c.len()));
                if lo < hi {
                    out.push(if hi - lo == c.len() { c.clone() } else { c.slice(lo - start, hi - lo) });
                }
                start += c.len();
            }
            out
        })
        .collect()
}

/// One batch's rows, cut from the input (slices, no copy) and not yet converted: the slices
/// themselves, or some rows of a shuffled block's slices in the block's order.
#[derive(Debug)]
pub struct Window {
    fields: Vec<FieldRef>,
    table: bool,
    options: BatchOptions,
    columns: Arc<Vec<Vec<ArrayRef>>>,
    rows: Option<Picks>,
    rows_of: Origin,
}

/// Where a window's rows come from: its block's row of its row 0 (unless picked), the stream's
/// row of each of the block's rows, and the source's of each of the stream's.
#[derive(Debug)]
struct Origin {
    block: Arc<Runs>,
    sources: Arc<Runs>,
    first: u64,
}

impl Window {
    /// The batch, converted: zero-copy when it is one slice that allows it, else one fused
    /// copy. A shuffled batch of a stacked table of plain columns is gathered and interleaved
    /// in that one pass; other shuffled batches gather each column first (a copy), and a
    /// column gathered so needs no second copy unless it is stacked, cast or filled.
    ///
    /// # Errors
    /// The conversion's errors (nulls under the error policy, values that do not fit a cast).
    pub fn convert(&self) -> Result<TableTensors> {
        self.converted().map_err(|e| e.at_rows(|row| (self.source_row(row), Rows::Source)))
    }

    /// The source's row of the batch's row `row`.
    fn source_row(&self, row: u64) -> u64 {
        let in_block = match &self.rows {
            None => self.rows_of.first + row,
            Some(Picks { rows, order }) => {
                let to = order.positions();
                to.iter().position(|&t| u64::from(t) == row).map_or(row, |i| u64::from(rows[i]))
            }
        };
        self.rows_of.sources.map(self.rows_of.block.map(in_block))
    }

    fn converted(&self) -> Result<TableTensors> {
        let BatchOptions { columns: layout, export, device, .. } = &self.options;
        let Some(Picks { rows, order }) = &self.rows else { return self.convert_columns(&self.columns) };
        // Where each picked row goes in the batch.
        let to = order.positions();
        if self.table && *layout == Columns::Stack && *device == Device::Cpu && self.fields.len() > 1 {
            if let Some(m) = crate::arrow::take_matrix(&self.fields, &self.columns, rows, &to, export)? {
                return Ok(TableTensors::One(transfer::completed(m, export.nulls)?));
            }
        }
        // (chunk, row) of the batch's rows in their order, for arrow's gather.
        let mut pairs = vec![(0usize, 0usize); rows.len()];
        let lens: Vec<usize> = self.columns[0].iter().map(|a| a.len()).collect();
        for (at, &t) in crate::kernels::chunk_rows(&lens, rows).zip(&to) {
            pairs[t as usize] = at;
        }
        // An array of rows (a matrix read from Parquet) gathers a row's bytes at a time.
        if !self.table
            && *device == Device::Cpu
            && let Some(rows) = crate::arrow::take_rows(&self.columns[0], &pairs)?
        {
            return self.convert_columns(&[vec![rows]]);
        }
        let gathered = self
            .columns
            .iter()
            .map(|chunks| {
                let arrays: Vec<&dyn Array> = chunks.iter().map(|a| a.as_ref()).collect();
                Ok(vec![arrow_select::interleave::interleave(&arrays, &pairs)?])
            })
            .collect::<Result<Vec<_>>>()?;
        self.convert_columns(&gathered)
    }

    fn convert_columns(&self, columns: &[Vec<ArrayRef>]) -> Result<TableTensors> {
        let BatchOptions { columns: layout, export, device, .. } = &self.options;
        if self.table {
            table_on(&self.fields, columns, *layout, export, *device)
        } else {
            transfer::column_on(&self.fields[0], &columns[0], export, *device).map(TableTensors::One)
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Float32Array, Int64Array};
    use arrow_schema::{DataType, Field};

    use super::super::Even;
    use super::super::plan::{Layout, Rank, Shuffle, SlotCourse, Training, TrainingPlan, runs};
    use super::*;
    use crate::options::{ExportOptions, NullPolicy};

    /// Units of `sizes` rows holding the row ids, in input batches of at most 7 rows.
    fn units(sizes: &[u64]) -> Vec<Vec<ArrayRef>> {
        let mut next = 0i64;
        sizes
            .iter()
            .map(|&n| {
                let ids: Vec<i64> = (next..next + n as i64).collect();
                next += n as i64;
                ids.chunks(7).map(|c| Arc::new(Int64Array::from(c.to_vec())) as ArrayRef).collect()
            })
            .collect()
    }

    fn ids(t: TableTensors) -> Vec<i64> {
        match t {
            TableTensors::One(c) => c.values.as_slice::<i64>().unwrap().to_vec(),
            TableTensors::Dict(_) => unreachable!("one column"),
        }
    }

    /// A job's settings for these tests: batches of `batch` rows, `epoch` 3.
    #[derive(Clone, Copy)]
    struct Job {
        batch: usize,
        drop_last: bool,
        training: Training,
    }

    fn job(batch: usize, seed: Option<u64>, splits: Option<usize>) -> Job {
        let shuffle = seed.map(|seed| Shuffle { seed, buffer: Some(12) });
        Job { batch, drop_last: false, training: Training { even: Even::Keep, shuffle, splits } }
    }

    /// The batches (as row ids) of one worker of one rank, from step `start` on (a worker's own
    /// start when `own`).
    fn run(sizes: &[u64], job: Job, rank: Rank, worker: (usize, usize), start: u64) -> Vec<Vec<i64>> {
        let options = BatchOptions { drop_last: job.drop_last, ..BatchOptions::new(job.batch).unwrap() }
            .for_worker(worker.0, worker.1)
            .unwrap();
        let plan =
            TrainingPlan::new(&Layout::Units(sizes.to_vec()), &options, &job.training, rank, 3).unwrap();
        let reads = plan.reads(start);
        let field = Arc::new(Field::new("id", DataType::Int64, false));
        let mut b = Batcher::new(vec![field], false, options)
            .unwrap()
            .on_course(plan.course(start))
            .unwrap()
            .routing(Router::new(runs(&reads, plan.unit_rows())))
            .from_source(Runs::of_reads(&reads, plan.unit_rows()));
        let all = units(sizes);
        let mut input = reads.iter().flat_map(|r| all[r.unit].clone());
        let mut out = Vec::new();
        loop {
            while let Some(w) = b.next_window() {
                let batch = ids(w.convert().unwrap());
                // Every row of every batch knows its row of the source, shuffled or not.
                for (r, &id) in batch.iter().enumerate() {
                    assert_eq!(w.source_row(r as u64), id as u64, "row {r} of {batch:?}");
                }
                out.push(batch);
            }
            if b.ended() && b.buffered() == 0 {
                return out;
            }
            b.feed(input.next().map(|a| Ok(vec![a]))).unwrap();
        }
    }

    const SIZES: [u64; 6] = [9, 4, 13, 8, 6, 1];

    #[test]
    fn a_shuffled_epoch_gives_every_row_once_in_an_order_fixed_by_the_seed() {
        let sizes = [9, 4, 13, 8, 6];
        let one = run(&sizes, job(5, Some(7), Some(1)), Rank::single(), (0, 1), 0);
        assert_eq!(one.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5, 5, 5, 5, 5, 5, 5]);
        let mut rows = one.concat();
        assert_ne!(rows, (0..40).collect::<Vec<_>>());
        rows.sort_unstable();
        assert_eq!(rows, (0..40).collect::<Vec<_>>());
        assert_eq!(run(&sizes, job(5, Some(7), Some(1)), Rank::single(), (0, 1), 0), one);
        assert_ne!(run(&sizes, job(5, Some(8), Some(1)), Rank::single(), (0, 1), 0), one);
        // Each batch orders its own rows, and resuming gives the same.
        let got = run(&sizes, job(5, Some(7), Some(5)), Rank::single(), (0, 1), 0);
        assert!(got.iter().any(|b| b.windows(2).any(|w| w[0] > w[1])), "{got:?}");
        let mut rows = got.concat();
        rows.sort_unstable();
        assert_eq!(rows, (0..40).collect::<Vec<_>>());
        assert_eq!(run(&sizes, job(5, Some(7), Some(5)), Rank::single(), (0, 1), 3), got[3..]);
    }

    #[test]
    fn global_steps_are_the_same_for_every_world_size_that_divides_the_splits() {
        // G = 8 rows per step over K = 8 splits, shuffled and not.
        for seed in [None, Some(11)] {
            let mut by_world = Vec::new();
            for world in [1, 2, 4, 8] {
                let per_rank: Vec<Vec<Vec<i64>>> = (0..world)
                    .map(|r| {
                        run(&SIZES, job(8 / world, seed, Some(8)), Rank::new(r, world).unwrap(), (0, 1), 0)
                    })
                    .collect();
                let steps = per_rank.iter().map(Vec::len).max().unwrap();
                let global: Vec<Vec<i64>> = (0..steps)
                    .map(|s| per_rank.iter().flat_map(|b| b.get(s).cloned().unwrap_or_default()).collect())
                    .collect();
                let mut all = global.concat();
                all.sort_unstable();
                assert_eq!(all, (0..41).collect::<Vec<_>>(), "{seed:?} {world}");
                by_world.push(global);
            }
            assert!(by_world.windows(2).all(|w| w[0] == w[1]), "{seed:?}: {by_world:?}");
        }
    }

    #[test]
    fn a_resumed_pass_and_the_workers_make_the_same_batches_as_one_pass() {
        for seed in [None, Some(11)] {
            for rank in 0..3 {
                let (j, r) = (job(5, seed, Some(3)), Rank::new(rank, 3).unwrap());
                let whole = run(&SIZES, j, r, (0, 1), 0);
                for start in 0..=whole.len() as u64 {
                    assert_eq!(
                        run(&SIZES, j, r, (0, 1), start),
                        whole[start as usize..],
                        "{seed:?} {rank} {start}"
                    );
                }
                // Two workers, taken in turn as a DataLoader takes them, from a resumed start.
                let (w0, w1) = (run(&SIZES, j, r, (0, 2), 1), run(&SIZES, j, r, (1, 2), 1));
                let mut turns = Vec::new();
                for i in 0..w0.len().max(w1.len()) {
                    turns.extend(w0.get(i).cloned());
                    turns.extend(w1.get(i).cloned());
                }
                assert_eq!(turns, whole[1..], "{seed:?} {rank}");
            }
            let ranks: Vec<i64> = (0..3)
                .flat_map(|r| {
                    run(&SIZES, job(5, seed, Some(3)), Rank::new(r, 3).unwrap(), (0, 1), 0).concat()
                })
                .collect();
            let mut sorted = ranks.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..41).collect::<Vec<_>>());
        }
    }

    #[test]
    fn drop_last_drops_only_the_short_batch() {
        for seed in [Some(1), None] {
            let j = Job { drop_last: true, ..job(5, seed, Some(1)) };
            let got = run(&SIZES, j, Rank::single(), (0, 1), 0);
            assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [5; 8], "{seed:?}");
        }
    }

    /// The batches of a stream of `rows` row ids in input batches of 7, for `rank`.
    fn stream(rows: i64, job: Job, rank: Rank, start: u64) -> Vec<Vec<i64>> {
        let options = BatchOptions::new(job.batch).unwrap();
        let plan = TrainingPlan::new(&Layout::Stream, &options, &job.training, rank, 0).unwrap();
        let field = Arc::new(Field::new("id", DataType::Int64, false));
        let mut b = Batcher::new(vec![field], false, options).unwrap().on_course(plan.course(start)).unwrap();
        let ids_: Vec<i64> = (0..rows).collect();
        let mut input = ids_.chunks(7).map(|c| Arc::new(Int64Array::from(c.to_vec())) as ArrayRef);
        let mut out = Vec::new();
        loop {
            while let Some(t) = b.next_ready() {
                out.push(ids(t.unwrap()));
            }
            if b.ended() {
                return out;
            }
            b.feed(input.next().map(|a| Ok(vec![a]))).unwrap();
        }
    }

    #[test]
    fn a_stream_cuts_each_global_step_into_the_ranks_batches_and_resumes() {
        for seed in [None, Some(4)] {
            let one = stream(50, job(12, seed, None), Rank::single(), 0);
            for world in [2, 3, 4] {
                let ranks: Vec<Vec<Vec<i64>>> = (0..world)
                    .map(|r| stream(50, job(12 / world, seed, None), Rank::new(r, world).unwrap(), 0))
                    .collect();
                for (s, step) in one.iter().enumerate() {
                    let joined: Vec<i64> =
                        ranks.iter().flat_map(|b| b.get(s).cloned().unwrap_or_default()).collect();
                    assert_eq!(&joined, step, "{seed:?} {world} {s}");
                }
            }
            assert_eq!(stream(50, job(12, seed, None), Rank::single(), 2), one[2..], "{seed:?}");
        }
    }

    #[test]
    fn a_shuffled_table_is_gathered_and_interleaved_in_one_pass() {
        let col = |v: Vec<f32>| Arc::new(Float32Array::from(v)) as ArrayRef;
        let fields: Vec<FieldRef> =
            ["a", "b"].iter().map(|n| Arc::new(Field::new(*n, DataType::Float32, false))).collect();
        let course = Course {
            slots: vec![SlotCourse { per_step: 3, rows: None, seed: Some(5) }],
            block_steps: 2,
            ..Course::in_order(3)
        };
        // Under nulls="mask" a batch without nulls still has its mask, all true.
        let export = ExportOptions { nulls: NullPolicy::Mask, ..ExportOptions::default() };
        let options = BatchOptions { export, ..BatchOptions::new(3).unwrap() };
        let mut b = Batcher::new(fields, true, options).unwrap().on_course(course).unwrap();
        b.push(vec![col(vec![0.0, 1.0, 2.0, 3.0]), col(vec![0.0, 10.0, 20.0, 30.0])]).unwrap();
        b.push(vec![col(vec![4.0, 5.0]), col(vec![40.0, 50.0])]).unwrap();
        let mut seen = Vec::new();
        while let Some(t) = b.next_ready() {
            let TableTensors::One(m) = t.unwrap() else { panic!("stacked") };
            assert_eq!(m.values.shape(), &[3, 2]);
            assert!(m.values.copied());
            let mask = m.mask.expect("a mask under nulls='mask'");
            assert_eq!((mask.shape(), mask.as_slice::<bool>().unwrap()), (&[3, 2][..], &[true; 6][..]));
            for row in m.values.as_slice::<f32>().unwrap().chunks(2) {
                assert_eq!(row[1], row[0] * 10.0, "rows stay whole");
                seen.push(row[0] as i64);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_source_shorter_than_its_plan_is_an_error() {
        let field = Arc::new(Field::new("id", DataType::Int64, false));
        let mut b = Batcher::new(vec![field], false, BatchOptions::new(4).unwrap())
            .unwrap()
            .routing(Router::new([(0, 10, 0)]));
        b.feed(Some(Ok(vec![Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef]))).unwrap();
        let e = b.feed(None).unwrap_err();
        assert!(e.to_string().contains("after 3 of the 10 rows"), "{e}");
    }
}

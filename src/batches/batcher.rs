//! [`Batcher`]: cuts a stream of input batches into exact-size windows (slices, no copy), in
//! blocks whose rows are permuted when shuffling; [`Window`]: one batch's rows, converted on
//! demand in one pass (a gather when shuffled).

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef};
use arrow_schema::FieldRef;

use super::BatchOptions;
use super::plan::Course;
use super::select::Select;
use super::shuffle::{Rng, deal, derive};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::table::{Columns, TableTensors, table_on};
use crate::transfer;

/// The columns of one input batch, all of the same length.
pub type InputColumns = Vec<ArrayRef>;

/// A block being handed out batch by batch: its rows (slices of the input), which of them each
/// batch takes (in increasing order), and the seed of each batch's own order.
#[derive(Debug)]
struct Block {
    columns: Arc<Vec<Vec<ArrayRef>>>,
    batches: Vec<Arc<Vec<u32>>>,
    seed: u64,
    first_batch: u64,
    next: usize,
}

/// A shuffled batch's rows of its block (increasing), and the seed of their order in the batch.
type Picks = (Arc<Vec<u32>>, u64);

/// Cuts a stream of input batches into exact-size windows and converts them: push input with
/// [`Batcher::push`], say when it ended with [`Batcher::end`], and take finished batches with
/// [`Batcher::next_ready`].
///
/// The rows come in blocks of [`Course::block_rows`] (one batch unless shuffling). A shuffled
/// block's rows are dealt out to its batches by a generator seeded with the course's seed and
/// the block's index, and each batch orders its rows with a seed of its own
/// ([`super::shuffle::deal`]), so a block made again (on resuming) is the same. Batch `k` (counted over the epoch) is made when `k >= start` and
/// `(k - start) % workers == worker`, from [`BatchOptions::shard`]; the others are cut and
/// skipped without being converted.
#[derive(Debug)]
pub struct Batcher {
    fields: Vec<FieldRef>,
    /// A table's columns (stacked or by name), or one column as itself (a 1-D or N-d tensor).
    table: bool,
    options: BatchOptions,
    course: Course,
    select: Option<Select>,
    pending: VecDeque<InputColumns>,
    /// Rows of the front input batch already handed out.
    offset: usize,
    /// Rows pending after `offset`.
    buffered: usize,
    /// The index of the next block to cut.
    block: u64,
    current: Option<Block>,
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
        Ok(Batcher {
            fields,
            table,
            options,
            course: Course::in_order(options.batch_size),
            select: None,
            pending: VecDeque::new(),
            offset: 0,
            buffered: 0,
            block: 0,
            current: None,
            ended: false,
        })
    }

    /// The same, on `course`: blocks from `course.first_block` on, shuffled by its seed, and
    /// batches from `course.start` on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for blocks that are not whole batches, or a start before the
    /// first block.
    pub fn on_course(mut self, course: Course) -> Result<Self> {
        let size = self.options.batch_size;
        if course.block_rows == 0 || course.block_rows % size != 0 {
            return Err(Error::InvalidArgument(format!(
                "blocks of {} rows are not whole batches of {size}",
                course.block_rows
            )));
        }
        if course.start < course.first_block * (course.block_rows / size) as u64 {
            return Err(Error::InvalidArgument(format!(
                "batch {} is before block {}",
                course.start, course.first_block
            )));
        }
        self.block = course.first_block;
        self.course = course;
        Ok(self)
    }

    /// The same, keeping only the rows of the input that `select` keeps; the input ends when
    /// the last of them has come.
    pub fn selecting(mut self, select: Select) -> Self {
        self.ended = select.done();
        self.select = Some(select);
        self
    }

    /// The fields of every input batch.
    pub fn fields(&self) -> &[FieldRef] {
        &self.fields
    }

    /// Rows received and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buffered
    }

    /// True once the input has ended ([`Batcher::end`], or every selected row came).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Takes one input batch (no copy: its arrays, or the slices of them that the selection
    /// keeps, are kept until the batches over them are made). Empty batches are ignored, and
    /// so is input after the selection is complete.
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
        match self.select.as_mut() {
            None => self.keep(columns, rows),
            Some(_) if self.ended => {}
            Some(select) => {
                let parts = select.cut(rows);
                let done = select.done();
                for (at, len) in parts {
                    let part = if at == 0 && len == rows {
                        columns.clone()
                    } else {
                        columns.iter().map(|c| c.slice(at, len)).collect()
                    };
                    self.keep(part, len);
                }
                self.ended = done;
            }
        }
        Ok(())
    }

    fn keep(&mut self, columns: InputColumns, rows: usize) {
        if rows > 0 {
            self.pending.push_back(columns);
            self.buffered += rows;
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
    /// input ends before every row that the selection keeps has come (the source is shorter
    /// than the plan says).
    pub fn feed(&mut self, input: Option<Result<InputColumns>>) -> Result<()> {
        let pushed = match input {
            None if self.ended => Ok(()),
            None => match &self.select {
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
        self.pending.clear();
        self.current = None;
        self.buffered = 0;
        self.offset = 0;
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

    /// Whether batch `k` of the epoch is this worker's to make.
    fn mine(&self, k: u64) -> bool {
        let (index, count) = self.options.shard;
        k >= self.course.start && (k - self.course.start) % count as u64 == index as u64
    }

    /// The next batch of this worker, as [`Batcher::next_ready`] cuts it, not yet converted
    /// (no copy: slices of the input, and the order of its rows when shuffled).
    pub fn next_window(&mut self) -> Option<Window> {
        let size = self.options.batch_size;
        loop {
            if let Some(w) = self.next_of_block() {
                return Some(w);
            }
            let block_rows = self.course.block_rows;
            let rows = match self.buffered {
                b if b >= block_rows => block_rows,
                b if b > 0 && self.ended => b,
                _ => return None,
            };
            let index = self.block;
            self.block += 1;
            let first_batch = index * (block_rows / size) as u64;
            let full = rows / size;
            let made = full + usize::from(rows % size > 0 && !self.options.drop_last);
            let wanted = (0..made as u64).any(|i| self.mine(first_batch + i));
            let columns = self.take(rows, wanted);
            if !wanted {
                continue;
            }
            let Some(seed) = self.course.seed else {
                // Unshuffled, a block is one batch.
                return Some(self.window(Arc::new(columns), None));
            };
            let sizes: Vec<usize> = (0..rows.div_ceil(size)).map(|i| size.min(rows - i * size)).collect();
            let block_seed = derive(seed, &[index]);
            // A block of one batch needs no dealing: the batch takes every row.
            let dealt = match sizes.len() {
                1 => vec![(0..rows as u32).collect()],
                _ => deal(&sizes, &mut Rng::new(block_seed)),
            };
            let batches = dealt.into_iter().map(Arc::new).collect();
            self.current =
                Some(Block { columns: Arc::new(columns), batches, seed: block_seed, first_batch, next: 0 });
        }
    }

    /// The next batch of this worker from the shuffled block being handed out.
    fn next_of_block(&mut self) -> Option<Window> {
        let size = self.options.batch_size;
        loop {
            let block = self.current.as_mut()?;
            let i = block.next;
            let Some(rows) = block.batches.get(i).cloned() else {
                self.current = None;
                return None;
            };
            if rows.len() < size && self.options.drop_last {
                self.current = None;
                return None;
            }
            block.next += 1;
            let k = block.first_batch + i as u64;
            let (columns, seed) = (block.columns.clone(), derive(block.seed, &[i as u64]));
            if self.mine(k) {
                return Some(self.window(columns, Some((rows, seed))));
            }
        }
    }

    fn window(&self, columns: Arc<Vec<Vec<ArrayRef>>>, rows: Option<Picks>) -> Window {
        Window { fields: self.fields.clone(), table: self.table, options: self.options, columns, rows }
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

/// One batch's rows, cut from the input (slices, no copy) and not yet converted: the slices
/// themselves, or some rows of a shuffled block's slices in the block's order.
#[derive(Debug)]
pub struct Window {
    fields: Vec<FieldRef>,
    table: bool,
    options: BatchOptions,
    columns: Arc<Vec<Vec<ArrayRef>>>,
    rows: Option<Picks>,
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
        let BatchOptions { columns: layout, export, device, .. } = &self.options;
        let Some((rows, seed)) = &self.rows else { return self.convert_columns(&self.columns) };
        // Where each picked row goes in the batch: a permutation of its own.
        let mut to: Vec<u32> = (0..rows.len() as u32).collect();
        Rng::new(*seed).shuffle(&mut to);
        if self.table && *layout == Columns::Stack && *device == Device::Cpu && self.fields.len() > 1 {
            if let Some(m) = crate::arrow::take_matrix(&self.fields, &self.columns, rows, &to, export)? {
                return Ok(TableTensors::One(m));
            }
        }
        // (chunk, row) of the batch's rows in their order, for arrow's gather.
        let mut pairs = vec![(0usize, 0usize); rows.len()];
        let lens: Vec<usize> = self.columns[0].iter().map(|a| a.len()).collect();
        for (at, &t) in crate::kernels::chunk_rows(&lens, rows).zip(&to) {
            pairs[t as usize] = at;
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

    use super::super::{EpochPlan, EpochSpec, Even};
    use super::*;

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

    /// The batches (as row ids) of one worker of one rank, from batch `start` on.
    fn run(sizes: &[u64], spec: EpochSpec, worker: (usize, usize), start: u64) -> Vec<Vec<i64>> {
        let plan = EpochPlan::new(sizes, spec).unwrap();
        let (read, runs) = plan.reads(start);
        let field = Arc::new(Field::new("id", DataType::Int64, false));
        let options =
            BatchOptions { drop_last: spec.drop_last, ..BatchOptions::new(spec.batch_size).unwrap() }
                .sharded(worker.0, worker.1)
                .unwrap();
        let mut b = Batcher::new(vec![field], false, options)
            .unwrap()
            .on_course(plan.course(start))
            .unwrap()
            .selecting(Select::new(runs));
        let all = units(sizes);
        let mut input = read.iter().flat_map(|&u| all[u].clone());
        let mut out = Vec::new();
        loop {
            while let Some(t) = b.next_ready() {
                out.push(ids(t.unwrap()));
            }
            if b.ended() && b.buffered() == 0 {
                return out;
            }
            b.feed(input.next().map(|a| Ok(vec![a]))).unwrap();
        }
    }

    fn spec(rank: usize, world: usize, seed: Option<u64>) -> EpochSpec {
        EpochSpec {
            batch_size: 5,
            drop_last: false,
            rank,
            world,
            even: Even::Keep,
            seed,
            buffer: 12,
            epoch: 3,
        }
    }

    #[test]
    fn a_shuffled_epoch_gives_every_row_once_in_an_order_fixed_by_the_seed() {
        let sizes = [9, 4, 13, 8, 6];
        let one = run(&sizes, spec(0, 1, Some(7)), (0, 1), 0);
        assert_eq!(one.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5, 5, 5, 5, 5, 5, 5]);
        let mut rows = one.concat();
        assert_ne!(rows, (0..40).collect::<Vec<_>>());
        rows.sort_unstable();
        assert_eq!(rows, (0..40).collect::<Vec<_>>());
        assert_eq!(run(&sizes, spec(0, 1, Some(7)), (0, 1), 0), one);
        assert_ne!(run(&sizes, spec(0, 1, Some(8)), (0, 1), 0), one);
        let next_epoch = EpochSpec { epoch: 4, ..spec(0, 1, Some(7)) };
        assert_ne!(run(&sizes, next_epoch, (0, 1), 0), one);
        // Blocks of one batch: each batch orders its own rows, and resuming gives the same.
        let single = EpochSpec { buffer: 5, ..spec(0, 1, Some(7)) };
        let got = run(&sizes, single, (0, 1), 0);
        let mut rows = got.concat();
        assert!(got.iter().any(|b| b.windows(2).any(|w| w[0] > w[1])), "{got:?}");
        rows.sort_unstable();
        assert_eq!(rows, (0..40).collect::<Vec<_>>());
        assert_eq!(run(&sizes, single, (0, 1), 3), got[3..]);
    }

    #[test]
    fn a_resumed_pass_and_the_workers_make_the_same_batches_as_one_pass() {
        let sizes = [9, 4, 13, 8, 6, 1];
        for seed in [None, Some(11)] {
            for rank in 0..3 {
                let s = spec(rank, 3, seed);
                let whole = run(&sizes, s, (0, 1), 0);
                for start in 0..=whole.len() as u64 {
                    assert_eq!(
                        run(&sizes, s, (0, 1), start),
                        whole[start as usize..],
                        "{seed:?} {rank} {start}"
                    );
                }
                // Two workers, taken in turn as a DataLoader takes them, from a resumed start.
                let (w0, w1) = (run(&sizes, s, (0, 2), 1), run(&sizes, s, (1, 2), 1));
                let mut turns = Vec::new();
                for i in 0..w0.len().max(w1.len()) {
                    turns.extend(w0.get(i).cloned());
                    turns.extend(w1.get(i).cloned());
                }
                assert_eq!(turns, whole[1..], "{seed:?} {rank}");
            }
            let ranks: Vec<i64> =
                (0..3).flat_map(|r| run(&sizes, spec(r, 3, seed), (0, 1), 0).concat()).collect();
            let mut sorted = ranks.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..41).collect::<Vec<_>>());
        }
    }

    #[test]
    fn drop_last_drops_only_the_short_batch() {
        let s = EpochSpec { drop_last: true, ..spec(0, 1, Some(1)) };
        let got = run(&[9, 4, 13, 8, 6, 1], s, (0, 1), 0);
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [5; 8]);
        let s = EpochSpec { drop_last: true, ..spec(0, 1, None) };
        assert_eq!(run(&[9, 4, 13, 8, 6, 1], s, (0, 1), 0).len(), 8);
    }

    #[test]
    fn a_shuffled_table_is_gathered_and_interleaved_in_one_pass() {
        let col = |v: Vec<f32>| Arc::new(Float32Array::from(v)) as ArrayRef;
        let fields: Vec<FieldRef> =
            ["a", "b"].iter().map(|n| Arc::new(Field::new(*n, DataType::Float32, false))).collect();
        let course = Course { block_rows: 6, seed: Some(5), first_block: 0, start: 0 };
        let mut b =
            Batcher::new(fields, true, BatchOptions::new(3).unwrap()).unwrap().on_course(course).unwrap();
        b.push(vec![col(vec![0.0, 1.0, 2.0, 3.0]), col(vec![0.0, 10.0, 20.0, 30.0])]).unwrap();
        b.push(vec![col(vec![4.0, 5.0]), col(vec![40.0, 50.0])]).unwrap();
        let mut seen = Vec::new();
        while let Some(t) = b.next_ready() {
            let TableTensors::One(m) = t.unwrap() else { panic!("stacked") };
            assert_eq!(m.values.shape(), &[3, 2]);
            assert!(m.values.copied());
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
            .selecting(Select::new([(0, 10)]));
        b.feed(Some(Ok(vec![Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef]))).unwrap();
        let e = b.feed(None).unwrap_err();
        assert!(e.to_string().contains("after 3 of the 10 rows"), "{e}");
    }
}

//! One pass of a batch stream over a source read ahead: where its rows come from ([`Epoch`]),
//! how its batcher is set up ([`Setup`]), the row ranges of a table held in memory
//! ([`TableSlices`]), and the loop that reads the source and hands the converted batches on in
//! order ([`produce`]). A binding supplies the source and the hand-over (Python's
//! `dlframe.batches` runs [`produce`] on a background thread); everything here is pure Rust, and
//! nothing copies but the conversions themselves.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::ArrayRef;
use arrow_schema::{ArrowError, FieldRef};

use super::origin::Runs;
use super::plan::runs;
use super::{Ahead, BatchOptions, Batcher, Course, Read, Router, TrainingPlan};
use crate::error::{Error, Result};
use crate::table::{TableTensors, split_struct};

/// One rank's pass over an epoch: the plan, and the step it starts at.
#[derive(Debug, Clone)]
pub struct Epoch {
    /// The epoch's plan for this rank.
    pub plan: TrainingPlan,
    /// The first step the pass makes; for a DataLoader worker's own saved position, the step
    /// at which the workers' turns begin (see [`Epoch::resumed`]).
    pub start: u64,
}

/// How the batcher of a pass is made once the first input gives the fields.
#[derive(Debug, Clone)]
pub struct Setup {
    /// What the batches look like.
    pub options: BatchOptions,
    /// The rank's splits, the blocks and the first step.
    pub course: Course,
    /// Which rows of the units read go to which split; None keeps every row.
    pub router: Option<Router>,
    /// The source's row of each row read, for errors that name a row.
    pub sources: Runs,
}

impl Setup {
    /// Every row, in order.
    pub fn in_order(options: BatchOptions) -> Self {
        Setup {
            options,
            course: Course::in_order(options.batch_size),
            router: None,
            sources: Runs::identity(),
        }
    }
}

impl Epoch {
    /// The pass of `plan` from `step` on, in DataLoader worker `worker` of the rank: a state
    /// saved by the main process names the next step of the rank, and a worker's own state the
    /// next step of that worker (the workers take turns from `step - worker`).
    pub fn resumed(plan: TrainingPlan, step: u64, own: bool, worker: (usize, usize)) -> Self {
        let start = if own { step.saturating_sub(worker.0 as u64) } else { step };
        Epoch { plan, start }
    }

    /// The units to read whole, in order, for a source that lists its units.
    pub fn reads(&self) -> Vec<Read> {
        self.plan.reads(self.start)
    }

    /// The batcher's setup, and for a table in memory the row ranges to hand out
    /// ([`TableSlices`]).
    pub fn setup(&self, options: BatchOptions) -> (Setup, Option<TableSlices>) {
        let course = self.plan.course(self.start);
        let Some(total) = self.plan.total_rows() else {
            return (Setup { options, course, router: None, sources: Runs::identity() }, None);
        };
        let reads = self.reads();
        let router = Some(Router::new(runs(&reads, self.plan.unit_rows())));
        let sources = Runs::of_reads(&reads, self.plan.unit_rows());
        let setup = Setup { options, course, router, sources };
        let Some(unit) = self.plan.table_unit() else { return (setup, None) };
        // A table's units are ranges of its rows; ranges that follow each other are one.
        let mut ranges: VecDeque<(u64, u64)> = VecDeque::new();
        for r in &reads {
            let lo = r.unit as u64 * unit;
            let hi = lo + self.plan.unit_rows()[r.unit];
            match ranges.back_mut() {
                Some(last) if last.1 == lo => last.1 = hi,
                _ => ranges.push_back((lo, hi)),
            }
        }
        (setup, Some(TableSlices::new(total, ranges)))
    }
}

/// A table held in memory and the row ranges of it that a pass makes, in order, handed out as
/// slices (no copy).
#[derive(Debug)]
pub struct TableSlices {
    /// The rows the plan was made for.
    total: u64,
    field: Option<FieldRef>,
    arrays: Vec<ArrayRef>,
    /// The first row of each array.
    starts: Vec<u64>,
    pieces: VecDeque<(u64, u64)>,
}

impl TableSlices {
    /// The ranges `pieces` (in order) of a table of `total` rows, not read yet.
    pub fn new(total: u64, pieces: VecDeque<(u64, u64)>) -> Self {
        TableSlices { total, field: None, arrays: Vec::new(), starts: Vec::new(), pieces }
    }

    /// Whether the table has been read ([`TableSlices::load`]).
    pub fn is_loaded(&self) -> bool {
        self.field.is_some()
    }

    /// Holds the whole table (its arrays are shared, not copied) and checks its length.
    ///
    /// # Errors
    /// The reader's error, or [`Error::InvalidArgument`] when the table's length changed since
    /// the plan; the pass then has no more pieces.
    pub fn load(
        &mut self,
        field: FieldRef,
        arrays: impl IntoIterator<Item = std::result::Result<ArrayRef, ArrowError>>,
    ) -> Result<()> {
        let mut at = 0u64;
        let read = arrays.into_iter().try_for_each(|a| {
            let a = a?;
            self.starts.push(at);
            at += a.len() as u64;
            self.arrays.push(a);
            Ok::<(), Error>(())
        });
        let checked = read.and_then(|()| match at == self.total {
            true => Ok(()),
            false => Err(Error::InvalidArgument(format!(
                "the table has {at} rows now, not the {} it had when the epoch was planned",
                self.total
            ))),
        });
        match checked {
            Ok(()) => {
                self.field = Some(field);
                Ok(())
            }
            Err(e) => {
                self.pieces.clear();
                Err(e)
            }
        }
    }

    /// The next slice of the next piece (no copy); None at the end, or before [`TableSlices::load`].
    pub fn next_slice(&mut self) -> Option<(FieldRef, ArrayRef)> {
        let field = self.field.clone()?;
        let (lo, hi) = self.pieces.pop_front()?;
        let i = self.starts.partition_point(|&s| s <= lo) - 1;
        let a = &self.arrays[i];
        let off = lo - self.starts[i];
        let n = (hi - lo).min(a.len() as u64 - off);
        if lo + n < hi {
            self.pieces.push_front((lo + n, hi));
        }
        Some((field, a.slice(off as usize, n as usize)))
    }
}

/// Reads `next` (the source's arrays and their field) to its end, or until `stop` is set or
/// `send` says the consumer is gone, converting up to `depth` windows at once and sending each
/// batch in order. An error (the source's or a conversion's) is sent after the batches before
/// it, and ends the pass.
pub fn produce<E: From<Error>>(
    mut next: impl FnMut() -> Option<std::result::Result<(FieldRef, ArrayRef), E>>,
    mut setup: Setup,
    depth: usize,
    mut send: impl FnMut(std::result::Result<TableTensors, E>) -> bool,
    stop: &AtomicBool,
) {
    let mut batcher: Option<Batcher> = None;
    let mut ahead = Ahead::new(depth);
    // Sends the oldest batch; false when the pass is over (the consumer left, or an error).
    let mut send_one = |ahead: &mut Ahead| match ahead.pop() {
        Some(r) => {
            let failed = r.is_err();
            send(r.map_err(E::from)) && !failed
        }
        None => false,
    };
    let failure = loop {
        if let Some(b) = batcher.as_mut() {
            while !ahead.is_full()
                && let Some(w) = b.next_window()
            {
                ahead.push(w);
            }
            // More input can only make more windows: hand out a batch when no room is left,
            // or when the input has ended.
            if ahead.is_full() || (b.ended() && !ahead.is_empty()) {
                if !send_one(&mut ahead) {
                    return;
                }
                continue;
            }
            if b.ended() {
                return;
            }
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let pushed = match next() {
            None => match batcher.as_mut() {
                Some(b) => b.feed(None).map_err(E::from),
                None => return,
            },
            Some(Err(e)) => Err(e),
            Some(Ok((field, array))) => push(&mut batcher, field, array, &mut setup).map_err(E::from),
        };
        if let Err(e) = pushed {
            break e;
        }
    };
    // The batches before the error go first, in order.
    while !ahead.is_empty() {
        if !send_one(&mut ahead) {
            return;
        }
    }
    send(Err(failure));
}

/// Pushes one input array: a table's columns, or the one column. The first array makes the
/// batcher, from its field.
fn push(batcher: &mut Option<Batcher>, field: FieldRef, array: ArrayRef, setup: &mut Setup) -> Result<()> {
    let chunk = [array];
    let (fields, columns, table) = match split_struct(&field, &chunk)? {
        Some((fields, cols)) => (fields, cols.into_iter().map(|mut c| c.remove(0)).collect(), true),
        None => (vec![field], chunk.to_vec(), false),
    };
    let b = match batcher {
        Some(b) => b,
        None => {
            let b = Batcher::new(fields, table, setup.options)?
                .on_course(setup.course.clone())?
                .from_source(std::mem::take(&mut setup.sources));
            batcher.insert(match setup.router.take() {
                Some(router) => b.routing(router),
                None => b,
            })
        }
    };
    b.push(columns)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Array, Int32Array};
    use arrow_schema::{DataType, Field};

    use super::*;

    fn column(values: std::ops::Range<i32>) -> (FieldRef, ArrayRef) {
        (Arc::new(Field::new("x", DataType::Int32, false)), Arc::new(Int32Array::from_iter_values(values)))
    }

    /// The batches of one pass, as the first row of each and its rows; or the error text.
    fn run(
        input: Vec<Result<(FieldRef, ArrayRef)>>,
        setup: Setup,
        depth: usize,
    ) -> Vec<std::result::Result<(i32, i64), String>> {
        let mut input = input.into_iter();
        let mut out = Vec::new();
        let stop = AtomicBool::new(false);
        produce(
            || input.next(),
            setup,
            depth,
            |r: Result<TableTensors>| {
                out.push(r.map_err(|e| e.to_string()).map(|t| match t {
                    TableTensors::One(c) => (c.values.as_slice::<i32>().unwrap()[0], c.values.shape()[0]),
                    TableTensors::Dict(_) => unreachable!("one column"),
                }));
                true
            },
            &stop,
        );
        out
    }

    #[test]
    fn batches_come_in_order_and_an_error_after_the_batches_before_it() {
        let options = BatchOptions::new(4).unwrap();
        for depth in [1, 3] {
            let got = run(vec![Ok(column(0..6)), Ok(column(6..10))], Setup::in_order(options), depth);
            assert_eq!(got, [Ok((0, 4)), Ok((4, 4)), Ok((8, 2))]);
            let got = run(
                vec![Ok(column(0..9)), Err(Error::InvalidArgument("the source broke".into()))],
                Setup::in_order(options),
                depth,
            );
            assert_eq!(got, [Ok((0, 4)), Ok((4, 4)), Err("the source broke".into())]);
        }
    }

    #[test]
    fn a_table_in_memory_hands_out_its_pieces_as_slices_and_checks_its_length() {
        let (field, a) = column(0..10);
        let b: ArrayRef = Arc::new(Int32Array::from_iter_values(10..20));
        let mut t = TableSlices::new(20, VecDeque::from([(8, 12), (15, 16)]));
        assert!(t.next_slice().is_none() && !t.is_loaded());
        t.load(field.clone(), [Ok(a.clone()), Ok(b.clone())]).unwrap();
        let rows: Vec<(i32, usize)> = std::iter::from_fn(|| t.next_slice())
            .map(|(_, s)| (s.as_any().downcast_ref::<Int32Array>().unwrap().value(0), s.len()))
            .collect();
        // The piece 8..12 spans both arrays: two slices.
        assert_eq!(rows, [(8, 2), (10, 2), (15, 1)]);
        let mut short = TableSlices::new(30, VecDeque::from([(0, 4)]));
        let e = short.load(field, [Ok(a), Ok(b)]).unwrap_err();
        assert!(e.to_string().contains("has 20 rows now, not the 30"), "{e}");
        assert!(short.next_slice().is_none());
    }

    #[test]
    fn a_stream_s_ranks_take_their_part_of_each_step() {
        use crate::batches::{Layout, Rank, Training};
        let options = BatchOptions::new(2).unwrap();
        let plan =
            TrainingPlan::new(&Layout::Stream, &options, &Training::in_order(), Rank::new(1, 2).unwrap(), 0)
                .unwrap();
        let (setup, table) = Epoch::resumed(plan, 0, false, (0, 1)).setup(options);
        assert!(table.is_none());
        assert_eq!(setup.course.cut, Some((2, 4)));
        let got = run(vec![Ok(column(0..8))], setup, 2);
        assert_eq!(got, [Ok((2, 2)), Ok((6, 2))]);
    }

    #[test]
    fn a_table_s_pass_reads_the_ranges_of_its_units() {
        use crate::batches::{Layout, Rank, Training};
        let options = BatchOptions::new(3).unwrap();
        let t = Training { splits: Some(2), ..Training::in_order() };
        let plan = TrainingPlan::new(&Layout::Rows(10), &options, &t, Rank::new(1, 2).unwrap(), 0).unwrap();
        let (setup, table) = Epoch::resumed(plan, 0, false, (0, 1)).setup(options);
        // Rank 1's split is rows 5..10 of the table, its one unit.
        let mut table = table.unwrap();
        let (field, a) = column(0..10);
        table.load(field, [Ok(a)]).unwrap();
        let slices: Vec<usize> = std::iter::from_fn(|| table.next_slice()).map(|(_, s)| s.len()).collect();
        assert_eq!(slices, [10]);
        let got = run(vec![Ok(column(0..10))], setup, 2);
        assert_eq!(got, [Ok((5, 3)), Ok((8, 2))]);
    }
}

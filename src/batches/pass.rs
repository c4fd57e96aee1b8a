//! One pass of a batch stream over a source read ahead: where its rows come from ([`Epoch`],
//! [`Units`]), how its batcher is set up ([`Setup`]), the row ranges of a table held in memory
//! ([`TableSlices`]), and the loop that reads the source and hands the converted batches on in
//! order ([`produce`]). A binding supplies the source and the hand-over (Python's
//! `dlframe.batches` runs [`produce`] on a background thread); everything here is pure Rust, and
//! nothing copies but the conversions themselves.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::ArrayRef;
use arrow_schema::{ArrowError, FieldRef};

use super::shuffle::derive;
use super::{Ahead, BatchOptions, Batcher, Course, EpochPlan, EpochSpec, Even, Select};
use crate::error::{Error, Result};
use crate::table::{TableTensors, split_struct};

/// Where a pass's rows come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Units {
    /// A source of known units (files, row groups) that yields the plan's units whole, in order:
    /// the rows of each.
    Listed(Vec<u64>),
    /// A table in memory of `total` rows, cut into units of `unit` rows.
    Table {
        /// Rows of the table.
        total: u64,
        /// Rows per unit.
        unit: u64,
    },
    /// A stream of unknown length.
    Stream,
}

/// An epoch of a pass: its source's units, the plan's numbers, and the batch it resumes at.
#[derive(Debug, Clone, PartialEq)]
pub struct Epoch {
    /// Where the rows come from.
    pub units: Units,
    /// Batch size, ranks, shuffle and epoch.
    pub spec: EpochSpec,
    /// The first batch of this rank to make (a resumed epoch's).
    pub start: u64,
}

/// How the batcher of a pass is made once the first input gives the fields.
#[derive(Debug, Clone)]
pub struct Setup {
    /// What the batches look like.
    pub options: BatchOptions,
    /// The order and the first batch.
    pub course: Course,
    /// The rows of the units read that this rank keeps; None keeps every row.
    pub select: Option<Select>,
}

impl Setup {
    /// Every row, in order.
    pub fn in_order(options: BatchOptions) -> Self {
        Setup { options, course: Course::in_order(options.batch_size), select: None }
    }
}

impl Units {
    /// The units of a source described by what it lists: its units' rows, or a table's rows and
    /// the rows of a unit; neither is a stream.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for both.
    pub fn of(listed: Option<Vec<u64>>, table: Option<(u64, u64)>) -> Result<Units> {
        match (listed, table) {
            (Some(u), None) => Ok(Units::Listed(u)),
            (None, Some((total, unit))) => Ok(Units::Table { total, unit }),
            (None, None) => Ok(Units::Stream),
            (Some(_), Some(_)) => {
                Err(Error::InvalidArgument("an epoch has units or a table, not both".into()))
            }
        }
    }
}

impl Epoch {
    /// The plan, for a source of known length; None for a stream.
    ///
    /// # Errors
    /// As [`EpochPlan::new`].
    pub fn plan(&self) -> Result<Option<EpochPlan>> {
        Ok(match self.units {
            Units::Listed(ref u) => Some(EpochPlan::new(u, self.spec)?),
            Units::Table { total, unit } => Some(EpochPlan::over_rows(total, unit, self.spec)?),
            Units::Stream => None,
        })
    }

    /// The batcher's setup, and for a table the row ranges to hand out ([`TableSlices`]).
    ///
    /// A stream's length is not known ahead, so its ranks cannot be given ranges: rank `r` of
    /// `w` makes the stream's batches `r, r + w, ...`, each reading the whole stream, and the
    /// shuffle's blocks are the same on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `even` other than `keep` over a stream; as [`Epoch::plan`].
    pub fn setup(&self, options: BatchOptions) -> Result<(Setup, Option<TableSlices>)> {
        let spec = &self.spec;
        let Some(plan) = self.plan()? else {
            if spec.even != Even::Keep {
                return Err(Error::InvalidArgument(
                    "even='drop' and even='pad' need a source whose length is known ahead (a pyarrow \
                     Table or dataset, Parquet files, a Polars DataFrame); this one is a stream"
                        .into(),
                ));
            }
            let (worker, workers) = options.shard;
            let options = options.sharded(spec.rank + spec.world * worker, spec.world * workers)?;
            let block = spec.block_rows();
            let start = self.start * spec.world as u64;
            let course = Course {
                block_rows: block,
                seed: spec.seed.map(|s| derive(s, &[spec.epoch])),
                first_block: start / (block / spec.batch_size) as u64,
                start,
            };
            return Ok((Setup { options, course, select: None }, None));
        };
        let course = plan.course(self.start);
        Ok(match self.units {
            Units::Table { total, unit } => {
                // Rows of units that follow each other in the table are one range.
                let mut pieces: VecDeque<(u64, u64)> = VecDeque::new();
                for p in plan.pieces(self.start) {
                    let (lo, hi) = (p.unit as u64 * unit + p.lo, p.unit as u64 * unit + p.hi);
                    match pieces.back_mut() {
                        Some(last) if last.1 == lo => last.1 = hi,
                        _ => pieces.push_back((lo, hi)),
                    }
                }
                (Setup { options, course, select: None }, Some(TableSlices::new(total, pieces)))
            }
            _ => {
                let (_, runs) = plan.reads(self.start);
                (Setup { options, course, select: Some(Select::new(runs)) }, None)
            }
        })
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
            let b = Batcher::new(fields, table, setup.options)?.on_course(setup.course)?;
            batcher.insert(match setup.select.take() {
                Some(select) => b.selecting(select),
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

    #[test]
    fn a_source_lists_units_or_a_table_or_nothing() {
        assert_eq!(Units::of(Some(vec![3, 4]), None).unwrap(), Units::Listed(vec![3, 4]));
        assert_eq!(Units::of(None, Some((10, 5))).unwrap(), Units::Table { total: 10, unit: 5 });
        assert_eq!(Units::of(None, None).unwrap(), Units::Stream);
        assert!(Units::of(Some(vec![1]), Some((1, 1))).unwrap_err().to_string().contains("not both"));
    }

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
    fn a_stream_cannot_be_evened_and_its_ranks_take_turns() {
        let spec = EpochSpec {
            batch_size: 2,
            drop_last: false,
            rank: 1,
            world: 2,
            even: Even::Drop,
            seed: None,
            buffer: 0,
            epoch: 0,
        };
        let options = BatchOptions::new(2).unwrap();
        let stream = Epoch { units: Units::Stream, spec, start: 0 };
        assert!(stream.setup(options).unwrap_err().to_string().contains("even='drop'"));
        let keep = Epoch { spec: EpochSpec { even: Even::Keep, ..spec }, ..stream };
        let (setup, table) = keep.setup(options).unwrap();
        assert!(table.is_none());
        assert_eq!(setup.options.shard, (1, 2));
        let got = run(vec![Ok(column(0..8))], setup, 2);
        assert_eq!(got, [Ok((2, 2)), Ok((6, 2))]);
    }
}

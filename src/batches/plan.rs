//! The plan of one epoch of a training job: which rows each rank makes at each global step, in
//! which order, and which units (row groups, partitions, ranges of rows in memory) it reads to
//! make them. Pure arithmetic: nothing is read here, so every rank, every DataLoader worker
//! and every restart computes the same plan from the same numbers.
//!
//! ## Elastic order
//!
//! A global step makes `G = batch_size x world` rows; `G` is what a job keeps when it restarts
//! on another number of ranks (with another `batch_size`). An epoch of a source of known length:
//! 1. orders the units: shuffled by `(seed, epoch)`, or as given;
//! 2. cuts that order into `K` splits, contiguous ranges of rows. Split `i` gives
//!    `g_i = C(i + 1) - C(i)` rows to every step, where `C(i) = floor(i G / K)`, so the `K`
//!    splits give `G` rows in all; its length is what its steps take
//!    (`split_start(i) = S C(i) + floor(L C(i) / G)` for `S` full steps and a last step of `L`
//!    rows);
//! 3. gives rank `r` of `W` the splits `r K / W .. (r + 1) K / W`. Because `W` divides `K`, their
//!    `g_i` add up to exactly `batch_size`, and their rows are exactly the `r`-th `W`-th of the
//!    epoch: `floor(r N / W) ..`;
//! 4. cuts each split's rows into blocks of `block_steps` steps; a shuffled block deals its rows
//!    out to its steps and orders each step's rows with generators seeded by
//!    `(seed, epoch, split, block)` (see [`super::Batcher`]), never by the rank;
//! 5. makes the rank's batch of step `s` from its splits' rows of step `s`, in split order.
//!
//! So the global step `s` (the ranks' batches, rank 0 first) is the same for every world size
//! that divides `K`, and a state saved at step `s` continues on any of them. The last step takes
//! the `L < G` rows left: under [`Even::Keep`] all of them (ranks then differ by at most one
//! row, and a rank may have one batch fewer), under [`Even::Drop`] `L - L % K` of them (the last
//! `L % K` rows of the order are left out), and under [`Even::Pad`] `L` rounded up to a multiple
//! of `K` (at most `G`), the extra rows wrapping round to the first rows of the order.
//!
//! A stream's length is not known ahead, so it has no splits: every rank reads the whole stream,
//! its global step `s` is rows `s G ..` (permuted in blocks of steps when shuffled), and rank `r`
//! makes the step's rows `r batch_size ..`.

use super::BatchOptions;
use super::shuffle::{derive, permutation};
use crate::error::{Error, Result};

/// Splits of an epoch when the job does not choose: elastic for 1, 2, 4 or 8 ranks, and at
/// most 8 units read at once per rank.
pub const DEFAULT_SPLITS: usize = 8;

/// Rows shuffled together at least, over the whole job, when the job does not choose.
pub const DEFAULT_SHUFFLE_ROWS: u64 = 65_536;

const UNIT_TAG: u64 = 0x756e_6974;
const SPLIT_TAG: u64 = 0x7370_6c74;

/// What the last, partial global step does with the rows left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Even {
    /// Every row, once: ranks differ by at most one row, and so by at most one batch.
    Keep,
    /// The last step takes a multiple of the splits: the last rows of the order are left out.
    Drop,
    /// The last step is rounded up to a multiple of the splits with the first rows again.
    Pad,
}

impl Even {
    /// `"keep"`, `"drop"` or `"pad"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another word.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "keep" => Ok(Even::Keep),
            "drop" => Ok(Even::Drop),
            "pad" => Ok(Even::Pad),
            _ => Err(Error::InvalidArgument(format!("even must be 'keep', 'drop' or 'pad', not '{s}'"))),
        }
    }

    /// The word [`Even::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Even::Keep => "keep",
            Even::Drop => "drop",
            Even::Pad => "pad",
        }
    }
}

/// What a source is made of, as far as the plan needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Units of known rows, in the source's order: row groups of Parquet files, partitions of a
    /// query plan. A rank reads only the units that hold its rows.
    Units(Vec<u64>),
    /// A table in memory of this many rows; its units are ranges of rows the plan chooses.
    Rows(u64),
    /// A stream whose length is not known ahead.
    Stream,
}

impl Layout {
    /// The layout a caller describes: `units`' rows when it has units, else a table of `rows`,
    /// else (neither) a stream.
    pub fn of(rows: Option<u64>, units: Option<Vec<u64>>) -> Layout {
        match (rows, units) {
            (_, Some(u)) => Layout::Units(u),
            (Some(n), None) => Layout::Rows(n),
            (None, None) => Layout::Stream,
        }
    }

    /// Rows of the source, where known.
    pub fn rows(&self) -> Option<u64> {
        match self {
            Layout::Units(u) => Some(u.iter().sum()),
            Layout::Rows(n) => Some(*n),
            Layout::Stream => None,
        }
    }
}

/// A shuffle: its seed (the same on every rank), and the rows shuffled together over the whole
/// job (None: at least [`DEFAULT_SHUFFLE_ROWS`], and one global step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shuffle {
    /// The seed.
    pub seed: u64,
    /// `shuffle_buffer`, in rows of the whole job.
    pub buffer: Option<u64>,
}

/// How a job orders its epochs: the same on every rank and every restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Training {
    /// The last step's rows.
    pub even: Even,
    /// The shuffle, or None for the source's order.
    pub shuffle: Option<Shuffle>,
    /// `splits=`; None chooses (see [`TrainingPlan::new`]).
    pub splits: Option<usize>,
}

impl Training {
    /// The source's order, one split per rank, every row kept.
    pub fn in_order() -> Self {
        Training { even: Even::Keep, shuffle: None, splits: None }
    }

    /// The order `dlframe.batches`' keywords ask for (`even=`, `shuffle=`, `seed=`,
    /// `shuffle_buffer=`, `splits=`), checked.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a shuffle without a seed, a seed or buffer without a
    /// shuffle, and what [`Training::check`] refuses.
    pub fn new(
        even: Even,
        shuffle: bool,
        seed: Option<u64>,
        buffer: Option<u64>,
        splits: Option<usize>,
    ) -> Result<Self> {
        let shuffle = match (shuffle, seed) {
            (true, Some(seed)) => Some(Shuffle { seed, buffer }),
            (true, None) => {
                let why = "shuffle=True needs seed=, an int in [0, 2**64), the same on every rank, not None";
                return Err(Error::InvalidArgument(why.into()));
            }
            (false, None) if buffer.is_none() => None,
            (false, _) => {
                let why = "seed= and shuffle_buffer= take effect with shuffle=True only";
                return Err(Error::InvalidArgument(why.into()));
            }
        };
        let training = Training { even, shuffle, splits };
        training.check()?;
        Ok(training)
    }

    /// These settings, with `splits` and the shuffle's `buffer` taken from a saved state where
    /// the job left them out.
    pub fn adopting(&self, splits: Option<usize>, buffer: Option<u64>) -> Training {
        let shuffle = self.shuffle.map(|s| Shuffle { buffer: s.buffer.or(buffer), ..s });
        Training { splits: self.splits.or(splits), shuffle, ..*self }
    }

    /// Checks the numbers.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `splits=0` or `shuffle_buffer=0`.
    pub fn check(&self) -> Result<()> {
        if self.splits == Some(0) {
            return Err(Error::InvalidArgument("splits must be a positive int, not 0".into()));
        }
        if self.shuffle.is_some_and(|s| s.buffer == Some(0)) {
            return Err(Error::InvalidArgument("shuffle_buffer must be a positive int (rows), not 0".into()));
        }
        Ok(())
    }
}

/// This process's place in the job: `shard=(rank, world)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
}

impl Rank {
    /// Rank `rank` of `world`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `0 <= rank < world`.
    pub fn new(rank: usize, world: usize) -> Result<Self> {
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "shard must be (rank, world_size) with 0 <= rank < world_size, not ({rank}, {world})"
            )));
        }
        Ok(Rank { rank, world })
    }

    /// The only rank.
    pub fn single() -> Self {
        Rank { rank: 0, world: 1 }
    }
}

/// Rows `lo..hi` of unit `unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The unit's index in the source.
    pub unit: usize,
    /// The first row of the unit taken.
    pub lo: u64,
    /// One past the last row taken.
    pub hi: u64,
}

/// Rows `lo..hi` of a unit read, for the rank's split `slot` (0 is the rank's first split).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The first row of the unit.
    pub lo: u64,
    /// One past the last row.
    pub hi: u64,
    /// The rank's split the rows go to.
    pub slot: usize,
}

/// One unit to read whole, and the rows of it that the rank's splits take, in increasing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The unit's index in the source.
    pub unit: usize,
    /// Its rows the splits take.
    pub cuts: Vec<Cut>,
}

/// One of the rank's splits, as its batcher sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCourse {
    /// Rows it gives to each step (the last step: what is left).
    pub per_step: usize,
    /// Rows it gives from the first block of the pass to the end of the epoch; None: until the
    /// input ends (a stream).
    pub rows: Option<u64>,
    /// The seed of its blocks, or None unshuffled.
    pub seed: Option<u64>,
}

/// How a rank's batcher cuts a pass: its splits, the blocks of steps, where it starts, and for a
/// stream the rows of each step that are the rank's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Course {
    /// The rank's splits, in order.
    pub slots: Vec<SlotCourse>,
    /// Steps in a block (1 unshuffled).
    pub block_steps: u64,
    /// The first block of the input.
    pub first_block: u64,
    /// The first step to make (a resumed pass's).
    pub start: u64,
    /// Rows of the input to skip before the first block (a resumed stream).
    pub skip_rows: u64,
    /// The positions `lo..hi` of each step's rows that are the rank's (a stream); None: all.
    pub cut: Option<(usize, usize)>,
}

impl Course {
    /// From the start of an unshuffled stream, in batches of `batch_size`.
    pub fn in_order(batch_size: usize) -> Self {
        Course {
            slots: vec![SlotCourse { per_step: batch_size, rows: None, seed: None }],
            block_steps: 1,
            first_block: 0,
            start: 0,
            skip_rows: 0,
            cut: None,
        }
    }
}

/// Why the plan has the splits it has, when it is not what the job asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitChoice {
    /// `splits=` as given.
    Given,
    /// [`DEFAULT_SPLITS`], elastic.
    Default,
    /// One split per rank: not elastic, with the reason.
    PerRank(String),
    /// A stream has no splits.
    Stream,
}

/// One rank's epoch, as `Batches.plan()` describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Rows this rank makes (None for a stream).
    pub rows: Option<u64>,
    /// Batches this rank makes.
    pub batches: Option<u64>,
    /// Rows of the source.
    pub total: Option<u64>,
    /// Rows of the source left out by `even="drop"`.
    pub dropped: u64,
    /// Rows made twice by `even="pad"`.
    pub padded: u64,
    /// Global steps of the epoch.
    pub steps: Option<u64>,
    /// Rows of a global step.
    pub global_batch: u64,
    /// The splits (None for a stream).
    pub splits: Option<usize>,
    /// Whether a restart on another world size continues this order.
    pub elastic: bool,
    /// `shuffle_buffer` in effect.
    pub shuffle_buffer: Option<u64>,
    /// Why the splits are not what was asked for, where they are not.
    pub note: Option<String>,
}

impl Summary {
    /// The summary as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a summary serializes")
    }
}

/// One rank's epoch.
#[derive(Debug, Clone)]
pub struct TrainingPlan {
    batch_size: u64,
    drop_last: bool,
    training: Training,
    rank: Rank,
    epoch: u64,
    /// Rows of the source; None for a stream.
    total: Option<u64>,
    /// Rows of each unit (a table's are ranges of `unit_rows`).
    units: Vec<u64>,
    /// Rows of a table's units; None for listed units.
    unit_rows: Option<u64>,
    /// Units in the epoch's order.
    order: Vec<usize>,
    splits: usize,
    choice: SplitChoice,
    /// Full global steps, and the rows of the last, partial one (after `even`).
    full_steps: u64,
    last: u64,
    block_steps: u64,
    buffer: Option<u64>,
}

/// `floor(a * b / c)` without overflow (c > 0).
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    (u128::from(a) * u128::from(b) / u128::from(c)) as u64
}

impl TrainingPlan {
    /// The epoch `epoch` of `layout` for `rank`, in batches of `options.batch_size`.
    ///
    /// Splits: `training.splits` when given; else [`DEFAULT_SPLITS`] when shuffled and one per
    /// rank when not (the source's order, each rank a contiguous range). A world size that does
    /// not divide the default gets one split per rank, and [`TrainingPlan::choice`] says so.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `splits=K` that the world size does not divide, `even`
    /// other than `keep` over a stream, and what [`Training::check`] refuses.
    pub fn new(
        layout: &Layout,
        options: &BatchOptions,
        training: &Training,
        rank: Rank,
        epoch: u64,
    ) -> Result<Self> {
        training.check()?;
        Rank::new(rank.rank, rank.world)?;
        let batch_size = options.batch_size as u64;
        let world = rank.world as u64;
        let global = batch_size.checked_mul(world).ok_or_else(|| {
            Error::InvalidArgument(format!("batch_size x world size ({batch_size} x {world}) overflows"))
        })?;
        let buffer = training.shuffle.map(|s| s.buffer.unwrap_or(global.max(DEFAULT_SHUFFLE_ROWS)));
        let block_steps = buffer.map_or(1, |b| b.div_ceil(global).max(1));
        let (splits, choice) = match (layout, training.splits) {
            (Layout::Stream, _) => {
                if training.even != Even::Keep {
                    return Err(Error::InvalidArgument(format!(
                        "even='{}' needs a source whose length is known ahead (a pyarrow Table or \
                         dataset, Parquet files, a Polars DataFrame); this one is a stream",
                        training.even.name()
                    )));
                }
                (1, SplitChoice::Stream)
            }
            (_, Some(k)) if k % rank.world != 0 => {
                return Err(Error::InvalidArgument(format!(
                    "splits={k} cannot be shared by {} ranks: each rank takes whole splits, so the \
                     world size must divide splits (choose splits a multiple of every world size \
                     the job may run on)",
                    rank.world
                )));
            }
            (_, Some(k)) => (k, SplitChoice::Given),
            (_, None) if training.shuffle.is_none() => (
                rank.world,
                SplitChoice::PerRank(
                    "one split per rank, the source's order (pass splits= for an order that a \
                     restart on another world size continues)"
                        .into(),
                ),
            ),
            (_, None) if DEFAULT_SPLITS % rank.world == 0 => (DEFAULT_SPLITS, SplitChoice::Default),
            (_, None) => (
                rank.world,
                SplitChoice::PerRank(format!(
                    "one split per rank: the default splits={DEFAULT_SPLITS} cannot be shared by {} \
                     ranks, so this order is not elastic (pass splits= a multiple of every world \
                     size the job may run on)",
                    rank.world
                )),
            ),
        };
        let (units, unit_rows) = match layout {
            Layout::Units(u) => (u.clone(), None),
            Layout::Rows(n) => {
                // A shuffled table's units are small enough that a step's rows come from at least
                // 16 places of the table; unshuffled, the table is one unit.
                let unit = match buffer {
                    Some(b) => (global.min(b) / 16).max(1),
                    None => (*n).max(1),
                };
                let units = (0..n.div_ceil(unit)).map(|u| unit.min(n - u * unit)).collect();
                (units, Some(unit))
            }
            Layout::Stream => (Vec::new(), None),
        };
        let order = match training.shuffle {
            Some(s) => permutation(units.len(), derive(s.seed, &[epoch, UNIT_TAG])),
            None => (0..units.len()).collect(),
        };
        let total = layout.rows();
        let n = total.unwrap_or(0);
        let (full_steps, rem) = (n / global, n % global);
        let k = splits as u64;
        let last = match training.even {
            Even::Keep => rem,
            Even::Drop => rem - rem % k,
            Even::Pad if rem == 0 => 0,
            Even::Pad => rem.div_ceil(k).saturating_mul(k).min(global),
        };
        Ok(TrainingPlan {
            batch_size,
            drop_last: options.drop_last,
            training: *training,
            rank,
            epoch,
            total,
            units,
            unit_rows,
            order,
            splits,
            choice,
            full_steps,
            last,
            block_steps,
            buffer,
        })
    }

    /// The settings.
    pub fn training(&self) -> &Training {
        &self.training
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Rows of a batch of this rank.
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// Whether a rank's last batch is dropped when it is short.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Rows of a global step: `batch_size x world`.
    pub fn global_batch(&self) -> u64 {
        self.batch_size * self.rank.world as u64
    }

    /// The splits of an epoch (1 for a stream).
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// Why the splits are what they are.
    pub fn choice(&self) -> &SplitChoice {
        &self.choice
    }

    /// Whether a restart on another world size (one that divides the splits) continues this
    /// order: the splits were not chosen by the world size.
    pub fn elastic(&self) -> bool {
        matches!(self.choice, SplitChoice::Given | SplitChoice::Default | SplitChoice::Stream)
    }

    /// `shuffle_buffer` in effect (rows of the whole job), or None unshuffled.
    pub fn shuffle_buffer(&self) -> Option<u64> {
        self.buffer
    }

    /// Rows of each unit of the source (a table's: the ranges the plan cut it into).
    pub fn unit_rows(&self) -> &[u64] {
        &self.units
    }

    /// Rows of a table's units; None for a source that lists its own.
    pub fn table_unit(&self) -> Option<u64> {
        self.unit_rows
    }

    /// Rows in the source; None for a stream.
    pub fn total_rows(&self) -> Option<u64> {
        self.total
    }

    /// Rows the epoch makes, over all ranks (after `even`); None for a stream.
    pub fn epoch_rows(&self) -> Option<u64> {
        self.total.map(|_| self.full_steps * self.global_batch() + self.last)
    }

    /// Global steps of the epoch (a rank may have one batch fewer); None for a stream.
    pub fn steps(&self) -> Option<u64> {
        self.total.map(|_| self.full_steps + u64::from(self.last > 0))
    }

    /// `C(i)`: the rows that splits `0..i` give to each full step.
    fn step_start(&self, i: usize) -> u64 {
        mul_div(i as u64, self.global_batch(), self.splits as u64)
    }

    /// The first row of split `i` in the epoch's order.
    fn split_start(&self, i: usize) -> u64 {
        let c = self.step_start(i);
        self.full_steps * c + mul_div(self.last, c, self.global_batch())
    }

    /// This rank's splits.
    fn slots(&self) -> std::ops::Range<usize> {
        let per = self.splits / self.rank.world;
        self.rank.rank * per..(self.rank.rank + 1) * per
    }

    /// Rows this rank makes in the epoch; None for a stream.
    pub fn rows(&self) -> Option<u64> {
        let slots = self.slots();
        self.total.map(|_| self.split_start(slots.end) - self.split_start(slots.start))
    }

    /// Batches this rank makes in the epoch; None for a stream.
    pub fn batches(&self) -> Option<u64> {
        let rows = self.rows()?;
        let last = rows - self.full_steps * self.batch_size;
        let kept = last > 0 && (!self.drop_last || last == self.batch_size);
        Some(self.full_steps + u64::from(kept))
    }

    /// Rows of the source that no rank makes this epoch (under [`Even::Drop`]), and rows made
    /// twice (under [`Even::Pad`]).
    pub fn uneven_rows(&self) -> (u64, u64) {
        match (self.total, self.epoch_rows()) {
            (Some(n), Some(made)) if made < n => (n - made, 0),
            (Some(n), Some(made)) => (0, made - n),
            _ => (0, 0),
        }
    }

    /// The epoch as `Batches.plan()` describes it.
    pub fn summary(&self) -> Summary {
        let (dropped, padded) = self.uneven_rows();
        let note = match &self.choice {
            SplitChoice::PerRank(why) => Some(why.clone()),
            SplitChoice::Stream => Some(
                "a stream has no splits: every rank reads all of it and makes its part of each step".into(),
            ),
            SplitChoice::Given | SplitChoice::Default => None,
        };
        Summary {
            rows: self.rows(),
            batches: self.batches(),
            total: self.total,
            dropped,
            padded,
            steps: self.steps(),
            global_batch: self.global_batch(),
            splits: self.total.map(|_| self.splits),
            elastic: self.elastic(),
            shuffle_buffer: self.buffer,
            note,
        }
    }

    /// Where a pass that makes steps from `start` on begins.
    pub fn course(&self, start: u64) -> Course {
        let first_block = start / self.block_steps;
        let seed = |split: usize| {
            self.training.shuffle.map(|s| derive(s.seed, &[self.epoch, SPLIT_TAG, split as u64]))
        };
        if self.total.is_none() {
            let b = self.batch_size as usize;
            let global = self.global_batch();
            return Course {
                slots: vec![SlotCourse { per_step: global as usize, rows: None, seed: seed(0) }],
                block_steps: self.block_steps,
                first_block,
                start,
                skip_rows: first_block.saturating_mul(self.block_steps).saturating_mul(global),
                cut: Some((self.rank.rank * b, (self.rank.rank + 1) * b)),
            };
        }
        let slots = self
            .slots()
            .map(|i| {
                let per_step = self.step_start(i + 1) - self.step_start(i);
                let len = self.split_start(i + 1) - self.split_start(i);
                let skipped = (first_block * self.block_steps).saturating_mul(per_step).min(len);
                SlotCourse { per_step: per_step as usize, rows: Some(len - skipped), seed: seed(i) }
            })
            .collect();
        Course { slots, block_steps: self.block_steps, first_block, start, skip_rows: 0, cut: None }
    }

    /// The units to read whole, in the order the pass needs them from step `start` on, with the
    /// rows each of the rank's splits takes of them. A unit at the edge of two splits is read
    /// once for each (once in all when both need it at the same time). Empty for a stream.
    pub fn reads(&self, start: u64) -> Vec<Read> {
        let Some(n) = self.total.filter(|&n| n > 0) else { return Vec::new() };
        let first_block = start / self.block_steps;
        // (block that first needs it, slot, piece), in the rank's order of need.
        let mut needs: Vec<(u64, usize, Piece)> = Vec::new();
        for (slot, i) in self.slots().enumerate() {
            let per_step = self.step_start(i + 1) - self.step_start(i);
            if per_step == 0 {
                continue;
            }
            let block_rows = per_step * self.block_steps;
            let (lo, hi) = (self.split_start(i), self.split_start(i + 1));
            let from = lo.saturating_add((first_block * block_rows).min(hi - lo));
            let mut at = from;
            for p in self.pieces_wrapping(from, hi, n) {
                needs.push((first_block + (at - from) / block_rows, slot, p));
                at += p.hi - p.lo;
            }
        }
        needs.sort_by_key(|&(block, slot, _)| (block, slot));
        let mut reads: Vec<Read> = Vec::new();
        for (_, slot, p) in needs {
            let cut = Cut { lo: p.lo, hi: p.hi, slot };
            match reads.last_mut() {
                // The same unit needed again at once, for rows after the last ones taken.
                Some(r) if r.unit == p.unit && r.cuts.last().is_some_and(|c| c.hi <= p.lo) => {
                    r.cuts.push(cut)
                }
                _ => reads.push(Read { unit: p.unit, cuts: vec![cut] }),
            }
        }
        reads
    }

    /// The pieces of rows `lo..hi` of the epoch's order, which wraps round after `n` rows.
    fn pieces_wrapping(&self, lo: u64, hi: u64, n: u64) -> Vec<Piece> {
        let mut out = Vec::new();
        let (mut from, mut left) = (lo % n, hi - lo);
        while left > 0 {
            let take = left.min(n - from);
            self.pieces_between(from, from + take, &mut out);
            left -= take;
            from = 0;
        }
        out
    }

    /// Appends the pieces of rows `lo..hi` of the epoch's order.
    fn pieces_between(&self, lo: u64, hi: u64, out: &mut Vec<Piece>) {
        let mut at = 0u64;
        for &u in &self.order {
            let n = self.units[u];
            let (a, b) = (lo.max(at), hi.min(at + n));
            if a < b {
                out.push(Piece { unit: u, lo: a - at, hi: b - at });
            }
            at += n;
            if at >= hi {
                break;
            }
        }
    }
}

/// `(skip, take, slot)` runs over the concatenated rows of `reads`, for [`super::Router`].
pub fn runs(reads: &[Read], unit_rows: &[u64]) -> Vec<(u64, u64, usize)> {
    let mut out = Vec::new();
    let mut skip = 0u64;
    for r in reads {
        let mut at = 0u64;
        for c in &r.cuts {
            out.push((skip + c.lo - at, c.hi - c.lo, c.slot));
            skip = 0;
            at = c.hi;
        }
        skip += unit_rows[r.unit] - at;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(batch_size: usize) -> BatchOptions {
        BatchOptions::new(batch_size).unwrap()
    }

    #[test]
    fn the_keywords_of_an_order_are_checked_together_and_a_state_fills_only_what_was_left_out() {
        let refused = |r: Result<Training>| r.unwrap_err().to_string();
        assert!(refused(Training::new(Even::Keep, true, None, None, None)).contains("needs seed="));
        assert!(refused(Training::new(Even::Keep, false, Some(1), None, None)).contains("shuffle=True only"));
        assert!(refused(Training::new(Even::Keep, false, None, Some(8), None)).contains("shuffle=True only"));
        assert!(refused(Training::new(Even::Keep, true, Some(1), Some(0), None)).contains("shuffle_buffer"));
        assert!(refused(Training::new(Even::Keep, false, None, None, Some(0))).contains("splits"));
        let t = Training::new(Even::Keep, true, Some(7), None, Some(4)).unwrap();
        assert_eq!(t.shuffle, Some(Shuffle { seed: 7, buffer: None }));
        let adopted = t.adopting(Some(2), Some(64));
        assert_eq!((adopted.splits, adopted.shuffle.unwrap().buffer), (Some(4), Some(64)));
        assert_eq!(Training::in_order().adopting(Some(2), Some(64)).shuffle, None);
    }

    fn plan(layout: &Layout, b: usize, training: Training, rank: usize, world: usize) -> TrainingPlan {
        TrainingPlan::new(layout, &options(b), &training, Rank::new(rank, world).unwrap(), 0).unwrap()
    }

    fn keep(splits: Option<usize>, seed: Option<u64>) -> Training {
        Training { even: Even::Keep, shuffle: seed.map(|seed| Shuffle { seed, buffer: None }), splits }
    }

    /// Every row the rank reads for its splits, per slot, as row ids of the source.
    fn rows_by_slot(p: &TrainingPlan, start: u64) -> Vec<Vec<u64>> {
        let base: Vec<u64> = p
            .unit_rows()
            .iter()
            .scan(0, |acc, &n| {
                *acc += n;
                Some(*acc - n)
            })
            .collect();
        let mut out = vec![Vec::new(); p.course(start).slots.len()];
        for r in p.reads(start) {
            for c in r.cuts {
                out[c.slot].extend((c.lo..c.hi).map(|x| base[r.unit] + x));
            }
        }
        out
    }

    #[test]
    fn splits_give_every_rank_its_share_and_the_same_rows_for_every_world_size() {
        // 1,003 rows in units of uneven sizes; G = 32 rows per step; K = 8.
        let layout = Layout::Units(vec![100, 250, 3, 400, 250]);
        let mut by_world = Vec::new();
        for world in [1, 2, 4, 8] {
            let mut all = Vec::new();
            for rank in 0..world {
                let p = plan(&layout, 32 / world, keep(Some(8), Some(3)), rank, world);
                assert_eq!(p.splits(), 8);
                let rows: Vec<u64> = rows_by_slot(&p, 0).concat();
                assert_eq!(rows.len() as u64, p.rows().unwrap());
                // Rank r's rows are the r-th W-th of the epoch, to the row.
                assert_eq!(
                    p.rows().unwrap(),
                    (rank as u64 + 1) * 1003 / world as u64 - rank as u64 * 1003 / world as u64
                );
                all.push(rows);
            }
            let flat = all.concat();
            let mut sorted = flat.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..1003).collect::<Vec<_>>());
            by_world.push(flat);
        }
        assert!(by_world.windows(2).all(|w| w[0] == w[1]), "the splits hold the same rows");
    }

    #[test]
    fn a_rank_batch_is_batch_size_rows_from_its_splits_for_every_world_size() {
        // G = 12 rows over K = 8 splits: steps take 1 or 2 rows of each split.
        for world in [1, 2, 4, 8] {
            for rank in 0..world {
                let p = plan(&Layout::Rows(100), 12 / world.min(4), keep(Some(8), None), rank, world);
                if 12 % world != 0 {
                    continue;
                }
                let c = p.course(0);
                assert_eq!(c.slots.iter().map(|s| s.per_step).sum::<usize>(), p.batch_size() as usize);
            }
        }
        let p = plan(&Layout::Rows(100), 12, keep(Some(8), None), 0, 1);
        let per: Vec<usize> = p.course(0).slots.iter().map(|s| s.per_step).collect();
        assert_eq!(per, [1, 2, 1, 2, 1, 2, 1, 2]);
        assert_eq!((p.steps(), p.batches(), p.rows()), (Some(9), Some(9), Some(100)));
    }

    #[test]
    fn the_last_step_is_kept_dropped_or_padded() {
        // 103 rows, G = 4 x 4 = 16: 6 full steps and 7 rows left.
        let layout = Layout::Rows(103);
        let t = |even| Training { even, shuffle: None, splits: Some(4) };
        let counts = |even| -> Vec<(u64, u64)> {
            (0..4)
                .map(|r| {
                    let p = plan(&layout, 4, t(even), r, 4);
                    (p.rows().unwrap(), p.batches().unwrap())
                })
                .collect()
        };
        assert_eq!(counts(Even::Keep), [(25, 7), (26, 7), (26, 7), (26, 7)]);
        assert_eq!(counts(Even::Drop), [(25, 7), (25, 7), (25, 7), (25, 7)]);
        assert_eq!(counts(Even::Pad), [(26, 7), (26, 7), (26, 7), (26, 7)]);
        let p = plan(&layout, 4, t(Even::Drop), 0, 4);
        assert_eq!(p.uneven_rows(), (3, 0));
        let p = plan(&layout, 4, t(Even::Pad), 3, 4);
        assert_eq!(p.uneven_rows(), (0, 1));
        // The padded row is the first of the order again, on the last rank.
        assert_eq!(rows_by_slot(&p, 0)[0].last(), Some(&0));
        let dl = TrainingPlan::new(
            &layout,
            &BatchOptions { drop_last: true, ..options(4) },
            &t(Even::Keep),
            Rank::new(0, 4).unwrap(),
            0,
        )
        .unwrap();
        assert_eq!(dl.batches(), Some(6));
    }

    #[test]
    fn a_rank_reads_only_the_units_of_its_splits_in_the_order_it_needs_them() {
        // Units of 10 rows, G = 8 over 4 splits of 10 rows: rank 1 of 2 has splits 2 and 3.
        let layout = Layout::Units(vec![10; 4]);
        let p = plan(&layout, 4, keep(Some(4), None), 1, 2);
        let reads = p.reads(0);
        assert_eq!(reads.iter().map(|r| r.unit).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(runs(&reads, p.unit_rows()), [(0, 10, 0), (0, 10, 1)]);
        // Resuming at step 3 (rows 6.. of each split).
        assert_eq!(runs(&p.reads(3), p.unit_rows()), [(6, 4, 0), (6, 4, 1)]);
        assert_eq!(p.course(3).slots[0].rows, Some(4));
        assert!(p.reads(5).is_empty());
        // 3 splits of 40 rows = 13/14 rows: units at the edges are read by both splits.
        let p = plan(&layout, 3, keep(Some(3), None), 0, 1);
        type Cuts = Vec<(usize, Vec<(u64, u64, usize)>)>;
        let got: Cuts = p
            .reads(0)
            .into_iter()
            .map(|r| (r.unit, r.cuts.iter().map(|c| (c.lo, c.hi, c.slot)).collect()))
            .collect();
        // Splits of rows 0..13, 13..26 and 26..40, needed a row a step: unit 1 is read at step
        // 0 for split 1 and again at step 10 for split 0.
        let want: Cuts = vec![
            (0, vec![(0, 10, 0)]),
            (1, vec![(3, 10, 1)]),
            (2, vec![(6, 10, 2)]),
            (3, vec![(0, 10, 2)]),
            (2, vec![(0, 6, 1)]),
            (1, vec![(0, 3, 0)]),
        ];
        assert_eq!(got, want);
        // One step of 12 rows needs both ends of unit 1 at once: one read.
        let p = plan(&Layout::Units(vec![5, 10, 5]), 12, keep(Some(2), None), 0, 1);
        let first: Vec<Read> = p.reads(0);
        assert_eq!(
            first[1],
            Read { unit: 1, cuts: vec![Cut { lo: 0, hi: 5, slot: 0 }, Cut { lo: 5, hi: 10, slot: 1 }] }
        );
    }

    #[test]
    fn the_default_splits_are_elastic_and_a_world_that_does_not_divide_them_gets_one_per_rank() {
        let layout = Layout::Rows(1000);
        let p = plan(&layout, 10, keep(None, Some(1)), 0, 4);
        assert_eq!((p.splits(), p.elastic()), (DEFAULT_SPLITS, true));
        let p = plan(&layout, 10, keep(None, Some(1)), 0, 3);
        assert_eq!((p.splits(), p.elastic()), (3, false));
        assert!(
            matches!(p.choice(), SplitChoice::PerRank(why) if why.contains("splits=8 cannot be shared by 3"))
        );
        let p = plan(&layout, 10, keep(None, None), 0, 4);
        assert_eq!((p.splits(), p.elastic()), (4, false));
        let e = TrainingPlan::new(&layout, &options(10), &keep(Some(8), None), Rank::new(0, 3).unwrap(), 0)
            .unwrap_err();
        assert!(e.to_string().contains("splits=8 cannot be shared by 3 ranks"), "{e}");
        let e = TrainingPlan::new(
            &Layout::Stream,
            &options(10),
            &Training { even: Even::Drop, ..keep(None, None) },
            Rank::single(),
            0,
        )
        .unwrap_err();
        assert!(e.to_string().contains("even='drop' needs a source whose length is known"), "{e}");
        assert!(Rank::new(4, 4).unwrap_err().to_string().contains("not (4, 4)"));
        assert!(Even::parse("most").unwrap_err().to_string().contains("'keep', 'drop' or 'pad'"));
        let zero = Training { splits: Some(0), ..keep(None, None) };
        assert!(TrainingPlan::new(&layout, &options(1), &zero, Rank::single(), 0).is_err());
    }

    #[test]
    fn a_shuffled_epoch_orders_the_units_by_seed_and_epoch() {
        let layout = Layout::Units(vec![1; 64]);
        let order = |seed, epoch| {
            let p =
                TrainingPlan::new(&layout, &options(8), &keep(Some(1), Some(seed)), Rank::single(), epoch)
                    .unwrap();
            rows_by_slot(&p, 0).concat()
        };
        assert_eq!(order(1, 0), order(1, 0));
        assert_ne!(order(1, 0), order(1, 1));
        assert_ne!(order(1, 0), order(2, 0));
        let mut sorted = order(1, 0);
        assert_ne!(sorted, (0..64).collect::<Vec<_>>());
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn a_stream_cuts_each_global_step_into_the_ranks_batches() {
        let t = keep(None, Some(5));
        let p = TrainingPlan::new(&Layout::Stream, &options(10), &t, Rank::new(2, 4).unwrap(), 0).unwrap();
        let c = p.course(7);
        assert_eq!(c.cut, Some((20, 30)));
        assert_eq!(c.slots[0].per_step, 40);
        // 65,536 rows shuffled together: blocks of 1,639 steps of 40 rows.
        assert_eq!((c.block_steps, c.first_block, c.skip_rows), (1639, 0, 0));
        assert_eq!(p.steps(), None);
        let p =
            TrainingPlan::new(&Layout::Stream, &options(10), &keep(None, None), Rank::new(2, 4).unwrap(), 0)
                .unwrap();
        assert_eq!(p.course(7).skip_rows, 280);
    }
}

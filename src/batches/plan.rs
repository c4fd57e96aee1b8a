//! The plan of one epoch over a sharded, shuffled source: which rows each rank makes, in
//! which order, and which units (files, row groups, row ranges) it must read to make them.
//! Pure arithmetic: nothing is read here, so every rank and every DataLoader worker computes
//! the same plan from the same numbers.
//!
//! The source is a list of units with known row counts. An epoch:
//! 1. orders the units (shuffled by `(seed, epoch)`, or as given);
//! 2. gives each rank one contiguous range of rows of that order, rank 0 first: all ranks get
//!    `N / world` rows under [`Even::Drop`] (the last `N % world` rows of the order are left
//!    out), `ceil(N / world)` under [`Even::Pad`] (the last rank wraps round to the first rows
//!    of the order), and under [`Even::Keep`] the first `N % world` ranks one row more;
//! 3. cuts the rank's rows into blocks of `buffer` rows (a multiple of the batch size) and,
//!    when shuffling, permutes the rows inside each block (see [`super::Batcher`]);
//! 4. cuts batches of `batch_size` rows from the blocks, in order.
//!
//! A rank reads only the units that hold its rows; a unit at either end of its range is read
//! whole and cut (the neighbouring rank reads it too). A pass that resumes at batch `k` starts
//! reading at the block that holds batch `k`.

use super::shuffle::{derive, permutation};
use crate::error::{Error, Result};

/// How ranks are given the same number of batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Even {
    /// Every row, once: ranks differ by at most one row, and so by at most one batch.
    Keep,
    /// `N / world` rows each: the last `N % world` rows of the epoch's order are left out.
    Drop,
    /// `ceil(N / world)` rows each: the last rank's share wraps round to the first rows.
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
}

/// What an epoch looks like, the same on every rank but for `rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochSpec {
    /// Rows per batch.
    pub batch_size: usize,
    /// Drop a rank's last batch when it is shorter than `batch_size`.
    pub drop_last: bool,
    /// This rank, and how many there are.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// How the ranks' counts are evened out.
    pub even: Even,
    /// The shuffle's seed, or None for the source's order.
    pub seed: Option<u64>,
    /// Rows shuffled together (rounded up to a multiple of `batch_size`); ignored unshuffled.
    pub buffer: usize,
    /// The epoch: another epoch, another order.
    pub epoch: u64,
}

impl EpochSpec {
    /// Checks the numbers.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a batch size or buffer of 0, or a rank outside the world.
    pub fn check(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::InvalidArgument("batch_size must be at least 1".into()));
        }
        if self.rank >= self.world {
            return Err(Error::InvalidArgument(format!(
                "rank {} of {}: expected 0 <= rank < world size",
                self.rank, self.world
            )));
        }
        if self.seed.is_some() && self.buffer == 0 {
            return Err(Error::InvalidArgument("shuffle_buffer must be at least 1 row".into()));
        }
        Ok(())
    }

    /// Rows of a block: the shuffle buffer rounded up to whole batches, or one batch.
    pub fn block_rows(&self) -> usize {
        match self.seed {
            Some(_) => self.buffer.div_ceil(self.batch_size).saturating_mul(self.batch_size),
            None => self.batch_size,
        }
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

/// Where a rank's pass starts, for [`super::Batcher`]: the blocks it is given come in order
/// from `first_block`, and it makes batches from `start` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Course {
    /// Rows of a block (a multiple of the batch size).
    pub block_rows: usize,
    /// The seed of the rank's blocks, or None unshuffled.
    pub seed: Option<u64>,
    /// The index of the first block of the input.
    pub first_block: u64,
    /// The first batch (counted over the rank's epoch) to make.
    pub start: u64,
}

impl Course {
    /// From the start of an unshuffled stream.
    pub fn in_order(batch_size: usize) -> Self {
        Course { block_rows: batch_size, seed: None, first_block: 0, start: 0 }
    }
}

/// One rank's epoch.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    spec: EpochSpec,
    unit_rows: Vec<u64>,
    total: u64,
    /// Units in the epoch's order.
    order: Vec<usize>,
    /// This rank's first row in that order, and how many rows it makes.
    first: u64,
    rows: u64,
}

impl EpochPlan {
    /// The epoch `spec` over units of `unit_rows` rows each.
    ///
    /// # Errors
    /// [`EpochSpec::check`]'s.
    pub fn new(unit_rows: &[u64], spec: EpochSpec) -> Result<Self> {
        spec.check()?;
        let total: u64 = unit_rows.iter().sum();
        let order = match spec.seed {
            Some(seed) => permutation(unit_rows.len(), derive(seed, &[spec.epoch, 0x756e_6974])),
            None => (0..unit_rows.len()).collect(),
        };
        let (world, rank) = (spec.world as u64, spec.rank as u64);
        let (q, rem) = (total / world, total % world);
        let (first, rows) = match spec.even {
            Even::Keep => (rank * q + rank.min(rem), q + u64::from(rank < rem)),
            Even::Drop => (rank * q, q),
            Even::Pad => {
                let each = total.div_ceil(world);
                (if total == 0 { 0 } else { (rank * each) % total }, each)
            }
        };
        Ok(EpochPlan { spec, unit_rows: unit_rows.to_vec(), total, order, first, rows })
    }

    /// The same epoch over `total` rows in units of `unit` rows (a source with no units of its
    /// own: a table in memory).
    ///
    /// # Errors
    /// [`EpochPlan::new`]'s, and [`Error::InvalidArgument`] for units of 0 rows.
    pub fn over_rows(total: u64, unit: u64, spec: EpochSpec) -> Result<Self> {
        if unit == 0 {
            return Err(Error::InvalidArgument("units must have at least 1 row".into()));
        }
        let units: Vec<u64> = (0..total.div_ceil(unit)).map(|u| unit.min(total - u * unit)).collect();
        Self::new(&units, spec)
    }

    /// The spec this plan was made from.
    pub fn spec(&self) -> &EpochSpec {
        &self.spec
    }

    /// Rows in the source.
    pub fn total_rows(&self) -> u64 {
        self.total
    }

    /// Rows this rank makes in the epoch.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Batches this rank makes in the epoch.
    pub fn batches(&self) -> u64 {
        let b = self.spec.batch_size as u64;
        self.rows / b + u64::from(self.rows % b > 0 && !self.spec.drop_last)
    }

    /// Rows of the source that no rank makes this epoch (under [`Even::Drop`]), and rows made
    /// twice (under [`Even::Pad`]).
    pub fn uneven_rows(&self) -> (u64, u64) {
        let world = self.spec.world as u64;
        match self.spec.even {
            Even::Keep => (0, 0),
            Even::Drop => (self.total % world, 0),
            Even::Pad => (0, self.total.div_ceil(world) * world - self.total),
        }
    }

    /// Where a pass that makes batches from `start` on begins.
    pub fn course(&self, start: u64) -> Course {
        let block = self.spec.block_rows() as u64;
        let batches_per_block = block / self.spec.batch_size as u64;
        let seed = self.spec.seed.map(|s| derive(s, &[self.spec.epoch, self.spec.rank as u64]));
        Course { block_rows: block as usize, seed, first_block: start / batches_per_block, start }
    }

    /// The pieces of units, in order, that hold this rank's rows from the block of batch
    /// `start` on (no piece at all when `start` is past the end).
    pub fn pieces(&self, start: u64) -> Vec<Piece> {
        let course = self.course(start);
        let skip = (course.first_block * course.block_rows as u64).min(self.rows);
        let mut out = Vec::new();
        if self.total == 0 {
            return out;
        }
        // The rank's rows as ranges of the order, wrapping round under Even::Pad.
        let (mut from, mut left) = ((self.first + skip) % self.total, self.rows - skip);
        while left > 0 {
            let n = left.min(self.total - from);
            self.pieces_between(from, from + n, &mut out);
            left -= n;
            from = 0;
        }
        out
    }

    /// Appends the pieces of rows `lo..hi` of the epoch's order.
    fn pieces_between(&self, lo: u64, hi: u64, out: &mut Vec<Piece>) {
        let mut at = 0u64;
        for &u in &self.order {
            let n = self.unit_rows[u];
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

    /// The units to read whole, in order, and the rows of their concatenation that make the
    /// pieces: `(skip, take)` runs.
    pub fn reads(&self, start: u64) -> (Vec<usize>, Vec<(u64, u64)>) {
        let pieces = self.pieces(start);
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(pieces.len());
        let mut skip = 0;
        for p in &pieces {
            runs.push((skip + p.lo, p.hi - p.lo));
            skip = self.unit_rows[p.unit] - p.hi;
        }
        (pieces.iter().map(|p| p.unit).collect(), runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rank: usize, world: usize, even: Even) -> EpochSpec {
        EpochSpec { batch_size: 4, drop_last: false, rank, world, even, seed: None, buffer: 0, epoch: 0 }
    }

    /// Every row the rank makes, as row ids of the source (units numbered from 0 in order).
    fn rows_of(plan: &EpochPlan, start: u64) -> Vec<u64> {
        let base: Vec<u64> = plan
            .unit_rows
            .iter()
            .scan(0, |acc, &n| {
                *acc += n;
                Some(*acc - n)
            })
            .collect();
        plan.pieces(start)
            .iter()
            .flat_map(|p| (p.lo..p.hi).map(|r| base[p.unit] + r).collect::<Vec<_>>())
            .collect()
    }

    #[test]
    fn one_hundred_rows_over_four_ranks_give_twenty_five_each() {
        for even in [Even::Keep, Even::Drop, Even::Pad] {
            let all: Vec<Vec<u64>> = (0..4)
                .map(|r| rows_of(&EpochPlan::over_rows(100, 7, spec(r, 4, even)).unwrap(), 0))
                .collect();
            assert!(all.iter().all(|r| r.len() == 25), "{even:?}");
            let mut union: Vec<u64> = all.concat();
            union.sort_unstable();
            assert_eq!(union, (0..100).collect::<Vec<_>>());
        }
    }

    #[test]
    fn uneven_counts_are_kept_dropped_or_padded() {
        let units = [3, 5, 2, 4]; // 14 rows over 4 ranks
        let per = |even| -> Vec<Vec<u64>> {
            (0..4).map(|r| rows_of(&EpochPlan::new(&units, spec(r, 4, even)).unwrap(), 0)).collect()
        };
        let keep = per(Even::Keep);
        assert_eq!(keep.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 3, 3]);
        let mut all = keep.concat();
        all.sort_unstable();
        assert_eq!(all, (0..14).collect::<Vec<_>>());
        let drop = per(Even::Drop);
        assert!(drop.iter().all(|r| r.len() == 3));
        assert_eq!(drop.concat(), (0..12).collect::<Vec<_>>());
        let pad = per(Even::Pad);
        assert!(pad.iter().all(|r| r.len() == 4));
        assert_eq!(pad.concat(), (0..14).chain(0..2).collect::<Vec<_>>());
        let plan = EpochPlan::new(&units, spec(0, 4, Even::Pad)).unwrap();
        assert_eq!(plan.uneven_rows(), (0, 2));
        assert_eq!(EpochPlan::new(&units, spec(0, 4, Even::Drop)).unwrap().uneven_rows(), (2, 0));
    }

    #[test]
    fn a_rank_reads_only_the_units_of_its_rows() {
        let units = [10, 10, 10, 10];
        let plan = EpochPlan::new(&units, spec(1, 4, Even::Keep)).unwrap();
        assert_eq!(plan.reads(0), (vec![1], vec![(0, 10)]));
        let plan = EpochPlan::new(&units, spec(1, 3, Even::Keep)).unwrap();
        // Rows 14..27: the end of unit 1 and the start of unit 2.
        assert_eq!(plan.reads(0), (vec![1, 2], vec![(4, 6), (0, 7)]));
        // Resuming at batch 2 (rows 8.. of the rank, 22.. of the source) skips unit 1.
        assert_eq!(plan.reads(2), (vec![2], vec![(2, 5)]));
        assert_eq!(rows_of(&plan, 2), (22..27).collect::<Vec<_>>());
        assert_eq!(plan.batches(), 4);
        assert!(plan.pieces(4).is_empty());
    }

    #[test]
    fn a_shuffled_epoch_orders_the_units_by_seed_and_epoch() {
        let units = vec![1; 64];
        let order = |seed, epoch| {
            let s = EpochSpec { seed: Some(seed), buffer: 8, epoch, ..spec(0, 1, Even::Keep) };
            rows_of(&EpochPlan::new(&units, s).unwrap(), 0)
        };
        assert_eq!(order(1, 0), order(1, 0));
        assert_ne!(order(1, 0), order(1, 1));
        assert_ne!(order(1, 0), order(2, 0));
        let mut sorted = order(1, 0);
        assert_ne!(sorted, (0..64).collect::<Vec<_>>());
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
        // Blocks of 8 rows are 2 batches; resuming at batch 3 starts at block 1.
        let s = EpochSpec { seed: Some(1), buffer: 7, ..spec(0, 1, Even::Keep) };
        let plan = EpochPlan::new(&units, s).unwrap();
        let c = plan.course(3);
        assert_eq!((c.block_rows, c.first_block, c.start), (8, 1, 3));
        assert_eq!(rows_of(&plan, 3), rows_of(&plan, 0)[8..]);
    }

    #[test]
    fn bad_numbers_are_refused() {
        let e = EpochPlan::new(&[1], spec(4, 4, Even::Keep)).unwrap_err();
        assert!(e.to_string().contains("rank 4 of 4"), "{e}");
        assert!(Even::parse("most").unwrap_err().to_string().contains("'keep', 'drop' or 'pad'"));
        assert!(EpochPlan::over_rows(10, 0, spec(0, 1, Even::Keep)).is_err());
        let empty = EpochPlan::new(&[], spec(0, 2, Even::Pad)).unwrap();
        assert_eq!((empty.rows(), empty.batches(), empty.pieces(0)), (0, 0, vec![]));
    }
}

//! Where rows come from, so that an error names the row of the source: [`Runs`] maps a batch's
//! rows (through its block and the stream read) back to the source's, even when shuffled.

use super::plan::Read;

/// A map of row numbers as runs: `(first, from)` says that rows `first..` (up to the next run's
/// first) are rows `from..` of what they map to. Rows before the first run, and every row of an
/// empty map, map to themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs(Vec<(u64, u64)>);

impl Runs {
    /// Every row to itself.
    pub fn identity() -> Self {
        Runs(Vec::new())
    }

    /// Adds a run from row `first` on, which must follow the last one.
    pub fn push(&mut self, first: u64, from: u64) {
        debug_assert!(self.0.last().is_none_or(|&(f, _)| f <= first), "runs in order");
        match self.0.last_mut() {
            // A run of no rows is replaced by the one that follows it.
            Some(last) if last.0 == first => last.1 = from,
            _ => self.0.push((first, from)),
        }
    }

    /// The source's row of each row of a stream that reads `reads` (whole units, in order) of
    /// a source whose units have `unit_rows` rows, one after another.
    pub fn of_reads(reads: &[Read], unit_rows: &[u64]) -> Self {
        let starts: Vec<u64> = unit_rows
            .iter()
            .scan(0u64, |at, &n| {
                *at += n;
                Some(*at - n)
            })
            .collect();
        let mut runs = Runs::identity();
        let mut at = 0u64;
        for r in reads {
            runs.push(at, starts[r.unit]);
            at += unit_rows[r.unit];
        }
        runs
    }

    /// What row `row` maps to.
    pub fn map(&self, row: u64) -> u64 {
        match self.0.partition_point(|&(first, _)| first <= row) {
            0 => row,
            i => {
                let (first, from) = self.0[i - 1];
                from + (row - first)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_map_through_their_run() {
        let mut runs = Runs::identity();
        assert_eq!(runs.map(7), 7);
        runs.push(0, 100);
        runs.push(3, 10);
        runs.push(3, 20);
        runs.push(5, 0);
        assert_eq!((0..7).map(|r| runs.map(r)).collect::<Vec<_>>(), [100, 101, 102, 20, 21, 0, 1]);
    }
}

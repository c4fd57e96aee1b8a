//! [`Select`]: the rows of an input stream that a plan keeps, as `(skip, take)` runs, cut out
//! of the input batches as they come (slices, no copy).

use std::collections::VecDeque;

/// `(skip, take)` runs over the rows of a stream: skip that many, keep that many, and so on.
#[derive(Debug, Clone, Default)]
pub struct Select {
    runs: VecDeque<(u64, u64)>,
    /// Rows kept so far, and rows still to keep.
    kept: u64,
    left: u64,
}

impl Select {
    /// Keeps the `take` rows after each `skip`, in order; nothing after the last run.
    pub fn new(runs: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let runs: VecDeque<(u64, u64)> = runs.into_iter().filter(|&(_, take)| take > 0).collect();
        let left = runs.iter().map(|r| r.1).sum();
        Select { runs, kept: 0, left }
    }

    /// True once every run was kept: the rest of the stream is not needed.
    pub fn done(&self) -> bool {
        self.runs.is_empty()
    }

    /// Rows kept so far, and rows still to come.
    pub fn counts(&self) -> (u64, u64) {
        (self.kept, self.left)
    }

    /// The parts of the next input batch of `rows` rows to keep, as `(offset, len)` within it.
    pub fn cut(&mut self, rows: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0usize;
        while at < rows {
            let Some(front) = self.runs.front_mut() else { break };
            let room = (rows - at) as u64;
            if front.0 > 0 {
                let s = front.0.min(room);
                front.0 -= s;
                at += s as usize;
                continue;
            }
            let t = front.1.min(room);
            out.push((at, t as usize));
            front.1 -= t;
            at += t as usize;
            self.kept += t;
            self.left -= t;
            if front.1 == 0 {
                self.runs.pop_front();
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cut_across_input_batches() {
        let mut s = Select::new([(2, 3), (4, 2), (0, 1)]);
        assert_eq!(s.cut(4), [(2, 2)]);
        assert_eq!(s.cut(3), [(0, 1)]);
        assert_eq!(s.counts(), (3, 3));
        assert_eq!(s.cut(10), [(2, 2), (4, 1)]);
        assert!(s.done());
        assert_eq!(s.cut(5), []);
        assert!(Select::new([(5, 0)]).done());
    }
}

//! [`Router`]: the rows of an input stream that a plan keeps, as `(skip, take, slot)` runs, cut
//! out of the input batches as they come (slices, no copy) and sent to the rank's splits.

use std::collections::VecDeque;

/// `(skip, take, slot)` runs over the rows of a stream: skip that many, give that many to split
/// `slot`, and so on.
#[derive(Debug, Clone, Default)]
pub struct Router {
    runs: VecDeque<(u64, u64, usize)>,
    /// Rows routed so far, and rows still to route.
    kept: u64,
    left: u64,
}

impl Router {
    /// Routes the `take` rows after each `skip`, in order; nothing after the last run.
    pub fn new(runs: impl IntoIterator<Item = (u64, u64, usize)>) -> Self {
        let runs: VecDeque<_> = runs.into_iter().filter(|&(_, take, _)| take > 0).collect();
        let left = runs.iter().map(|r| r.1).sum();
        Router { runs, kept: 0, left }
    }

    /// True once every run was routed: the rest of the stream is not needed.
    pub fn done(&self) -> bool {
        self.runs.is_empty()
    }

    /// Rows routed so far, and rows still to come.
    pub fn counts(&self) -> (u64, u64) {
        (self.kept, self.left)
    }

    /// The parts of the next input batch of `rows` rows to keep, as `(offset, len, slot)` within
    /// it. Runs that follow each other into one split are one part: a batch across them is then
    /// one slice of the input, not two joined by a copy (a group of row groups read as one
    /// array, whose units are runs of their own).
    pub fn cut(&mut self, rows: usize) -> Vec<(usize, usize, usize)> {
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
            match out.last_mut() {
                Some((o, l, slot)) if *slot == front.2 && *o + *l == at => *l += t as usize,
                _ => out.push((at, t as usize, front.2)),
            }
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
        let mut s = Router::new([(2, 3, 0), (4, 2, 1), (0, 1, 0)]);
        assert_eq!(s.cut(4), [(2, 2, 0)]);
        assert_eq!(s.cut(3), [(0, 1, 0)]);
        assert_eq!(s.counts(), (3, 3));
        assert_eq!(s.cut(10), [(2, 2, 1), (4, 1, 0)]);
        assert!(s.done());
        assert_eq!(s.cut(5), []);
        assert!(Router::new([(5, 0, 0)]).done());
    }

    #[test]
    fn runs_that_follow_each_other_into_one_split_are_one_part() {
        let mut s = Router::new([(0, 3, 0), (0, 4, 0), (0, 2, 1), (1, 2, 1), (0, 5, 0)]);
        assert_eq!(s.cut(7), [(0, 7, 0)]);
        // Another split, a skipped row, then split 0 again: each a part of its own.
        assert_eq!(s.cut(20), [(0, 2, 1), (3, 2, 1), (5, 5, 0)]);
        assert_eq!(s.counts(), (16, 0));
    }
}

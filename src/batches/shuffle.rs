//! The random numbers of a shuffled epoch: a seeded generator whose stream is fixed by this
//! file, so an order can be made again from its seed (to resume a pass, or on another rank).
//!
//! Seeds are mixed with SplitMix64, and permutations are Fisher-Yates shuffles driven by
//! wyrand with Lemire's unbiased bounded draws. A block of rows is permuted in two steps that
//! together draw every permutation with the same probability: [`deal`] hands the rows out to
//! the batches (each row drawn with weights equal to the room left in each batch, so every
//! split into batches of these sizes is equally likely), and each batch orders its rows with a
//! Fisher-Yates shuffle of its own. The first step reads the rows in order, so each batch's
//! rows come out sorted, and gathering them reads memory forward. These algorithms are part of the saved-state
//! format: changing any of them changes the order that a saved `(seed, epoch)` stands for, so
//! [`STREAM_VERSION`] must change with them.

/// The version of the streams this file makes; a saved state from another version is refused.
pub const STREAM_VERSION: u32 = 2;

/// SplitMix64's finalizer: a well-mixed 64-bit value of `x`.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed derived from `seed` and the `parts` (epoch, rank, block...), in order.
pub fn derive(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(mix(seed), |acc, &p| mix(acc ^ mix(p)))
}

/// wyrand: a small, fast generator with a 64-bit state.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        (t >> 64) as u64 ^ t as u64
    }

    /// A uniform value in `0..n` (n > 0), without bias (Lemire's method).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// Shuffles `items` in place (Fisher-Yates): every order equally likely.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Rows `0..sizes.sum()` dealt out to batches of `sizes` rows, uniformly among all such
/// splits: each batch's rows, in increasing order.
pub fn deal(sizes: &[usize], rng: &mut Rng) -> Vec<Vec<u32>> {
    let n = sizes.len();
    let total: usize = sizes.iter().sum();
    let mut out: Vec<Vec<u32>> = sizes.iter().map(|&s| Vec::with_capacity(s)).collect();
    // A Fenwick tree over the room left in each batch: a draw finds its batch in log2(n) steps.
    let mut tree = vec![0u64; n + 1];
    for (i, &s) in sizes.iter().enumerate() {
        let mut j = i + 1;
        while j <= n {
            tree[j] += s as u64;
            j += j & j.wrapping_neg();
        }
    }
    let top = if n == 0 { 0 } else { 1usize << (usize::BITS - 1 - n.leading_zeros()) };
    for (row, left) in (0..total as u32).zip((1..=total as u64).rev()) {
        // The batch holding the `r`-th slot left: the smallest i whose prefix of room exceeds r.
        let mut r = rng.below(left);
        let (mut at, mut step) = (0usize, top);
        while step > 0 {
            if at + step <= n && tree[at + step] <= r {
                at += step;
                r -= tree[at];
            }
            step >>= 1;
        }
        out[at].push(row);
        let mut j = at + 1;
        while j <= n {
            tree[j] -= 1;
            j += j & j.wrapping_neg();
        }
    }
    out
}

/// `0..n` in the order that `seed` gives (a fresh permutation).
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    Rng::new(seed).shuffle(&mut p);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_streams_are_fixed_by_their_seed() {
        // Pinned values: a change here changes what saved states mean (bump STREAM_VERSION).
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        let mut r = Rng::new(42);
        let first: Vec<u64> = (0..3).map(|_| r.below(1000)).collect();
        let mut again = Rng::new(42);
        assert_eq!(first, (0..3).map(|_| again.below(1000)).collect::<Vec<_>>());
        assert_eq!(permutation(10, 7), permutation(10, 7));
        assert_ne!(permutation(10, 7), permutation(10, 8));
        assert_ne!(derive(1, &[2, 3]), derive(1, &[3, 2]));
    }

    #[test]
    fn rows_are_dealt_to_batches_uniformly() {
        let dealt = deal(&[3, 3, 2], &mut Rng::new(1));
        assert_eq!(dealt.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 2]);
        let mut all: Vec<u32> = dealt.concat();
        assert!(dealt.iter().all(|b| b.windows(2).all(|w| w[0] < w[1])), "sorted: {dealt:?}");
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        // Row 0 lands in each of 4 equal batches a quarter of the time, and the last row too.
        let mut first = [0u32; 4];
        let mut last = [0u32; 4];
        let mut rng = Rng::new(5);
        for _ in 0..8000 {
            let d = deal(&[4, 4, 4, 4], &mut rng);
            first[d.iter().position(|b| b.contains(&0)).unwrap()] += 1;
            last[d.iter().position(|b| b.contains(&15)).unwrap()] += 1;
        }
        // 2,000 expected each; 5 standard deviations is about 190.
        assert!(first.iter().chain(&last).all(|&c| c.abs_diff(2000) < 190), "{first:?} {last:?}");
        assert!(deal(&[], &mut rng).is_empty());
        assert_eq!(deal(&[0, 2], &mut rng), [vec![], vec![0, 1]]);
    }

    #[test]
    fn permutations_are_permutations_and_draws_are_uniform() {
        let mut p = permutation(1000, 3);
        assert_ne!(p, (0..1000).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
        let mut r = Rng::new(9);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[r.below(6) as usize] += 1;
        }
        // 10,000 expected each; 5 standard deviations is about 460.
        assert!(counts.iter().all(|&c| c.abs_diff(10_000) < 460), "{counts:?}");
    }
}

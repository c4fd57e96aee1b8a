"""What the Python benchmarks that compare dlframe with its peers share: the best time of a
call, and the markdown table of ratios they print (the table `benches/charts.py` reads).
Python 3.11 standard library only; imported by the scripts beside it."""

import time


def best(fn, reps=15):
    """The shortest of `reps` timed calls of `fn`, in seconds, after one untimed call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


class Table:
    """Rows of `what | ratio | target | verdict | note`, a ratio being dlframe's time over the
    yardstick's (lower is faster for dlframe)."""

    def __init__(self):
        self.rows = []

    def row(self, what, ours, theirs, target=None, note=""):
        r = ours / theirs
        verdict = "" if target is None else ("meets" if r <= target else "misses")
        self.rows.append((what, f"{r:.2f}x", "-" if target is None else f"<= {target:.2g}x", verdict, note))

    def print(self, measured: str):
        """Prints `measured` (when, where, which versions), then the table."""
        print(measured + "\n")
        print("| what | ratio (lower is faster for dlframe) | target | | note |")
        print("|---|---|---|---|---|")
        for r in self.rows:
            print("| " + " | ".join(r) + " |")

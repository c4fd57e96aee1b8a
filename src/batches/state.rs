//! The saved form of a position in a training job ([`State`]), and the rule that says whether a
//! job can continue from it ([`State::resume`]).
//!
//! A state is global: the epoch, the next global step, and everything the rows of that step
//! depend on (the global batch, the splits, the shuffle, `even`, and the source's units). Under
//! DDP every rank is at the same step, so rank 0's state is the job's; it continues on any
//! world size that divides its splits, with `batch_size x world` equal to its global batch. A
//! state that another setting would make name other rows is refused, naming the setting.

use serde::{Deserialize, Serialize};

use super::BatchOptions;
use super::plan::{Layout, Rank, Training, TrainingPlan};
use super::shuffle::{STREAM_VERSION, mix};
use crate::error::{Error, Result};

/// What [`State::format`] says.
pub const FORMAT: &str = "dlframe.batches";

/// The version of the saved form; a state of another version is refused.
pub const STATE_VERSION: u32 = 2;

/// Which source a state was saved over: its kind, rows and units, and a fingerprint of its
/// units' row counts in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceId {
    /// `"units"` (row groups, partitions), `"rows"` (a table in memory) or `"stream"`.
    pub kind: String,
    /// Rows, where known.
    pub rows: Option<u64>,
    /// Units, where the source lists them.
    pub units: Option<u64>,
    /// A hash of the kind and the units' row counts, in order.
    pub fingerprint: String,
}

impl SourceId {
    /// The identity of `layout`.
    pub fn of(layout: &Layout) -> Self {
        let (kind, counts): (&str, &[u64]) = match layout {
            Layout::Units(u) => ("units", u),
            Layout::Rows(n) => ("rows", std::slice::from_ref(n)),
            Layout::Stream => ("stream", &[]),
        };
        let seed = kind.bytes().fold(0u64, |h, b| mix(h ^ u64::from(b)));
        let hash = counts.iter().fold(mix(seed ^ counts.len() as u64), |h, &c| mix(h ^ mix(c)));
        let units = matches!(layout, Layout::Units(_)).then_some(counts.len() as u64);
        SourceId { kind: kind.into(), rows: layout.rows(), units, fingerprint: format!("{hash:016x}") }
    }

    fn describe(&self) -> String {
        match (self.kind.as_str(), self.rows, self.units) {
            ("units", Some(rows), Some(units)) => {
                format!(
                    "{units} units (row groups or partitions) of {rows} rows in all, fingerprint {}",
                    self.fingerprint
                )
            }
            ("rows", Some(rows), _) => format!("a table of {rows} rows in memory"),
            ("stream", ..) => "a stream of unknown length".into(),
            _ => format!("{} (fingerprint {})", self.kind, self.fingerprint),
        }
    }
}

/// A position in a training job, as saved (`Batches.state_dict()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// [`FORMAT`].
    pub format: String,
    /// [`STATE_VERSION`].
    pub version: u32,
    /// The shuffle generators' version ([`STREAM_VERSION`]).
    pub stream_version: u32,
    /// The epoch.
    pub epoch: u64,
    /// The next global step.
    pub step: u64,
    /// Rows of a global step: `batch_size x world`.
    pub global_batch: u64,
    /// The batch size it was saved with (what the global batch was made of).
    pub batch_size: u64,
    /// The world size it was saved with.
    pub world: u64,
    /// `drop_last`.
    pub drop_last: bool,
    /// `even`.
    pub even: String,
    /// `seed`, or None unshuffled.
    pub seed: Option<u64>,
    /// `shuffle_buffer` in effect, or None unshuffled.
    pub shuffle_buffer: Option<u64>,
    /// `splits` in effect; None for a stream.
    pub splits: Option<u64>,
    /// The source.
    pub source: SourceId,
    /// `(worker, workers)` when it is one DataLoader worker's own position.
    pub worker: Option<(u64, u64)>,
}

/// Where a job continues from a state: the epoch, the first step, whether that step is one
/// DataLoader worker's own, and the settings it adopted from the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// The epoch.
    pub epoch: u64,
    /// The next step, in this job's global batches.
    pub step: u64,
    /// True when the state is one DataLoader worker's own position.
    pub own: bool,
    /// The settings with `splits` and `shuffle_buffer` taken from the state where the job left
    /// them to choose.
    pub training: Training,
}

fn mismatch(setting: &'static str, saved: impl ToString, here: impl ToString, remedy: &str) -> Error {
    Error::StateMismatch { setting, saved: saved.to_string(), here: here.to_string(), remedy: remedy.into() }
}

fn or_none<T: ToString>(v: Option<T>) -> String {
    v.map_or("None".into(), |v| v.to_string())
}

impl State {
    /// The position `step` of `plan` (over `layout`), of one DataLoader worker when `worker` is
    /// given.
    pub fn of(plan: &TrainingPlan, layout: &Layout, step: u64, worker: Option<(usize, usize)>) -> Self {
        let t = plan.training();
        State {
            format: FORMAT.into(),
            version: STATE_VERSION,
            stream_version: STREAM_VERSION,
            epoch: plan.epoch(),
            step,
            global_batch: plan.global_batch(),
            batch_size: plan.batch_size(),
            world: plan.rank().world as u64,
            drop_last: plan.drop_last(),
            even: t.even.name().into(),
            seed: t.shuffle.map(|s| s.seed),
            shuffle_buffer: plan.shuffle_buffer(),
            splits: (*layout != Layout::Stream).then_some(plan.splits() as u64),
            source: SourceId::of(layout),
            worker: worker.map(|(i, n)| (i as u64, n as u64)),
        }
    }

    /// The state as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a state serializes")
    }

    /// A state from JSON.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for anything but a state of this version.
    pub fn from_json(text: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("not a dlframe.batches state: {e}")))?;
        let version = value.get("version").and_then(serde_json::Value::as_u64);
        if value.get("format").and_then(serde_json::Value::as_str) != Some(FORMAT) {
            let old = version == Some(1);
            return Err(Error::InvalidArgument(if old {
                format!(
                    "this state was saved by an older dlframe (state version 1), whose order this \
                     version does not make; it reads version {STATE_VERSION}: start the epoch again"
                )
            } else {
                format!("not a dlframe.batches state of version {STATE_VERSION}: {text}")
            }));
        }
        if version != Some(u64::from(STATE_VERSION)) {
            return Err(Error::InvalidArgument(format!(
                "a dlframe.batches state of version {}, and this dlframe reads version {STATE_VERSION}",
                or_none(version)
            )));
        }
        serde_json::from_value(value)
            .map_err(|e| Error::InvalidArgument(format!("not a valid dlframe.batches state: {e}")))
    }

    /// Checks that this job (`layout`, `options`, `training` as given, `rank`, and the
    /// DataLoader `worker` it runs in) can continue from the state, and says where.
    ///
    /// `splits` and `shuffle_buffer` left to choose (None) are taken from the state. An
    /// unshuffled state of another global batch continues when its rows already given are whole
    /// steps of this one, and its splits divide both.
    ///
    /// # Errors
    /// [`Error::StateMismatch`] naming the first setting that differs (the source, `seed`,
    /// `even`, `drop_last`, `splits`, `shuffle_buffer`, `batch_size x world`), a position past
    /// the end of the epoch, or a worker's own state in another worker;
    /// [`Error::InvalidArgument`] for splits this world size cannot share.
    pub fn resume(
        &self,
        layout: &Layout,
        options: &BatchOptions,
        training: &Training,
        rank: Rank,
        worker: (usize, usize),
    ) -> Result<Resume> {
        if self.stream_version != STREAM_VERSION {
            return Err(mismatch(
                "shuffle generators' version",
                self.stream_version,
                STREAM_VERSION,
                "another dlframe version made that order, and this one cannot make it again",
            ));
        }
        let source = SourceId::of(layout);
        if self.source != source {
            return Err(mismatch(
                "source",
                self.source.describe(),
                source.describe(),
                "a step names rows by the source's units, so over another layout it would repeat \
                 some rows and skip others; resume over the same files, row groups or table",
            ));
        }
        let seed = training.shuffle.map(|s| s.seed);
        if self.seed != seed {
            return Err(mismatch("seed", or_none(self.seed), or_none(seed), "another seed is another order"));
        }
        if self.even != training.even.name() {
            return Err(mismatch(
                "even",
                &self.even,
                training.even.name(),
                "the last step's rows would differ",
            ));
        }
        if self.drop_last != options.drop_last {
            return Err(mismatch(
                "drop_last",
                self.drop_last,
                options.drop_last,
                "the epoch's batches would differ",
            ));
        }
        let splits = match (training.splits, self.splits) {
            (Some(k), Some(s)) if k as u64 != s => {
                return Err(mismatch(
                    "splits",
                    s,
                    k,
                    "a job keeps its splits for good; leave splits= out to take the state's",
                ));
            }
            (None, Some(s)) if s % rank.world as u64 != 0 => {
                return Err(Error::InvalidArgument(format!(
                    "the state was saved with splits={s}, which {} ranks cannot share (each rank \
                     takes whole splits): resume on a world size that divides {s}",
                    rank.world
                )));
            }
            (k, s) => k.or(s.map(|s| s as usize)),
        };
        let adopted = training.adopting(splits, self.shuffle_buffer);
        let plan = TrainingPlan::new(layout, options, &adopted, rank, self.epoch)?;
        if self.shuffle_buffer != plan.shuffle_buffer() {
            return Err(mismatch(
                "shuffle_buffer",
                or_none(self.shuffle_buffer),
                or_none(plan.shuffle_buffer()),
                "rows are shuffled in blocks of this many rows",
            ));
        }
        if self.splits.is_some() && self.splits != Some(plan.splits() as u64) {
            return Err(mismatch(
                "splits",
                or_none(self.splits),
                plan.splits(),
                "a job keeps its splits for good",
            ));
        }
        let step = self.step_in(&plan)?;
        let own = match self.worker {
            None => false,
            Some((i, n)) if (i as usize, n as usize) == worker => true,
            Some((i, n)) => {
                let here = match worker {
                    (0, 1) => "the main process".to_string(),
                    (w, c) => format!("worker {w} of {c}"),
                };
                return Err(mismatch(
                    "DataLoader worker",
                    format!("worker {i} of {n}"),
                    here,
                    "load a worker's state in the same worker (torchdata's StatefulDataLoader does), \
                     or save the state of the loop that consumes the batches",
                ));
            }
        };
        if let Some(steps) = plan.steps() {
            let slack = if own { worker.1 as u64 } else { 0 };
            if step > steps + slack {
                return Err(mismatch(
                    "step",
                    self.step,
                    format!("at most {steps} (the steps of epoch {})", self.epoch),
                    "the position lies past the end of the epoch",
                ));
            }
        }
        Ok(Resume { epoch: self.epoch, step, own, training: adopted })
    }

    /// The state's step in `plan`'s global batches: the same, or for an unshuffled state of
    /// another global batch the step after the same rows.
    fn step_in(&self, plan: &TrainingPlan) -> Result<u64> {
        let (saved, here) = (self.global_batch, plan.global_batch());
        if saved == here {
            return Ok(self.step);
        }
        let k = plan.splits() as u64;
        let rows = u128::from(self.step) * u128::from(saved);
        let exact = self.seed.is_none() && saved % k == 0 && here % k == 0 && rows % u128::from(here) == 0;
        if exact {
            return Ok((rows / u128::from(here)) as u64);
        }
        let why = if self.seed.is_some() {
            "a shuffled step is a fixed number of rows; resume with batch_size x world equal to it"
                .to_string()
        } else {
            format!(
                "the {rows} rows already given are not whole steps of {here}; resume with batch_size x \
                 world equal to {saved}"
            )
        };
        Err(mismatch(
            "batch_size x world",
            format!("{} x {} = {saved}", self.batch_size, self.world),
            format!("{} x {} = {here}", plan.batch_size(), plan.rank().world),
            &why,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Even, Shuffle};
    use super::*;

    fn options(b: usize) -> BatchOptions {
        BatchOptions::new(b).unwrap()
    }

    fn shuffled(splits: Option<usize>) -> Training {
        Training { even: Even::Keep, shuffle: Some(Shuffle { seed: 5, buffer: None }), splits }
    }

    fn saved(layout: &Layout, b: usize, t: &Training, world: usize, step: u64) -> State {
        let plan = TrainingPlan::new(layout, &options(b), t, Rank::new(0, world).unwrap(), 2).unwrap();
        State::from_json(&State::of(&plan, layout, step, None).to_json()).unwrap()
    }

    #[test]
    fn a_state_continues_on_another_world_size_with_the_same_global_batch() {
        let layout = Layout::Units(vec![3000; 17]);
        let state = saved(&layout, 64, &shuffled(None), 4, 11);
        assert_eq!((state.splits, state.global_batch, state.epoch), (Some(8), 256, 2));
        for (b, world) in [(128, 2), (32, 8), (256, 1)] {
            let r = state.resume(
                &layout,
                &options(b),
                &shuffled(None),
                Rank::new(world - 1, world).unwrap(),
                (0, 1),
            );
            let adopted = Training {
                splits: Some(8),
                shuffle: Some(Shuffle { seed: 5, buffer: Some(65_536) }),
                ..shuffled(None)
            };
            assert_eq!(r.unwrap(), Resume { epoch: 2, step: 11, own: false, training: adopted });
        }
    }

    #[test]
    fn a_state_of_another_source_or_setting_is_refused_naming_it() {
        let layout = Layout::Units(vec![3000; 17]);
        let state = saved(&layout, 64, &shuffled(None), 4, 11);
        let r = |layout: &Layout, b, t: &Training, world| {
            state
                .resume(layout, &options(b), t, Rank::new(0, world).unwrap(), (0, 1))
                .unwrap_err()
                .to_string()
        };
        // The same 51,000 rows in row groups of another size, or in memory.
        let e = r(&Layout::Units(vec![1000; 51]), 64, &shuffled(None), 4);
        assert!(e.contains("saved with source=17 units") && e.contains("51 units"), "{e}");
        assert!(r(&Layout::Rows(51_000), 64, &shuffled(None), 4).contains("a table of 51000 rows"));
        assert!(
            r(&layout, 64, &Training { shuffle: None, ..shuffled(None) }, 4)
                .contains("seed=5, but these batches have seed=None")
        );
        assert!(
            r(&layout, 64, &shuffled(Some(16)), 4).contains("splits=8, but these batches have splits=16")
        );
        let e = r(&layout, 64, &shuffled(None), 2);
        assert!(
            e.contains(
                "batch_size x world=64 x 4 = 256, but these batches have batch_size x world=64 x 2 = 128"
            ),
            "{e}"
        );
        assert!(r(&layout, 16, &shuffled(None), 16).contains("which 16 ranks cannot share"));
        let e = r(&layout, 64, &Training { even: Even::Pad, ..shuffled(None) }, 4);
        assert!(e.contains("even=keep"), "{e}");
    }

    #[test]
    fn a_state_past_the_end_or_of_another_worker_is_refused() {
        let layout = Layout::Rows(1000);
        let t = shuffled(None);
        // 1000 rows in steps of 100: 10 steps; a state at 10 is the end, at 11 past it.
        assert!(
            saved(&layout, 100, &t, 1, 10).resume(&layout, &options(100), &t, Rank::single(), (0, 1)).is_ok()
        );
        let e = saved(&layout, 100, &t, 1, 11)
            .resume(&layout, &options(100), &t, Rank::single(), (0, 1))
            .unwrap_err();
        assert!(e.to_string().contains("step=11, but these batches have step=at most 10"), "{e}");
        let mut s = saved(&layout, 100, &t, 1, 3);
        s.worker = Some((1, 2));
        let e = s.resume(&layout, &options(100), &t, Rank::single(), (0, 1)).unwrap_err();
        assert!(e.to_string().contains("worker 1 of 2") && e.to_string().contains("the main process"), "{e}");
        assert!(s.resume(&layout, &options(100), &t, Rank::single(), (1, 2)).unwrap().own);
    }

    #[test]
    fn an_unshuffled_state_continues_with_another_batch_size_when_its_rows_are_whole_steps() {
        let layout = Layout::Rows(1000);
        let t = Training { splits: Some(2), ..Training::in_order() };
        let state = saved(&layout, 100, &t, 2, 2); // 400 rows given
        let step =
            |b| state.resume(&layout, &options(b), &t, Rank::new(0, 2).unwrap(), (0, 1)).map(|r| r.step);
        assert_eq!(step(50).unwrap(), 4);
        assert!(
            step(300).unwrap_err().to_string().contains("400 rows already given are not whole steps of 600")
        );
    }

    #[test]
    fn only_states_of_this_version_are_read() {
        assert!(
            State::from_json(r#"{"version": 1, "next": 3}"#)
                .unwrap_err()
                .to_string()
                .contains("older dlframe")
        );
        assert!(
            State::from_json(r#"{"next": 3}"#)
                .unwrap_err()
                .to_string()
                .contains("not a dlframe.batches state")
        );
        let mut s = saved(&Layout::Rows(10), 2, &shuffled(None), 1, 0);
        s.version = 3;
        assert!(State::from_json(&s.to_json()).unwrap_err().to_string().contains("version 3"));
        assert!(State::from_json("[").is_err());
    }

    #[test]
    fn a_fingerprint_is_fixed_by_the_units_in_order() {
        let a = SourceId::of(&Layout::Units(vec![3, 5]));
        assert_eq!(a, SourceId::of(&Layout::Units(vec![3, 5])));
        assert_ne!(a.fingerprint, SourceId::of(&Layout::Units(vec![5, 3])).fingerprint);
        assert_ne!(a.fingerprint, SourceId::of(&Layout::Rows(8)).fingerprint);
        // Pinned: a change here makes saved states refuse their own source.
        assert_eq!(SourceId::of(&Layout::Rows(8)).fingerprint.len(), 16);
    }
}

//! `dlframe._native.Schedule`, `Plan`, `ParquetFiles` and `BatchStream`: `dlframe.batches`'
//! settings, checked once; one rank's plan of an epoch; and one pass over a source, its batches
//! converted on a background thread (without the GIL) while the consumer works.
//!
//! The core owns the rules (`dlframe::batches`: the plan, the saved state) and runs the pass on
//! one of the process's reader threads, each attached to Python once, when it starts, and then
//! working detached. A source that takes the GIL for every batch (DataFusion's stream) then only
//! takes and gives back the GIL, where a thread without a Python thread state would have one
//! made and deleted by CPython each time. `_stream.py` finds the rank, worker and units.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBool;
use pyo3_arrow::ffi::ArrayReader;

use dlframe::Device;
use dlframe::batches::pass::{Epoch, Setup};
use dlframe::batches::readers::{Done, Readers, Serve};
use dlframe::batches::stream::{Arrays, Source, Stream};
use dlframe::batches::{BatchOptions, Even, Layout, Rank, State, Training, TrainingPlan};
use dlframe::parquet::Route;
use dlframe::parquet::files::ParquetFiles;
use dlframe::table::Columns;

use crate::args::{DTypeArg, FillValue, TargetDevice, export_options};
use crate::convert::wrap_table;
use crate::error::{Error, Result};
use crate::input::Input;

/// An Arrow producer's data as a stream of arrays (no copy).
fn reader_of(obj: &Bound<'_, PyAny>) -> Result<Arrays> {
    let input = obj.extract::<Input>()?;
    let reader: Box<dyn ArrayReader + Send> = input.arrow()?.into_reader()?;
    Ok((reader.field(), reader))
}

/// The error for keyword `name`, which takes `what`, given `obj`.
fn bad_arg(obj: &Bound<'_, PyAny>, name: &str, what: &str) -> Error {
    let given = obj.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
    dlframe::Error::InvalidArgument(format!("{name} must be {what}, not {given}")).into()
}

/// An int argument of at least `min`: a Python int or anything with `__index__` (a numpy
/// integer), not a bool.
fn int_arg(obj: &Bound<'_, PyAny>, name: &str, min: u64, what: &str) -> Result<u64> {
    let index = match obj.is_instance_of::<PyBool>() {
        true => None,
        false => obj.py().import("operator")?.call_method1("index", (obj,)).ok(),
    };
    index.and_then(|i| i.extract::<u64>().ok()).filter(|&v| v >= min).ok_or_else(|| bad_arg(obj, name, what))
}

/// A flag argument: True or False (a numpy bool too).
fn flag_arg(obj: &Bound<'_, PyAny>, name: &str) -> Result<bool> {
    if obj.is_instance_of::<PyBool>() || obj.get_type().name().is_ok_and(|n| n == "bool") {
        return Ok(obj.is_truthy()?);
    }
    Err(bad_arg(obj, name, "True or False"))
}

/// Where a job continues from a saved state: `(epoch, step, own, splits, shuffle_buffer)`.
type Resumed = (u64, u64, bool, Option<usize>, Option<u64>);

/// `dlframe.batches`' settings, checked once: the batches' shape and conversion, and the order
/// of a training job's epochs. Each keyword is held here and nowhere else.
#[pyclass(name = "Schedule", module = "dlframe._native", frozen)]
pub struct PySchedule {
    options: BatchOptions,
    training: Training,
    prefetch: usize,
}

#[pymethods]
impl PySchedule {
    #[new]
    #[pyo3(signature = (batch_size, *, columns="stack", nulls="error", fill_value=None, dtype=None, order="C", device=None, drop_last=None, prefetch=None, ragged="error", pad_value=None, max_len=None, inexact="error", even="keep", shuffle=None, seed=None, shuffle_buffer=None, splits=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        batch_size: &Bound<'_, PyAny>,
        columns: &str,
        nulls: &str,
        fill_value: Option<FillValue>,
        dtype: Option<DTypeArg>,
        order: &str,
        device: Option<TargetDevice>,
        drop_last: Option<&Bound<'_, PyAny>>,
        prefetch: Option<&Bound<'_, PyAny>>,
        ragged: &str,
        pad_value: Option<FillValue>,
        max_len: Option<&Bound<'_, PyAny>>,
        inexact: &str,
        even: &str,
        shuffle: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        shuffle_buffer: Option<&Bound<'_, PyAny>>,
        splits: Option<&Bound<'_, PyAny>>,
    ) -> Result<Self> {
        let batch_size = int_arg(batch_size, "batch_size", 1, "a positive int")? as usize;
        let prefetch = prefetch.map_or(Ok(2), |p| int_arg(p, "prefetch", 0, "an int >= 0"))? as usize;
        let max_len =
            max_len.map(|m| int_arg(m, "max_len", 1, "a positive int")).transpose()?.map(|m| m as usize);
        let export =
            export_options(nulls, fill_value, None, dtype, order, ragged, pad_value, max_len, inexact)?;
        let options = BatchOptions {
            drop_last: drop_last.map_or(Ok(false), |d| flag_arg(d, "drop_last"))?,
            columns: Columns::parse(columns)?,
            export,
            device: device.map_or(Device::Cpu, |d| d.0),
            ..BatchOptions::new(batch_size)?
        };
        // None is no value, for each of these keywords.
        let int = |v: Option<&Bound<'_, PyAny>>, name, min, what| {
            v.filter(|v| !v.is_none()).map(|v| int_arg(v, name, min, what)).transpose()
        };
        let training = Training::new(
            Even::parse(even)?,
            shuffle.map_or(Ok(false), |s| flag_arg(s, "shuffle"))?,
            int(seed, "seed", 0, "an int in [0, 2**64), the same on every rank")?,
            int(shuffle_buffer, "shuffle_buffer", 1, "a positive int (rows of the whole job)")?,
            int(splits, "splits", 1, "a positive int")?.map(|k| k as usize),
        )?;
        Ok(PySchedule { options, training, prefetch })
    }

    #[getter]
    fn batch_size(&self) -> usize {
        self.options.batch_size
    }

    /// The epoch `epoch` of a source of `rows` (a table) or `units` (row groups), or of a
    /// stream (neither), for rank `rank` of `world`; `splits` and `shuffle_buffer` adopted from
    /// a loaded state where the job left them out.
    #[pyo3(signature = (rows, units, *, rank, world, epoch, splits=None, shuffle_buffer=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        rows: Option<u64>,
        units: Option<Vec<u64>>,
        rank: usize,
        world: usize,
        epoch: u64,
        splits: Option<usize>,
        shuffle_buffer: Option<u64>,
    ) -> Result<PyPlan> {
        let layout = Layout::of(rows, units);
        let training = self.training.adopting(splits, shuffle_buffer);
        let plan = TrainingPlan::new(&layout, &self.options, &training, Rank::new(rank, world)?, epoch)?;
        Ok(PyPlan { plan, layout })
    }

    /// Where a job continues from `state` (a saved dict, as JSON), in DataLoader `worker` of
    /// rank `rank` of `world`: `(epoch, step, own, splits, shuffle_buffer)`, the last two the
    /// settings taken from the state. ValueError names the first setting that differs.
    #[pyo3(signature = (state, rows, units, *, rank, world, worker))]
    #[allow(clippy::too_many_arguments)]
    fn resume(
        &self,
        state: &str,
        rows: Option<u64>,
        units: Option<Vec<u64>>,
        rank: usize,
        world: usize,
        worker: (usize, usize),
    ) -> Result<Resumed> {
        let state = State::from_json(state)?;
        let r = state.resume(
            &Layout::of(rows, units),
            &self.options,
            &self.training,
            Rank::new(rank, world)?,
            worker,
        )?;
        Ok((r.epoch, r.step, r.own, r.training.splits, r.training.shuffle.and_then(|s| s.buffer)))
    }
}

/// One rank's plan of one epoch.
#[pyclass(name = "Plan", module = "dlframe._native", frozen)]
pub struct PyPlan {
    plan: TrainingPlan,
    layout: Layout,
}

#[pymethods]
impl PyPlan {
    /// Batches this rank makes in the epoch; None for a stream.
    #[getter]
    fn batches(&self) -> Option<u64> {
        self.plan.batches()
    }

    /// This rank's epoch, for `Batches.plan()`, as JSON.
    fn summary(&self) -> String {
        self.plan.summary().to_json()
    }

    /// The units this pass reads whole, in order (a unit may come twice).
    #[pyo3(signature = (step, own, worker))]
    fn reads(&self, step: u64, own: bool, worker: (usize, usize)) -> Vec<usize> {
        Epoch::resumed(self.plan.clone(), step, own, worker).reads().iter().map(|r| r.unit).collect()
    }

    /// The state at `step` (of DataLoader `worker` when given), as JSON.
    #[pyo3(signature = (step, worker=None))]
    fn state(&self, step: u64, worker: Option<(usize, usize)>) -> String {
        State::of(&self.plan, &self.layout, step, worker).to_json()
    }
}

/// Parquet files that dlframe's reader decodes straight into batches: the units of a plan,
/// and a source of `BatchStream`.
#[pyclass(name = "ParquetFiles", module = "dlframe._native", frozen)]
pub struct PyParquetFiles {
    files: Arc<ParquetFiles>,
}

#[pymethods]
impl PyParquetFiles {
    /// Opens `paths` (local files: memory-mapped, footers read).
    #[new]
    fn new(py: Python<'_>, paths: Vec<PathBuf>) -> Result<Self> {
        let files = py.detach(|| ParquetFiles::open(&paths))?;
        Ok(PyParquetFiles { files: Arc::new(files) })
    }

    /// The rows of every row group, file after file.
    #[getter]
    fn units(&self) -> Vec<u64> {
        self.files.units()
    }

    /// None where the batches of `schedule` are decoded straight into their rows, else why
    /// they are not.
    fn route(&self, schedule: &PySchedule) -> Option<String> {
        match self.files.route(&schedule.options) {
            Route::Direct => None,
            Route::Arrow(why) => Some(why),
        }
    }
}

/// One pass over a source: an iterator of tensors (or `(values, mask)` pairs, or dicts).
#[pyclass(name = "BatchStream", module = "dlframe._native")]
pub struct PyBatchStream {
    stream: Stream<Error>,
}

#[pymethods]
impl PyBatchStream {
    /// Starts reading `source` (an Arrow producer, or with `iterate=True` a Python iterator of
    /// them) on a background thread: the pass of `plan` from `step` on, in DataLoader `worker`
    /// (which makes every `worker[1]`-th batch from its own), `own` when `step` is that
    /// worker's own saved position.
    #[new]
    #[pyo3(signature = (source, schedule, plan, *, step=0, own=false, worker=(0, 1), iterate=false))]
    fn new(
        source: &Bound<'_, PyAny>,
        schedule: &PySchedule,
        plan: &PyPlan,
        step: u64,
        own: bool,
        worker: (usize, usize),
        iterate: bool,
    ) -> Result<Self> {
        let py = source.py();
        let options = schedule.options.for_worker(worker.0, worker.1)?;
        let epoch = Epoch::resumed(plan.plan.clone(), step, own, worker);
        let (setup, table): (Setup, _) = epoch.setup(options);
        let source = if let Ok(files) = source.cast::<PyParquetFiles>() {
            // The pass's units, decoded by dlframe's reader on the batch thread (no GIL).
            let mut reads = files.get().files.reads(epoch.reads().iter().map(|r| r.unit), options.export);
            Source::chain(move || {
                let unit = |(field, rows)| (field, Box::new(std::iter::once(Ok(rows))) as _);
                reads.next().map(|r| r.map(unit).map_err(Error::from))
            })
        } else if iterate {
            let items = source.try_iter()?.unbind();
            Source::chain(move || {
                Python::attach(|py| {
                    Some(items.bind(py).clone().next()?.map_err(Error::from).and_then(|o| reader_of(&o)))
                })
            })
        } else {
            match table {
                Some(rows) => Source::Memory { reader: Some(reader_of(source)?), rows },
                None => Source::Reader(reader_of(source)?),
            }
        };
        prepare(py);
        let panicked = || Error::panicked("dlframe.batches' background thread");
        let prefetch = schedule.prefetch;
        let stream = py
            .detach(|| Stream::start(&READERS, source, setup, prefetch, panicked))
            .map_err(|e| dlframe::Error::InvalidArgument(format!("could not start the batch thread: {e}")))?;
        Ok(PyBatchStream { stream })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch (waits, without the GIL, for the thread to make it); StopIteration at
    /// the end. An error ends the stream.
    fn __next__(&mut self, py: Python<'_>) -> Result<Option<Py<PyAny>>> {
        let stream = &mut self.stream;
        match py.detach(|| stream.next()) {
            Some(Ok(t)) => wrap_table(py, t, None).map(Some),
            end => {
                self.close(py);
                end.transpose().map(|_| None)
            }
        }
    }

    /// Stops the thread and drops what it made ahead (tensors already handed out stay valid):
    /// tells the thread to stop, unblocks it, and waits for it (see [`wait`]).
    fn close(&mut self, py: Python<'_>) {
        if let Some(done) = self.stream.stop() {
            wait(py, done);
        }
    }
}

impl Drop for PyBatchStream {
    fn drop(&mut self) {
        if self.stream.running() {
            Python::attach(|py| self.close(py));
        }
    }
}

/// The process's readers.
pub static READERS: Readers = Readers::new(attach);

/// Runs a new reader's loop attached once: `detach` releases the GIL and, as the loop never
/// returns, never takes it back. Without an interpreter to attach to, the loop is left to run
/// unattached.
fn attach(serve: &mut Option<Serve>) {
    let _ = Python::try_attach(|py| py.detach(|| serve.take().expect("served once")()));
}

/// Looks up `sys.is_finalizing` while imports still work (for a later [`wait`]); call it before
/// starting work.
pub fn prepare(py: Python<'_>) {
    let _ = finalizing(py);
}

/// Waits, without the GIL, until the work has ended. While the interpreter finalizes it does not
/// wait: work that takes the GIL then is stopped by CPython for good (or blocked in what unwinds
/// it), and waiting for it would hang the process's exit.
pub fn wait(py: Python<'_>, done: Done) {
    if !finalizing(py) {
        py.detach(move || done.wait());
    }
}

/// `sys.is_finalizing`, looked up while imports still work.
static IS_FINALIZING: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether the interpreter is finalizing (also when that cannot be asked any more).
fn finalizing(py: Python<'_>) -> bool {
    IS_FINALIZING
        .get_or_try_init(py, || py.import("sys")?.getattr("is_finalizing").map(Bound::unbind))
        .and_then(|f| f.bind(py).call0()?.is_truthy())
        .unwrap_or(true)
}

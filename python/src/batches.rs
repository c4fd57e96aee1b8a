//! `dlframe._native.BatchStream`: one pass of `dlframe.batches` over an Arrow stream, its
//! batches converted on a background thread (without the GIL) while the consumer works.
//!
//! That thread is one of the process's readers (`readers.rs`), which keep a Python thread state
//! for sources that take the GIL. It reads the source and cuts exact-size windows with the core's
//! [`dlframe::batches::Batcher`]; [`dlframe::batches::Ahead`] converts up to `prefetch` of them
//! at once on dlframe's pool while the thread reads on, and a channel of one place carries the
//! tensors in order, so at most `prefetch + 1` converted batches exist ahead of the consumer.
//! The source is read only as far as those batches need.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator};
use pyo3_arrow::ffi::ArrayReader;

use dlframe::Device;
use dlframe::batches::shuffle::derive;
use dlframe::batches::{Ahead, BatchOptions, Batcher, Course, EpochPlan, EpochSpec, Even, Select};
use dlframe::options::NullPolicy;
use dlframe::table::{TableTensors, split_struct};

use crate::args::{ColumnsArg, DTypeArg, FillValue, OrderArg, TargetDevice, export_options};
use crate::convert::{arrow_input, input_error, wrap_table};
use crate::error::{Error, Result};
use crate::readers;

/// Where the thread reads input from.
enum Source {
    /// One Arrow stream (or array), read without the GIL.
    Reader(Box<dyn ArrayReader + Send>),
    /// A Python iterator of Arrow producers (Polars' streaming batches), each read in turn; the
    /// GIL is taken only to get the next one.
    Iter { items: Py<PyIterator>, current: Option<Box<dyn ArrayReader + Send>> },
    /// A table in memory, read whole once (no copy), of which `pieces` (row ranges, in order)
    /// are handed out as slices.
    Memory(Memory),
}

/// A table held in memory and the row ranges of it that a pass makes, in order.
struct Memory {
    reader: Option<Box<dyn ArrayReader + Send>>,
    /// The rows the plan was made for.
    total: u64,
    field: Option<FieldRef>,
    arrays: Vec<ArrayRef>,
    /// The first row of each array.
    starts: Vec<u64>,
    pieces: VecDeque<(u64, u64)>,
}

impl Memory {
    /// Reads the whole table (no copy: its arrays are shared) and checks its length.
    fn load(&mut self) -> Result<()> {
        let Some(mut reader) = self.reader.take() else { return Ok(()) };
        let field = reader.field();
        let mut at = 0u64;
        for a in reader.by_ref() {
            let a = a.map_err(|e| Error::from(dlframe::Error::from(e)))?;
            self.starts.push(at);
            at += a.len() as u64;
            self.arrays.push(a);
        }
        if at != self.total {
            return Err(dlframe::Error::InvalidArgument(format!(
                "the table has {at} rows now, not the {} it had when the epoch was planned",
                self.total
            ))
            .into());
        }
        self.field = Some(field);
        Ok(())
    }

    /// The next slice of the next piece (no copy).
    fn next(&mut self) -> Option<Result<(FieldRef, ArrayRef)>> {
        if let Err(e) = self.load() {
            self.pieces.clear();
            return Some(Err(e));
        }
        let (lo, hi) = self.pieces.pop_front()?;
        let i = self.starts.partition_point(|&s| s <= lo) - 1;
        let a = &self.arrays[i];
        let off = lo - self.starts[i];
        let n = (hi - lo).min(a.len() as u64 - off);
        if lo + n < hi {
            self.pieces.push_front((lo + n, hi));
        }
        let field = self.field.clone().expect("loaded");
        Some(Ok((field, a.slice(off as usize, n as usize))))
    }
}

impl Source {
    /// The next input array and its field, None at the end.
    fn next(&mut self) -> Option<Result<(FieldRef, ArrayRef)>> {
        match self {
            Source::Reader(r) => read(r),
            Source::Memory(m) => m.next(),
            Source::Iter { items, current } => loop {
                if let Some(r) = current {
                    match read(r) {
                        None => *current = None,
                        some => return some,
                    }
                }
                let next = Python::attach(|py| -> Option<Result<Box<dyn ArrayReader + Send>>> {
                    let item = items.bind(py).clone().next()?;
                    Some(item.map_err(Error::from).and_then(|obj| reader_of(&obj)))
                })?;
                match next {
                    Ok(r) => *current = Some(r),
                    Err(e) => return Some(Err(e)),
                }
            },
        }
    }
}

fn read(r: &mut Box<dyn ArrayReader + Send>) -> Option<Result<(FieldRef, ArrayRef)>> {
    let field = r.field();
    r.next().map(|a| a.map(|a| (field, a)).map_err(|e| Error::from(dlframe::Error::from(e))))
}

/// An Arrow producer's data as a stream of arrays (no copy).
fn reader_of(obj: &Bound<'_, PyAny>) -> Result<Box<dyn ArrayReader + Send>> {
    arrow_input(obj).and_then(|input| input.into_reader()).map_err(|e| input_error(obj, e.into()))
}

/// The converted batches of one pass, in order; an error ends the pass.
type Sent = Result<TableTensors>;

/// How the batcher of a pass is made once the first input gives the fields.
struct Setup {
    options: BatchOptions,
    course: Course,
    select: Option<Select>,
}

/// Reads `source` to its end (or until the consumer is gone), converting up to `depth` windows
/// at once and sending each batch in order.
fn produce(mut source: Source, mut setup: Setup, depth: usize, tx: SyncSender<Sent>, stop: Arc<AtomicBool>) {
    let mut batcher: Option<Batcher> = None;
    let mut ahead = Ahead::new(depth);
    // Sends the oldest batch; false when the pass is over (the consumer left, or an error).
    let send_one = |ahead: &mut Ahead| match ahead.pop() {
        Some(r) => {
            let failed = r.is_err();
            tx.send(r.map_err(Error::from)).is_ok() && !failed
        }
        None => false,
    };
    loop {
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
        let pushed = match source.next() {
            None => match batcher.as_mut() {
                Some(b) => b.feed(None).map_err(Error::from),
                None => return,
            },
            Some(Err(e)) => Err(e),
            Some(Ok((field, array))) => push(&mut batcher, field, array, &mut setup),
        };
        if let Err(e) = pushed {
            // The batches before the error go first, in order.
            while !ahead.is_empty() {
                if !send_one(&mut ahead) {
                    return;
                }
            }
            let _ = tx.send(Err(e));
            return;
        }
    }
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
    Ok(b.push(columns)?)
}

/// Where a pass's rows come from: a source of known units (files, row groups) that yields
/// the plan's units whole, in order; a table in memory of known rows, cut into units of
/// `unit` rows; or a stream of unknown length.
enum Units {
    Listed(Vec<u64>),
    Table { total: u64, unit: u64 },
    Stream,
}

/// A table's rows when the epoch was planned, and the row ranges of it to hand out in order.
type TableRows = (u64, VecDeque<(u64, u64)>);

/// `dlframe.batches`' epoch: the plan's numbers, given as a dict by `_stream.py`.
struct EpochArg {
    units: Units,
    spec: EpochSpec,
    start: u64,
}

impl EpochArg {
    fn from_dict(d: &Bound<'_, PyDict>, batch_size: usize, drop_last: bool) -> Result<Self> {
        macro_rules! get {
            ($key:expr, $t:ty, $default:expr) => {
                match d.get_item($key)? {
                    Some(v) if !v.is_none() => v.extract::<$t>().map_err(PyErr::from)?,
                    _ => $default,
                }
            };
        }
        let units = match (get!("units", Option<Vec<u64>>, None), get!("table", Option<(u64, u64)>, None)) {
            (Some(u), None) => Units::Listed(u),
            (None, Some((total, unit))) => Units::Table { total, unit },
            (None, None) => Units::Stream,
            (Some(_), Some(_)) => {
                return Err(dlframe::Error::InvalidArgument(
                    "an epoch has units or a table, not both".into(),
                )
                .into());
            }
        };
        let even: String = get!("even", String, "keep".to_string());
        let spec = EpochSpec {
            batch_size,
            drop_last,
            rank: get!("rank", usize, 0),
            world: get!("world", usize, 1),
            even: Even::parse(&even)?,
            seed: get!("seed", Option<u64>, None),
            buffer: get!("buffer", usize, 0),
            epoch: get!("epoch", u64, 0),
        };
        spec.check()?;
        Ok(EpochArg { units, spec, start: get!("start", u64, 0) })
    }

    /// The plan, for a source of known length.
    fn plan(&self) -> Result<Option<EpochPlan>> {
        Ok(match self.units {
            Units::Listed(ref u) => Some(EpochPlan::new(u, self.spec)?),
            Units::Table { total, unit } => Some(EpochPlan::over_rows(total, unit, self.spec)?),
            Units::Stream => None,
        })
    }

    /// The batcher's setup, and for a table the row ranges to hand out.
    ///
    /// A stream's length is not known ahead, so its ranks cannot be given ranges: rank `r` of
    /// `w` makes the stream's batches `r, r + w, ...`, each reading the whole stream, and the
    /// shuffle's blocks are the same on every rank.
    fn setup(&self, options: BatchOptions) -> Result<(Setup, Option<TableRows>)> {
        let spec = &self.spec;
        let Some(plan) = self.plan()? else {
            if spec.even != Even::Keep {
                return Err(dlframe::Error::InvalidArgument(
                    "even='drop' and even='pad' need a source whose length is known ahead (a pyarrow \
                     Table or dataset, Parquet files, a Polars DataFrame); this one is a stream"
                        .into(),
                )
                .into());
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
                (Setup { options, course, select: None }, Some((total, pieces)))
            }
            _ => {
                let (_, runs) = plan.reads(self.start);
                (Setup { options, course, select: Some(Select::new(runs)) }, None)
            }
        })
    }
}

/// The plan of one rank's epoch over a source of known length, for `_stream.py`: the units it
/// reads (in order), its rows and batches, and the source's rows left out or made twice.
#[pyfunction]
#[pyo3(name = "_epoch_plan", signature = (batch_size, drop_last, epoch))]
pub fn epoch_plan<'py>(
    batch_size: usize,
    drop_last: bool,
    epoch: &Bound<'py, PyDict>,
) -> Result<Bound<'py, PyDict>> {
    let py = epoch.py();
    let arg = EpochArg::from_dict(epoch, batch_size, drop_last)?;
    let plan = arg.plan()?.ok_or_else(|| dlframe::Error::InvalidArgument("a stream has no plan".into()))?;
    let out = PyDict::new(py);
    out.set_item("read", plan.reads(arg.start).0)?;
    out.set_item("rows", plan.rows())?;
    out.set_item("batches", plan.batches())?;
    out.set_item("total", plan.total_rows())?;
    let (dropped, padded) = plan.uneven_rows();
    out.set_item("dropped", dropped)?;
    out.set_item("padded", padded)?;
    Ok(out)
}

/// One pass over a source: an iterator of tensors (or `(values, mask)` pairs, or dicts).
#[pyclass(name = "BatchStream", module = "dlframe._native")]
pub struct PyBatchStream {
    /// In a Mutex only to make the class Sync; `__next__` has it exclusively.
    rx: Option<Mutex<Receiver<Sent>>>,
    thread: Option<readers::Done>,
    stop: Arc<AtomicBool>,
    nulls: NullPolicy,
}

#[pymethods]
impl PyBatchStream {
    /// Starts reading `source` (an Arrow producer, or with `iterate=True` a Python iterator of
    /// them) on a background thread; `shard=(i, n)` makes only every n-th batch from batch i.
    #[new]
    #[pyo3(signature = (source, batch_size, *, iterate=false, nulls="error", fill_value=None, dtype=None, order=OrderArg(dlframe::options::Order::C), device=None, columns=ColumnsArg(dlframe::table::Columns::Stack), drop_last=false, prefetch=2, shard=(0, 1), ragged="error", pad_value=None, max_len=None, epoch=None, inexact="error"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        source: &Bound<'_, PyAny>,
        batch_size: usize,
        iterate: bool,
        nulls: &str,
        fill_value: Option<FillValue>,
        dtype: Option<DTypeArg>,
        order: OrderArg,
        device: Option<TargetDevice>,
        columns: ColumnsArg,
        drop_last: bool,
        prefetch: usize,
        shard: (usize, usize),
        ragged: &str,
        pad_value: Option<FillValue>,
        max_len: Option<usize>,
        epoch: Option<Bound<'_, PyDict>>,
        inexact: &str,
    ) -> Result<Self> {
        let py = source.py();
        let epoch = epoch.map(|d| EpochArg::from_dict(&d, batch_size, drop_last)).transpose()?;
        let export =
            export_options(nulls, fill_value, None, dtype, order, ragged, pad_value, max_len, inexact)?;
        let nulls = export.nulls;
        let options = BatchOptions {
            drop_last,
            columns: columns.0,
            export,
            device: device.map_or(Device::Cpu, |d| d.0),
            ..BatchOptions::new(batch_size)?
        }
        .sharded(shard.0, shard.1)?;
        let (setup, memory) = match epoch {
            Some(e) => e.setup(options)?,
            None => (Setup { options, course: Course::in_order(batch_size), select: None }, None),
        };
        let source = if iterate {
            Source::Iter { items: source.try_iter()?.unbind(), current: None }
        } else {
            let reader = reader_of(source)?;
            match memory {
                Some((total, pieces)) => Source::Memory(Memory {
                    reader: Some(reader),
                    total,
                    field: None,
                    arrays: Vec::new(),
                    starts: Vec::new(),
                    pieces,
                }),
                None => Source::Reader(reader),
            }
        };
        // `prefetch` batches ahead: converting (up to `prefetch` at once), or done and waiting in
        // the channel's one place.
        let depth = prefetch.max(1);
        let (tx, rx) = sync_channel(prefetch + 1 - depth);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = readers::start(py, move || {
            let on_panic = tx.clone();
            if catch_unwind(AssertUnwindSafe(|| produce(source, setup, depth, tx, flag))).is_err() {
                // Without this the consumer would see the end of the stream, and lose rows.
                let _ = on_panic.send(Err(Error::panicked("dlframe.batches' background thread")));
            }
        })
        .map_err(|e| dlframe::Error::InvalidArgument(format!("could not start the batch thread: {e}")))?;
        Ok(PyBatchStream { rx: Some(Mutex::new(rx)), thread: Some(thread), stop, nulls })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch (waits, without the GIL, for the thread to make it); StopIteration at
    /// the end. An error ends the stream.
    fn __next__(&mut self, py: Python<'_>) -> Result<Option<Py<PyAny>>> {
        let Some(rx) = self.rx.as_mut() else { return Ok(None) };
        let rx = rx.get_mut().unwrap_or_else(|e| e.into_inner());
        match py.detach(move || rx.recv()) {
            Ok(Ok(t)) => wrap_table(py, t, self.nulls, None).map(Some),
            Ok(Err(e)) => {
                self.finish(py);
                Err(e)
            }
            Err(_) => {
                self.finish(py);
                Ok(None)
            }
        }
    }

    /// Stops the thread and drops what it made ahead (tensors already handed out stay valid).
    fn close(&mut self, py: Python<'_>) {
        self.finish(py);
    }
}

impl PyBatchStream {
    /// Tells the thread to stop, unblocks it, and waits for it without the GIL (it may need the
    /// GIL to read a Python iterator); at the interpreter's exit it does not wait.
    fn finish(&mut self, py: Python<'_>) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.rx.take());
        if let Some(t) = self.thread.take() {
            t.wait(py);
        }
    }
}

impl Drop for PyBatchStream {
    fn drop(&mut self) {
        if self.thread.is_some() {
            Python::attach(|py| self.finish(py));
        }
    }
}

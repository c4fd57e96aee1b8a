//! `dlframe._native.BatchStream`: one pass of `dlframe.batches` over an Arrow stream, its
//! batches converted on a background thread (without the GIL) while the consumer works.
//!
//! That thread is one of the process's readers (`readers.rs`), which keep a Python thread state
//! for sources that take the GIL. It runs the core's pass ([`dlframe::batches::pass::produce`]):
//! it reads the source and cuts exact-size windows, converts up to `prefetch` of them at once on
//! dlframe's pool while it reads on, and a channel of one place carries the tensors in order, so
//! at most `prefetch + 1` converted batches exist ahead of the consumer. The source is read only
//! as far as those batches need. This file reads the Python objects (the source, the epoch's
//! dict) and hands the batches over.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex};

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator};
use pyo3_arrow::ffi::ArrayReader;

use dlframe::Device;
use dlframe::batches::pass::{Epoch, Setup, TableSlices, Units, produce};
use dlframe::batches::{BatchOptions, EpochSpec, Even};
use dlframe::options::NullPolicy;
use dlframe::table::TableTensors;

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
    /// A table in memory, read whole once (no copy) from `reader`, of which the core hands out
    /// the pass's row ranges as slices.
    Memory { reader: Option<Box<dyn ArrayReader + Send>>, rows: TableSlices },
}

impl Source {
    /// The next input array and its field, None at the end.
    fn next(&mut self) -> Option<Result<(FieldRef, ArrayRef)>> {
        match self {
            Source::Reader(r) => read(r),
            Source::Memory { reader, rows } => {
                if let Some(r) = reader.take() {
                    let field = r.field();
                    if let Err(e) = rows.load(field, r) {
                        return Some(Err(e.into()));
                    }
                }
                rows.next_slice().map(Ok)
            }
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

/// `dlframe.batches`' epoch, from the dict of the plan's numbers that `_stream.py` gives.
fn epoch_of(d: &Bound<'_, PyDict>, batch_size: usize, drop_last: bool) -> Result<Epoch> {
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
            return Err(
                dlframe::Error::InvalidArgument("an epoch has units or a table, not both".into()).into()
            );
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
    Ok(Epoch { units, spec, start: get!("start", u64, 0) })
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
    let arg = epoch_of(epoch, batch_size, drop_last)?;
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
        let epoch = epoch.map(|d| epoch_of(&d, batch_size, drop_last)).transpose()?;
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
        let (setup, table) = match epoch {
            Some(e) => e.setup(options)?,
            None => (Setup::in_order(options), None),
        };
        let source = if iterate {
            Source::Iter { items: source.try_iter()?.unbind(), current: None }
        } else {
            let reader = reader_of(source)?;
            match table {
                Some(rows) => Source::Memory { reader: Some(reader), rows },
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
            let mut source = source;
            let pass =
                || produce(|| source.next(), setup, depth, |batch: Sent| tx.send(batch).is_ok(), &flag);
            if catch_unwind(AssertUnwindSafe(pass)).is_err() {
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

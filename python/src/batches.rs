//! `dlframe._native.BatchStream`: one pass of `dlframe.batches` over an Arrow stream, its
//! batches converted on a background thread (without the GIL) while the consumer works.
//!
//! The core runs the pass (`dlframe::batches::stream::Stream`) on one of the process's reader
//! threads (`readers.rs`, which keep a Python thread state for sources that take the GIL). This
//! file reads the Python objects (the source, the epoch's dict) and hands the batches over.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_arrow::ffi::ArrayReader;

use dlframe::Device;
use dlframe::batches::pass::{Epoch, Setup, Units};
use dlframe::batches::stream::{Arrays, Source, Stream};
use dlframe::batches::{BatchOptions, EpochSpec, Even};
use dlframe::options::NullPolicy;

use crate::args::{ColumnsArg, DTypeArg, FillValue, OrderArg, TargetDevice, export_options};
use crate::convert::{arrow_input, input_error, wrap_table};
use crate::error::{Error, Result};
use crate::readers;

/// An Arrow producer's data as a stream of arrays (no copy).
fn reader_of(obj: &Bound<'_, PyAny>) -> Result<Arrays> {
    let reader: Box<dyn ArrayReader + Send> =
        arrow_input(obj).and_then(|input| input.into_reader()).map_err(|e| input_error(obj, e.into()))?;
    Ok((reader.field(), reader))
}

/// `dlframe.batches`' epoch, as `_stream.py` gives it: a dict of the plan's numbers, with the
/// source's `units` or `table` where its length is known.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct EpochArg {
    rank: usize,
    world: usize,
    even: String,
    seed: Option<u64>,
    buffer: usize,
    epoch: u64,
    start: u64,
    #[pyo3(default)]
    units: Option<Vec<u64>>,
    #[pyo3(default)]
    table: Option<(u64, u64)>,
}

/// The core's epoch of an [`EpochArg`], checked.
fn epoch_of(d: &Bound<'_, PyDict>, batch_size: usize, drop_last: bool) -> Result<Epoch> {
    let a: EpochArg = d.extract()?;
    let spec = EpochSpec {
        batch_size,
        drop_last,
        rank: a.rank,
        world: a.world,
        even: Even::parse(&a.even)?,
        seed: a.seed,
        buffer: a.buffer,
        epoch: a.epoch,
    };
    spec.check()?;
    Ok(Epoch { units: Units::of(a.units, a.table)?, spec, start: a.start })
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
    stream: Stream<Error>,
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
        readers::prepare(py);
        let panicked = || Error::panicked("dlframe.batches' background thread");
        let stream = py
            .detach(|| Stream::start(&readers::READERS, source, setup, prefetch, panicked))
            .map_err(|e| dlframe::Error::InvalidArgument(format!("could not start the batch thread: {e}")))?;
        Ok(PyBatchStream { stream, nulls })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch (waits, without the GIL, for the thread to make it); StopIteration at
    /// the end. An error ends the stream.
    fn __next__(&mut self, py: Python<'_>) -> Result<Option<Py<PyAny>>> {
        let stream = &mut self.stream;
        match py.detach(|| stream.next()) {
            Some(Ok(t)) => wrap_table(py, t, self.nulls, None).map(Some),
            end => {
                self.finish(py);
                end.transpose().map(|_| None)
            }
        }
    }

    /// Stops the thread and drops what it made ahead (tensors already handed out stay valid).
    fn close(&mut self, py: Python<'_>) {
        self.finish(py);
    }
}

impl PyBatchStream {
    /// Tells the thread to stop, unblocks it, and waits for it (see [`readers::wait`]).
    fn finish(&mut self, py: Python<'_>) {
        if let Some(done) = self.stream.stop() {
            readers::wait(py, done);
        }
    }
}

impl Drop for PyBatchStream {
    fn drop(&mut self) {
        if self.stream.running() {
            Python::attach(|py| self.finish(py));
        }
    }
}

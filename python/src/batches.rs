//! `dlframe._native.BatchStream`: one pass of `dlframe.batches` over an Arrow stream, its
//! batches converted on a background thread (without the GIL) while the consumer works.
//!
//! That thread is one of the process's readers (`readers.rs`), which keep a Python thread state
//! for sources that take the GIL. It reads the source and cuts exact-size windows with the core's
//! [`dlframe::batches::Batcher`]; [`dlframe::batches::Ahead`] converts up to `prefetch` of them
//! at once on dlframe's pool while the thread reads on, and a channel of one place carries the
//! tensors in order, so at most `prefetch + 1` converted batches exist ahead of the consumer.
//! The source is read only as far as those batches need.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use arrow_array::ArrayRef;
use arrow_schema::FieldRef;
use pyo3::prelude::*;
use pyo3::types::PyIterator;
use pyo3_arrow::ffi::ArrayReader;

use dlframe::Device;
use dlframe::batches::{Ahead, BatchOptions, Batcher};
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
}

impl Source {
    /// The next input array and its field, None at the end.
    fn next(&mut self) -> Option<Result<(FieldRef, ArrayRef)>> {
        match self {
            Source::Reader(r) => read(r),
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

/// Reads `source` to its end (or until the consumer is gone), converting up to `depth` windows
/// at once and sending each batch in order.
fn produce(
    mut source: Source,
    options: BatchOptions,
    depth: usize,
    tx: SyncSender<Sent>,
    stop: Arc<AtomicBool>,
) {
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
                Some(b) => {
                    b.end();
                    continue;
                }
                None => return,
            },
            Some(Err(e)) => Err(e),
            Some(Ok((field, array))) => push(&mut batcher, field, array, options),
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
fn push(
    batcher: &mut Option<Batcher>,
    field: FieldRef,
    array: ArrayRef,
    options: BatchOptions,
) -> Result<()> {
    let chunk = [array];
    let (fields, columns, table) = match split_struct(&field, &chunk)? {
        Some((fields, cols)) => (fields, cols.into_iter().map(|mut c| c.remove(0)).collect(), true),
        None => (vec![field], chunk.to_vec(), false),
    };
    let b = match batcher {
        Some(b) => b,
        None => batcher.insert(Batcher::new(fields, table, options)?),
    };
    Ok(b.push(columns)?)
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
    #[pyo3(signature = (source, batch_size, *, iterate=false, nulls="error", fill_value=None, dtype=None, order=OrderArg(dlframe::options::Order::C), device=None, columns=ColumnsArg(dlframe::table::Columns::Stack), drop_last=false, prefetch=2, shard=(0, 1), ragged="error", pad_value=None, max_len=None))]
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
    ) -> Result<Self> {
        let py = source.py();
        let export = export_options(nulls, fill_value, None, dtype, order, ragged, pad_value, max_len)?;
        let nulls = export.nulls;
        let options = BatchOptions {
            drop_last,
            columns: columns.0,
            export,
            device: device.map_or(Device::Cpu, |d| d.0),
            ..BatchOptions::new(batch_size)?
        }
        .sharded(shard.0, shard.1)?;
        let source = if iterate {
            Source::Iter { items: source.try_iter()?.unbind(), current: None }
        } else {
            Source::Reader(reader_of(source)?)
        };
        // `prefetch` batches ahead: converting (up to `prefetch` at once), or done and waiting in
        // the channel's one place.
        let depth = prefetch.max(1);
        let (tx, rx) = sync_channel(prefetch + 1 - depth);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = readers::start(py, move || {
            let on_panic = tx.clone();
            if catch_unwind(AssertUnwindSafe(|| produce(source, options, depth, tx, flag))).is_err() {
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

//! A batch stream read ahead on one of the process's reader threads ([`super::readers`]): the
//! thread runs [`produce`] over a [`Source`], converting up to `prefetch` batches at once while
//! it reads on, and a channel of one place carries the batches to the consumer in order, so at
//! most `prefetch + 1` converted batches exist ahead of it. The source is read only as far as
//! those batches need. Nothing here copies but the conversions themselves.
//!
//! The error type `E` is the embedder's (the Python binding's carries a producer's own
//! exception), so a source may fail in its own words.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, sync_channel};
use std::sync::{Arc, Mutex};

use arrow_array::ArrayRef;
use arrow_schema::{ArrowError, FieldRef};

use super::pass::{Setup, TableSlices, produce};
use super::readers::{Done, Readers};
use crate::error::Error;
use crate::table::TableTensors;

/// One Arrow stream: its field and its arrays.
pub type Arrays = (FieldRef, Box<dyn Iterator<Item = Result<ArrayRef, ArrowError>> + Send>);

/// What a pass reads.
pub enum Source<E> {
    /// One Arrow stream (or array).
    Reader(Arrays),
    /// Streams one after another (a Python iterator of Arrow producers): `next` gives the next
    /// one, None at the end.
    Chain {
        /// The next stream.
        next: Box<dyn FnMut() -> Option<Result<Arrays, E>> + Send>,
        /// The stream being read.
        current: Option<Arrays>,
    },
    /// A table in memory, read whole once (no copy) from `reader`, of which `rows` hands out the
    /// pass's row ranges as slices.
    Memory {
        /// The table, until it is read.
        reader: Option<Arrays>,
        /// The pass's row ranges.
        rows: TableSlices,
    },
}

/// The next array of a stream, with its field.
fn read<E: From<Error>>(s: &mut Arrays) -> Option<Result<(FieldRef, ArrayRef), E>> {
    let field = s.0.clone();
    s.1.next().map(|a| a.map(|a| (field, a)).map_err(|e| E::from(Error::from(e))))
}

impl<E: From<Error>> Source<E> {
    /// A chain of streams, the first of which is read when the pass starts.
    pub fn chain(next: impl FnMut() -> Option<Result<Arrays, E>> + Send + 'static) -> Self {
        Source::Chain { next: Box::new(next), current: None }
    }

    /// The next input array and its field, None at the end.
    fn next(&mut self) -> Option<Result<(FieldRef, ArrayRef), E>> {
        match self {
            Source::Reader(s) => read(s),
            Source::Memory { reader, rows } => {
                if let Some((field, arrays)) = reader.take()
                    && let Err(e) = rows.load(field, arrays)
                {
                    return Some(Err(e.into()));
                }
                rows.next_slice().map(Ok)
            }
            Source::Chain { next, current } => loop {
                if let Some(s) = current {
                    match read(s) {
                        None => *current = None,
                        some => return some,
                    }
                }
                match next()? {
                    Ok(s) => *current = Some(s),
                    Err(e) => return Some(Err(e)),
                }
            },
        }
    }
}

/// A pass running on a reader thread, and the consumer's end of its channel.
pub struct Stream<E> {
    /// In a Mutex only to make the stream Sync (a Python class must be); `next` has it
    /// exclusively.
    rx: Option<Mutex<Receiver<Result<TableTensors, E>>>>,
    done: Option<Done>,
    stop: Arc<AtomicBool>,
}

impl<E: From<Error> + Send + 'static> Stream<E> {
    /// Starts the pass over `source` on one of `readers`' threads, `prefetch` batches ahead
    /// (converting, up to `prefetch` at once, or done and waiting in the channel's one place).
    /// A panic on the thread ends the stream with `panicked()`, so that the consumer does not
    /// take it for the end, and lose rows. Blocks while a new reader is set up (see
    /// [`Readers::start`]).
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(
        readers: &'static Readers,
        mut source: Source<E>,
        setup: Setup,
        prefetch: usize,
        panicked: fn() -> E,
    ) -> std::io::Result<Self> {
        let depth = prefetch.max(1);
        let (tx, rx) = sync_channel(prefetch + 1 - depth);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let done = readers.start(move || {
            let on_panic = tx.clone();
            let pass = || produce(|| source.next(), setup, depth, |batch| tx.send(batch).is_ok(), &flag);
            if catch_unwind(AssertUnwindSafe(pass)).is_err() {
                let _ = on_panic.send(Err(panicked()));
            }
        })?;
        Ok(Stream { rx: Some(Mutex::new(rx)), done: Some(done), stop })
    }

    /// Tells the thread to stop and drops what it made ahead (batches already handed out stay
    /// valid); the thread's [`Done`] to wait on, the first time.
    pub fn stop(&mut self) -> Option<Done> {
        self.stop.store(true, Ordering::Relaxed);
        self.rx = None;
        self.done.take()
    }

    /// Whether the thread has not been waited for yet ([`Stream::stop`]).
    pub fn running(&self) -> bool {
        self.done.is_some()
    }
}

impl<E> Iterator for Stream<E> {
    type Item = Result<TableTensors, E>;

    /// The next batch (blocks until the thread has made it); None at the end. An error, or the
    /// end, stops the stream.
    fn next(&mut self) -> Option<Result<TableTensors, E>> {
        let rx = self.rx.as_mut()?.get_mut().unwrap_or_else(|e| e.into_inner());
        let got = rx.recv().ok();
        if !matches!(got, Some(Ok(_))) {
            self.stop.store(true, Ordering::Relaxed);
            self.rx = None;
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::Int32Array;
    use arrow_schema::{DataType, Field};

    use super::super::BatchOptions;
    use super::super::readers::Serve;
    use super::*;

    fn plain(_: &mut Option<Serve>) {}
    static READERS: Readers = Readers::new(plain);

    fn arrays(chunks: Vec<Vec<i32>>) -> Arrays {
        let field = Arc::new(Field::new("x", DataType::Int32, false));
        let it = chunks.into_iter().map(|c| Ok(Arc::new(Int32Array::from(c)) as ArrayRef));
        (field, Box::new(it))
    }

    fn lengths(mut s: Stream<Error>) -> Vec<Result<i64, String>> {
        let mut out = Vec::new();
        for b in s.by_ref() {
            out.push(
                b.map(|t| match t {
                    TableTensors::One(c) => c.values.shape()[0],
                    TableTensors::Dict(_) => unreachable!("stacked"),
                })
                .map_err(|e| e.to_string()),
            );
        }
        assert!(s.next().is_none(), "an ended stream stays ended");
        s.stop().expect("the thread, once").wait();
        assert!(!s.running());
        out
    }

    fn setup(batch: usize) -> Setup {
        Setup::in_order(BatchOptions::new(batch).unwrap())
    }

    #[test]
    fn a_chain_of_streams_is_cut_into_exact_batches_in_order() {
        let mut parts =
            vec![arrays(vec![vec![1, 2, 3], vec![4]]), arrays(vec![vec![5, 6, 7, 8, 9]])].into_iter();
        let source = Source::chain(move || parts.next().map(Ok));
        let s = Stream::start(&READERS, source, setup(4), 2, || Error::InvalidArgument("panicked".into()));
        assert_eq!(lengths(s.unwrap()), [Ok(4), Ok(4), Ok(1)]);
    }

    #[test]
    fn a_source_error_comes_after_the_batches_before_it_and_ends_the_stream() {
        let mut calls = 0;
        let source = Source::chain(move || {
            calls += 1;
            match calls {
                1 => Some(Ok(arrays(vec![vec![1, 2, 3, 4, 5]]))),
                2 => Some(Err(Error::InvalidArgument("the source broke".into()))),
                _ => panic!("read past an error"),
            }
        });
        let s = Stream::start(&READERS, source, setup(2), 1, || Error::InvalidArgument("panicked".into()));
        let got = lengths(s.unwrap());
        assert_eq!(got[..2], [Ok(2), Ok(2)]);
        assert!(got[2].as_ref().unwrap_err().contains("the source broke"), "{got:?}");
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_panic_on_the_thread_is_an_error_not_the_end() {
        let source: Source<Error> = Source::chain(|| panic!("a broken source"));
        let s = Stream::start(&READERS, source, setup(2), 1, || Error::InvalidArgument("it panicked".into()));
        assert_eq!(lengths(s.unwrap()), [Err("it panicked".to_string())]);
    }

    #[test]
    fn a_table_in_memory_is_handed_out_as_its_row_ranges() {
        let rows = TableSlices::new(6, [(4, 6), (0, 2)].into_iter().collect());
        let source = Source::Memory { reader: Some(arrays(vec![vec![1, 2, 3], vec![4, 5, 6]])), rows };
        let s = Stream::start(&READERS, source, setup(3), 2, || Error::InvalidArgument("panicked".into()));
        assert_eq!(lengths(s.unwrap()), [Ok(3), Ok(1)]);
    }

    #[test]
    fn a_stream_stopped_early_lets_its_thread_end() {
        let source = Source::Reader(arrays((0..1000).map(|i| vec![i; 10]).collect()));
        let mut s =
            Stream::start(&READERS, source, setup(5), 2, || Error::InvalidArgument("panicked".into()))
                .unwrap();
        assert!(matches!(s.next(), Some(Ok(_))));
        s.stop().expect("the thread").wait();
        assert!(s.next().is_none());
    }
}

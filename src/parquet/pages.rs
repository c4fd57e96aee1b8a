//! A column chunk's pages written straight into a matrix's column: the direct path of the
//! reader. A [`Cursor`] holds one column chunk's current page and hands its rows out a tile at a
//! time, so that the reader fills a tile of rows of every column while the tile is in cache (a
//! tile without nulls a whole row at a time, [`rows_into`]). One
//! pass over each page's bytes (after the codec's): the definition levels and the values (PLAIN,
//! or a dictionary's indices) land in their rows, nulls filled as asked. What this path does not
//! decode (other encodings, nested columns) never reaches it: the reader routes it to
//! arrow-rs's reader first.

use std::marker::PhantomData;

use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::page::Page;

use super::chunk::{self, Chunk};

use super::hybrid;

/// A fixed-width value as Parquet stores it (little-endian, PLAIN).
pub trait Plain: Copy + Send + Sync + Default + 'static {
    /// Its bytes.
    const SIZE: usize;
    /// The value of `SIZE` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("SIZE bytes"))
            }
        }
    )*};
}
plain!(i32, i64, f32, f64);

/// What a null becomes: a fill value, or nothing (the caller refuses the nulls it is told of).
#[derive(Clone, Copy)]
pub enum OnNull<T> {
    /// The value written in a null's place.
    Fill(T),
    /// Nothing written: the caller refuses the nulls it is told of.
    Refuse,
}

/// The values of the current page.
enum Values {
    /// PLAIN bytes (the page's, shared), and the next value's offset.
    Plain(Bytes, usize),
    /// Indices into the dictionary (checked against its length), and the next one's place.
    Dict(Vec<u32>, usize),
}

/// The data page being read: its rows, where the next one is, its levels (none for a required
/// column) and its values.
struct Current {
    rows: usize,
    at: usize,
    levels: Vec<u32>,
    values: Values,
}

/// One column chunk being read, a tile of rows at a time.
pub struct Cursor<T> {
    pages: Chunk,
    /// Rows of the chunk not yet in a page read: a page that says more is malformed (and its
    /// levels are never allocated).
    unread: usize,
    max_def: u32,
    /// The dictionary page's values, as the page holds them (no copy: the file's mapped bytes,
    /// or the codec's output).
    dict: Option<Bytes>,
    page: Option<Current>,
    on_null: OnNull<T>,
    /// Nulls met so far.
    pub nulls: usize,
}

impl<T: Plain> Cursor<T> {
    /// A cursor over the pages of a flat column chunk (`max_def` 0 or 1) of `rows` rows.
    pub fn new(pages: Chunk, rows: usize, max_def: i16, on_null: OnNull<T>) -> Self {
        let max_def = max_def.max(0) as u32;
        Cursor { pages, unread: rows, max_def, dict: None, page: None, on_null, nulls: 0 }
    }

    /// Writes the next `rows` rows into `out[r * stride + col]`, `r` from 0.
    ///
    /// # Errors
    /// A description of what is malformed or not for this path: a page of another encoding,
    /// levels or values that the page does not hold, dictionary indices out of range, pages
    /// that end before the rows do.
    pub fn fill(&mut self, out: &mut [T], stride: usize, col: usize, rows: usize) -> Result<(), String> {
        if rows > 0 && out.len() <= (rows - 1).saturating_mul(stride).saturating_add(col) {
            return Err("the output holds fewer rows than asked for".into());
        }
        let mut r = 0;
        while r < rows {
            let page = match &mut self.page {
                Some(p) if p.at < p.rows => p,
                _ => {
                    self.page = Some(self.next_page()?.ok_or("pages end before the row group's rows")?);
                    continue;
                }
            };
            let m = (rows - r).min(page.rows - page.at);
            let dst = &mut out[r * stride + col..];
            let levels = page.levels.get(page.at..page.at + m);
            let dict = self.dict.as_deref().unwrap_or_default();
            self.nulls += put(dst, stride, m, levels, self.max_def, &mut page.values, dict, self.on_null);
            page.at += m;
            r += m;
        }
        Ok(())
    }

    /// The next `n` rows when they hold no null and lie in one page (the next page read when
    /// the last is done), and the cursor past them; None, the cursor where it was, otherwise
    /// ([`Cursor::fill`] then writes them). No copy: the page's values or indices, in place.
    ///
    /// # Errors
    /// As [`Cursor::fill`], for the page read.
    pub fn rows(&mut self, n: usize) -> Result<Option<Rows<'_, T>>, String> {
        if self.page.as_ref().is_none_or(|p| p.at >= p.rows) {
            self.page = self.next_page()?;
        }
        let Cursor { page: Some(page), dict, max_def, .. } = self else { return Ok(None) };
        let levels = page.levels.get(page.at..page.at + n);
        if page.rows - page.at < n || levels.is_some_and(|l| l.iter().any(|d| d != max_def)) {
            return Ok(None);
        }
        page.at += n;
        Ok(Some(match &mut page.values {
            Values::Plain(bytes, next) => {
                *next += n * T::SIZE;
                Rows::Plain(&bytes[*next - n * T::SIZE..*next], PhantomData)
            }
            Values::Dict(ids, next) => {
                *next += n;
                // The page's indices were checked against this dictionary when it was read.
                let dict = dict.as_deref().unwrap_or_default();
                Rows::Dict(Lookups { ids: &ids[*next - n..*next], dict, of: PhantomData })
            }
        }))
    }

    /// Checks that no rows are left after the row group's (a chunk that holds more rows than
    /// its row group says is malformed).
    ///
    /// # Errors
    /// As [`Cursor::fill`].
    pub fn finish(mut self) -> Result<(), String> {
        let more = "pages hold more rows than the row group";
        if self.page.as_ref().is_some_and(|p| p.at < p.rows) {
            return Err(more.into());
        }
        while let Some(p) = self.next_page()? {
            if p.rows > 0 {
                return Err(more.into());
            }
        }
        Ok(())
    }

    /// The next data page, read (a dictionary page before it is kept); None at the end.
    fn next_page(&mut self) -> Result<Option<Current>, String> {
        // The last page's buffers, reused: a page's levels and indices are as long as its rows,
        // and a fresh allocation of that size would be mapped and zeroed by the system anew.
        let (mut levels, mut indices) = match self.page.take() {
            Some(Current { levels, values: Values::Dict(indices, _), .. }) => (levels, indices),
            Some(Current { levels, values: Values::Plain(bytes, _), .. }) => {
                chunk::recycle(bytes);
                (levels, Vec::new())
            }
            None => (Vec::new(), Vec::new()),
        };
        loop {
            let Some(page) = self.pages.next_page()? else { return Ok(None) };
            let (n, encoding, defs, buf, offset) = match &page {
                Page::DictionaryPage { buf, num_values, encoding, .. } => {
                    if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                        return Err(format!("a dictionary page encoded {encoding}"));
                    }
                    let n = *num_values as usize;
                    if buf.len() < n.saturating_mul(T::SIZE) {
                        return Err("dictionary values past the end of the page".into());
                    }
                    self.dict = Some(buf.slice(..n * T::SIZE));
                    continue;
                }
                Page::DataPage { buf, num_values, encoding, def_level_encoding, .. } => {
                    let n = *num_values as usize;
                    if self.max_def == 0 {
                        (n, *encoding, None, buf, 0)
                    } else {
                        if *def_level_encoding != Encoding::RLE {
                            return Err(format!("definition levels encoded {def_level_encoding}"));
                        }
                        let len = buf.get(..4).ok_or("definition levels past the end of the page")?;
                        let end = 4usize
                            .saturating_add(u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize);
                        let defs = buf.get(4..end).ok_or("definition levels past the end of the page")?;
                        (n, *encoding, Some(defs), buf, end)
                    }
                }
                Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding,
                    def_levels_byte_len,
                    rep_levels_byte_len,
                    ..
                } => {
                    if *rep_levels_byte_len != 0 {
                        return Err("repetition levels in a flat column".into());
                    }
                    let len = *def_levels_byte_len as usize;
                    let defs = buf.get(..len).ok_or("definition levels past the end of the page")?;
                    (*num_values as usize, *encoding, (self.max_def > 0).then_some(defs), buf, len)
                }
            };
            if n > self.unread {
                return Err(format!("a page of {n} rows where {} are left", self.unread));
            }
            self.unread -= n;
            // A page without nulls has one run of the top level: no level to decode or read.
            let width = hybrid::bit_width(self.max_def);
            levels.clear();
            if let Some(defs) = defs.filter(|d| !hybrid::one_run(d, width, n, self.max_def)) {
                levels.resize(n, 0);
                hybrid::decode(defs, width, &mut levels)?;
            }
            let present =
                if levels.is_empty() { n } else { levels.iter().filter(|&&d| d == self.max_def).count() };
            let values = &buf[offset..];
            let values = match encoding {
                Encoding::PLAIN => {
                    if values.len() < present.saturating_mul(T::SIZE) {
                        return Err("values past the end of the page".into());
                    }
                    Values::Plain(buf.slice(offset..), 0)
                }
                Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY => {
                    let dict = self.dict.as_ref().ok_or("dictionary indices before a dictionary page")?;
                    let width = *values.first().ok_or("dictionary indices past the end of the page")?;
                    // The decode overwrites every index: only a longer page's growth is zeroed.
                    indices.resize(present, 0);
                    hybrid::decode(&values[1..], width, &mut indices)?;
                    let len = dict.len() / T::SIZE;
                    // The largest first (a fold of values, which the compiler vectorises where
                    // `max()`, which keeps a reference, it does not), the culprit only then.
                    if indices.iter().fold(0, |m, &i| m.max(i)) as usize >= len && !indices.is_empty() {
                        let bad = indices.iter().find(|&&i| i as usize >= len).expect("the largest is");
                        return Err(format!("dictionary index {bad} of a dictionary of {len}"));
                    }
                    Values::Dict(indices, 0)
                }
                other => return Err(format!("values encoded {other}")),
            };
            if let Values::Dict(..) = values {
                // The indices are read out: the page's bytes are free for the next page.
                let bytes = page.buffer().clone();
                drop(page);
                chunk::recycle(bytes);
            }
            return Ok(Some(Current { rows: n, at: 0, levels, values }));
        }
    }
}

impl<T> Drop for Cursor<T> {
    /// The dictionary's and the last page's bytes go back for the thread's next pages.
    fn drop(&mut self) {
        if let Some(dict) = self.dict.take() {
            chunk::recycle(dict);
        }
        if let Some(Current { values: Values::Plain(bytes, _), .. }) = self.page.take() {
            chunk::recycle(bytes);
        }
    }
}

/// A column's rows of `T` without a null, as [`Cursor::rows`] hands them out (the page's, in
/// place).
pub enum Rows<'a, T> {
    /// PLAIN values' bytes.
    Plain(&'a [u8], PhantomData<T>),
    /// Indices into a dictionary.
    Dict(Lookups<'a, T>),
}

/// Indices and the bytes of their dictionary of `T`s, every index checked to lie in it (as
/// `T`s) when its page was read by a `Cursor<T>` (`Cursor::next_page`, which alone replaces a
/// cursor's dictionary, and drops the page before). Made only by [`Cursor::rows`] (its fields
/// are private to this module), and read only as `T`s, so that a lookup needs no check of its
/// own.
pub struct Lookups<'a, T> {
    ids: &'a [u32],
    dict: &'a [u8],
    of: PhantomData<T>,
}

impl<T: Plain> Lookups<'_, T> {
    /// The value of index `r`.
    fn get(&self, r: usize) -> T {
        let i = self.ids[r] as usize;
        debug_assert!(i < self.dict.len() / T::SIZE);
        let at = i * T::SIZE;
        // SAFETY: `i` is below the dictionary's length in `T`s (a `Lookups<T>` holds only indices
        // checked against its dictionary for this `T`, see above), so `at + T::SIZE <= dict.len()`.
        T::from_le(unsafe { self.dict.get_unchecked(at..at + T::SIZE) })
    }
}

impl<T: Plain> Rows<'_, T> {
    /// Value `r`.
    fn get(&self, r: usize) -> T {
        match self {
            Rows::Plain(bytes, _) => T::from_le(&bytes[r * T::SIZE..(r + 1) * T::SIZE]),
            Rows::Dict(lookups) => lookups.get(r),
        }
    }

    /// Writes the values into `dst[r * stride]`, one at a time.
    pub fn column_into(&self, dst: &mut [T], stride: usize) {
        let n = match self {
            Rows::Plain(bytes, _) => bytes.len() / T::SIZE,
            Rows::Dict(lookups) => lookups.ids.len(),
        };
        dst.iter_mut().step_by(stride).take(n).enumerate().for_each(|(r, d)| *d = self.get(r));
    }
}

/// Writes the rows of `cols` (as many each) into the rows of `dst`, one column each. Up to 8
/// columns a whole row at a time: the row's values read from each column and stored together,
/// which takes a whole-file read 20% less time than each column stored at its stride.
pub fn rows_into<T: Plain>(cols: &[Rows<'_, T>], dst: &mut [T]) {
    match cols.len() {
        1 => rows_const::<1, T>(cols, dst),
        2 => rows_const::<2, T>(cols, dst),
        3 => rows_const::<3, T>(cols, dst),
        4 => rows_const::<4, T>(cols, dst),
        5 => rows_const::<5, T>(cols, dst),
        6 => rows_const::<6, T>(cols, dst),
        7 => rows_const::<7, T>(cols, dst),
        8 => rows_const::<8, T>(cols, dst),
        k => cols.iter().enumerate().for_each(|(j, col)| col.column_into(&mut dst[j..], k)),
    }
}

/// [`rows_into`] for `K` columns: columns all of one kind are taken out of [`Rows`] once, so
/// that each value is a load and a store (the kind no longer asked per value).
fn rows_const<const K: usize, T: Plain>(cols: &[Rows<'_, T>], dst: &mut [T]) {
    let n = dst.len() / K;
    if cols.iter().all(|c| matches!(c, Rows::Dict(..))) {
        let cols: [&Lookups<'_, T>; K] = std::array::from_fn(|j| match &cols[j] {
            Rows::Dict(lookups) => lookups,
            Rows::Plain(..) => unreachable!("every column is a dictionary's"),
        });
        for (r, row) in dst.chunks_exact_mut(K).enumerate() {
            for j in 0..K {
                row[j] = cols[j].get(r);
            }
        }
    } else if cols.iter().all(|c| matches!(c, Rows::Plain(..))) {
        let mut values: [_; K] = std::array::from_fn(|j| match cols[j] {
            Rows::Plain(bytes, _) => bytes[..n * T::SIZE].chunks_exact(T::SIZE),
            Rows::Dict(..) => unreachable!("every column is PLAIN"),
        });
        for row in dst.chunks_exact_mut(K) {
            for j in 0..K {
                row[j] = T::from_le(values[j].next().expect("n rows"));
            }
        }
    } else {
        let cols: [&Rows<'_, T>; K] = std::array::from_fn(|j| &cols[j]);
        for (r, row) in dst.chunks_exact_mut(K).enumerate() {
            for j in 0..K {
                row[j] = cols[j].get(r);
            }
        }
    }
}

/// Value `i` of a dictionary page's bytes (little-endian `T`s, as Parquet stores them).
fn entry<T: Plain>(dict: &[u8], i: u32) -> T {
    let at = i as usize * T::SIZE;
    T::from_le(&dict[at..at + T::SIZE])
}

/// Writes `m` rows from `values` (or the values of `dict`'s bytes at them) into `dst[i * stride]`, a
/// null where a level is below `max_def` (filled as `on_null` says); returns the nulls. The
/// values were checked to hold one per present row, and the indices to lie in `dict`, when the
/// page was read.
#[allow(clippy::too_many_arguments)]
fn put<T: Plain>(
    dst: &mut [T],
    stride: usize,
    m: usize,
    levels: Option<&[u32]>,
    max_def: u32,
    values: &mut Values,
    dict: &[u8],
    on_null: OnNull<T>,
) -> usize {
    let rows = dst.iter_mut().step_by(stride).take(m);
    // A run of levels without a null is written as a page without levels.
    let levels = levels.filter(|l| l.iter().any(|&d| d != max_def));
    let mut nulls = 0;
    match (levels, values) {
        (None, Values::Plain(bytes, next)) => {
            let src = bytes[*next..*next + m * T::SIZE].chunks_exact(T::SIZE);
            rows.zip(src).for_each(|(d, s)| *d = T::from_le(s));
            *next += m * T::SIZE;
        }
        (None, Values::Dict(v, next)) => {
            // The lookups first, into a run in cache, then the strided writes: the loads from
            // the dictionary then overlap instead of each waiting behind a store.
            let mut run = [T::default(); 64];
            let mut rows = rows;
            for ids in v[*next..*next + m].chunks(64) {
                run.iter_mut().zip(ids).for_each(|(r, &i)| *r = entry(dict, i));
                rows.by_ref().zip(&run[..ids.len()]).for_each(|(d, &r)| *d = r);
            }
            *next += m;
        }
        (Some(levels), values) => {
            for (d, &l) in rows.zip(levels) {
                if l == max_def {
                    *d = match values {
                        Values::Plain(bytes, next) => {
                            *next += T::SIZE;
                            T::from_le(&bytes[*next - T::SIZE..*next])
                        }
                        Values::Dict(v, next) => {
                            *next += 1;
                            entry(dict, v[*next - 1])
                        }
                    };
                } else {
                    nulls += 1;
                    if let OnNull::Fill(f) = on_null {
                        *d = f;
                    }
                }
            }
        }
    }
    nulls
}

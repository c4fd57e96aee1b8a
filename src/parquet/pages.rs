//! A column chunk's pages written straight into a matrix's column: the direct path of the
//! reader. One pass over each page's bytes (after the codec's): the definition levels and the
//! values (PLAIN, or a dictionary's indices) land in their rows, nulls filled as asked. What
//! this path does not decode (other encodings, nested columns) never reaches it: the reader
//! routes it to arrow-rs's reader first.

use parquet::basic::Encoding;
use parquet::column::page::{Page, PageReader};

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

/// Where a column's rows go: `rows[r * stride + col]` for row `r` of the chunk.
pub struct Column<'a, T> {
    /// The rows of the matrix the chunk's rows are part of.
    pub rows: &'a mut [T],
    /// Values from one row to the next (the matrix's columns).
    pub stride: usize,
    /// The column written.
    pub col: usize,
}

/// What a null becomes: a fill value, or an error (the caller counts them).
#[derive(Clone, Copy)]
pub enum OnNull<T> {
    /// The value written in a null's place.
    Fill(T),
    /// Nothing written: the caller refuses the nulls it is told of.
    Refuse,
}

/// Writes the `rows` rows of a flat column chunk (`max_def` 0 or 1) from `pages` into `out`.
/// Returns how many nulls it met (each written as `on_null` says; under [`OnNull::Refuse`]
/// they are left as they were and counted).
///
/// # Errors
/// A description of what is malformed or not for this path: a page of another encoding, levels
/// or values that the page does not hold, dictionary indices out of range, a chunk whose pages
/// hold more or fewer rows than the row group says.
pub fn decode_chunk<T: Plain>(
    pages: &mut dyn PageReader,
    max_def: i16,
    rows: usize,
    out: Column<'_, T>,
    on_null: OnNull<T>,
) -> Result<usize, String> {
    let Column { rows: dst, stride, col } = out;
    if rows > 0 && dst.len() <= (rows - 1).saturating_mul(stride).saturating_add(col) {
        return Err("the output holds fewer rows than the chunk".into());
    }
    let mut dict: Option<Vec<T>> = None;
    let (mut row, mut nulls) = (0usize, 0usize);
    let mut levels = Vec::new();
    let mut indices = Vec::new();
    while let Some(page) = pages.get_next_page().map_err(|e| e.to_string())? {
        let (n, encoding, defs, values) = match &page {
            Page::DictionaryPage { buf, num_values, encoding, .. } => {
                if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                    return Err(format!("a dictionary page encoded {encoding}"));
                }
                dict = Some(plain_values(buf, *num_values as usize)?);
                continue;
            }
            Page::DataPage { buf, num_values, encoding, def_level_encoding, .. } => {
                let n = *num_values as usize;
                if max_def == 0 {
                    (n, *encoding, None, &buf[..])
                } else {
                    if *def_level_encoding != Encoding::RLE {
                        return Err(format!("definition levels encoded {def_level_encoding}"));
                    }
                    let len = buf.get(..4).ok_or("definition levels past the end of the page")?;
                    let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
                    let end = 4usize.saturating_add(len);
                    let defs = buf.get(4..end).ok_or("definition levels past the end of the page")?;
                    (n, *encoding, Some(defs), &buf[end..])
                }
            }
            Page::DataPageV2 {
                buf, num_values, encoding, def_levels_byte_len, rep_levels_byte_len, ..
            } => {
                if *rep_levels_byte_len != 0 {
                    return Err("repetition levels in a flat column".into());
                }
                let len = *def_levels_byte_len as usize;
                let defs = buf.get(..len).ok_or("definition levels past the end of the page")?;
                (*num_values as usize, *encoding, (max_def > 0).then_some(defs), &buf[len..])
            }
        };
        if n > rows - row {
            return Err(format!("pages hold more than the row group's {rows} rows"));
        }
        let valid = match defs {
            None => None,
            Some(defs) => {
                levels.resize(n, 0);
                hybrid::decode(defs, hybrid::bit_width(max_def as u32), &mut levels)?;
                Some(&levels[..])
            }
        };
        let present = valid.map_or(n, |l| l.iter().filter(|&&d| d == max_def as u32).count());
        let mut put = |i: usize, v: T| dst[(row + i) * stride + col] = v;
        let mut next_value: Box<dyn FnMut() -> T + '_> = match encoding {
            Encoding::PLAIN => {
                let bytes = values.get(..present * T::SIZE).ok_or("values past the end of the page")?;
                let mut chunks = bytes.chunks_exact(T::SIZE);
                Box::new(move || T::from_le(chunks.next().expect("present values")))
            }
            Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY => {
                let dict = dict.as_deref().ok_or("dictionary indices before a dictionary page")?;
                let width = *values.first().ok_or("dictionary indices past the end of the page")?;
                indices.resize(present, 0);
                hybrid::decode(&values[1..], width, &mut indices)?;
                if let Some(bad) = indices.iter().find(|&&i| i as usize >= dict.len()) {
                    return Err(format!("dictionary index {bad} of a dictionary of {}", dict.len()));
                }
                let mut at = indices.iter();
                Box::new(move || dict[*at.next().expect("present values") as usize])
            }
            other => return Err(format!("values encoded {other}")),
        };
        match valid {
            None => (0..n).for_each(|i| put(i, next_value())),
            Some(levels) => {
                for (i, &d) in levels.iter().enumerate() {
                    if d == max_def as u32 {
                        put(i, next_value());
                    } else {
                        nulls += 1;
                        if let OnNull::Fill(v) = on_null {
                            put(i, v);
                        }
                    }
                }
            }
        }
        row += n;
    }
    if row != rows {
        return Err(format!("pages hold {row} rows of the row group's {rows}"));
    }
    Ok(nulls)
}

/// `n` PLAIN values at the start of `buf`.
fn plain_values<T: Plain>(buf: &[u8], n: usize) -> Result<Vec<T>, String> {
    let bytes = buf.get(..n.saturating_mul(T::SIZE)).ok_or("dictionary values past the end of the page")?;
    Ok(bytes.chunks_exact(T::SIZE).map(T::from_le).collect())
}

//! The page headers of a compressed column chunk, read ahead of arrow-rs's page reader. That
//! reader allocates a page's declared uncompressed size (up to 2 GiB) before it decompresses,
//! so a header that lies would make a small file allocate far more than its rows can fill (a
//! decompression bomb). [`check_chunk`] reads each header's sizes (Thrift's compact protocol:
//! a `PageHeader`'s fields 2 and 3, the others skipped) and refuses a page that declares more
//! than a bound, before any page of the chunk is decoded. No copy: it reads the file in place.

/// Nesting deeper than this in a page header is refused (a header nests three structs deep).
const DEPTH: usize = 16;

/// Checks the pages of the column chunk at `file[start..start + len]`: every header is whole,
/// each page lies within the chunk, and none declares more than `limit` bytes uncompressed.
///
/// # Errors
/// What is wrong, and at which byte of the file.
pub fn check_chunk(file: &[u8], start: u64, len: u64, limit: u64) -> Result<(), String> {
    let end = start.checked_add(len).filter(|&e| e <= file.len() as u64).ok_or("a chunk past the file")?;
    let chunk = &file[start as usize..end as usize];
    let mut at = 0usize;
    while at < chunk.len() {
        let mut r = Reader { b: &chunk[at..], at: 0 };
        let (uncompressed, compressed) = r
            .page_sizes()
            .map_err(|why| format!("the page header at byte {}: {why}", start as usize + at))?;
        if uncompressed > limit {
            return Err(format!(
                "the page at byte {} declares {uncompressed} bytes uncompressed, more than its rows can \
                 fill ({limit})",
                start as usize + at
            ));
        }
        at = at
            .checked_add(r.at)
            .and_then(|a| a.checked_add(compressed as usize))
            .filter(|&a| a <= chunk.len())
            .ok_or_else(|| format!("the page at byte {} runs past its column chunk", start as usize + at))?;
    }
    Ok(())
}

/// A reader of Thrift's compact protocol over a page header's bytes.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// The header's uncompressed and compressed page sizes (fields 2 and 3, both required).
    fn page_sizes(&mut self) -> Result<(u64, u64), String> {
        let (mut uncompressed, mut compressed) = (None, None);
        let mut last = 0i64;
        while let Some((id, kind)) = self.field(&mut last)? {
            match (id, kind) {
                (2, 5) => uncompressed = Some(self.size()?),
                (3, 5) => compressed = Some(self.size()?),
                _ => self.skip(kind, 0)?,
            }
        }
        Ok((uncompressed.ok_or("no uncompressed size")?, compressed.ok_or("no compressed size")?))
    }

    /// A size field: an i32 that is not negative.
    fn size(&mut self) -> Result<u64, String> {
        let v = zigzag(self.varint()?);
        u64::try_from(v).ok().filter(|&v| v <= i32::MAX as u64).ok_or_else(|| format!("a size of {v}"))
    }

    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.b.get(self.at).ok_or("truncated")?;
        self.at += 1;
        Ok(b)
    }

    fn advance(&mut self, n: u64) -> Result<(), String> {
        let to = (self.at as u64).checked_add(n).filter(|&t| t <= self.b.len() as u64).ok_or("truncated")?;
        self.at = to as usize;
        Ok(())
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift.min(63);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint of more than 10 bytes".into())
    }

    /// The next field's id and type, None at the struct's end.
    fn field(&mut self, last: &mut i64) -> Result<Option<(i64, u8)>, String> {
        let h = self.byte()?;
        if h == 0 {
            return Ok(None);
        }
        let delta = i64::from(h >> 4);
        *last = if delta == 0 { zigzag(self.varint()?) } else { *last + delta };
        Ok(Some((*last, h & 0x0f)))
    }

    /// Skips a value of compact type `kind`.
    fn skip(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        if depth > DEPTH {
            return Err("nested too deep".into());
        }
        match kind {
            1 | 2 => Ok(()),
            3 => self.advance(1),
            4..=6 => self.varint().map(drop),
            7 => self.advance(8),
            8 => {
                let n = self.varint()?;
                self.advance(n)
            }
            9 | 10 => {
                let h = self.byte()?;
                let n = match h >> 4 {
                    15 => self.varint()?,
                    n => u64::from(n),
                };
                (0..n).try_for_each(|_| self.element(h & 0x0f, depth))
            }
            11 => {
                let n = self.varint()?;
                let kinds = if n > 0 { self.byte()? } else { 0 };
                (0..n).try_for_each(|_| {
                    self.element(kinds >> 4, depth)?;
                    self.element(kinds & 0x0f, depth)
                })
            }
            12 => {
                let mut last = 0;
                while let Some((_, k)) = self.field(&mut last)? {
                    self.skip(k, depth + 1)?;
                }
                Ok(())
            }
            k => Err(format!("a field of type {k}")),
        }
    }

    /// Skips an element of a list, set or map: a bool is a byte there.
    fn element(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        match kind {
            1 | 2 => self.advance(1),
            k => self.skip(k, depth + 1),
        }
    }
}

fn zigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of a data page: type 0, the sizes, a nested data page header (num_values 7,
    /// encodings), a list of bools and a binary field that the check skips.
    fn header(uncompressed: u32, compressed: u32) -> Vec<u8> {
        let zz = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
        let varint = |mut v: u64, out: &mut Vec<u8>| loop {
            if v < 0x80 {
                out.push(v as u8);
                break;
            }
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        };
        let mut h = vec![0x15]; // field 1 (type), an i32
        varint(zz(0), &mut h);
        h.push(0x15); // field 2
        varint(zz(uncompressed.into()), &mut h);
        h.push(0x15); // field 3
        varint(zz(compressed.into()), &mut h);
        h.push(0x2c); // field 5, a struct: num_values 7, then a list of two bools
        h.extend([0x15, 14, 0x19, 0x21, 0x01, 0x02, 0x00]);
        h.extend([0x08, 0x1a, 0x03, b'a', b'b', b'c']); // field 13 by its id: binary "abc"
        h.push(0x00);
        h
    }

    #[test]
    fn pages_within_the_bound_pass_and_a_page_that_declares_more_is_refused() {
        let mut file = vec![0u8; 4];
        for size in [100u32, 50] {
            file.extend(header(size, 10));
            file.extend([0u8; 10]);
        }
        let len = file.len() as u64 - 4;
        assert_eq!(check_chunk(&file, 4, len, 100), Ok(()));
        let e = check_chunk(&file, 4, len, 99).unwrap_err();
        assert!(e.contains("byte 4 declares 100 bytes"), "{e}");
        // A page whose bytes run past the chunk, and a header cut short.
        assert!(check_chunk(&file, 4, len - 1, 100).unwrap_err().contains("runs past"));
        assert!(check_chunk(&file, 4, 3, 100).unwrap_err().contains("truncated"));
        // A header of 2^31 - 1 bytes uncompressed.
        let mut bomb = header(i32::MAX as u32, 1);
        bomb.push(0);
        let e = check_chunk(&bomb, 0, bomb.len() as u64, 1 << 20).unwrap_err();
        assert!(e.contains("2147483647 bytes"), "{e}");
    }

    #[test]
    fn any_bytes_end_in_a_result_never_a_panic_or_a_hang() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..4000 {
            let bytes: Vec<u8> = (0..(n % 97))
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = check_chunk(&bytes, 0, bytes.len() as u64, 1 << 20);
        }
        // Deep nesting is refused, not followed.
        let mut deep = vec![0x15, 0x00, 0x15, 0x00, 0x15, 0x00];
        deep.extend(std::iter::repeat_n(0x1c, 100));
        assert!(check_chunk(&deep, 0, deep.len() as u64, 10).unwrap_err().contains("deep"));
    }
}

//! Parquet's RLE / bit-packed hybrid encoding, decoded: the definition levels of a page and the
//! indices of a dictionary-encoded one. Reads only the bytes it is given; a run that claims
//! more bytes than there are is an error, never a read past the end.

/// Decodes `out.len()` values of `bit_width` bits from `data` (runs of one repeated value, or
/// groups of eight bit-packed values, each run after its ULEB128 header). Returns the bytes
/// read. A last bit-packed group may hold more values than are asked for (padding); a run
/// longer than what is left is cut at the end of `out`.
///
/// # Errors
/// A description of what is malformed: a width over 32 bits, a header that does not end, a
/// run past the end of `data`, or values missing at its end.
pub fn decode(data: &[u8], bit_width: u8, out: &mut [u32]) -> Result<usize, String> {
    if bit_width > 32 {
        return Err(format!("a bit width of {bit_width} (at most 32)"));
    }
    let width = usize::from(bit_width);
    let value_bytes = width.div_ceil(8);
    let (mut at, mut done) = (0usize, 0usize);
    while done < out.len() {
        let header = uleb128(data, &mut at)?;
        let left = out.len() - done;
        if header & 1 == 0 {
            let count = usize::try_from(header >> 1).unwrap_or(usize::MAX);
            if count == 0 {
                return Err("an RLE run of no values".into());
            }
            let bytes = data.get(at..at + value_bytes).ok_or("an RLE run past the end of the data")?;
            let v = little_endian(bytes) as u32;
            if width < 32 && v >> width != 0 {
                return Err(format!("an RLE value {v} wider than {width} bits"));
            }
            at += value_bytes;
            let n = count.min(left);
            out[done..done + n].fill(v);
            done += n;
        } else {
            let groups = usize::try_from(header >> 1).unwrap_or(usize::MAX);
            if groups == 0 {
                return Err("a bit-packed run of no groups".into());
            }
            let bytes = groups.checked_mul(width).ok_or("a bit-packed run past the end of the data")?;
            let packed = data
                .get(at..at.checked_add(bytes).ok_or("a bit-packed run past the end of the data")?)
                .ok_or("a bit-packed run past the end of the data")?;
            at += bytes;
            let n = groups.saturating_mul(8).min(left);
            // Whole groups of eight by the width's own code; a last, partial one value by value.
            let whole = n / 8;
            unpack_groups(&packed[..whole * width], width, &mut out[done..done + whole * 8]);
            unpack(&packed[whole * width..], width, &mut out[done + whole * 8..done + n]);
            done += n;
        }
    }
    Ok(at)
}

/// The values of `width` bits packed from the lowest bit of `packed` on, into `out` (which
/// `packed` holds: `out.len() * width` bits at most).
fn unpack(packed: &[u8], width: usize, out: &mut [u32]) {
    if width == 0 {
        out.fill(0);
        return;
    }
    let mask = if width == 32 { u64::from(u32::MAX) } else { (1u64 << width) - 1 };
    for (i, v) in out.iter_mut().enumerate() {
        let bit = i * width;
        let (byte, shift) = (bit / 8, bit % 8);
        // One load of 8 bytes where they are there (a value spans at most 5), else byte by byte.
        let word = match packed.get(byte..byte + 8) {
            Some(b) => u64::from_le_bytes(b.try_into().expect("8 bytes")),
            None => little_endian(&packed[byte..packed.len().min(byte + 5)]),
        };
        *v = ((word >> shift) & mask) as u32;
    }
}

/// Groups of eight values of `width` bits (`width` bytes each) from `packed` into `out`, by
/// a decoder made for that width (its shifts and masks constants).
fn unpack_groups(packed: &[u8], width: usize, out: &mut [u32]) {
    macro_rules! widths {
        ($($w:literal)*) => {
            match width {
                $($w => group::<$w>(packed, out),)*
                _ => unpack(packed, width, out),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
}

/// [`unpack_groups`] for a width of `W` bits.
fn group<const W: usize>(packed: &[u8], out: &mut [u32]) {
    let mask = if W == 32 { u64::from(u32::MAX) } else { (1u64 << W) - 1 };
    let unpack8 = |bytes: &[u8], values: &mut [u32]| {
        for (j, v) in values.iter_mut().enumerate() {
            let bit = j * W;
            let word = u64::from_le_bytes(bytes[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
            *v = ((word >> (bit % 8)) & mask) as u32;
        }
    };
    for (g, values) in out.chunks_exact_mut(8).enumerate().take(packed.len() / W) {
        let at = g * W;
        match packed.get(at..at + W + 8) {
            // The group and 8 bytes after it: every value's 8-byte load reads in place.
            Some(bytes) => unpack8(bytes, values),
            // A last group: value by value, each load within the group's bytes.
            None => unpack(&packed[at..at + W], W, values),
        }
    }
}

/// Whether `data` begins with one RLE run of `value` covering at least `n` values: the levels
/// of a page without nulls, which need not be decoded.
pub fn one_run(data: &[u8], bit_width: u8, n: usize, value: u32) -> bool {
    let mut at = 0;
    let Ok(header) = uleb128(data, &mut at) else { return false };
    let bytes = usize::from(bit_width).div_ceil(8);
    let Some(v) = data.get(at..at + bytes) else { return false };
    let v = little_endian(v);
    header & 1 == 0 && header >> 1 >= n as u64 && v == u64::from(value)
}

/// The little-endian number of up to 8 `bytes`.
fn little_endian(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0, |w, (k, b)| w | u64::from(*b) << (8 * k))
}

/// A ULEB128 number at `*at` (at most 5 bytes: a header of 32 bits), and `*at` past it.
fn uleb128(data: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut v = 0u64;
    for k in 0..5 {
        let b = *data.get(*at).ok_or("a run header past the end of the data")?;
        *at += 1;
        v |= u64::from(b & 0x7f) << (7 * k);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a run header of more than 5 bytes".into())
}

/// The bits a value up to `max` takes (0 for 0), as Parquet sizes levels.
pub fn bit_width(max: u32) -> u8 {
    (32 - max.leading_zeros()) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_packed_groups_decode_as_the_specification_writes_them() {
        // RLE: 4 x 1 (header 4 << 1), then a bit-packed group (header 1 << 1 | 1) of eight
        // 1-bit values 1,0,1,1,0,0,0,1 (LSB first: 0b1000_1101).
        let data = [0x08, 0x01, 0x03, 0b1000_1101];
        let mut out = [9u32; 12];
        assert_eq!(decode(&data, 1, &mut out), Ok(4));
        assert_eq!(out, [1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 1]);
        // 3-bit values 0..8 packed in one group (3 bytes); asked for 5: the padding is skipped.
        let packed = [0b1000_1000, 0b1100_0110, 0b1111_1010];
        let mut five = [0u32; 5];
        assert_eq!(decode(&[&[0x03][..], &packed].concat(), 3, &mut five), Ok(4));
        assert_eq!(five, [0, 1, 2, 3, 4]);
        // A 32-bit RLE value.
        let mut one = [0u32; 2];
        assert!(decode(&[0x04, 0xff, 0xff, 0xff, 0xff], 32, &mut one).is_ok());
        assert_eq!(one, [u32::MAX; 2]);
        assert_eq!(bit_width(0), 0);
        assert_eq!(bit_width(1), 1);
        assert_eq!(bit_width(4), 3);
    }

    #[test]
    fn malformed_runs_are_errors_not_reads_past_the_end() {
        let mut out = [0u32; 8];
        assert!(decode(&[], 1, &mut out).is_err());
        assert!(decode(&[0x08], 1, &mut out).is_err(), "an RLE value missing");
        assert!(decode(&[0x05, 0xff], 1, &mut out).is_err(), "two groups, one byte");
        assert!(decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 1, &mut out).is_err(), "a long header");
        assert!(decode(&[0x00], 1, &mut out).is_err(), "a run of nothing");
        assert!(decode(&[0x08, 0x02], 1, &mut out).is_err(), "a value wider than its bits");
        assert!(decode(&[0x08, 0x01], 33, &mut out).is_err());
        // A run that says more values than are asked for is cut.
        let mut two = [0u32; 2];
        assert_eq!(decode(&[0xfe, 0x7f, 0x01], 1, &mut two), Ok(3));
        assert_eq!(two, [1, 1]);
    }

    #[test]
    fn wide_packed_values_read_with_one_load_equal_those_read_byte_by_byte() {
        // 17-bit values (dictionary indices), 5 groups: the last values lie within 8 bytes of
        // the end, where the load falls back to bytes.
        let values: Vec<u32> = (0..40u32).map(|i| i.wrapping_mul(2_654_435_761) >> 15).collect();
        let mut packed = vec![0u8; 40 * 17 / 8];
        for (i, &v) in values.iter().enumerate() {
            for b in 0..17 {
                if v >> b & 1 == 1 {
                    packed[(i * 17 + b) / 8] |= 1 << ((i * 17 + b) % 8);
                }
            }
        }
        let mut out = [0u32; 40];
        assert_eq!(decode(&[&[0x0b][..], &packed].concat(), 17, &mut out), Ok(1 + packed.len()));
        assert_eq!(out[..], values[..]);
    }

    #[test]
    fn one_run_of_the_top_level_is_told_from_levels_with_a_null() {
        assert!(one_run(&[0x10, 0x01], 1, 8, 1), "8 x 1");
        assert!(one_run(&[0x12, 0x01], 1, 8, 1), "9 x 1 covers 8");
        assert!(!one_run(&[0x0e, 0x01], 1, 8, 1), "7 x 1 does not");
        assert!(!one_run(&[0x10, 0x00], 1, 8, 1), "8 nulls");
        assert!(!one_run(&[0x03, 0xff], 1, 8, 1), "a bit-packed group");
        assert!(!one_run(&[0x10], 1, 8, 1) && !one_run(&[], 1, 8, 1), "cut short");
    }
}

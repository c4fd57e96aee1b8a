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
            let mut v = 0u32;
            for (i, b) in bytes.iter().enumerate() {
                v |= u32::from(*b) << (8 * i);
            }
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
            unpack(packed, width, &mut out[done..done + n]);
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
        let mut word = 0u64;
        for (k, b) in packed[byte..packed.len().min(byte + 5)].iter().enumerate() {
            word |= u64::from(*b) << (8 * k);
        }
        *v = ((word >> shift) & mask) as u32;
    }
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
}

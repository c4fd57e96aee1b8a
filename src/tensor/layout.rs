//! Checked shape/stride arithmetic shared by every constructor and importer.
//!
//! Nothing here touches memory: a layout is proven sane before any pointer is read.

use super::Dims;
use crate::error::{Error, Result};

/// The most dimensions dlframe accepts (numpy's limit is 64).
pub const MAX_NDIM: usize = 64;

/// What a valid layout spans, in elements relative to the first element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Number of elements (the product of the shape).
    pub numel: usize,
    /// Smallest element offset reachable (<= 0 with negative strides).
    pub min: i64,
    /// Largest element offset reachable.
    pub max: i64,
}

impl Extent {
    /// Bytes between the lowest and the highest byte reachable (0 for an empty tensor).
    pub fn span_bytes(&self, itemsize: usize) -> usize {
        if self.numel == 0 { 0 } else { (self.max - self.min + 1) as usize * itemsize }
    }

    /// The byte range `[low, high)` the elements occupy when element `[0, ..., 0]` is at byte
    /// `base`, in i128 so that no address or offset arithmetic can wrap. Meaningful only for a
    /// non-empty layout.
    pub fn byte_bounds(&self, base: i128, itemsize: usize) -> (i128, i128) {
        let item = itemsize as i128;
        (base + self.min as i128 * item, base + (self.max as i128 + 1) * item)
    }
}

/// Row-major (C order) strides in elements for `shape`.
pub fn c_strides(shape: &[i64]) -> Vec<i64> {
    c_strides_inline(shape).into_vec()
}

/// [`c_strides`] in a tensor's own form: inline, without allocating, up to two dimensions.
pub(crate) fn c_strides_inline(shape: &[i64]) -> Dims {
    let mut strides = Dims::from_elem(0, shape.len());
    let mut acc = 1i64;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// Column-major (F order, numpy's `asfortranarray`) strides in elements for `shape`: the
/// first index varies fastest.
pub fn f_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for (s, &d) in strides.iter_mut().zip(shape) {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// True when `strides` walk `shape` in F order with no gaps (as [`is_c_contiguous`], with the
/// dimensions reversed).
pub fn is_f_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    let rev = |v: &[i64]| v.iter().rev().copied().collect::<Vec<_>>();
    is_c_contiguous(&rev(shape), &rev(strides))
}

/// True when `strides` walk `shape` in C order with no gaps. Dimensions of extent 1 may have
/// any stride, and an empty tensor is contiguous.
pub fn is_c_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Checks a layout with overflow-checked arithmetic: `ndim <= MAX_NDIM`, non-negative shape,
/// one stride per dimension, and a byte span that fits in `isize`.
///
/// # Errors
/// [`Error::InvalidLayout`] naming the first problem.
pub fn check(shape: &[i64], strides: &[i64], itemsize: usize) -> Result<Extent> {
    if shape.len() > MAX_NDIM {
        return Err(Error::layout(format!("ndim {} exceeds the limit of {MAX_NDIM}", shape.len())));
    }
    if strides.len() != shape.len() {
        return Err(Error::layout(format!("{} strides for {} dimensions", strides.len(), shape.len())));
    }
    let overflow = || Error::layout(format!("shape {shape:?} with strides {strides:?} overflows"));
    let mut numel: usize = 1;
    for (i, &d) in shape.iter().enumerate() {
        if d < 0 {
            return Err(Error::layout(format!("negative extent {d} in dimension {i}")));
        }
        numel = numel.checked_mul(d as usize).ok_or_else(overflow)?;
    }
    let total = numel.checked_mul(itemsize).ok_or_else(overflow)?;
    if total > isize::MAX as usize {
        return Err(overflow());
    }
    let (mut min, mut max) = (0i64, 0i64);
    if numel > 0 {
        for (&d, &s) in shape.iter().zip(strides) {
            let reach = (d - 1).checked_mul(s).ok_or_else(overflow)?;
            if reach < 0 {
                min = min.checked_add(reach).ok_or_else(overflow)?;
            } else {
                max = max.checked_add(reach).ok_or_else(overflow)?;
            }
        }
        let span = max
            .checked_sub(min)
            .and_then(|v| v.checked_add(1))
            .and_then(|v| (v as u64).checked_mul(itemsize as u64))
            .ok_or_else(overflow)?;
        if span > isize::MAX as u64 {
            return Err(overflow());
        }
    }
    Ok(Extent { numel, min, max })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity_ignores_unit_dims_and_empty() {
        assert!(is_c_contiguous(&[2, 3], &[3, 1]));
        assert!(is_c_contiguous(&[2, 1, 3], &[3, 99, 1]));
        assert!(!is_c_contiguous(&[2, 3], &[1, 2]));
        assert!(is_c_contiguous(&[0, 3], &[7, 7]));
        assert_eq!(c_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(c_strides(&[]), Vec::<i64>::new());
    }

    #[test]
    fn f_order_is_c_order_reversed() {
        assert_eq!(f_strides(&[2, 3, 4]), vec![1, 2, 6]);
        assert_eq!(f_strides(&[5, 0, 2]), vec![1, 5, 5]);
        assert!(is_f_contiguous(&[2, 3, 4], &[1, 2, 6]));
        assert!(!is_f_contiguous(&[2, 3, 4], &c_strides(&[2, 3, 4])));
        // One row, or cells of one element, are both orders at once.
        assert!(is_f_contiguous(&[1, 3], &[3, 1]) && is_c_contiguous(&[1, 3], &[3, 1]));
        assert!(is_f_contiguous(&[4, 1], &[1, 1]) && is_c_contiguous(&[4, 1], &[1, 1]));
        assert!(is_f_contiguous(&[0, 3], &[3, 1]));
    }

    #[test]
    fn extents_cover_negative_and_zero_strides() {
        let e = check(&[3, 4], &[-4, 1], 4).unwrap();
        assert_eq!((e.numel, e.min, e.max), (12, -8, 3));
        let e = check(&[5], &[0], 8).unwrap();
        assert_eq!((e.min, e.max, e.span_bytes(8)), (0, 0, 8));
        assert_eq!(check(&[0, 5], &[5, 1], 4).unwrap().span_bytes(4), 0);
    }

    #[test]
    fn bad_layouts_are_refused_not_panicked() {
        assert!(check(&[-1], &[1], 4).unwrap_err().to_string().contains("negative"));
        assert!(check(&[i64::MAX, 4], &[4, 1], 4).unwrap_err().to_string().contains("overflows"));
        assert!(check(&[2, i64::MAX], &[i64::MAX, 1], 1).is_err());
        assert!(check(&[2], &[i64::MAX], 1).is_err());
        assert!(check(&[2], &[1, 1], 1).is_err());
        assert!(check(&vec![1; 65], &vec![1; 65], 1).is_err());
    }
}

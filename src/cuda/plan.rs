//! The host half of the device kernels (`convert` in `kernels.cu`, and `unpack` for bools
//! alone): what to upload, which segments the kernel writes and which kernel does it, checked
//! with the CPU path's rules before anything moves.
//!
//! A plan covers one column (chunks concatenated, list cells flattened, permuted tensor cells
//! kept in memory order) or several columns into an `(n, k)` matrix in C or F order. Each
//! chunk of each column is one segment: its raw values (bit-packed for bools) and validity are
//! uploaded as they are in Arrow, and the kernel casts, fills nulls, unpacks bits and writes
//! each slot at `out + i * stride`. Casts that can lose values are checked here on the host,
//! value by value as the CPU kernels check them, so the kernel never meets a value that does not
//! fit and the errors are the CPU's. Nothing here touches CUDA: the unit tests run plans through
//! the kernel source built for the CPU (`emulate.rs`).

use std::ops::Range;

use arrow_array::{Array, ArrayRef};
use arrow_buffer::{Buffer, NullBuffer};
use arrow_schema::{DataType, FieldRef};

use crate::arrow::read::{column_ref, leaf_of, leaf_validity, segments};
use crate::arrow::spec::{ColumnSpec, Made, MatrixSpec};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels;
use crate::options::{ExportOptions, Order};

/// `Seg::valid` of a segment without nulls.
pub(crate) const NO_VALIDITY: u64 = u64::MAX;

/// One run of slots for the kernel, laid out as `struct Seg` in `kernels.cu`: the values at byte
/// `src` of the scratch buffer (bit `src_bit` for bools), the validity at byte `valid` (bit
/// `valid_bit`) or [`NO_VALIDITY`], `rows` slots written at elements `out + i * stride`, the
/// source dtype's code, and whether the values were copied straight into their place in the
/// output (`inplace`: same dtype, stride 1, no nulls), where the kernel writes only the mask.
/// `group` is how many segments, this one and the next ones, the kernel writes together in
/// output order (the columns of a C-order matrix over the same rows), 0 for the next ones.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seg {
    pub src: u64,
    pub src_bit: u64,
    pub valid: u64,
    pub valid_bit: u64,
    pub rows: u64,
    pub out: u64,
    pub stride: u64,
    pub dtype: u64,
    pub inplace: u64,
    pub group: u64,
}

/// Which kernel of `kernels.cu` carries out a plan (both take the same arguments; the launch
/// and the emulator pick the function by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// `convert`: any plan.
    Convert,
    /// `unpack`: bit-packed bools into contiguous bools, with no mask, faster than `convert`.
    Unpack,
}

/// The kernel's code for a dtype (its declaration order, the `DT_*` of `kernels.cu`).
pub(crate) fn code(d: DType) -> u64 {
    d as u64
}

/// Everything the device does for one conversion: the bytes to place in one scratch buffer
/// (Arrow buffers, shared, not copied on the host), the segment table, and the output.
pub(crate) struct Plan {
    pieces: Vec<(usize, Buffer, Range<usize>)>,
    to_out: Vec<(usize, Buffer, Range<usize>)>,
    segs: Vec<Seg>,
    table: Vec<u8>,
    table_at: usize,
    scratch_len: usize,
    /// What the conversion makes, as the spec says it (the kernel writes `made.storage`, and a
    /// validity mask of the same shape and strides where `made.mask`).
    pub made: Made,
    /// Elements written.
    pub len: usize,
}

impl Plan {
    fn new(made: Made) -> Self {
        let len = made.shape.iter().map(|&d| d as usize).product();
        let (pieces, to_out, segs, table) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        Plan { pieces, to_out, segs, table, table_at: 0, scratch_len: 0, made, len }
    }

    /// Places `bytes` of `buf` in the scratch buffer (16-byte aligned) and returns its offset.
    fn place(&mut self, buf: &Buffer, bytes: Range<usize>) -> Result<u64> {
        within(buf, &bytes)?;
        let at = self.scratch_len.next_multiple_of(16);
        self.scratch_len = at + bytes.len();
        self.pieces.push((at, buf.clone(), bytes));
        Ok(at as u64)
    }

    /// Adds a segment for a primitive or boolean leaf array (its own offset applied) whose
    /// slots go to `out + i * stride`; `validity` replaces the array's own when given.
    fn segment(
        &mut self,
        leaf: &dyn Array,
        declared: DType,
        validity: Option<&NullBuffer>,
        out: usize,
        stride: usize,
    ) -> Result<()> {
        let data = leaf.to_data();
        let (off, len) = (data.offset(), data.len());
        if len == 0 {
            return Ok(());
        }
        let dtype = if data.data_type() == &DataType::Boolean {
            DType::Bool
        } else {
            crate::dtype::leaf_dtype(data.data_type(), declared)?
        };
        let values =
            data.buffers().first().ok_or_else(|| Error::layout("an array without a values buffer"))?;
        let item = dtype.itemsize();
        let validity = validity.or(data.nulls()).filter(|v| v.null_count() > 0);
        // Values that keep their dtype and place go straight into the output, unless they have
        // nulls: those the kernel writes whole from the scratch buffer, since filling the null
        // slots in place would write parts of most of the output's sectors (one value in ten
        // null touches nearly all of them) and so cost the device a read and a write of it.
        let inplace = dtype == self.made.storage && stride == 1 && dtype != DType::Bool && validity.is_none();
        let (src, src_bit) = if dtype == DType::Bool {
            (self.place(values, off / 8..(off + len).div_ceil(8))?, (off % 8) as u64)
        } else if inplace {
            let bytes = off * item..(off + len) * item;
            within(values, &bytes)?;
            self.to_out.push((out * item, values.clone(), bytes));
            (0, 0)
        } else {
            (self.place(values, off * item..(off + len) * item)?, 0)
        };
        let (valid, valid_bit) = match validity {
            Some(v) => {
                let (voff, vlen) = (v.offset(), v.len());
                if vlen != len {
                    return Err(Error::LengthMismatch {
                        what: "a validity bitmap".into(),
                        expected: len,
                        found: vlen,
                    });
                }
                (self.place(v.buffer(), voff / 8..(voff + vlen).div_ceil(8))?, (voff % 8) as u64)
            }
            None => (NO_VALIDITY, 0),
        };
        self.segs.push(Seg {
            src,
            src_bit,
            valid,
            valid_bit,
            rows: len as u64,
            out: out as u64,
            stride: stride as u64,
            dtype: code(dtype),
            inplace: inplace as u64,
            group: 1,
        });
        Ok(())
    }

    /// Appends the segment table to the scratch layout.
    fn finish(mut self) -> Self {
        self.table = self
            .segs
            .iter()
            .flat_map(|s| {
                [s.src, s.src_bit, s.valid, s.valid_bit, s.rows, s.out, s.stride, s.dtype, s.inplace, s.group]
            })
            .flat_map(u64::to_le_bytes)
            .collect();
        self.table_at = self.scratch_len.next_multiple_of(16);
        self.scratch_len = self.table_at + self.table.len();
        self
    }

    /// Bytes of the scratch buffer (at least 1).
    pub fn scratch_len(&self) -> usize {
        self.scratch_len.max(1)
    }

    /// What to copy where in the scratch buffer: every piece, then the segment table.
    pub fn uploads(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.pieces
            .iter()
            .map(|(at, buf, r)| (*at, &buf.as_slice()[r.clone()]))
            .chain(std::iter::once((self.table_at, &self.table[..])))
    }

    /// Values copied host-to-device straight into the output: each chunk's bytes and their byte
    /// offset there (segments of the output's dtype with stride 1).
    pub fn output_copies(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.to_out.iter().map(|(at, buf, r)| (*at, &buf.as_slice()[r.clone()]))
    }

    /// Whether the kernel has anything to do: a null to fill, a mask to write, or a segment
    /// not copied into place (a cast, bools, an interleave). A column of one dtype without
    /// nulls is only the output copies.
    pub fn needs_kernel(&self) -> bool {
        self.made.mask || self.segs.iter().any(|s| s.inplace == 0 || s.valid != NO_VALIDITY)
    }

    /// The kernel that carries out this plan: `unpack` when every segment is bools written into
    /// bools with stride 1 and there is no mask, `convert` otherwise.
    pub fn kernel(&self) -> Kernel {
        let bool = code(DType::Bool);
        let bools = self.made.storage == DType::Bool
            && !self.made.mask
            && self.segs.iter().all(|s| s.dtype == bool && s.stride == 1 && s.inplace == 0);
        if bools { Kernel::Unpack } else { Kernel::Convert }
    }

    /// The segments, and the table's offset in the scratch buffer.
    pub fn segments(&self) -> (&[Seg], usize) {
        (&self.segs, self.table_at)
    }
}

/// Refuses a byte range that a buffer does not hold.
fn within(buf: &Buffer, bytes: &Range<usize>) -> Result<()> {
    if bytes.end > buf.len() {
        return Err(Error::layout(format!("{bytes:?} outside a buffer of {} bytes", buf.len())));
    }
    Ok(())
}

/// The plan for one column (chunked or not; lists as their fixed-size cells, tensor columns in
/// their memory order), with the CPU path's checks: nulls, bool and NaN policies, fill range,
/// and every value of a lossy cast.
///
/// # Errors
/// As [`crate::arrow::to_tensor`] for a copy. The copy policy was decided before the plan, by
/// `transfer::column_on`: the plan always copies.
pub(crate) fn column(field: &FieldRef, chunks: &[ArrayRef], opts: &ExportOptions) -> Result<Plan> {
    let spec = ColumnSpec::new(field, chunks, opts)?;
    if spec.fortran {
        // `transfer::column_on` makes these on the host; refuse rather than write C order.
        return Err(Error::InvalidArgument(format!(
            "column '{}' in F order is laid out on the host, not by the device plan",
            spec.field.name()
        )));
    }
    let (leaf, target) = (spec.leaf, spec.made.target);
    let mut plan = Plan::new(spec.made.clone());
    let mut pos = 0;
    for chunk in &spec.chunks {
        let (leaf_array, list_nulls) = leaf_of(chunk);
        let slots = chunk.len() * spec.cell_size;
        if leaf_array.len() != slots {
            return Err(Error::LengthMismatch {
                what: format!("the values of a chunk of column '{}'", spec.field.name()),
                expected: slots,
                found: leaf_array.len(),
            });
        }
        if leaf != DType::Bool && target != leaf {
            let col = column_ref(leaf_array.as_ref(), leaf, spec.field.name())?.starting_at(pos);
            kernels::check_cast(target, &col, 0, spec.inexact)?;
        }
        let validity = (!list_nulls.is_empty()).then(|| leaf_validity(leaf_array.as_ref(), &list_nulls));
        plan.segment(leaf_array.as_ref(), leaf, validity.as_ref(), pos, 1)?;
        pos += slots;
    }
    Ok(plan.finish())
}

/// The plan for several columns into one `(n, k)` matrix in C or F order, with the CPU path's
/// checks (see [`crate::arrow::columns_to_tensor`]) and every value of a lossy cast checked.
///
/// # Errors
/// As [`crate::arrow::columns_to_tensor`].
pub(crate) fn matrix(fields: &[FieldRef], columns: &[Vec<ArrayRef>], opts: &ExportOptions) -> Result<Plan> {
    let MatrixSpec { n, k, dtypes, made, inexact } = MatrixSpec::new(fields, columns, opts)?;
    let (target, storage) = (made.target, made.storage);
    if target != DType::Bool {
        // Row ranges over which every column is one chunk, in the CPU path's order, so that the
        // first value found not to fit is the one the CPU path reports.
        for seg in segments(columns) {
            for (j, ((a, field), &declared)) in seg.slices.iter().zip(fields).zip(&dtypes).enumerate() {
                if a.data_type() != &DataType::Boolean {
                    kernels::check_cast(
                        storage,
                        &column_ref(a.as_ref(), declared, field.name())?.starting_at(seg.start),
                        j,
                        inexact,
                    )?;
                }
            }
        }
    }
    let mut plan = Plan::new(made);
    match opts.order {
        // Each column's chunks go to a contiguous run of the output.
        Order::F => {
            for (j, (chunks, &declared)) in columns.iter().zip(&dtypes).enumerate() {
                let mut start = 0;
                for chunk in chunks {
                    plan.segment(chunk.as_ref(), declared, None, j * n + start, 1)?;
                    start += chunk.len();
                }
            }
        }
        // Rows interleave the columns: over each row range where every column is one chunk,
        // the k segments form one group, written in output order.
        Order::C => {
            for seg in segments(columns) {
                let first = plan.segs.len();
                for (j, (a, &declared)) in seg.slices.iter().zip(&dtypes).enumerate() {
                    plan.segment(a.as_ref(), declared, None, seg.start * k + j, k)?;
                }
                if plan.segs.len() == first + k && k > 1 {
                    plan.segs[first].group = k as u64;
                    plan.segs[first + 1..].iter_mut().for_each(|s| s.group = 0);
                }
            }
        }
    }
    Ok(plan.finish())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use arrow_array::builder::{Int32Builder, ListBuilder};
    use arrow_array::{
        BooleanArray, FixedSizeListArray, Float64Array, Int16Array, Int32Array, Int64Array, StringArray,
    };
    use arrow_schema::Field;

    use super::*;
    use crate::arrow::{FIXED_SHAPE_TENSOR, columns_to_tensor, to_tensor};
    use crate::options::{CopyPolicy, Inexact, NullPolicy, Scalar};

    /// A named column in its chunks.
    type Col = (FieldRef, Vec<ArrayRef>);

    fn col(name: &str, a: ArrayRef) -> Col {
        (Arc::new(Field::new(name, a.data_type().clone(), true)), vec![a])
    }

    /// The outcome as both paths report it: the error's message, or "ok".
    fn outcome<T>(r: Result<T>) -> String {
        r.map_or_else(|e| e.to_string(), |_| "ok".into())
    }

    #[test]
    fn a_column_gets_the_same_answer_from_the_cpu_and_the_device_planner() {
        let ints_with_null: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None]));
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2]));
        let ragged: ArrayRef = {
            let mut b = ListBuilder::new(Int32Builder::new());
            b.append_value([Some(1), Some(2)]);
            b.append_value([Some(3)]);
            Arc::new(b.finish())
        };
        let cells = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            2,
            Arc::new(Int32Array::from(vec![1, 2, 3, 4])),
            None,
        );
        let bad_tensor =
            Arc::new(Field::new("t", cells.data_type().clone(), false).with_metadata(HashMap::from([
                ("ARROW:extension:name".to_string(), FIXED_SHAPE_TENSOR.to_string()),
                ("ARROW:extension:metadata".to_string(), r#"{"shape":[3]}"#.to_string()),
            ])));
        let fill = |v: i64| NullPolicy::Fill(Scalar::Int(v));
        let with =
            |nulls: NullPolicy, dtype: Option<DType>| ExportOptions { nulls, dtype, ..Default::default() };
        let default = ExportOptions::default();
        let cases: Vec<(&str, Col, ExportOptions)> = vec![
            ("nulls under 'error'", col("a", ints_with_null.clone()), default),
            ("a string column", col("s", Arc::new(StringArray::from(vec!["x"]))), default),
            (
                "a chunk of another type",
                (Arc::new(Field::new("a", DataType::Int32, true)), vec![Arc::new(Int64Array::from(vec![1]))]),
                default,
            ),
            ("ragged list rows", col("l", ragged), default),
            (
                "a boolean column as int32",
                col("b", Arc::new(BooleanArray::from(vec![true]))),
                with(NullPolicy::Error, Some(DType::Int32)),
            ),
            ("NaN into int32 with a null", col("a", ints_with_null.clone()), with(NullPolicy::Nan, None)),
            ("NaN policy, int32 without nulls", col("a", ints.clone()), with(NullPolicy::Nan, None)),
            (
                "a fill that uint8 cannot hold",
                col("a", ints_with_null.clone()),
                with(fill(300), Some(DType::UInt8)),
            ),
            ("the same fill, no nulls", col("a", ints.clone()), with(fill(300), Some(DType::UInt8))),
            (
                "a bool fill of 7",
                col("b", Arc::new(BooleanArray::from(vec![Some(true), None]))),
                with(fill(7), None),
            ),
            (
                "int16 300 into uint8",
                col("a", Arc::new(Int16Array::from(vec![1, 300]))),
                with(NullPolicy::Error, Some(DType::UInt8)),
            ),
            (
                "1e300 into float32",
                col("f", Arc::new(Float64Array::from(vec![1.0, 1e300]))),
                with(NullPolicy::Error, Some(DType::Float32)),
            ),
            (
                "int64 2^53 + 1 into float64",
                col("i", Arc::new(Int64Array::from(vec![1, (1 << 53) + 1]))),
                with(NullPolicy::Error, Some(DType::Float64)),
            ),
            ("tensor metadata that misfits", (bad_tensor, vec![Arc::new(cells) as ArrayRef]), default),
        ];
        let mut refused = 0;
        for (what, (field, chunks), opts) in cases {
            let cpu = outcome(to_tensor(&field, &chunks, &opts));
            let device = outcome(column(&field, &chunks, &opts));
            assert_eq!(cpu, device, "{what}");
            refused += usize::from(cpu != "ok");
        }
        assert_eq!(refused, 13, "every case but the NaN policy over a column without nulls is refused");
    }

    #[test]
    fn a_matrix_gets_the_same_answer_from_the_cpu_and_the_device_planner() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None]));
        let short: ArrayRef = Arc::new(Int32Array::from(vec![1]));
        let list: ArrayRef = Arc::new(FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Int32, false)),
            1,
            Arc::new(Int32Array::from(vec![1, 2])),
            None,
        ));
        let fill = ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(0)), ..Default::default() };
        let cases: Vec<(&str, Vec<Col>, ExportOptions)> = vec![
            ("nulls under 'error'", vec![col("a", a.clone()), col("b", a.clone())], ExportOptions::default()),
            ("different lengths", vec![col("a", a.clone()), col("s", short)], fill),
            ("a list column", vec![col("a", a.clone()), col("l", list)], fill),
            ("copy=False", vec![col("a", a.clone())], ExportOptions { copy: CopyPolicy::Never, ..fill }),
            ("ints as bool", vec![col("a", a.clone())], ExportOptions { dtype: Some(DType::Bool), ..fill }),
            (
                "NaN into int32 with a null",
                vec![col("a", a.clone())],
                ExportOptions { nulls: NullPolicy::Nan, ..fill },
            ),
            (
                "a fill int8 cannot hold",
                vec![col("a", a.clone())],
                ExportOptions { nulls: NullPolicy::Fill(Scalar::Int(300)), dtype: Some(DType::Int8), ..fill },
            ),
            (
                "an int64 that float64 cannot hold, stacked with an int32",
                vec![col("a", a.clone()), col("big", Arc::new(Int64Array::from(vec![1, (1 << 53) + 1])))],
                ExportOptions { dtype: Some(DType::Float64), ..fill },
            ),
            (
                "an int32 that float32 cannot hold",
                vec![col("big", Arc::new(Int32Array::from(vec![16_777_217, 0])))],
                ExportOptions { dtype: Some(DType::Float32), ..fill },
            ),
        ];
        for (what, cols, opts) in cases {
            let (fields, columns): (Vec<_>, Vec<_>) = cols.into_iter().unzip();
            let cpu = outcome(columns_to_tensor(&fields, &columns, &opts));
            let device = outcome(matrix(&fields, &columns, &opts));
            assert_eq!(cpu, device, "{what}");
            assert_ne!(cpu, "ok", "{what}");
        }
        // The opt-in rounds on both.
        let big: ArrayRef = Arc::new(Int64Array::from(vec![1, (1 << 53) + 1]));
        let (fields, columns) = (vec![col("big", big.clone()).0], vec![col("big", big).1]);
        let round = ExportOptions { dtype: Some(DType::Float64), inexact: Inexact::Round, ..fill };
        assert_eq!(outcome(columns_to_tensor(&fields, &columns, &round)), "ok");
        assert_eq!(outcome(matrix(&fields, &columns, &round)), "ok");
        let e = columns_to_tensor(&fields, &columns, &ExportOptions { inexact: Inexact::Error, ..round })
            .unwrap_err();
        assert!(e.to_string().contains("at row 1 of column 'big'"), "{e}");
    }
}

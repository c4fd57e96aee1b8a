//! Functions that inspect and reshape tensor columns: `tensor_shape`, `tensor_ndim`,
//! `tensor_dtype` (metadata only), `tensor_reshape` (without copying) and `tensor_element`
//! (one gather, copies).

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray, Int64Array, ListArray, StringArray, UInt64Array};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, FieldRef};
use datafusion::arrow::compute::{cast, take};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, Signature, Volatility};
use dlframe::arrow::TensorMetadata;

use crate::args;
use crate::tensor_type::{flat_values, tensor_field, tensor_type};
use crate::to_df_err;
use dlframe::arrow::CellLayout;

/// The tensor type of argument 0, as a plan error when it is not a tensor column.
fn tensor_arg(func: &str, fields: &[FieldRef]) -> Result<CellLayout> {
    match fields.first() {
        Some(f) => tensor_type(f).or_else(|e| plan_err!("{func}: {e}")),
        None => plan_err!("{func}: give a tensor column"),
    }
}

/// Argument 0 as a FixedSizeList array of `n` rows.
fn tensor_array(args: &ScalarFunctionArgs) -> Result<(ArrayRef, CellLayout)> {
    let t = tensor_type(&args.arg_fields[0]).map_err(to_df_err)?;
    let array = args.args[0].clone().into_array(args.number_rows)?;
    Ok((array, t))
}

fn as_fixed_list(array: &ArrayRef) -> Result<&FixedSizeListArray> {
    match array.as_any().downcast_ref::<FixedSizeListArray>() {
        Some(a) => Ok(a),
        None => exec_err!("expected a FixedSizeList array, found {}", array.data_type()),
    }
}

fn shape_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Int64, false)))
}

crate::scalar_udf! {
    /// `tensor_shape(t)`: the logical shape of each cell, as a list of int64 (metadata only).
    TensorShapeFunc, "tensor_shape", Signature::any(1, Volatility::Immutable);

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(shape_type())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        tensor_arg(self.name(), args.arg_fields)?;
        Ok(Arc::new(Field::new(self.name(), shape_type(), args.arg_fields[0].is_nullable())))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (array, t) = tensor_array(&args)?;
        let n = array.len();
        let d = t.shape.len();
        let values = Int64Array::from_iter_values(t.shape.iter().copied().cycle().take(n * d));
        let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(d, n));
        let DataType::List(item) = shape_type() else { unreachable!("shape_type is a list") };
        let list = ListArray::try_new(item, offsets, Arc::new(values), array.nulls().cloned())?;
        Ok(ColumnarValue::Array(Arc::new(list)))
    }
}

crate::scalar_udf! {
    /// `tensor_ndim(t)`: the number of dimensions of each cell (metadata only).
    TensorNdimFunc, "tensor_ndim", Signature::any(1, Volatility::Immutable);

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        tensor_arg(self.name(), args.arg_fields)?;
        Ok(Arc::new(Field::new(self.name(), DataType::Int64, args.arg_fields[0].is_nullable())))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (array, t) = tensor_array(&args)?;
        let values = vec![t.shape.len() as i64; array.len()];
        Ok(ColumnarValue::Array(Arc::new(Int64Array::new(values.into(), array.nulls().cloned()))))
    }
}

crate::scalar_udf! {
    /// `tensor_dtype(t)`: the dtype name of the cells, such as `float32` (metadata only).
    TensorDtypeFunc, "tensor_dtype", Signature::any(1, Volatility::Immutable);

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        tensor_arg(self.name(), args.arg_fields)?;
        Ok(Arc::new(Field::new(self.name(), DataType::Utf8, args.arg_fields[0].is_nullable())))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (array, t) = tensor_array(&args)?;
        let names = StringArray::from_iter_values(std::iter::repeat_n(t.dtype.name(), array.len()));
        let names = StringArray::new(names.offsets().clone(), names.values().clone(), array.nulls().cloned());
        Ok(ColumnarValue::Array(Arc::new(names)))
    }
}

/// The output cell shape of `tensor_reshape(t, d1, ...)`.
fn reshaped(func: &str, t: &CellLayout, dims: &[i64]) -> Result<TensorMetadata> {
    if t.metadata.as_ref().is_some_and(|m| m.permutation.is_some()) {
        return plan_err!(
            "{func}: the tensor is permuted; reshaping it needs a copy in logical order, which \
             this function does not make"
        );
    }
    let shape = args::dims(func, dims, Some(t.cell))?;
    Ok(TensorMetadata { shape, dim_names: None, permutation: None })
}

crate::scalar_udf! {
    /// `tensor_reshape(t, d1, ...)`: the same values under another cell shape; one dimension
    /// may be `-1` (without copying).
    TensorReshapeFunc, "tensor_reshape", Signature::variadic_any(Volatility::Immutable);

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        datafusion::common::internal_err!("tensor_reshape uses return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let func = self.name();
        let t = tensor_arg(func, args.arg_fields)?;
        let dims = (1..args.arg_fields.len())
            .map(|i| args::int(func, "a dimension", args::planned(func, "a dimension", args.scalar_arguments, i)?))
            .collect::<Result<Vec<_>>>()?;
        let meta = reshaped(func, &t, &dims)?;
        let field = tensor_field(func, t.leaf.clone(), &meta, args.arg_fields[0].is_nullable());
        Ok(Arc::new(field.or_else(|e| plan_err!("{func}: {e}"))?))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (array, _) = tensor_array(&args)?;
        let out = tensor_type(&args.return_field).map_err(to_df_err)?;
        let list = as_fixed_list(&array)?;
        let values = flat_values(list).map_err(to_df_err)?;
        let n = list.len();
        let list = FixedSizeListArray::try_new_with_length(
            out.leaf.clone(),
            out.cell as i32,
            values,
            list.nulls().cloned(),
            n,
        )?;
        Ok(ColumnarValue::Array(Arc::new(list)))
    }
}

crate::scalar_udf! {
    /// `tensor_element(t, i1, ..., ik)`: element `[i1, ..., ik]` of each cell, with one index
    /// per dimension (literals or columns; negative indices count from the end). Copies.
    TensorElementFunc, "tensor_element", Signature::variadic_any(Volatility::Immutable);

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        datafusion::common::internal_err!("tensor_element uses return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let func = self.name();
        let t = tensor_arg(func, args.arg_fields)?;
        let given = args.arg_fields.len() - 1;
        if given != t.shape.len() {
            return plan_err!("{func}: the cells have {} dimension(s) and {given} index(es) were given", t.shape.len());
        }
        if let Some(f) = args.arg_fields[1..].iter().find(|f| !f.data_type().is_integer()) {
            return plan_err!("{func}: indexes must be integers, found {}", f.data_type());
        }
        Ok(Arc::new(Field::new(func, t.leaf.data_type().clone(), true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let func = self.name();
        let (array, t) = tensor_array(&args)?;
        let list = as_fixed_list(&array)?;
        let n = list.len();
        let indexes = args.args[1..]
            .iter()
            .map(|a| {
                let a = cast(&a.clone().into_array(n)?, &DataType::Int64)?;
                Ok(a.as_any().downcast_ref::<Int64Array>().expect("cast to Int64").clone())
            })
            .collect::<Result<Vec<_>>>()?;
        let mut take_at = Vec::with_capacity(n);
        for row in 0..n {
            if list.is_null(row) || indexes.iter().any(|ix| ix.is_null(row)) {
                take_at.push(None);
                continue;
            }
            let mut offset = (row * t.cell) as i64;
            for (dim, ix) in indexes.iter().enumerate() {
                let (i, size) = (ix.value(row), t.shape[dim]);
                let wrapped = if i < 0 { i + size } else { i };
                if !(0..size).contains(&wrapped) {
                    return exec_err!(
                        "{func}: index {i} is out of bounds for dimension {dim} of size {size} in row {row}"
                    );
                }
                offset += wrapped * t.strides[dim];
            }
            take_at.push(Some(offset as u64));
        }
        let values = flat_values(list).map_err(to_df_err)?;
        let picked = take(values.as_ref(), &UInt64Array::from(take_at), None)?;
        Ok(ColumnarValue::Array(picked))
    }
}

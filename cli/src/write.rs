//! Tensors to `.npy` (numpy's format 1.0) and `.safetensors` files.
//!
//! Both write the C-order bytes straight from the tensor's memory; a strided tensor is first
//! gathered into one contiguous copy.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use dlframe::interface::typestr::TypeStr;
use dlframe::{DType, Error, Result, Tensor};
use safetensors::Dtype;

/// The C-contiguous bytes of a host tensor (without copying when it already is contiguous).
fn contiguous(tensor: &Tensor) -> Result<Cow<'_, Tensor>> {
    if tensor.is_c_contiguous() {
        Ok(Cow::Borrowed(tensor))
    } else {
        dlframe::kernels::contiguous_copy(tensor).map(Cow::Owned)
    }
}

/// The `.npy` header dict: dtype, order and shape, padded so the data starts 64-byte aligned.
fn npy_header(tensor: &Tensor) -> Vec<u8> {
    let descr = match tensor.logical().and_then(|f| TypeStr::from_arrow(f.data_type()).ok()) {
        Some(t) if t.unit.is_some() && tensor.ndim() == 1 => t.to_string(),
        _ => TypeStr::from_dtype(tensor.dtype()).to_string(),
    };
    let dims: Vec<String> = tensor.shape().iter().map(i64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Writes `tensor` as a `.npy` file that `numpy.load` reads back (datetimes keep their unit).
///
/// # Errors
/// I/O errors, and device memory (copy it to the host first).
pub fn write_npy(tensor: &Tensor, path: &Path) -> Result<()> {
    let t = contiguous(tensor)?;
    let io = |e: std::io::Error| Error::InvalidArgument(format!("writing {}: {e}", path.display()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    f.write_all(&npy_header(&t)).map_err(io)?;
    f.write_all(t.as_bytes()?).map_err(io)?;
    f.flush().map_err(io)
}

fn safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::Bool => Dtype::BOOL,
        DType::Int8 => Dtype::I8,
        DType::Int16 => Dtype::I16,
        DType::Int32 => Dtype::I32,
        DType::Int64 => Dtype::I64,
        DType::UInt8 => Dtype::U8,
        DType::UInt16 => Dtype::U16,
        DType::UInt32 => Dtype::U32,
        DType::UInt64 => Dtype::U64,
        DType::Float16 => Dtype::F16,
        DType::Float32 => Dtype::F32,
        DType::Float64 => Dtype::F64,
    }
}

/// Writes `tensor` under `name` as a `.safetensors` file.
///
/// # Errors
/// I/O and format errors, and device memory (copy it to the host first).
pub fn write_safetensors(tensor: &Tensor, name: &str, path: &Path) -> Result<()> {
    let t = contiguous(tensor)?;
    let shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
    let bad =
        |e: safetensors::SafeTensorError| Error::InvalidArgument(format!("writing {}: {e}", path.display()));
    let view = safetensors::tensor::TensorView::new(safetensors_dtype(t.dtype()), shape, t.as_bytes()?)
        .map_err(bad)?;
    safetensors::tensor::serialize_to_file([(name, view)], None, path).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_describes_the_tensor() {
        let t = Tensor::from_vec(vec![1.0f32; 6], vec![2, 3]).unwrap();
        let h = npy_header(&t);
        assert_eq!(h.len() % 64, 0);
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), "{text}");
        assert!(text.ends_with('\n'));
        let v = Tensor::from_vec(vec![1i64; 4], vec![4]).unwrap();
        assert!(String::from_utf8_lossy(&npy_header(&v)).contains("'shape': (4,)"));
    }
}

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
///
/// # Errors
/// bfloat16 and float8, which `.npy` has no dtype for.
fn npy_header(tensor: &Tensor) -> Result<Vec<u8>> {
    let descr = match tensor.logical().and_then(|f| TypeStr::from_arrow(f.data_type()).ok()) {
        Some(t) if t.unit.is_some() && tensor.ndim() == 1 => t.to_string(),
        _ => TypeStr::from_dtype(tensor.dtype())
            .map_err(|_| Error::UnsupportedDType {
                what: format!("{} in a .npy file", tensor.dtype()),
                remedy: format!(
                    "numpy has no {}: write .safetensors (which has it), or cast with to_tensor_as('float32', ...)",
                    tensor.dtype()
                )
                .into(),
            })?
            .to_string(),
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
    Ok(out)
}

/// Writes `tensor` as a `.npy` file that `numpy.load` reads back (datetimes keep their unit).
///
/// # Errors
/// I/O errors, and device memory (copy it to the host first).
pub fn write_npy(tensor: &Tensor, path: &Path) -> Result<()> {
    let t = contiguous(tensor)?;
    let io = |e: std::io::Error| Error::InvalidArgument(format!("writing {}: {e}", path.display()));
    let header = npy_header(&t)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    f.write_all(&header).map_err(io)?;
    f.write_all(t.as_bytes()?).map_err(io)?;
    f.flush().map_err(io)
}

/// The safetensors dtype the dtype table names (`DType::safetensors`), read through the
/// crate's own (serde) names.
fn safetensors_dtype(dtype: DType) -> Result<Dtype> {
    use serde::Deserialize;
    use serde::de::value::{Error as DeError, StrDeserializer};
    Dtype::deserialize(StrDeserializer::<DeError>::new(dtype.safetensors()))
        .map_err(|e| Error::InvalidArgument(format!("safetensors has no dtype {}: {e}", dtype.safetensors())))
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
    let view = safetensors::tensor::TensorView::new(safetensors_dtype(t.dtype())?, shape, t.as_bytes()?)
        .map_err(bad)?;
    safetensors::tensor::serialize_to_file([(name, view)], None, path).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_describes_the_tensor() {
        let t = Tensor::from_vec(vec![1.0f32; 6], vec![2, 3]).unwrap();
        let h = npy_header(&t).unwrap();
        assert_eq!(h.len() % 64, 0);
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), "{text}");
        assert!(text.ends_with('\n'));
        let v = Tensor::from_vec(vec![1i64; 4], vec![4]).unwrap();
        assert!(String::from_utf8_lossy(&npy_header(&v).unwrap()).contains("'shape': (4,)"));
    }

    #[test]
    fn bfloat16_goes_to_safetensors_and_is_refused_by_npy_without_a_file() {
        // 0x3fc0 is 1.5 in bfloat16.
        let t = Tensor::from_vec(vec![0x3fc0u16; 4], vec![2, 2]).unwrap().view_as(DType::BFloat16).unwrap();
        let dir = std::env::temp_dir().join(format!("dlframe-bf16-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let npy = dir.join("t.npy");
        let e = write_npy(&t, &npy).unwrap_err();
        assert!(e.to_string().contains("safetensors"), "{e}");
        assert!(!npy.exists(), "a refused .npy left a file behind");
        // float8 is refused under its own name.
        let f8 = Tensor::from_vec(vec![0u8; 4], vec![4]).unwrap().view_as(DType::Float8E4M3FN).unwrap();
        let e = write_npy(&f8, &npy).unwrap_err().to_string();
        assert!(
            e.contains("float8_e4m3fn in a .npy file") && e.contains("numpy has no float8_e4m3fn"),
            "{e}"
        );
        let st = dir.join("t.safetensors");
        write_safetensors(&t, "t", &st).unwrap();
        let bytes = std::fs::read(&st).unwrap();
        let read = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let view = read.tensor("t").unwrap();
        assert_eq!((view.dtype(), view.shape()), (Dtype::BF16, &[2usize, 2][..]));
        assert_eq!(view.data(), t.as_bytes().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_dtype_has_its_safetensors_dtype() {
        for d in DType::ALL {
            let st = safetensors_dtype(d).unwrap();
            assert_eq!(st.to_string(), d.safetensors());
            assert_eq!(st.bitsize(), d.itemsize() * 8, "{d}");
        }
        assert_eq!(safetensors_dtype(DType::Float8E4M3FN).unwrap(), Dtype::F8_E4M3);
        assert_eq!(safetensors_dtype(DType::Float8E5M2).unwrap(), Dtype::F8_E5M2);
    }
}

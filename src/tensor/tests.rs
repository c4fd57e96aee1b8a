use super::*;

#[test]
fn inline_dims_take_no_more_room_than_a_vec() {
    // A tensor is moved by value through every conversion: inline dims must not grow it.
    assert_eq!(std::mem::size_of::<Dims>(), std::mem::size_of::<Vec<i64>>());
    let t = Tensor::from_vec(vec![0u8; 6], vec![2, 3]).unwrap();
    let c = t.clone();
    assert_eq!((c.shape(), c.strides()), (&[2i64, 3][..], &[3i64, 1][..]));
    let r = t.reshape(vec![1, 2, 3]).unwrap();
    assert_eq!((r.shape(), r.strides()), (&[1i64, 2, 3][..], &[6i64, 3, 1][..]));
}

#[test]
fn layouts_that_wrap_around_the_address_space_are_refused() {
    let make = |addr: usize, shape: Vec<i64>, strides: Vec<i64>| {
        // SAFETY: every layout here is refused before a tensor exists; none is read.
        unsafe {
            Tensor::from_raw_parts(
                addr as *mut u8,
                shape,
                Some(strides),
                DType::Float64,
                Device::Cpu,
                true,
                Arc::new(()),
            )
        }
    };
    // Below address 0, and past usize::MAX, with spans that fit isize.
    assert!(make(0x1000, vec![2], vec![-(1 << 40)]).is_err());
    assert!(make(usize::MAX - 0x1000, vec![2], vec![1 << 40]).is_err());
    assert!(make(usize::MAX - 16, vec![2], vec![1]).is_ok());
    assert!(make(usize::MAX - 16, vec![3], vec![1]).is_err());
    // Empty tensors reach nothing.
    assert!(make(usize::MAX, vec![0, 5], vec![1 << 40, 1]).is_ok());
}

#[test]
fn from_buffer_refuses_views_outside_the_buffer() {
    let buf = Buffer::from_vec(vec![1i32, 2, 3, 4]);
    assert!(Tensor::from_buffer(buf.clone(), 4, vec![3], None, DType::Int32).is_ok());
    assert!(Tensor::from_buffer(buf.clone(), 8, vec![3], None, DType::Int32).is_err());
    assert!(Tensor::from_buffer(buf.clone(), 0, vec![2], Some(vec![-1]), DType::Int32).is_err());
    let rev = Tensor::from_buffer(buf.clone(), 12, vec![4], Some(vec![-1]), DType::Int32);
    assert_eq!(rev.unwrap().strides(), &[-1]);
    assert!(Tensor::from_buffer(buf, 20, vec![0], None, DType::Int32).is_err());
}

#[test]
fn zeros_are_writable_contiguous_and_zero_for_every_dtype() {
    for dtype in DType::ALL {
        let t = Tensor::zeros(dtype, vec![3, 5]).unwrap();
        assert_eq!((t.shape(), t.strides(), t.dtype()), (&[3i64, 5][..], &[5i64, 1][..], dtype));
        assert!(!t.readonly() && !t.copied() && t.is_aligned());
        assert!(t.as_bytes().unwrap().iter().all(|&b| b == 0));
    }
    assert!(Tensor::zeros(DType::Float32, vec![0]).unwrap().data_ptr().is_null());
    assert!(Tensor::zeros(DType::Float32, vec![-1]).is_err());
}

#[test]
fn dense_layouts_are_any_order_of_the_dimensions_without_gaps() {
    let buf = Buffer::from_vec((0..24).collect::<Vec<i32>>());
    let view = |shape: Vec<i64>, strides: Vec<i64>| {
        Tensor::from_buffer(buf.clone(), 0, shape, Some(strides), DType::Int32).unwrap()
    };
    let c = view(vec![2, 3, 4], vec![12, 4, 1]);
    let f = view(vec![2, 3, 4], vec![1, 2, 6]);
    let permuted = view(vec![2, 3, 4], vec![12, 1, 3]);
    let gappy = view(vec![2, 3], vec![12, 4]);
    let overlapping = view(vec![3, 4], vec![2, 1]);
    let reversed = Tensor::from_buffer(buf.clone(), 92, vec![24], Some(vec![-1]), DType::Int32).unwrap();
    assert_eq!(c.dense_strides(), Some(vec![12, 4, 1]));
    assert_eq!(f.dense_strides(), Some(vec![1, 2, 6]));
    assert_eq!(permuted.dense_strides(), Some(vec![12, 1, 3]));
    assert_eq!(view(vec![2, 1, 3, 4], vec![12, 99, 1, 3]).dense_strides(), Some(vec![12, 99, 1, 3]));
    for not_dense in [&gappy, &overlapping, &reversed] {
        assert_eq!(not_dense.dense_strides(), None, "{:?}", not_dense.strides());
    }
    // Both orders at once (a vector, unit dimensions): C, the canonical answer.
    assert_eq!(view(vec![4, 1], vec![1, 1]).dense_strides(), Some(vec![1, 1]));
    assert_eq!(f.check_host_dense().unwrap(), vec![1, 2, 6]);
    assert!(f.check_host_contiguous().is_err());
    let e = gappy.check_host_dense().unwrap_err();
    assert!(e.to_string().contains("is not dense"), "{e}");
    assert_eq!(view(vec![0, 3], vec![7, 7]).check_host_dense().unwrap(), vec![3, 1]);
}

#[test]
fn from_vec_checks_the_element_count() {
    let t = Tensor::from_vec(vec![1.0f32; 6], vec![2, 3]).unwrap();
    assert_eq!((t.shape(), t.strides(), t.readonly()), (&[2i64, 3][..], &[3i64, 1][..], false));
    assert_eq!(t.as_slice::<f32>().unwrap().len(), 6);
    assert!(t.as_slice::<f64>().is_err());
    assert!(Tensor::from_vec(vec![1u8; 5], vec![2, 3]).is_err());
    assert!(Tensor::from_vec(vec![1u8; 5], vec![-5]).is_err());
}

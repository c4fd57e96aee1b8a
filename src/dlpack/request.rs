//! DLPack negotiation: what a consumer's `__dlpack__(stream, max_version, dl_device, copy)`
//! asks of a [`Tensor`], resolved into the tensor to export, the capsule kind and the stream
//! action (docs/conformance.md, items 3-11).
//!
//! | request | tensor exported | data movement |
//! |---|---|---|
//! | nothing special, versioned capsule | the same tensor, `READ_ONLY` where shared | zero-copy |
//! | legacy capsule of read-only memory (it cannot say read-only) | a host copy | one copy |
//! | `copy=True` | a fresh copy on the tensor's device | one copy |
//! | `dl_device=(1, 0)` for a device tensor | a host copy; the host waits for it | one device-to-host copy |
//! | `dl_device=(2, n)` for a host tensor | a copy on `cuda:n` | one host-to-device copy |
//!
//! Every refusal comes before any copy is made and before any consumer stream is made to wait.
//! Device moves go through [`crate::transfer`], so this module knows no back end.

use crate::device::Device;
use crate::dlpack::{ExportedLegacy, ExportedVersioned, export_legacy, export_versioned};
use crate::error::{Error, Result};
use crate::ffi::dlpack::{DLDevice, device_type};
use crate::kernels;
use crate::tensor::Tensor;
use crate::transfer;

/// The arguments of `__dlpack__`, as the consumer gave them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportRequest {
    /// The highest DLPack version the consumer reads; `None` (or a major below 1) asks for a
    /// legacy capsule.
    pub max_version: Option<(u32, u32)>,
    /// Where the consumer wants the data; `None` is the tensor's own device.
    pub dl_device: Option<DLDevice>,
    /// `Some(true)` always copies, `Some(false)` never does, `None` copies only when needed.
    pub copy: Option<bool>,
    /// DLPack's stream number: for CUDA, 1 the legacy default stream, 2 the per-thread one,
    /// above 2 a stream handle, -1 no synchronisation; on the CPU only `None` or -1.
    pub stream: Option<i64>,
}

/// Which capsule the consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapsuleKind {
    /// `"dltensor_versioned"` (DLPack 1.x, with flags such as `READ_ONLY`).
    Versioned,
    /// `"dltensor"` (DLPack 0.x, which cannot say read-only).
    Legacy,
}

/// How the consumer is ordered after the work that made the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamAction {
    /// Nothing to order: host memory, or a device tensor whose consumer synchronises itself
    /// (`stream=-1`).
    Nothing,
    /// The consumer's stream (a raw handle) waits for the tensor's readiness event; the host
    /// does not block.
    Wait(usize),
    /// The host waits for the tensor: the consumer synchronises itself (`stream=-1`) but cannot
    /// know of the copy that this export has just queued on dlframe's stream.
    Synchronize,
}

/// A request resolved for one tensor; nothing has been made to wait yet.
#[derive(Debug)]
pub struct Resolved {
    /// The tensor to export: the request's tensor, a copy, or a copy on another device.
    pub tensor: Tensor,
    /// The capsule to put it in.
    pub capsule: CapsuleKind,
    /// What to do with the consumer's stream before handing the capsule over.
    pub stream: StreamAction,
}

/// A managed tensor ready for a capsule of its kind.
pub enum Export {
    /// For a `"dltensor_versioned"` capsule.
    Versioned(ExportedVersioned),
    /// For a `"dltensor"` capsule.
    Legacy(ExportedLegacy),
}

/// Where the request sends the data.
enum Target {
    /// The tensor's own device.
    Own,
    /// The host, from a device.
    Host,
    /// A CUDA device, from the host.
    Cuda(usize),
}

/// DLPack's CUDA stream number as the handle to wait on: 1 the legacy default stream, 2 the
/// per-thread one, above 2 a stream handle, -1 no synchronisation (`None`); 0 and other
/// negatives are refused.
///
/// # Errors
/// [`Error::InvalidStream`] for 0 and negatives other than -1.
pub fn consumer_stream(s: i64) -> Result<Option<usize>> {
    match s {
        -1 => Ok(None),
        0 => Err(Error::InvalidStream {
            stream: 0,
            reason: "is ambiguous and disallowed; pass 1 for the legacy default stream".into(),
        }),
        s if s < 0 => Err(Error::InvalidStream { stream: s, reason: "is not a stream".into() }),
        s => Ok(Some(s as usize)),
    }
}

/// A conversion's `stream=` for a result on `target`: the handle to wait on, as
/// [`consumer_stream`] reads it; a stream orders only a device result.
///
/// # Errors
/// [`Error::InvalidArgument`] for a stream with a host result; as [`consumer_stream`].
pub fn consumer_stream_on(stream: Option<i64>, target: Device) -> Result<Option<usize>> {
    match (stream, target) {
        (None, _) => Ok(None),
        (Some(s), Device::Cuda(_)) => consumer_stream(s),
        (Some(_), _) => Err(Error::InvalidArgument(
            "stream= orders a device result on a consumer's stream; pass device='cuda:N' too".into(),
        )),
    }
}

impl ExportRequest {
    /// The capsule kind `max_version` asks for: versioned from major 1 on (any minor, any
    /// higher major), legacy otherwise.
    pub fn capsule_kind(&self) -> CapsuleKind {
        match self.max_version {
            Some((major, _)) if major >= 1 => CapsuleKind::Versioned,
            _ => CapsuleKind::Legacy,
        }
    }

    /// Resolves the request for `t` (copies when the request needs a copy or a device move;
    /// otherwise shares `t`). The stream action is decided, not taken.
    ///
    /// # Errors
    /// [`Error::ExportRefused`] for a copy or device the request rules out;
    /// [`Error::InvalidStream`] for a stream the tensor's device cannot use;
    /// [`Error::DeviceUnavailable`] for a CUDA device this build or machine cannot reach; the
    /// copies' errors.
    pub fn resolve(&self, t: &Tensor) -> Result<Resolved> {
        let capsule = self.capsule_kind();
        let legacy = capsule == CapsuleKind::Legacy;
        if legacy && t.readonly() && self.copy == Some(false) {
            return Err(Error::ExportRefused {
                what: "a legacy DLPack capsule cannot mark shared Arrow memory read-only, so it needs a \
                       copy, but copy=False"
                    .into(),
                remedy: "pass max_version=(1, 0) or copy=None",
            });
        }
        let must_copy = self.copy == Some(true) || (legacy && t.readonly());
        let (tensor, made_here) = match self.target(t)? {
            Target::Host => {
                // One copy, and the host waits for it (DLPack: with dl_device kDLCPU "a
                // synchronization must be performed"), so there is no stream to order.
                self.refuse_copy_false(t, "the CPU")?;
                if let Some(s) = self.stream.filter(|&s| s != -1) {
                    return Err(Error::InvalidStream {
                        stream: s,
                        reason: "is not valid when dl_device is the CPU: the host waits for the copy; \
                                 pass None (or -1)"
                            .into(),
                    });
                }
                let tensor = transfer::move_to(t, Device::Cpu)?;
                return Ok(Resolved { tensor, capsule, stream: StreamAction::Nothing });
            }
            Target::Cuda(ordinal) => {
                // One host-to-device copy on dlframe's stream; the consumer then waits on the
                // copy's event.
                self.refuse_copy_false(t, &format!("cuda:{ordinal}"))?;
                (transfer::move_to(t, Device::Cuda(ordinal as i32))?, true)
            }
            // A fresh copy on the device, made on dlframe's stream after the tensor's work.
            Target::Own if must_copy && !t.device().is_host_accessible() => {
                (transfer::copy_on_device(t)?, true)
            }
            Target::Own => (t.clone(), false),
        };
        let stream = match (tensor.sync(), self.stream) {
            // A device tensor: None is the legacy default stream, as 1 is.
            (Some(_), s) => match consumer_stream(s.unwrap_or(1))? {
                Some(h) => StreamAction::Wait(h),
                None if made_here => StreamAction::Synchronize,
                None => StreamAction::Nothing,
            },
            (None, Some(s)) if s != -1 => {
                return Err(Error::InvalidStream {
                    stream: s,
                    reason: format!(
                        "is not valid for a {} tensor; only None (or -1) is accepted on the CPU",
                        tensor.device()
                    ),
                });
            }
            (None, _) => StreamAction::Nothing,
        };
        let tensor = if must_copy && tensor.device().is_host_accessible() {
            kernels::contiguous_copy(&tensor)?
        } else {
            tensor
        };
        Ok(Resolved { tensor, capsule, stream })
    }

    /// Resolves the request, takes the stream action and exports: the one call behind
    /// `__dlpack__`. May block the host (a copy to the host, or [`StreamAction::Synchronize`]).
    ///
    /// # Errors
    /// As [`ExportRequest::resolve`]; a device error while ordering the consumer's stream.
    pub fn export(&self, t: &Tensor) -> Result<Export> {
        self.resolve(t)?.export()
    }

    /// Where `dl_device` sends the data: the tensor's own device and `(1, 0)` for host
    /// memory; the CPU for a device tensor; a CUDA device for a host tensor.
    fn target(&self, t: &Tensor) -> Result<Target> {
        let Some(d) = self.dl_device else { return Ok(Target::Own) };
        let (ty, id) = (d.device_type, d.device_id);
        let host = t.device().is_host_accessible();
        let cpu = (ty, id) == (device_type::KDL_CPU, 0);
        if cpu && !host {
            return Ok(Target::Host);
        }
        if ty == device_type::KDL_CUDA && id >= 0 && host {
            return Ok(Target::Cuda(id as usize));
        }
        if cpu || d == t.device().to_dlpack() {
            return Ok(Target::Own);
        }
        Err(Error::ExportRefused {
            what: format!("cannot export a {} tensor to device ({ty}, {id})", t.device()),
            remedy: "dlframe exports to the tensor's own device, to the CPU, or from the CPU to a CUDA device",
        })
    }

    /// Refuses a device move under `copy=False` (a move is always a copy).
    fn refuse_copy_false(&self, t: &Tensor, to: &str) -> Result<()> {
        if self.copy == Some(false) {
            return Err(Error::ExportRefused {
                what: format!("a {} tensor reaches {to} only by a copy, but copy=False", t.device()),
                remedy: "pass copy=None or copy=True",
            });
        }
        Ok(())
    }
}

impl Resolved {
    /// Takes the stream action and hands the tensor to a managed tensor of the resolved kind.
    ///
    /// # Errors
    /// A device error while ordering the consumer's stream.
    pub fn export(self) -> Result<Export> {
        if let Some(sync) = self.tensor.sync() {
            match self.stream {
                StreamAction::Wait(h) => sync.wait_on(h)?,
                StreamAction::Synchronize => sync.synchronize()?,
                StreamAction::Nothing => {}
            }
        }
        Ok(match self.capsule {
            CapsuleKind::Versioned => Export::Versioned(export_versioned(self.tensor)),
            CapsuleKind::Legacy => Export::Legacy(export_legacy(self.tensor)),
        })
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Float32Array;

    use super::*;
    use crate::ErrorKind;
    use crate::arrow::array_to_tensor;
    use crate::dlpack::ForeignTensor;

    /// A read-only tensor over shared Arrow memory.
    fn shared() -> Tensor {
        array_to_tensor(&Float32Array::from(vec![1.0, 2.0, 3.0])).unwrap()
    }

    fn req(max_version: Option<(u32, u32)>, copy: Option<bool>) -> ExportRequest {
        ExportRequest { max_version, copy, ..Default::default() }
    }

    fn on(ty: i32, id: i32) -> Option<DLDevice> {
        Some(DLDevice { device_type: ty, device_id: id })
    }

    const V1: Option<(u32, u32)> = Some((1, 3));

    #[test]
    fn max_version_chooses_the_capsule() {
        for (mv, kind) in [
            (None, CapsuleKind::Legacy),
            (Some((0, 8)), CapsuleKind::Legacy),
            (Some((1, 0)), CapsuleKind::Versioned),
            (Some((2, 0)), CapsuleKind::Versioned),
            (Some((100, 3)), CapsuleKind::Versioned),
        ] {
            assert_eq!(req(mv, None).capsule_kind(), kind, "{mv:?}");
        }
        let t = Tensor::from_vec(vec![1i32, 2], vec![2]).unwrap();
        assert!(matches!(req(V1, None).export(&t).unwrap(), Export::Versioned(_)));
        assert!(matches!(req(None, None).export(&t).unwrap(), Export::Legacy(_)));
    }

    #[test]
    fn a_versioned_export_shares_read_only_memory_and_copy_true_copies() {
        let t = shared();
        for copy in [None, Some(false)] {
            let r = req(V1, copy).resolve(&t).unwrap();
            assert_eq!(r.tensor.data_ptr(), t.data_ptr(), "copy={copy:?} shares");
            assert_eq!(r.stream, StreamAction::Nothing);
        }
        let r = req(V1, Some(true)).resolve(&t).unwrap();
        assert_ne!(r.tensor.data_ptr(), t.data_ptr());
        assert!(r.tensor.copied());
        let Export::Versioned(e) = r.export().unwrap() else { panic!("versioned") };
        // SAFETY: a fresh export, imported once.
        let back = unsafe { ForeignTensor::from_versioned(e.into_raw()) }.unwrap().into_tensor();
        assert_eq!(back.shape(), &[3]);
        assert_eq!(back.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn a_legacy_capsule_never_carries_shared_read_only_memory() {
        let t = shared();
        let r = req(None, None).resolve(&t).unwrap();
        assert_ne!(r.tensor.data_ptr(), t.data_ptr(), "a copy, not the Arrow buffer");
        assert_eq!(r.capsule, CapsuleKind::Legacy);
        let e = req(Some((0, 9)), Some(false)).resolve(&t).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Buffer);
        assert!(e.to_string().contains("a legacy DLPack capsule cannot mark shared Arrow memory read-only"));
        // Refused before anything else is looked at, even a device move.
        let e = ExportRequest { dl_device: on(2, 0), ..req(None, Some(false)) }.resolve(&t).unwrap_err();
        assert!(e.to_string().contains("legacy"), "{e}");
        // Writable memory goes into a legacy capsule as it is.
        let w = Tensor::from_vec(vec![1i64, 2], vec![2]).unwrap();
        assert_eq!(req(None, Some(false)).resolve(&w).unwrap().tensor.data_ptr(), w.data_ptr());
    }

    #[test]
    fn the_cpu_is_accepted_and_other_devices_are_refused() {
        let t = shared();
        for d in [None, on(1, 0)] {
            let r = ExportRequest { dl_device: d, ..req(V1, None) }.resolve(&t).unwrap();
            assert_eq!(r.tensor.data_ptr(), t.data_ptr());
        }
        for d in [on(4, 0), on(1, 1), on(2, -1)] {
            let e = ExportRequest { dl_device: d, ..req(V1, None) }.resolve(&t).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Buffer, "{e}");
            assert!(e.to_string().contains("cannot export a cpu tensor to device"), "{e}");
        }
    }

    #[test]
    fn a_cuda_device_out_of_reach_is_one_error() {
        let t = shared();
        let e = ExportRequest { dl_device: on(2, 0), ..req(V1, Some(false)) }.resolve(&t).unwrap_err();
        assert!(e.to_string().contains("reaches cuda:0 only by a copy, but copy=False"), "{e}");
        let mut unreachable = vec![1_000];
        if transfer::cuda_device_count() == 0 {
            unreachable.push(0);
        }
        for id in unreachable {
            let e = ExportRequest { dl_device: on(2, id), ..req(V1, None) }.resolve(&t).unwrap_err();
            assert!(matches!(e, Error::DeviceUnavailable { .. }), "{e}");
            assert_eq!(e.kind(), ErrorKind::Buffer);
            assert!(e.to_string().contains(&format!("cuda:{id} is not available")), "{e}");
            if !transfer::BUILT_WITH_CUDA {
                assert!(e.to_string().contains("no CUDA support"), "{e}");
            }
        }
    }

    #[test]
    fn a_cpu_tensor_takes_no_stream_but_none_or_minus_one() {
        let t = shared();
        for s in [None, Some(-1)] {
            let r = ExportRequest { stream: s, ..req(V1, None) }.resolve(&t).unwrap();
            assert_eq!(r.stream, StreamAction::Nothing);
        }
        for s in [0, 1, 2, 5, -2] {
            let e = ExportRequest { stream: Some(s), ..req(V1, None) }.resolve(&t).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Value, "{e}");
            assert!(e.to_string().contains("only None (or -1) is accepted on the CPU"), "{e}");
        }
    }

    #[test]
    fn dlpack_stream_numbers() {
        assert_eq!(consumer_stream(-1).unwrap(), None);
        assert_eq!(consumer_stream(1).unwrap(), Some(1));
        assert_eq!(consumer_stream(0x7f00_1234).unwrap(), Some(0x7f00_1234));
        let e = consumer_stream(0).unwrap_err();
        assert!(e.to_string().contains("stream=0 is ambiguous"), "{e}");
        assert_eq!(e.kind(), ErrorKind::Value);
        assert!(consumer_stream(-7).unwrap_err().to_string().contains("stream=-7 is not a stream"));
        // A conversion's stream orders a device result only.
        assert_eq!(consumer_stream_on(None, Device::Cpu).unwrap(), None);
        assert_eq!(consumer_stream_on(Some(5), Device::Cuda(0)).unwrap(), Some(5));
        assert_eq!(consumer_stream_on(Some(-1), Device::Cuda(0)).unwrap(), None);
        let e = consumer_stream_on(Some(5), Device::Cpu).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("device='cuda:N'"), "{e}");
    }

    #[test]
    fn copy_true_gathers_a_strided_host_tensor_into_c_order() {
        let buffer = arrow_buffer::Buffer::from_vec((0..6i32).collect::<Vec<_>>());
        let tr = Tensor::from_buffer(buffer, 0, vec![3, 2], Some(vec![1, 3]), crate::DType::Int32).unwrap();
        assert!(!tr.is_c_contiguous());
        let r = req(V1, Some(true)).resolve(&tr).unwrap();
        assert!(r.tensor.is_c_contiguous());
        assert_eq!(r.tensor.as_slice::<i32>().unwrap(), &[0, 3, 1, 4, 2, 5]);
    }
}

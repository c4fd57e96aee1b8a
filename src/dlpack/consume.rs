//! The import ladder, the import twin of [`ExportRequest`](super::ExportRequest): which of a
//! producer's offers dlframe takes, in which order, what a failure on one rung leads to, and the
//! `__dlpack__` call to make for a producer on a given device. Pure decisions over what the
//! binding read of the object; the binding only reads the Python objects and carries the
//! decisions out (`python/src/importer.rs`), so every route answers alike.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::ffi::dlpack::DLDevice;

/// What an object given to a call that takes data is taken as: the first of these that it
/// offers, in [`Entry::ORDER`], the same for every such call (`from_dlpack`, `tensor`,
/// `to_dlpack`, `batches`). Arrow data on the host comes before `__dlpack__` (a pyarrow array
/// has both, and its `__dlpack__` refuses nulls and booleans); Arrow data offered only on a
/// device comes after the tensor protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// dlframe's own tensor.
    Ours,
    /// A DLPack capsule.
    Capsule,
    /// `__arrow_c_array__` or `__arrow_c_stream__`.
    ArrowHost,
    /// `__dlpack__`, imported along the [`ImportRequest`]'s rungs.
    Dlpack,
    /// `__sycl_usm_array_interface__`, `__array_interface__`, `__array_struct__` or the buffer
    /// protocol.
    Interface,
    /// `__arrow_c_device_array__` or `__arrow_c_device_stream__`.
    ArrowDevice,
    /// A lazy query (a Polars LazyFrame), collected first.
    Lazy,
    /// A path (a string or path object): a Parquet file, read by `dlframe::parquet`.
    File,
}

impl Entry {
    /// The order in which an object's offers are looked for.
    pub const ORDER: [Entry; 8] = [
        Entry::Ours,
        Entry::Capsule,
        Entry::ArrowHost,
        Entry::Dlpack,
        Entry::Interface,
        Entry::ArrowDevice,
        Entry::Lazy,
        Entry::File,
    ];
}

/// Where an imported tensor may stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// On the host, for Arrow: device data only by an explicit `copy=True`, which the producer
    /// makes.
    Host,
    /// Where it is: a CUDA tensor stays on its device (`dlframe.tensor(x)`), without a copy.
    Device,
}

/// What a producer offers, as the binding read it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offer {
    /// A DLPack exchange table of dlframe's major version that may answer for this object (a
    /// torch tensor that requires grad has a table that must not: its `__dlpack__` refuses it).
    pub table: bool,
    /// An exact `numpy.ndarray`, whose struct dlframe reads as numpy's DLPack export would
    /// describe it.
    pub ndarray: bool,
    /// A `__dlpack__` method.
    pub dlpack: bool,
}

/// One way of importing, in the ladder's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// The producer's exchange table: no Python call.
    Table,
    /// numpy's struct: no Python call; declines what numpy's export would not describe.
    NdArray,
    /// `__dlpack__`, as [`ImportRequest::dlpack_call`] says.
    Dlpack,
    /// A numpy array of a dtype numpy lacks (ml_dtypes' bfloat16 and float8, which numpy's
    /// `__dlpack__` refuses), read by its dtype's name as a view of its bits; declines any other
    /// array.
    NamedBits,
    /// The array interface (`__array_interface__`, `__array_struct__`, the buffer protocol),
    /// which also carries a datetime's unit; declines (so that `__dlpack__`'s refusal stands)
    /// unless it can say more (a datetime's unit that Arrow lacks).
    Interface,
}

/// How a rung failed, as the binding saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The producer cannot export this tensor (`BufferError`, or a C++ `RuntimeError` from a
    /// table).
    Refused,
    /// An object or argument of the wrong kind (`TypeError`).
    WrongObject,
    /// Anything else.
    Other,
}

/// What follows a failed rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// The next rung.
    Next,
    /// The failure is the answer.
    Raise,
}

/// The `__dlpack__` call for a producer on a given device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlpackCall {
    /// `__dlpack__(max_version=..., dl_device=..., copy=...)` (the keywords that are `Some`); on
    /// TypeError again without `max_version`, then, when `bare_last`, with no keywords at all.
    Host {
        /// Where the producer is asked to put the tensor (the CPU, for device data).
        dl_device: Option<DLDevice>,
        /// The `copy=` keyword.
        copy: Option<bool>,
        /// Whether a last call with no keywords may follow (not for device data, which the
        /// producer must copy).
        bare_last: bool,
    },
    /// `__dlpack__(stream=dlframe's stream on the device, max_version=...)`, the tensor kept
    /// on this device; no bare call (without `stream` the producer would not order its work
    /// before dlframe's).
    OnDevice(Device),
}

/// One import: `copy=` as the array API has it, and where the tensor may stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportRequest {
    /// `copy=`: None shares where possible, `Some(true)` asks the producer for a copy.
    pub copy: Option<bool>,
    /// Where the tensor may stay.
    pub keep: Keep,
}

impl ImportRequest {
    /// The rungs to try, in order. The two without a Python call come first, unless a copy is
    /// asked for (which only the producer makes, through `__dlpack__`). The two after
    /// `__dlpack__` are reached only when it refuses ([`ImportRequest::then`]).
    pub fn rungs(&self, offer: Offer) -> impl Iterator<Item = Rung> {
        let shared = self.copy != Some(true);
        [
            (shared && offer.table).then_some(Rung::Table),
            (shared && offer.ndarray).then_some(Rung::NdArray),
            offer.dlpack.then_some(Rung::Dlpack),
            (offer.dlpack && offer.ndarray).then_some(Rung::NamedBits),
            offer.dlpack.then_some(Rung::Interface),
        ]
        .into_iter()
        .flatten()
    }

    /// What follows a failure on `rung`. A table that cannot export the tensor hands over to
    /// `__dlpack__`, which says why in the producer's words; a table that is given the wrong
    /// object says so. A `__dlpack__` that refuses hands over to the rungs after it, and when
    /// they decline, its refusal is the answer. A failure after it is the answer.
    pub fn then(&self, rung: Rung, failure: Failure) -> Then {
        match (rung, failure) {
            (Rung::Table, Failure::Refused | Failure::Other) => Then::Next,
            (Rung::Dlpack, Failure::Refused) => Then::Next,
            _ => Then::Raise,
        }
    }

    /// The `__dlpack__` call for a producer whose `__dlpack_device__` is `device`.
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for device data kept on the host without `copy=True`;
    /// [`Error::UnsupportedDevice`] for device data kept on a device other than CUDA.
    pub fn dlpack_call(&self, device: DLDevice) -> Result<DlpackCall> {
        let host = Device::from_dlpack(DLDevice { device_type: device.device_type, device_id: 0 })
            .is_ok_and(|d| d.is_host_accessible());
        if host {
            return Ok(DlpackCall::Host { dl_device: None, copy: self.copy, bare_last: true });
        }
        let named = || format!("DLPack device ({}, {})", device.device_type, device.device_id);
        match self.keep {
            Keep::Device => match Device::from_dlpack(device) {
                Ok(d @ Device::Cuda(_)) => Ok(DlpackCall::OnDevice(d)),
                _ => Err(Error::UnsupportedDevice {
                    what: named(),
                    remedy: "dlframe keeps only CUDA (2) device tensors on their device; use \
                             dlframe.from_dlpack(x, copy=True) for a host copy",
                }),
            },
            Keep::Host if self.copy == Some(true) => Ok(DlpackCall::Host {
                dl_device: Some(Device::Cpu.to_dlpack()),
                copy: Some(true),
                bare_last: false,
            }),
            Keep::Host => Err(Error::NotOnHost { device: named(), copy_false: self.copy == Some(false) }),
        }
    }

    /// Whether the tensor a producer returned for `call` is on the device asked for: host memory
    /// for a host call, the device itself for a call that keeps it there.
    ///
    /// # Errors
    /// [`Error::Refused`] naming both devices.
    pub fn returned(&self, call: &DlpackCall, device: Device) -> Result<()> {
        match *call {
            DlpackCall::Host { .. } if !device.is_host_accessible() => Err(Error::Refused(format!(
                "the producer returned a {device} tensor; Arrow needs host memory"
            ))),
            DlpackCall::OnDevice(asked) if asked != device => Err(Error::Refused(format!(
                "__dlpack_device__ said {asked} but the producer returned a tensor on {device}"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether a tensor that a rung produced on `device` is the answer.
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for a device tensor where the host was asked for.
    pub fn accept(&self, device: Device) -> Result<()> {
        if device.is_host_accessible() || self.keep == Keep::Device {
            return Ok(());
        }
        Err(Error::NotOnHost { device: device.to_string(), copy_false: self.copy == Some(false) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: DLDevice = DLDevice { device_type: 1, device_id: 0 };
    const CUDA1: DLDevice = DLDevice { device_type: 2, device_id: 1 };
    const ROCM: DLDevice = DLDevice { device_type: 10, device_id: 0 };

    fn rungs(copy: Option<bool>, offer: Offer) -> Vec<Rung> {
        ImportRequest { copy, keep: Keep::Host }.rungs(offer).collect()
    }

    #[test]
    fn the_calls_without_python_come_first_unless_a_copy_is_asked_for() {
        let torch = Offer { table: true, ndarray: false, dlpack: true };
        let numpy = Offer { table: false, ndarray: true, dlpack: true };
        use Rung::{Dlpack, Interface, NamedBits, NdArray, Table};
        assert_eq!(rungs(None, torch), [Table, Dlpack, Interface]);
        assert_eq!(rungs(Some(false), numpy), [NdArray, Dlpack, NamedBits, Interface]);
        assert_eq!(rungs(Some(true), torch), [Dlpack, Interface]);
        // A copy of an ml_dtypes array is made of its bits, after numpy's refusal.
        assert_eq!(rungs(Some(true), numpy), [Dlpack, NamedBits, Interface]);
        // A table that must not answer (a tensor that requires grad) is no rung.
        assert_eq!(rungs(None, Offer { table: false, ..torch }), [Dlpack, Interface]);
        assert!(rungs(None, Offer::default()).is_empty());
    }

    #[test]
    fn a_table_that_cannot_export_hands_over_to_dlpack_and_dlpack_to_the_interface() {
        let r = ImportRequest { copy: None, keep: Keep::Host };
        assert_eq!(r.then(Rung::Table, Failure::Refused), Then::Next);
        assert_eq!(r.then(Rung::Table, Failure::Other), Then::Next);
        assert_eq!(r.then(Rung::Table, Failure::WrongObject), Then::Raise);
        assert_eq!(r.then(Rung::Dlpack, Failure::Refused), Then::Next);
        assert_eq!(r.then(Rung::Dlpack, Failure::WrongObject), Then::Raise);
        assert_eq!(r.then(Rung::Dlpack, Failure::Other), Then::Raise);
        assert_eq!(r.then(Rung::NamedBits, Failure::Refused), Then::Raise);
        assert_eq!(r.then(Rung::Interface, Failure::Refused), Then::Raise);
    }

    #[test]
    fn the_dlpack_call_follows_the_device_and_the_request() {
        let host = |copy| ImportRequest { copy, keep: Keep::Host };
        let keep = ImportRequest { copy: None, keep: Keep::Device };
        assert_eq!(
            host(Some(false)).dlpack_call(CPU).unwrap(),
            DlpackCall::Host { dl_device: None, copy: Some(false), bare_last: true }
        );
        assert_eq!(
            host(Some(true)).dlpack_call(CUDA1).unwrap(),
            DlpackCall::Host { dl_device: Some(CPU), copy: Some(true), bare_last: false }
        );
        let e = host(Some(false)).dlpack_call(CUDA1).unwrap_err();
        assert!(matches!(e, Error::NotOnHost { copy_false: true, .. }), "{e}");
        assert!(e.to_string().contains("(2, 1)"), "{e}");
        assert!(matches!(
            host(None).dlpack_call(CUDA1).unwrap_err(),
            Error::NotOnHost { copy_false: false, .. }
        ));
        assert_eq!(keep.dlpack_call(CUDA1).unwrap(), DlpackCall::OnDevice(Device::Cuda(1)));
        assert_eq!(
            keep.dlpack_call(CPU).unwrap(),
            DlpackCall::Host { dl_device: None, copy: None, bare_last: true }
        );
        let e = keep.dlpack_call(ROCM).unwrap_err();
        assert!(e.to_string().contains("copy=True"), "{e}");
        // The producer's tensor must be where the call asked for it.
        let host_call = host(None).dlpack_call(CPU).unwrap();
        assert!(host(None).returned(&host_call, Device::Cpu).is_ok());
        let e = host(None).returned(&host_call, Device::Cuda(0)).unwrap_err().to_string();
        assert_eq!(e, "the producer returned a cuda:0 tensor; Arrow needs host memory");
        let on = keep.dlpack_call(CUDA1).unwrap();
        assert!(keep.returned(&on, Device::Cuda(1)).is_ok());
        let e = keep.returned(&on, Device::Cuda(0)).unwrap_err().to_string();
        assert_eq!(e, "__dlpack_device__ said cuda:1 but the producer returned a tensor on cuda:0");
        // A CUDA tensor from a rung is the answer only where it may stay on its device.
        assert!(keep.accept(Device::Cuda(0)).is_ok() && host(None).accept(Device::Cpu).is_ok());
        assert!(matches!(
            host(Some(false)).accept(Device::Cuda(0)),
            Err(Error::NotOnHost { copy_false: true, .. })
        ));
    }
}

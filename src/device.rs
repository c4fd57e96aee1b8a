//! Where a tensor's memory lives: [`Device`] <-> DLPack `DLDevice`.

use crate::error::{Error, Result};
use crate::ffi::dlpack::{DLDevice, device_type as dt};

/// A device that DLPack can name. Unknown device-type codes are refused at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Device {
    /// Host memory.
    Cpu,
    /// CUDA device memory on the given ordinal.
    Cuda(i32),
    /// CUDA pinned host memory.
    CudaHost,
    /// CUDA managed (unified) memory.
    CudaManaged,
    /// OpenCL device.
    OpenCl(i32),
    /// Vulkan buffer.
    Vulkan(i32),
    /// Metal buffer.
    Metal(i32),
    /// Verilog simulator buffer.
    Vpi(i32),
    /// ROCm device memory.
    Rocm(i32),
    /// ROCm pinned host memory.
    RocmHost,
    /// Reserved extension device.
    ExtDev(i32),
    /// oneAPI / SYCL unified shared memory.
    OneApi(i32),
    /// WebGPU.
    WebGpu(i32),
    /// Qualcomm Hexagon DSP.
    Hexagon(i32),
    /// Microsoft MAIA.
    Maia(i32),
    /// AWS Trainium.
    Trn(i32),
}

impl Device {
    /// The DLPack device pair.
    pub const fn to_dlpack(self) -> DLDevice {
        let (device_type, device_id) = match self {
            Device::Cpu => (dt::KDL_CPU, 0),
            Device::Cuda(i) => (dt::KDL_CUDA, i),
            Device::CudaHost => (dt::KDL_CUDA_HOST, 0),
            Device::CudaManaged => (dt::KDL_CUDA_MANAGED, 0),
            Device::OpenCl(i) => (dt::KDL_OPENCL, i),
            Device::Vulkan(i) => (dt::KDL_VULKAN, i),
            Device::Metal(i) => (dt::KDL_METAL, i),
            Device::Vpi(i) => (dt::KDL_VPI, i),
            Device::Rocm(i) => (dt::KDL_ROCM, i),
            Device::RocmHost => (dt::KDL_ROCM_HOST, 0),
            Device::ExtDev(i) => (dt::KDL_EXT_DEV, i),
            Device::OneApi(i) => (dt::KDL_ONEAPI, i),
            Device::WebGpu(i) => (dt::KDL_WEBGPU, i),
            Device::Hexagon(i) => (dt::KDL_HEXAGON, i),
            Device::Maia(i) => (dt::KDL_MAIA, i),
            Device::Trn(i) => (dt::KDL_TRN, i),
        };
        DLDevice { device_type, device_id }
    }

    /// Parses a conversion's target device as users write it: `"cpu"`, `"cuda"` (device 0) or
    /// `"cuda:N"`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for anything else.
    pub fn parse(name: &str) -> Result<Self> {
        let device = match name {
            "cpu" => Some(Device::Cpu),
            "cuda" => Some(Device::Cuda(0)),
            _ => {
                name.strip_prefix("cuda:").and_then(|n| n.parse::<u16>().ok()).map(|n| Device::Cuda(n.into()))
            }
        };
        device.ok_or_else(|| {
            Error::InvalidArgument(format!("device={name:?}: expected 'cpu', 'cuda' or 'cuda:N'"))
        })
    }

    /// Reads a DLPack device pair; unknown codes and negative ordinals are refused.
    pub fn from_dlpack(d: DLDevice) -> Result<Self> {
        let id = d.device_id;
        let dev = match d.device_type {
            dt::KDL_CPU => Device::Cpu,
            dt::KDL_CUDA => Device::Cuda(id),
            dt::KDL_CUDA_HOST => Device::CudaHost,
            dt::KDL_CUDA_MANAGED => Device::CudaManaged,
            dt::KDL_OPENCL => Device::OpenCl(id),
            dt::KDL_VULKAN => Device::Vulkan(id),
            dt::KDL_METAL => Device::Metal(id),
            dt::KDL_VPI => Device::Vpi(id),
            dt::KDL_ROCM => Device::Rocm(id),
            dt::KDL_ROCM_HOST => Device::RocmHost,
            dt::KDL_EXT_DEV => Device::ExtDev(id),
            dt::KDL_ONEAPI => Device::OneApi(id),
            dt::KDL_WEBGPU => Device::WebGpu(id),
            dt::KDL_HEXAGON => Device::Hexagon(id),
            dt::KDL_MAIA => Device::Maia(id),
            dt::KDL_TRN => Device::Trn(id),
            other => {
                return Err(Error::UnsupportedDevice {
                    what: format!("(device_type={other}, device_id={id})"),
                    remedy: "DLPack 1.3 defines device types 1-4 and 7-18; move the tensor to \
                             the CPU (device_type 1) first",
                });
            }
        };
        if id < 0 {
            return Err(Error::UnsupportedDevice {
                what: format!("(device_type={}, device_id={id})", d.device_type),
                remedy: "device ordinals are non-negative",
            });
        }
        Ok(dev)
    }

    /// True when the CPU can read the memory in place (host, pinned, managed).
    pub const fn is_host_accessible(self) -> bool {
        matches!(self, Device::Cpu | Device::CudaHost | Device::CudaManaged | Device::RocmHost)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            other => {
                let d = other.to_dlpack();
                write!(f, "dlpack-device({}, {})", d.device_type, d.device_id)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_round_trips_and_unknown_is_refused() {
        for code in (1..=18).filter(|c| ![5, 6].contains(c)) {
            let d = DLDevice { device_type: code, device_id: 0 };
            assert_eq!(Device::from_dlpack(d).unwrap().to_dlpack(), d);
        }
        for code in [0, 5, 6, 19, 20, -1] {
            let e = Device::from_dlpack(DLDevice { device_type: code, device_id: 0 }).unwrap_err();
            assert!(e.to_string().contains(&format!("device_type={code}")), "{e}");
        }
        assert!(Device::from_dlpack(DLDevice { device_type: 2, device_id: -3 }).is_err());
    }

    #[test]
    fn target_devices_parse_as_users_write_them() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(Device::parse("cuda:3").unwrap(), Device::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "cuda:70000"] {
            assert!(Device::parse(bad).unwrap_err().to_string().contains("expected 'cpu'"), "{bad}");
        }
    }
}

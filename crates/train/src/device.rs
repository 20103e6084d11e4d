//! `train.device` (`--device`): where the model, its batches and its
//! gradients live. `cpu` is burn's flex backend; `wgpu` (or `vulkan`) is
//! burn's wgpu backend on the best adapter wgpu finds (a GPU, else a CPU
//! adapter such as Mesa's lavapipe), `wgpu:N` on the N-th discrete GPU, and
//! `lavapipe` on wgpu's CPU adapter by name. `cuda` (or `cuda:N`) is burn's
//! CUDA backend on NVIDIA GPU N, its kernels compiled by NVRTC when they
//! first run; what it needs from the machine is checked first
//! ([`crate::cuda_check`]), so a missing driver, NVRTC or header directory
//! is one line, not a panic.
//!
//! The model is initialised on the CPU from the config's seed and then
//! moved, so every device starts from the same weights.

use std::fmt;
use std::str::FromStr;

use burn::backend::DispatchDevice;
use burn::tensor::{Device, DeviceKind, Tensor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Precision, TrainError, cuda_check};

/// The device a run trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// burn's flex backend on the host's cores.
    #[default]
    Cpu,
    /// burn's wgpu backend on wgpu's preferred adapter.
    Wgpu,
    /// burn's wgpu backend on the N-th discrete GPU.
    WgpuDiscrete(usize),
    /// burn's wgpu backend on the CPU adapter (Mesa's lavapipe).
    Lavapipe,
    /// burn's CUDA backend on NVIDIA GPU N.
    Cuda(usize),
}

const CHOICES: &str =
    "cpu, wgpu (or vulkan), wgpu:N (the N-th discrete GPU), lavapipe, cuda, cuda:N";

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text {
            "cpu" | "flex" => Self::Cpu,
            "wgpu" | "vulkan" | "gpu" => Self::Wgpu,
            "lavapipe" => Self::Lavapipe,
            "cuda" => Self::Cuda(0),
            other => {
                let index = |prefixes: &[&str]| {
                    prefixes
                        .iter()
                        .find_map(|p| other.strip_prefix(p))
                        .and_then(|n| n.parse().ok())
                };
                if let Some(index) = index(&["wgpu:", "vulkan:"]) {
                    Self::WgpuDiscrete(index)
                } else if let Some(index) = index(&["cuda:"]) {
                    Self::Cuda(index)
                } else {
                    return Err(format!("unknown device `{other}`: one of {CHOICES}"));
                }
            }
        })
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Wgpu => f.write_str("wgpu"),
            Self::WgpuDiscrete(index) => write!(f, "wgpu:{index}"),
            Self::Lavapipe => f.write_str("lavapipe"),
            Self::Cuda(0) => f.write_str("cuda"),
            Self::Cuda(index) => write!(f, "cuda:{index}"),
        }
    }
}

impl Serialize for DeviceChoice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl DeviceChoice {
    /// Whether this is the default (`cpu`), which configs leave unwritten.
    pub fn is_cpu(&self) -> bool {
        *self == Self::Cpu
    }

    /// The device, checked to work for a run in `precision`: a wgpu adapter
    /// that is missing or fails to start, or a GPU lacking what the run's
    /// kernels need, is an error naming the choice, not a panic.
    pub fn open(&self, precision: Precision) -> Result<Device, TrainError> {
        let kind = match self {
            Self::Cpu => return Ok(Device::flex()),
            Self::Cuda(index) => return self.open_cuda(*index, precision),
            _ => self.wgpu_kind(),
        };
        let found = adapters();
        let fits = |info: &&Adapter| match self {
            Self::WgpuDiscrete(_) => info.device_type == wgpu::DeviceType::DiscreteGpu,
            Self::Lavapipe => info.device_type == wgpu::DeviceType::Cpu,
            _ => true,
        };
        let index = match self {
            Self::WgpuDiscrete(index) => *index,
            _ => 0,
        };
        if found.iter().filter(fits).nth(index).is_none() {
            let wanted = match self {
                Self::WgpuDiscrete(index) => format!("no discrete GPU number {index}"),
                Self::Lavapipe => "no CPU adapter (lavapipe)".into(),
                _ => "no adapter".into(),
            };
            let listed: Vec<String> = found
                .iter()
                .map(|a| format!("{} ({:?}, {:?})", a.name, a.device_type, a.backend))
                .collect();
            return Err(self.unavailable(format!(
                "{wanted} among the adapters wgpu finds here: {}{HOW}",
                if listed.is_empty() {
                    "none".to_string()
                } else {
                    listed.join(", ")
                }
            )));
        }
        let device = Device::wgpu(kind);
        probe(&device).map_err(|reason| {
            self.unavailable(format!("the adapter failed to start: {reason}{HOW}"))
        })?;
        if precision == Precision::Fp16 {
            let f16 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F16);
            let has = self.cube_properties(|properties| properties.supports_type(f16));
            if let Some(reason) = fp16_missing(has, self, || self.hardware()) {
                return Err(TrainError::InvalidRun {
                    field: "train.precision",
                    reason,
                });
            }
        }
        Ok(device)
    }

    /// The kind of wgpu adapter a wgpu choice names (`DefaultDevice` for
    /// the others, which never ask).
    fn wgpu_kind(&self) -> DeviceKind {
        match self {
            Self::WgpuDiscrete(index) => DeviceKind::DiscreteGpu(*index),
            Self::Lavapipe => DeviceKind::Cpu,
            _ => DeviceKind::DefaultDevice,
        }
    }

    /// The device's memory in all as cubecl states it (CUDA's
    /// `cuDeviceTotalMem`), for messages such as the out-of-memory line;
    /// `None` on the CPU and where the runtime states none (wgpu: WebGPU
    /// has no figure, and cubecl reads Vulkan's heaps only in its `spirv`
    /// build, which terse does not use).
    pub fn memory_capacity(&self) -> Option<u64> {
        self.cube_properties(|properties| properties.memory.max_memory())
            .flatten()
    }

    /// The hardware behind this choice, for the run's log: the adapter
    /// as wgpu names it (`llvmpipe (LLVM 15.0.6, 256 bits)`), a CUDA GPU
    /// by its name and compute capability (`NVIDIA H100 80GB HBM3,
    /// compute capability 9.0`, which says whether its matmuls have TF32
    /// and bf16); `None` on the CPU. On CUDA this process's GPU: with
    /// several ranks on a node each has its own.
    pub fn hardware(&self) -> Option<String> {
        match self {
            Self::Cpu => None,
            // cudarc panics on a driver it cannot open.
            Self::Cuda(_) if !terse_comm::cuda_driver_present() => None,
            Self::Cuda(index) => terse_comm::cuda_gpu(terse_comm::gpu_of_process(*index))
                .ok()
                .map(|gpu| gpu.to_string()),
            _ => self.cube_properties(|properties| properties.identity.name.clone()),
        }
    }

    /// `read` of the device's properties as its cubecl client holds them;
    /// `None` on the CPU. Asks the client, which a run has started already
    /// (nothing is allocated, nothing waits for the device).
    fn cube_properties<T>(
        &self,
        read: impl FnOnce(&cubecl::prelude::DeviceProperties) -> T,
    ) -> Option<T> {
        let device = match self {
            Self::Cpu => return None,
            Self::Cuda(index) => Device::cuda(terse_comm::gpu_of_process(*index)),
            _ => Device::wgpu(self.wgpu_kind()),
        };
        match device.as_dispatch() {
            DispatchDevice::Cube(cube) => Some(read(cube.client().properties())),
            #[allow(unreachable_patterns)] // flex is not a choice here, but is a variant
            _ => None,
        }
    }

    /// NVIDIA GPU `index` (offset by the process's node-local rank) through
    /// burn's CUDA backend, once the machine has what it needs.
    fn open_cuda(&self, index: usize, precision: Precision) -> Result<Device, TrainError> {
        let index = terse_comm::gpu_of_process(index);
        cuda_check::check(&cuda_check::ThisMachine, index, precision)
            .map_err(|e| self.unavailable(e))?;
        let device = Device::cuda(index);
        probe(&device)
            .map_err(|reason| self.unavailable(format!("the GPU failed to start: {reason}")))?;
        Ok(device)
    }

    fn unavailable(&self, reason: String) -> TrainError {
        TrainError::InvalidRun {
            field: "train.device",
            reason: format!("`{self}` cannot be used: {reason}"),
        }
    }
}

/// Why wgpu `device` cannot run `train.precision = "fp16"`, given whether
/// cubecl registered f16 for its adapter (it does where the adapter has
/// WebGPU's `shader-f16`; `None`: no cubecl client), else `None`. Worded
/// as `Precision::check_device`'s refusals ("cannot run on device"), which
/// the bundle's run.sh records as refused rather than failed.
fn fp16_missing(
    has_f16: Option<bool>,
    device: &DeviceChoice,
    adapter: impl FnOnce() -> Option<String>,
) -> Option<String> {
    (has_f16 != Some(true)).then(|| {
        format!(
            "train.precision = \"fp16\" cannot run on device {device}, whose adapter ({}) \
             lacks WebGPU's shader-f16: it computes in fp32 (train.precision = \"fp32\")",
            adapter().unwrap_or_else(|| "unnamed".into())
        )
    })
}

/// What a machine needs for `wgpu`, said with every error.
const HOW: &str = " (Vulkan needs a driver and the loader: `libvulkan1` and \
                   `mesa-vulkan-drivers` for lavapipe, the GPU vendor's driver for a GPU)";

type Adapter = wgpu::AdapterInfo;

/// The adapters of the graphics API burn's wgpu backend comes up on (the
/// first of Vulkan, Metal, DX12 and OpenGL this machine has one for), listed
/// once per process: the Vulkan loader crashes when instances come and go
/// on several threads at once, and every thread rank opens the device.
fn adapters() -> &'static [Adapter] {
    static FOUND: std::sync::OnceLock<Vec<Adapter>> = std::sync::OnceLock::new();
    FOUND.get_or_init(|| {
        for backend in [
            wgpu::Backend::Vulkan,
            wgpu::Backend::Metal,
            wgpu::Backend::Dx12,
            wgpu::Backend::Gl,
        ] {
            let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
                backends: backend.into(),
                ..wgpu::InstanceDescriptor::new_without_display_handle()
            });
            let found: Vec<Adapter> =
                futures_lite::future::block_on(instance.enumerate_adapters(backend.into()))
                    .iter()
                    .map(wgpu::Adapter::get_info)
                    .collect();
            if !found.is_empty() {
                return found;
            }
        }
        Vec::new()
    })
}

/// Runs one small computation on `device`; wgpu starts its adapter lazily
/// and panics when there is none, so the panic is caught (and kept off the
/// terminal) and returned as its message. The panic hook is process-wide
/// and every thread rank probes: one probe at a time, or two interleaved
/// swaps would leave the silent hook installed for good.
fn probe(device: &Device) -> Result<(), String> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(|| {
        let x = Tensor::<1>::from_floats([1.0, 2.0, 3.0], device);
        x.sum().into_scalar::<f32>()
    });
    std::panic::set_hook(previous);
    match outcome {
        Ok(6.0) => Ok(()),
        Ok(sum) => Err(format!("a test sum gave {sum}, not 6")),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the adapter failed to start".into())
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_print_back() {
        for (text, choice) in [
            ("cpu", DeviceChoice::Cpu),
            ("wgpu", DeviceChoice::Wgpu),
            ("vulkan", DeviceChoice::Wgpu),
            ("wgpu:1", DeviceChoice::WgpuDiscrete(1)),
            ("lavapipe", DeviceChoice::Lavapipe),
            ("cuda", DeviceChoice::Cuda(0)),
            ("cuda:3", DeviceChoice::Cuda(3)),
        ] {
            assert_eq!(text.parse::<DeviceChoice>(), Ok(choice));
            assert_eq!(choice.to_string().parse::<DeviceChoice>(), Ok(choice));
        }
        assert_eq!(DeviceChoice::Cuda(0).to_string(), "cuda");
        let error = "gpu3".parse::<DeviceChoice>().unwrap_err();
        assert!(error.contains("unknown device `gpu3`") && error.contains("lavapipe"));
        let error = "cuda:x".parse::<DeviceChoice>().unwrap_err();
        assert!(error.contains("cuda:N"), "{error}");
    }

    /// lavapipe has shader-f16 (an fp16 run opens it); an adapter without
    /// it refuses fp16 by name (no such adapter here: the decision alone).
    #[test]
    fn fp16_on_wgpu_needs_the_adapter_s_shader_f16() {
        DeviceChoice::Lavapipe.open(Precision::Fp16).unwrap();
        let wgpu = DeviceChoice::Wgpu;
        assert_eq!(fp16_missing(Some(true), &wgpu, || None), None);
        let why = fp16_missing(Some(false), &wgpu, || Some("SomeGPU".into())).unwrap();
        assert!(
            why.contains(
                "\"fp16\" cannot run on device wgpu, whose adapter (SomeGPU) lacks WebGPU's \
                 shader-f16"
            ),
            "{why}"
        );
        let why = fp16_missing(None, &wgpu, || None).unwrap();
        assert!(why.contains("(unnamed)"), "{why}");
    }

    /// The CPU has no device memory to state, and wgpu's runtime states
    /// none (lavapipe here); CUDA's is `cuDeviceTotalMem`, which only a
    /// GPU machine can show.
    #[test]
    fn memory_capacity_only_where_the_runtime_states_it() {
        assert_eq!(DeviceChoice::Cpu.memory_capacity(), None);
        assert_eq!(DeviceChoice::Lavapipe.memory_capacity(), None);
    }

    #[test]
    fn the_hardware_is_named_as_its_runtime_names_it() {
        assert_eq!(DeviceChoice::Cpu.hardware(), None);
        let lavapipe = DeviceChoice::Lavapipe
            .hardware()
            .expect("lavapipe has a name");
        assert!(lavapipe.starts_with("llvmpipe"), "{lavapipe}");
        // No driver here: nothing to name, and no error either (the device
        // check has said what is missing before a run logs this).
        assert_eq!(DeviceChoice::Cuda(0).hardware(), None);
    }

    /// This machine has no NVIDIA driver (CI's neither): the real lookup
    /// refuses the device in one line naming the setting and the driver,
    /// before burn's CUDA backend (which would panic) is touched.
    #[test]
    fn cuda_without_a_driver_is_one_line_naming_what_is_missing() {
        use cuda_check::Machine as _;
        assert!(
            !cuda_check::ThisMachine.has_driver(),
            "this test is for machines without an NVIDIA driver (CI's)"
        );
        let error = DeviceChoice::Cuda(0)
            .open(Precision::Fp32)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "invalid run setting `train.device`: `cuda` cannot be used: no NVIDIA driver"
            ),
            "{error}"
        );
        assert_eq!(error.lines().count(), 1, "{error}");
    }
}

//! `train.precision`: the type the model's forward and backward compute in.
//! The parameters the optimizer steps, the flat gradient and every
//! optimizer state stay fp32 in all four; what the compressed allreduce
//! sends does not change with it.

use std::fmt;

use burn::tensor::FloatDType;
use serde::{Deserialize, Serialize};

use crate::DeviceChoice;

/// The compute type of a run's model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp32 throughout (on CUDA the matmuls are TF32 all the same: cubek
    /// feeds f32 operands to TF32 tensor cores from sm_80 on, and cubecl
    /// 0.11 has no switch for strict fp32).
    #[default]
    Fp32,
    /// fp32 with TF32 matmuls (CUDA on sm_80 and newer).
    Tf32,
    /// bf16 matmuls and activations, fp32 LayerNorm, softmax and losses
    /// (PyTorch's `autocast(dtype=torch.bfloat16)`, DeepSpeed's `bf16`).
    Bf16,
    /// fp16 as bf16, with dynamic loss scaling (`train.loss_scaling`;
    /// DeepSpeed's `fp16`).
    Fp16,
}

impl Precision {
    /// Every precision, in the order `--help` lists them.
    pub const ALL: [Precision; 4] = [Self::Fp32, Self::Tf32, Self::Bf16, Self::Fp16];

    /// The half type the forward's matmuls cast to (`None`: fp32).
    pub fn half(self) -> Option<FloatDType> {
        match self {
            Self::Fp32 | Self::Tf32 => None,
            Self::Bf16 => Some(FloatDType::BF16),
            Self::Fp16 => Some(FloatDType::F16),
        }
    }

    /// Whether the loss is scaled (and overflowing steps skipped).
    pub fn scales_loss(self) -> bool {
        self == Self::Fp16
    }

    /// The precisions `device` computes in, and why it lacks the others.
    /// flex (this CPU) has bf16 and fp16 matmuls and arithmetic in burn
    /// 0.22 but no TF32; wgpu's Vulkan has no bf16 arithmetic in cubecl
    /// 0.11, and fp16 where the adapter has `shader-f16` (asked when the
    /// device opens, `DeviceChoice::open`; lavapipe has it, and its fp16
    /// runs follow fp32's losses, `crates/cli/tests/mixed_precision.rs`);
    /// CUDA has all four.
    pub fn supported_on(device: &DeviceChoice) -> (&'static [Precision], &'static str) {
        match device {
            DeviceChoice::Cpu => (
                &[Self::Fp32, Self::Bf16, Self::Fp16],
                "TF32 is a tensor-core format of NVIDIA GPUs",
            ),
            DeviceChoice::Wgpu | DeviceChoice::WgpuDiscrete(_) | DeviceChoice::Lavapipe => (
                &[Self::Fp32, Self::Fp16],
                "cubecl 0.11 has bf16 and TF32 arithmetic only on CUDA; fp16 where the \
                 adapter has shader-f16",
            ),
            DeviceChoice::Cuda(_) => (&Self::ALL, ""),
        }
    }

    /// What this precision means on `device` where that is not what its
    /// name says, for the run's log: on CUDA, cubek stages f32 matmul
    /// operands as TF32 from sm_80 on, so `fp32` is `tf32` there (PyTorch
    /// keeps them f32 unless told; a DeepSpeed user comparing runs needs to
    /// know).
    pub fn note_on(self, device: &DeviceChoice) -> Option<String> {
        match (self, device) {
            (Self::Fp32, DeviceChoice::Cuda(_)) => Some(format!(
                "train.precision = \"fp32\" on {device}: the matmuls run in TF32 on GPUs of \
                 compute capability 8.0 and newer (cubecl 0.11 stages f32 operands as TF32 \
                 and has no strict-f32 switch), as with \"tf32\"; elementwise ops, \
                 reductions, gradients and the optimizer are f32; train.matmul = \"cublas\" \
                 runs the linear layers' matmuls in f32 through cuBLAS, as PyTorch does \
                 (attention's two products stay TF32)"
            )),
            (Self::Tf32, DeviceChoice::Cuda(_)) => Some(format!(
                "train.precision = \"tf32\" on {device}: the same as \"fp32\" there (cubecl \
                 0.11 stages f32 matmul operands as TF32 on compute capability 8.0 and newer \
                 either way; on older GPUs both are f32); train.matmul = \"cublas_tf32\" runs \
                 the linear layers' matmuls as cuBLAS's TF32"
            )),
            _ => None,
        }
    }

    /// `Ok` when `device` computes in this precision, else the refusal
    /// naming the device and the precisions it has (never a silent fp32).
    pub fn check_device(self, device: &DeviceChoice) -> Result<(), String> {
        let (supported, why) = Self::supported_on(device);
        if supported.contains(&self) {
            return Ok(());
        }
        let names: Vec<String> = supported.iter().map(ToString::to_string).collect();
        Err(format!(
            "train.precision = \"{self}\" cannot run on device {device}, which computes in {} \
             ({why})",
            names.join(", ")
        ))
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.to_string() == text)
            .ok_or_else(|| format!("unknown precision `{text}` (fp32, tf32, bf16, fp16)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp32_and_tf32_on_cuda_say_they_are_one_and_nowhere_else() {
        let note = Precision::Fp32
            .note_on(&DeviceChoice::Cuda(0))
            .expect("a note on cuda");
        assert!(note.contains("TF32") && note.contains("cuda"), "{note}");
        let note = Precision::Tf32
            .note_on(&DeviceChoice::Cuda(0))
            .expect("a note on cuda");
        assert!(
            note.contains("the same as \"fp32\"") && note.contains("cublas_tf32"),
            "{note}"
        );
        for device in [DeviceChoice::Cpu, DeviceChoice::Lavapipe] {
            assert_eq!(Precision::Fp32.note_on(&device), None);
        }
        for precision in [Precision::Bf16, Precision::Fp16] {
            assert_eq!(precision.note_on(&DeviceChoice::Cuda(0)), None);
        }
    }

    #[test]
    fn wgpu_refuses_bf16_and_tf32_naming_the_device_and_what_it_has() {
        for device in [DeviceChoice::Lavapipe, DeviceChoice::Wgpu] {
            for refused in [Precision::Bf16, Precision::Tf32] {
                let err = refused.check_device(&device).unwrap_err();
                assert!(
                    err.contains(&format!("\"{refused}\" cannot run on device {device}")),
                    "{err}"
                );
                assert!(err.contains("computes in fp32, fp16 ("), "{err}");
            }
            // fp16 then depends on the adapter (`DeviceChoice::open`).
            for allowed in [Precision::Fp32, Precision::Fp16] {
                allowed.check_device(&device).unwrap();
            }
        }
    }

    #[test]
    fn the_cpu_has_the_half_types_but_not_tf32() {
        let err = Precision::Tf32
            .check_device(&DeviceChoice::Cpu)
            .unwrap_err();
        assert!(err.contains("fp32, bf16, fp16"), "{err}");
        for p in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
            p.check_device(&DeviceChoice::Cpu).unwrap();
        }
        for p in Precision::ALL {
            p.check_device(&DeviceChoice::Cuda(0)).unwrap();
        }
    }

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(p.to_string().parse::<Precision>(), Ok(p));
        }
        assert!("half".parse::<Precision>().is_err());
    }
}

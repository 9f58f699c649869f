//! Device and precision selection: the one seam where CPU and CUDA differ.
//!
//! Everything that places tensors asks this module, so `--device cuda:1 --dtype bf16` on a GPU
//! machine and the defaults on a CPU-only one go through the same code. `--dtype auto` means bf16
//! on CUDA and on CPUs with bf16 matrix instructions, f32 on other CPUs ([`Precision::auto`]);
//! `RLHOST_CPU_BF16` ([`CPU_BF16_ENV`]) overrides the CPU probe.

use std::fmt;
use std::str::FromStr;

/// Errors while parsing or resolving a device or precision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device string is not `auto`, `cpu`, `cuda` or `cuda:N`.
    #[error("invalid device {0:?}: expected auto, cpu, cuda or cuda:N")]
    InvalidDevice(String),
    /// `RLHOST_CPU_BF16` is set to something other than `0` or `1`.
    #[error(
        "invalid RLHOST_CPU_BF16={0:?}: expected 0 (act as a CPU without bf16 matrix instructions) or 1 (with them)"
    )]
    InvalidCpuBf16(String),
    /// `RLHOST_CPU_KERNELS` is set to something other than `auto`, `avx2` or `avx512-bf16`.
    #[error(
        "invalid RLHOST_CPU_KERNELS={0:?}: expected auto (what this CPU has), avx2 (bf16 products \
         widened to f32, as on a CPU without bf16 instructions) or avx512-bf16 (the AVX-512 BF16 \
         kernels, emulated where this CPU lacks them)"
    )]
    InvalidCpuKernels(String),
    /// The precision string is not a known dtype name.
    #[error("invalid dtype {0:?}: expected f32 (float32) or bf16 (bfloat16)")]
    InvalidDtype(String),
    /// CUDA was asked for and this build or machine has none.
    #[error("device {requested} requested but CUDA is not available ({why})")]
    CudaUnavailable {
        /// The device as requested.
        requested: DeviceSpec,
        /// Why: not compiled in, or no device found.
        why: &'static str,
    },
    /// A CUDA ordinal beyond the devices present.
    #[error("device cuda:{ordinal} requested but only {count} CUDA device(s) are present")]
    NoSuchCudaDevice {
        /// The requested ordinal.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
}

/// A device as a user writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// CUDA device 0 when available, else the CPU.
    #[default]
    Auto,
    /// The CPU, written `cpu`.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Self::Cuda)
                .ok_or_else(|| DeviceError::InvalidDevice(s.to_owned())),
        }
    }
}

/// `cpu` or `cuda:N`: a resolved device as `--device` and torch write it.
pub fn name(device: tch::Device) -> String {
    match device {
        tch::Device::Cuda(n) => format!("cuda:{n}"),
        tch::Device::Mps => "mps".to_owned(),
        tch::Device::Vulkan => "vulkan".to_owned(),
        tch::Device::Cpu => "cpu".to_owned(),
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What this build and machine offer, as far as device selection cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaStatus {
    /// The binary was built with the `cuda` feature (libtorch_cuda linked in).
    pub compiled: bool,
    /// Number of CUDA devices libtorch sees (0 when not compiled in).
    pub device_count: usize,
}

impl CudaStatus {
    /// Asks libtorch.
    pub fn probe() -> Self {
        let device_count = if tch::Cuda::is_available() {
            usize::try_from(tch::Cuda::device_count()).unwrap_or(0)
        } else {
            0
        };
        Self {
            compiled: cfg!(feature = "cuda"),
            device_count,
        }
    }

    /// Whether at least one CUDA device can be used.
    pub fn available(&self) -> bool {
        self.device_count > 0
    }
}

impl DeviceSpec {
    /// The concrete device, given what CUDA offers. `Auto` never fails.
    /// On the CPU, [`CPU_KERNELS_ENV`] is checked here, before any work.
    pub fn resolve(self, cuda: CudaStatus) -> Result<tch::Device, DeviceError> {
        let device = self.resolve_device(cuda)?;
        if device == tch::Device::Cpu {
            CpuKernels::from_env()?;
        }
        Ok(device)
    }

    fn resolve_device(self, cuda: CudaStatus) -> Result<tch::Device, DeviceError> {
        match self {
            Self::Cpu => Ok(tch::Device::Cpu),
            Self::Auto if cuda.available() => Ok(tch::Device::Cuda(0)),
            Self::Auto => {
                if !cuda.compiled && nvidia_driver_present() {
                    tracing::warn!(
                        "this machine has an NVIDIA driver but this host was built without CUDA: \
                         running on the CPU (build with `make build CUDA=1`; `host doctor` says more)"
                    );
                }
                Ok(tch::Device::Cpu)
            }
            Self::Cuda(_) if !cuda.compiled => Err(DeviceError::CudaUnavailable {
                requested: self,
                why: "this host binary was built without the `cuda` feature",
            }),
            Self::Cuda(_) if !cuda.available() => Err(DeviceError::CudaUnavailable {
                requested: self,
                why: "libtorch sees no CUDA device",
            }),
            Self::Cuda(n) if n >= cuda.device_count => Err(DeviceError::NoSuchCudaDevice {
                ordinal: n,
                count: cuda.device_count,
            }),
            Self::Cuda(n) => Ok(tch::Device::Cuda(n)),
        }
    }
}

/// Whether the NVIDIA kernel driver is loaded (it lists itself in `/proc/driver/nvidia`).
pub fn nvidia_driver_present() -> bool {
    std::path::Path::new("/proc/driver/nvidia/version").exists()
}

/// The bf16 matrix instructions a CPU offers, read from the flags the kernel lists in
/// `/proc/cpuinfo` (which name a feature only when the kernel also enables it, as AMX needs).
/// With any of them libtorch's bf16 matrix products run in hardware (oneDNN); without, bf16 is
/// converted to f32 around every product and is slower than f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct CpuBf16 {
    /// x86 `avx512_bf16` (dot products of bf16 pairs).
    pub avx512_bf16: bool,
    /// x86 `amx_bf16` (tile matrix multiply, Sapphire Rapids and later).
    pub amx_bf16: bool,
    /// aarch64 `bf16` (BFDOT/BFMMLA).
    pub arm_bf16: bool,
    /// Set from [`CPU_BF16_ENV`] (`1`: as if the CPU had bf16 matrix instructions, `0`: as if it
    /// had none), whatever the flags say; `None` where the variable is unset.
    pub forced: Option<bool>,
}

/// The environment variable that overrides what [`CpuBf16::detect`] reads from the CPU: `1` makes
/// `--dtype auto` pick bf16 as on a CPU with bf16 matrix instructions, `0` f32 as on one without.
/// For running the test suite as either kind of CPU would (`RLHOST_CPU_BF16=1 make test` on an
/// AVX2 machine) and for users whose kernel hides the flags; `host doctor` says when it is set.
pub const CPU_BF16_ENV: &str = "RLHOST_CPU_BF16";

impl CpuBf16 {
    /// What this machine's CPU offers (nothing, where `/proc/cpuinfo` cannot be read), with
    /// [`CPU_BF16_ENV`]'s override where it is set to `0` or `1`. Any other value is an error
    /// naming the variable.
    pub fn detect() -> Result<Self, DeviceError> {
        Self::read_cpu().with_env_override()
    }

    /// What `/proc/cpuinfo` says, without [`CPU_BF16_ENV`] (nothing where it cannot be read).
    pub fn read_cpu() -> Self {
        std::fs::read_to_string("/proc/cpuinfo")
            .map(|text| Self::from_cpuinfo(&text))
            .unwrap_or_default()
    }

    /// `self` with [`CPU_BF16_ENV`]'s override where it is set to `0` or `1`; any other value is
    /// an error naming the variable.
    pub fn with_env_override(mut self) -> Result<Self, DeviceError> {
        self.forced = match std::env::var(CPU_BF16_ENV) {
            Err(std::env::VarError::NotPresent) => None,
            Ok(v) if v.trim() == "1" => Some(true),
            Ok(v) if v.trim() == "0" => Some(false),
            Ok(v) => return Err(DeviceError::InvalidCpuBf16(v)),
            Err(std::env::VarError::NotUnicode(v)) => {
                return Err(DeviceError::InvalidCpuBf16(
                    v.to_string_lossy().into_owned(),
                ));
            }
        };
        Ok(self)
    }

    /// Reads the first processor's `flags` (x86) or `Features` (aarch64) line of a
    /// `/proc/cpuinfo` text.
    pub fn from_cpuinfo(text: &str) -> Self {
        let line = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.split_whitespace().collect::<Vec<_>>())
            })
        };
        let x86 = line("flags").unwrap_or_default();
        let arm = line("Features").unwrap_or_default();
        Self {
            avx512_bf16: x86.contains(&"avx512_bf16"),
            amx_bf16: x86.contains(&"amx_bf16"),
            arm_bf16: arm.contains(&"bf16"),
            forced: None,
        }
    }

    /// Whether bf16 matrix products run in hardware (or [`CPU_BF16_ENV`] says to act as if).
    pub fn matrix(&self) -> bool {
        self.forced
            .unwrap_or(self.avx512_bf16 || self.amx_bf16 || self.arm_bf16)
    }

    /// The instructions found, by their `/proc/cpuinfo` names.
    pub fn found(&self) -> String {
        let names: Vec<&str> = [
            (self.avx512_bf16, "avx512_bf16"),
            (self.amx_bf16, "amx_bf16"),
            (self.arm_bf16, "bf16"),
        ]
        .into_iter()
        .filter_map(|(has, name)| has.then_some(name))
        .collect();
        let found = match names.is_empty() {
            true => "none".to_owned(),
            false => names.join(", "),
        };
        match self.forced {
            Some(f) => format!("{found}; {CPU_BF16_ENV}={} overrides it", u8::from(f)),
            None => found,
        }
    }
}

/// The environment variable that picks which instructions the CPU's bf16 products run on
/// ([`CpuKernels`]): for running the test suite down the path another kind of CPU takes
/// (`RLHOST_CPU_BF16=1 RLHOST_CPU_KERNELS=avx512-bf16 make test` on an AVX2 machine runs what
/// an AVX-512 BF16 CPU runs), and for measuring one path against the other on one machine.
/// `host doctor` says when it is set; an invalid value is refused when a device is resolved.
pub const CPU_KERNELS_ENV: &str = "RLHOST_CPU_KERNELS";

/// Which instructions the CPU's bf16 matrix products run on ([`CPU_KERNELS_ENV`]). f32 products
/// are the same under every value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuKernels {
    /// What the CPU has: few-row products by AVX-512 BF16 dot products where the CPU has them,
    /// else widened to f32 in registers; larger ones by libtorch's bf16 BLAS where the CPU has
    /// bf16 matrix instructions, else widened to f32 for its f32 BLAS.
    #[default]
    Auto,
    /// As on a CPU with AVX2 only, whatever this one has: bf16 operands widened to f32 (the
    /// few-rows kernel, then the f32 BLAS beyond its rows), and rotary by slices.
    Avx2,
    /// As on a CPU with AVX-512 BF16, whatever this one has: few-row products by the AVX-512
    /// BF16 kernel, on its portable emulation where this CPU lacks the instructions (the same
    /// results bit for bit, far slower), and larger ones by libtorch's bf16 BLAS (which emulates
    /// bf16 itself on such a CPU).
    Avx512Bf16,
}

impl CpuKernels {
    /// [`CPU_KERNELS_ENV`]'s value ([`CpuKernels::Auto`] where it is unset or empty); any
    /// other value than `auto`, `avx2` or `avx512-bf16` is an error naming the variable.
    pub fn from_env() -> Result<Self, DeviceError> {
        match std::env::var(CPU_KERNELS_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Self::Auto),
            Ok(v) => match v.trim() {
                "" | "auto" => Ok(Self::Auto),
                "avx2" => Ok(Self::Avx2),
                "avx512-bf16" => Ok(Self::Avx512Bf16),
                _ => Err(DeviceError::InvalidCpuKernels(v)),
            },
            Err(std::env::VarError::NotUnicode(v)) => Err(DeviceError::InvalidCpuKernels(
                v.to_string_lossy().into_owned(),
            )),
        }
    }
}

impl fmt::Display for CpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Avx2 => "avx2",
            Self::Avx512Bf16 => "avx512-bf16",
        })
    }
}

/// This machine's CPU for a benchmark's table: its model name, the cores this process may use,
/// and the vector and matrix instructions that decide its kernels (those present among avx2,
/// fma, avx512f, avx512_bf16, amx_bf16, amx_tile; aarch64's bf16). Figures name the CPU they
/// ran on.
pub fn cpu_summary() -> String {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    let name = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let flags = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default();
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let wanted = [
        "avx2",
        "fma",
        "avx512f",
        "avx512_bf16",
        "amx_bf16",
        "amx_tile",
        "bf16",
    ];
    let present: Vec<&str> = wanted.into_iter().filter(|w| flags.contains(w)).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!(
        "{name}, {cores} cores, {}",
        if present.is_empty() {
            "none of avx2/avx512/amx".to_owned()
        } else {
            present.join(" ")
        }
    )
}

/// Floating-point precision of weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    /// 32-bit floats: the CPU default without bf16 hardware, and the trainer's precision.
    F32,
    /// bfloat16: the default on CUDA and on CPUs with bf16 matrix instructions.
    Bf16,
}

impl Precision {
    /// The precision `--dtype auto` picks for `device` on this machine: bf16 on CUDA, and on a
    /// CPU with bf16 matrix instructions ([`CpuBf16::detect`]); f32 otherwise.
    pub fn default_for(device: tch::Device) -> Result<Self, DeviceError> {
        Ok(Self::auto(device, &CpuBf16::detect()?).0)
    }

    /// The precision `--dtype auto` picks for `device` on a CPU offering `cpu`, and why.
    pub fn auto(device: tch::Device, cpu: &CpuBf16) -> (Self, String) {
        match device {
            tch::Device::Cpu if cpu.forced == Some(true) => (
                Self::Bf16,
                format!("{CPU_BF16_ENV}=1 (this CPU has: {})", cpu.found()),
            ),
            tch::Device::Cpu if cpu.forced == Some(false) => (
                Self::F32,
                format!("{CPU_BF16_ENV}=0 (this CPU has: {})", cpu.found()),
            ),
            tch::Device::Cpu if cpu.matrix() => (
                Self::Bf16,
                format!("this CPU has bf16 matrix instructions ({})", cpu.found()),
            ),
            tch::Device::Cpu => (
                Self::F32,
                "this CPU has no bf16 matrix instructions (none of avx512_bf16, amx_bf16, \
                 aarch64 bf16 in /proc/cpuinfo): bf16 would be emulated, slower than f32"
                    .to_owned(),
            ),
            _ => (Self::Bf16, "a CUDA device".to_owned()),
        }
    }

    /// The compute precision a trainer's `dtype` names on `device` (`trainer.dtype`, `host sft
    /// --dtype`): `auto` is bf16 on CUDA and f32 on the CPU, where training in bf16 is slower
    /// than in f32 even with bf16 matrix instructions (libtorch converts around each product).
    pub fn for_training(dtype: &str, device: tch::Device) -> Result<Self, DeviceError> {
        match dtype {
            "auto" if device.is_cuda() => Ok(Self::Bf16),
            "auto" => Ok(Self::F32),
            other => other.parse(),
        }
    }

    /// The libtorch element kind of weights at this precision (`Float` or `BFloat16`).
    pub fn kind(self) -> tch::Kind {
        match self {
            Self::F32 => tch::Kind::Float,
            Self::Bf16 => tch::Kind::BFloat16,
        }
    }
}

impl FromStr for Precision {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" | "float" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            _ => Err(DeviceError::InvalidDtype(s.to_owned())),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_CUDA: CudaStatus = CudaStatus {
        compiled: false,
        device_count: 0,
    };
    const TWO_GPUS: CudaStatus = CudaStatus {
        compiled: true,
        device_count: 2,
    };

    #[test]
    fn auto_picks_bf16_only_where_the_cpu_multiplies_bf16_in_hardware() {
        let sapphire = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 \
                        amx_tile\nprocessor\t: 1\nflags\t\t: fpu\n";
        let zen3 = "processor\t: 0\nflags\t\t: fpu sse fma avx avx2\n";
        let zen4 = "flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n";
        let graviton3 = "processor\t: 0\nFeatures\t: fp asimd sve i8mm bf16\n";
        let graviton2 = "Features\t: fp asimd atomics\n";
        let cpu = CpuBf16::from_cpuinfo;
        assert_eq!(
            cpu(sapphire),
            CpuBf16 {
                avx512_bf16: true,
                amx_bf16: true,
                arm_bf16: false,
                forced: None,
            }
        );
        assert_eq!(cpu(sapphire).found(), "avx512_bf16, amx_bf16");
        assert!(!cpu(zen3).matrix());
        assert_eq!(cpu(zen3).found(), "none");
        assert!(cpu(zen4).matrix() && !cpu(zen4).amx_bf16);
        assert!(cpu(graviton3).arm_bf16 && cpu(graviton3).matrix());
        assert!(!cpu(graviton2).matrix());
        assert!(!cpu("").matrix());
        // A flag name that merely contains the word does not count.
        assert!(!cpu("flags : avx512_bf16x\n").matrix());
        let cpu0 = tch::Device::Cpu;
        assert_eq!(Precision::auto(cpu0, &cpu(sapphire)).0, Precision::Bf16);
        assert!(Precision::auto(cpu0, &cpu(sapphire)).1.contains("amx_bf16"));
        assert_eq!(Precision::auto(cpu0, &cpu(zen3)).0, Precision::F32);
        assert!(
            Precision::auto(cpu0, &cpu(zen3))
                .1
                .contains("no bf16 matrix")
        );
        assert_eq!(Precision::auto(cpu0, &cpu(graviton3)).0, Precision::Bf16);
        // The override wins both ways and says so.
        let forced = |text: &str, f: bool| CpuBf16 {
            forced: Some(f),
            ..cpu(text)
        };
        assert_eq!(
            Precision::auto(cpu0, &forced(zen3, true)).0,
            Precision::Bf16
        );
        assert_eq!(
            Precision::auto(cpu0, &forced(zen4, false)).0,
            Precision::F32
        );
        assert!(
            Precision::auto(cpu0, &forced(zen4, false))
                .1
                .contains("RLHOST_CPU_BF16=0")
        );
        assert!(
            forced(zen3, true)
                .found()
                .contains("RLHOST_CPU_BF16=1 overrides")
        );
        // CUDA is bf16 whatever the CPU.
        assert_eq!(
            Precision::auto(tch::Device::Cuda(0), &cpu(zen3)).0,
            Precision::Bf16
        );
    }

    #[test]
    fn parses_device_strings() {
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu));
        assert_eq!("AUTO".parse(), Ok(DeviceSpec::Auto));
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceSpec::Cuda(3)));
        for bad in ["cuda:", "cuda:-1", "cuda:x", "tpu", ""] {
            assert_eq!(
                bad.parse::<DeviceSpec>(),
                Err(DeviceError::InvalidDevice(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            DeviceSpec::Cuda(2).to_string().parse(),
            Ok(DeviceSpec::Cuda(2))
        );
    }

    #[test]
    fn auto_falls_back_to_cpu_and_prefers_cuda() {
        assert_eq!(DeviceSpec::Auto.resolve(NO_CUDA), Ok(tch::Device::Cpu));
        assert_eq!(DeviceSpec::Auto.resolve(TWO_GPUS), Ok(tch::Device::Cuda(0)));
    }

    #[test]
    fn explicit_cuda_without_cuda_says_why() {
        let err = DeviceSpec::Cuda(0).resolve(NO_CUDA).unwrap_err();
        assert!(
            err.to_string().contains("without the `cuda` feature"),
            "{err}"
        );
        let no_device = CudaStatus {
            compiled: true,
            device_count: 0,
        };
        let err = DeviceSpec::Cuda(0).resolve(no_device).unwrap_err();
        assert!(err.to_string().contains("no CUDA device"), "{err}");
        assert_eq!(
            DeviceSpec::Cuda(2).resolve(TWO_GPUS),
            Err(DeviceError::NoSuchCudaDevice {
                ordinal: 2,
                count: 2
            })
        );
        assert_eq!(
            DeviceSpec::Cuda(1).resolve(TWO_GPUS),
            Ok(tch::Device::Cuda(1))
        );
    }

    #[test]
    fn precision_defaults_and_parsing() {
        assert_eq!(
            Precision::default_for(tch::Device::Cuda(0)),
            Ok(Precision::Bf16)
        );
        assert_eq!("bfloat16".parse(), Ok(Precision::Bf16));
        assert_eq!("F32".parse(), Ok(Precision::F32));
        assert!("fp8".parse::<Precision>().is_err());
        assert_eq!(Precision::Bf16.kind(), tch::Kind::BFloat16);
    }

    #[test]
    fn this_machine_matches_its_build() {
        // A binary built without `cuda` can never see a CUDA device (libtorch_cuda is not linked).
        let status = CudaStatus::probe();
        if !status.compiled {
            assert!(!status.available());
        }
        let t = tch::Tensor::ones([2, 2], (Precision::F32.kind(), tch::Device::Cpu));
        assert_eq!(t.sum(tch::Kind::Float).double_value(&[]), 4.0);
    }
}

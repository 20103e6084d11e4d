//! Facts about this machine that results record.

/// The CPU's model name as `/proc/cpuinfo` gives it ("unknown" where it
/// cannot be read): the ratio to PyTorch depends on it (gemm's and MKL's
/// kernels differ between CPU vendors), so every run records it.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

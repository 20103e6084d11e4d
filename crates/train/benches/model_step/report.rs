//! `model_step`'s JSON line per model ([`report`]): throughput, the
//! forward / backward / rest split, the host-timed breakdown by class of op
//! and, on a cubecl device, the dispatches, the device memory and, with
//! `--kernel-times`, the kernels' device time by kind.

use std::collections::BTreeMap;

use cubecl::config::{TypeNameFormatLevel, type_name_format};
use terse_fused as fused;
use terse_fused::op_profile::OpClass;
use terse_kernels::dispatches::KernelTimes;

use super::Timings;

/// One JSON line: throughput, the forward / backward / rest split and the
/// per-class breakdown ("other": the step less every timed class and the
/// wait at its end).
pub(crate) fn report(
    name: &str,
    device: &terse_train::DeviceChoice,
    batch: usize,
    extra: &str,
    t: &Timings,
) {
    let steps = t.steps;
    // Which GPU (or adapter) the numbers are of, beside the choice's name.
    let hardware = device
        .hardware()
        .map_or(String::new(), |name| format!(" \"hardware\": {name:?},"));
    let mut breakdown: Vec<String> = OpClass::ALL
        .iter()
        .zip(t.classes)
        .map(|(class, ms)| format!("\"{}\": {ms:.1}", class.name()))
        .collect();
    breakdown.push(format!(
        "\"other\": {:.1}",
        t.step - t.device_wait - t.classes.iter().sum::<f64>()
    ));
    let mut device_fields = t.dispatches.as_ref().map_or(String::new(), |kinds| {
        let total: f64 = kinds.iter().map(|(_, n)| n).sum();
        let each: Vec<String> = kinds
            .iter()
            .map(|(kind, n)| format!("\"{}\": {n:.1}", kind.name()))
            .collect();
        format!(
            ", \"dispatches_per_step\": {total:.1}, \"dispatches_by_kind\": {{{}}}",
            each.join(", ")
        )
    });
    if let Some(times) = &t.kernel_times {
        device_fields += &kernel_time_fields(times, steps);
    }
    if let Some(memory) = &t.memory {
        device_fields += &format!(
            ", \"device_memory_mb\": {{\"in_use\": {:.3}, \"reserved\": {:.3}}}",
            memory.bytes_in_use as f64 / 1e6,
            memory.bytes_reserved as f64 / 1e6
        );
    }
    if let Some((scale, skipped)) = t.loss_scale {
        device_fields +=
            &format!(", \"loss_scale\": {scale}, \"overflow_skipped_steps\": {skipped}");
    }
    if let Some(name) = fused::named_linear_matmul() {
        device_fields += &format!(
            ", \"matmul\": \"{name}\", \"matmul_declined\": {}, \"matmul_first_decline\": {:?}",
            fused::declined_matmuls(),
            fused::first_decline_reason().unwrap_or_default()
        );
    }
    println!(
        "{{\"framework\": \"terse\", \"device\": \"{device}\",{hardware} \"preset\": \"{name}\", \"batch\": {batch},{extra} \
         \"threads\": {}, \"samples_per_s\": {:.3}, \"step_ms\": {:.1}, \"forward_ms\": {:.1}, \
         \"backward_ms\": {:.1}, \"optimizer_ms\": {:.1}, \"device_wait_ms\": {:.1}, \
         \"breakdown_ms\": {{{}}}{device_fields}}}",
        rayon::current_num_threads(),
        batch as f64 / (t.step / 1e3),
        t.step,
        t.forward,
        t.backward,
        t.step - t.forward - t.backward - t.device_wait,
        t.device_wait,
        breakdown.join(", "),
    );
}

/// `--kernel-times`' fields of the JSON line: the kernels' milliseconds per
/// step by kind and in all, and how they were timed; the 12 costliest
/// kernels on stderr.
fn kernel_time_fields(times: &KernelTimes, steps: f64) -> String {
    // Named as cubecl's profiling log names them (the type's name and its
    // first generic arguments), launches of one name together.
    let mut named: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for (name, &(launches, ms)) in &times.by_kernel {
        let short = type_name_format(name, TypeNameFormatLevel::Balanced);
        let entry = named.entry(short).or_default();
        (entry.0, entry.1) = (entry.0 + launches, entry.1 + ms);
    }
    let mut costliest: Vec<(String, (u64, f64))> = named.into_iter().collect();
    costliest.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
    for (name, (launches, ms)) in costliest.iter().take(12) {
        eprintln!(
            "{:>9.2} ms per step {:>7.1} launches  {name}",
            ms / steps,
            *launches as f64 / steps
        );
    }
    let kinds = times.by_kind();
    let total: f64 = kinds.values().sum::<f64>() / steps;
    let each: Vec<String> = kinds
        .iter()
        .map(|(kind, ms)| format!("\"{}\": {:.2}", kind.name(), ms / steps))
        .collect();
    let launches: u64 = times.by_kernel.values().map(|(n, _)| n).sum();
    let mut clock = if times.host_timed == 0 {
        "device".to_string()
    } else {
        format!("host for {} of {launches} launches", times.host_timed)
    };
    if times.waited > 0 {
        clock += &format!(
            ", {} of {launches} launches each waited for (cubecl's profiling logger is on)",
            times.waited
        );
    }
    format!(
        ", \"kernel_ms_per_step\": {total:.2}, \"kernel_ms_by_kind\": {{{}}}, \"kernel_clock\": \"{clock}\", \"kernels_timed_per_step\": {:.2}, \"kernels_unmeasured_per_step\": {:.2}",
        each.join(", "),
        launches as f64 / steps,
        times.unmeasured as f64 / steps
    )
}

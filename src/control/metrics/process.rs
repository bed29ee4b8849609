//! `vgate_build_info` and the `process_*` families (CPU, memory, descriptors, start time).

use super::out::Out;

/// `vgate_build_info` and the process metrics every Prometheus client library exports.
pub(super) fn process_families(o: &mut Out) {
    o.family("vgate_build_info");
    let pfring = if cfg!(vgate_pfring) { "true" } else { "false" };
    o.sample(
        "vgate_build_info",
        &[("version", env!("CARGO_PKG_VERSION")), ("pfring", pfring)],
        1,
    );
    let p = crate::control::process::sample();
    o.family("process_cpu_seconds_total");
    o.sample(
        "process_cpu_seconds_total",
        &[],
        format!("{:.3}", p.cpu_seconds),
    );
    for (fam, v) in [
        ("process_resident_memory_bytes", p.resident_bytes),
        ("process_open_fds", p.open_fds),
        ("process_max_fds", p.max_fds),
    ] {
        if let Some(v) = v {
            o.family(fam);
            o.sample(fam, &[], v);
        }
    }
    if let Some(t) = p.start_time_seconds {
        o.family("process_start_time_seconds");
        o.sample("process_start_time_seconds", &[], format!("{t:.2}"));
    }
}

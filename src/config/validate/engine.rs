//! `[engine]`: the capture mode and its knobs, queues and the CPUs the workers run on
//! ([`auto_cpus`] when none are given).

use toml::Spanned;

use crate::config::check::invalid;
use crate::config::raw::RawConfig;
use crate::config::{Cpus, EngineConfig, Mode, TnapiRing};

use super::Result;

pub(super) fn engine(raw: &RawConfig, machine: &Cpus) -> Result<EngineConfig> {
    let machine_cpus = machine.online.len();
    let e = &raw.engine;
    let queues = *e.queues.get_ref();
    if queues < 1 {
        return Err(invalid(
            &e.queues,
            "engine.queues",
            "needs at least one queue",
        ));
    }
    let queues = queues as usize;
    if queues > machine_cpus {
        return Err(invalid(
            &e.queues,
            "engine.queues",
            format!(
                "{queues} channels but this machine has {machine_cpus} online CPUs; one worker per core at most (the published model never runs more channels than cores)"
            ),
        ));
    }
    let mut cpus = Vec::new();
    let empty = Spanned::new(0..0, Vec::new());
    let cpu_list = e.cpus.as_ref().unwrap_or(&empty);
    for &c in cpu_list.get_ref() {
        if c < 0 || !machine.online.contains(&(c as usize)) {
            return Err(invalid(
                cpu_list,
                "engine.cpus",
                format!(
                    "CPU {c} is not online here (online CPUs: {}); name online CPUs or leave the list empty",
                    machine.online_list()
                ),
            ));
        }
        if cpus.contains(&(c as usize)) {
            return Err(invalid(
                cpu_list,
                "engine.cpus",
                format!("CPU {c} is listed twice; one worker per core"),
            ));
        }
        cpus.push(c as usize);
    }
    if cpus.is_empty() {
        cpus = auto_cpus(queues, machine);
    } else if cpus.len() != queues {
        return Err(invalid(
            cpu_list,
            "engine.cpus",
            format!(
                "lists {} CPUs for {queues} queues; give one CPU per queue or leave it empty",
                cpus.len()
            ),
        ));
    }
    let batch = *e.batch.get_ref();
    if !(1..=1024).contains(&batch) {
        return Err(invalid(
            &e.batch,
            "engine.batch",
            "must be between 1 and 1024 packets",
        ));
    }
    let max_payload = *e.max_payload.get_ref();
    if !(64..=9000).contains(&max_payload) {
        return Err(invalid(
            &e.max_payload,
            "engine.max_payload",
            "must be between 64 and 9000 bytes (jumbo frames at most)",
        ));
    }
    let mode = *e.mode.get_ref();
    if let Some(ring) = &e.tnapi.ring {
        if mode != Mode::Tnapi {
            return Err(invalid(
                ring,
                "engine.tnapi.ring",
                format!("applies to mode tnapi only (mode is {mode}); remove it or set engine.mode = \"tnapi\""),
            ));
        }
    }
    Ok(EngineConfig {
        mode,
        queues,
        cpus,
        batch: batch as usize,
        max_payload: max_payload as usize,
        tnapi_ring: e
            .tnapi
            .ring
            .as_ref()
            .map_or_else(TnapiRing::default, |r| *r.get_ref()),
        reserve_ports: e.reserve_ports,
    })
}

/// One CPU per queue, keeping CPU 0 for the kernel and the rest of the system when there is
/// room (the published model's tuning lesson); on two cores there is not.
pub fn auto_cpus(queues: usize, machine: &Cpus) -> Vec<usize> {
    // From the start-up affinity first (what the operator gave the service), its lowest CPU
    // kept free when there are more than two; then other online CPUs if it is too small.
    let allowed = &machine.allowed;
    let skip = usize::from(allowed.len() > 2 && queues < allowed.len());
    allowed
        .iter()
        .skip(skip)
        .chain(machine.online.iter().filter(|c| !allowed.contains(c)))
        .copied()
        .take(queues)
        .collect()
}

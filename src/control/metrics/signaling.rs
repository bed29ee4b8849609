//! The signaling routes' families: requests, responses, SIP call setup time, and every
//! proxy event in its family ([`EVENT_FAMILIES`]).

use super::families::{event_family, event_label};
use super::out::Out;
use super::{ControlState, EVENT_FAMILIES};

/// The signaling routes' requests, responses, call setup times and proxy events, each
/// event in the family [`EVENT_FAMILIES`] gives it.
pub(super) fn signaling_families(o: &mut Out, st: &ControlState) {
    let signaling = st.signaling.all();
    let kind_name = |k: crate::config::SignalingKind| match k {
        crate::config::SignalingKind::Sip => "sip",
        crate::config::SignalingKind::Rtsp => "rtsp",
    };
    for (fam, label) in [
        ("vgate_signaling_requests_total", "method"),
        ("vgate_signaling_responses_total", "class"),
    ] {
        o.family(fam);
        for (name, s) in &signaling {
            let values = if label == "method" {
                s.requests()
            } else {
                s.responses()
            };
            for (k, v) in values {
                o.sample(
                    fam,
                    &[("route", name), ("kind", kind_name(s.kind)), (label, k)],
                    v,
                );
            }
        }
    }
    o.family("vgate_signaling_call_setup_seconds");
    for (name, s) in &signaling {
        if s.kind != crate::config::SignalingKind::Sip {
            continue;
        }
        o.histogram(
            "vgate_signaling_call_setup_seconds",
            ("route", name),
            &s.call_setup,
        );
    }
    // Every event family once, in declaration order, with the samples that belong to it.
    let events: Vec<_> = signaling
        .iter()
        .map(|(name, s)| (name, kind_name(s.kind), s.events()))
        .collect();
    let mut families: Vec<&str> = EVENT_FAMILIES.iter().map(|e| e.1).collect();
    families.push("vgate_signaling_other_events_total");
    families.dedup();
    let mut done: Vec<&str> = Vec::new();
    for fam in families {
        if done.contains(&fam) {
            continue;
        }
        done.push(fam);
        o.family(fam);
        let label = event_label(fam);
        for (route, kind, list) in &events {
            for (event, v) in list {
                let (f, value) = event_family(event);
                if f != fam {
                    continue;
                }
                let mut labels = vec![("route", route.as_str()), ("kind", *kind)];
                if !value.is_empty() {
                    labels.push((label, value));
                }
                o.sample(fam, &labels, v);
            }
        }
    }
}

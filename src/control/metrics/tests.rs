//! Unit tests of the exposition: escaping and the family tables.

use super::families::event_family;
use super::out::escape;
use super::*;

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

#[test]
fn families_are_unique_and_named_vgate() {
    let all: Vec<_> = FAMILIES
        .iter()
        .chain(SPLIT_FAMILIES)
        .chain(HA_FAMILIES)
        .collect();
    let mut names: Vec<_> = all.iter().map(|f| f.0).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all.len());
    assert!(all
        .iter()
        .all(|f| matches!(f.1, "counter" | "gauge" | "histogram")));
    assert!(all
        .iter()
        .all(|f| f.0.starts_with("vgate_") || f.0.starts_with("process_")));
    assert!(all
        .iter()
        .filter(|f| f.1 == "counter")
        .all(|f| f.0.ends_with("_total")));
}

#[test]
fn every_event_family_is_declared() {
    for (event, fam, _) in EVENT_FAMILIES {
        assert!(FAMILIES.iter().any(|f| f.0 == *fam), "{event}: {fam}");
    }
    assert_eq!(
        event_family("nonsense").0,
        "vgate_signaling_other_events_total"
    );
}

#[test]
fn every_known_proxy_event_has_a_family() {
    let sip = crate::signaling::proxy::sip::Counters::default().list();
    let rtsp = crate::signaling::proxy::rtsp::logic::Events::default().list();
    for (event, _) in sip.iter().chain(&rtsp) {
        assert_ne!(
            event_family(event).0,
            "vgate_signaling_other_events_total",
            "give the proxy event {event} a family in EVENT_FAMILIES"
        );
    }
}

//! Counters of the signaling routes, for the metrics: requests by method, responses by class,
//! and each proxy's own events (403s, rate-limited sources, timeouts ...). Written by the
//! proxies (per message, lock-free for requests and responses), read by `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::config::SignalingKind;

/// Methods counted by name; anything else counts as `other`.
pub const SIP_METHODS: &[&str] = &[
    "INVITE",
    "ACK",
    "BYE",
    "CANCEL",
    "REGISTER",
    "MESSAGE",
    "INFO",
    "SUBSCRIBE",
    "NOTIFY",
    "OPTIONS",
    "UPDATE",
    "PRACK",
    "REFER",
];
pub const RTSP_METHODS: &[&str] = &[
    "OPTIONS",
    "DESCRIBE",
    "SETUP",
    "PLAY",
    "PAUSE",
    "TEARDOWN",
    "GET_PARAMETER",
    "SET_PARAMETER",
    "ANNOUNCE",
    "RECORD",
];
const MAX_METHODS: usize = 14;

/// One signaling route's counters.
#[derive(Debug)]
pub struct SignalingStats {
    pub kind: SignalingKind,
    requests: [AtomicU64; MAX_METHODS + 1],
    /// Responses by class: index 0 is 1xx ... 5 is 6xx.
    responses: [AtomicU64; 6],
    events: Mutex<Vec<(&'static str, u64)>>,
    registrations: Mutex<Vec<Registration>>,
    dialogs: Mutex<Vec<Dialog>>,
    /// SIP: from the INVITE to its first 2xx, per call.
    pub call_setup: Histogram,
}

pub use crate::stats::{Histogram, SETUP_BUCKETS};

/// A device registered through a SIP route (published by the proxy on its timer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The user part of its contact: the GB/T 28181 device ID.
    pub id: String,
    /// The domain the device is in.
    pub domain: crate::config::DomainId,
    /// Its contact URI as it sent it.
    pub contact: String,
    /// Where vgate reaches it.
    pub peer: std::net::SocketAddrV4,
    /// The binding token the other side sees in the contact vgate shows.
    pub token: String,
    pub expires_in: std::time::Duration,
}

/// A confirmed, live SIP call through a route (published by the proxy on its timer): what
/// `GET /api/v1/dialogs` lists, so that the two nodes of a hot-standby pair can be compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dialog {
    /// Its Call-ID on the listen face, and on the upstream face (topology hiding).
    pub call_id: String,
    pub upstream_call_id: String,
    /// The binding tokens of each face's party.
    pub contacts: [Option<String>; 2],
    /// The ports of its media session (`a:20000`), sorted; empty without media.
    pub media_ports: Vec<String>,
}

impl SignalingStats {
    pub fn new(kind: SignalingKind) -> SignalingStats {
        SignalingStats {
            kind,
            requests: Default::default(),
            responses: Default::default(),
            events: Mutex::new(Vec::new()),
            registrations: Mutex::new(Vec::new()),
            dialogs: Mutex::new(Vec::new()),
            call_setup: Histogram::default(),
        }
    }

    /// The methods counted by name for this kind.
    pub fn methods(&self) -> &'static [&'static str] {
        match self.kind {
            SignalingKind::Sip => SIP_METHODS,
            SignalingKind::Rtsp => RTSP_METHODS,
        }
    }

    /// Counts a request (method compared case-sensitively, as both protocols define it).
    pub fn request(&self, method: &[u8]) {
        let methods = self.methods();
        let i = methods
            .iter()
            .position(|m| m.as_bytes() == method)
            .unwrap_or(methods.len());
        self.requests[i].fetch_add(1, Relaxed);
    }

    /// Counts a response by its status class.
    pub fn response(&self, status: u16) {
        if (100..700).contains(&status) {
            self.responses[usize::from(status / 100 - 1)].fetch_add(1, Relaxed);
        }
    }

    /// Replaces the proxy's event counters (it publishes them on its timer).
    pub fn set_events(&self, events: Vec<(&'static str, u64)>) {
        *self.events.lock().unwrap_or_else(|p| p.into_inner()) = events;
    }

    /// Replaces the route's registrations (the SIP proxy publishes them on its timer).
    pub fn set_registrations(&self, r: Vec<Registration>) {
        *self.registrations.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }

    pub fn registrations(&self) -> Vec<Registration> {
        self.registrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the route's confirmed calls (the SIP proxy publishes them on its timer).
    pub fn set_dialogs(&self, d: Vec<Dialog>) {
        *self.dialogs.lock().unwrap_or_else(|p| p.into_inner()) = d;
    }

    pub fn dialogs(&self) -> Vec<Dialog> {
        self.dialogs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// (method, count) for every named method and `other`.
    pub fn requests(&self) -> Vec<(&'static str, u64)> {
        let methods = self.methods();
        let mut v: Vec<_> = methods
            .iter()
            .enumerate()
            .map(|(i, m)| (*m, self.requests[i].load(Relaxed)))
            .collect();
        v.push(("other", self.requests[methods.len()].load(Relaxed)));
        v
    }

    /// (class, count) for 1xx..6xx.
    pub fn responses(&self) -> Vec<(&'static str, u64)> {
        ["1xx", "2xx", "3xx", "4xx", "5xx", "6xx"]
            .into_iter()
            .zip(self.responses.iter().map(|a| a.load(Relaxed)))
            .collect()
    }

    pub fn events(&self) -> Vec<(&'static str, u64)> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Every signaling route's counters, by route name.
#[derive(Debug, Default)]
pub struct SignalingRegistry {
    routes: Mutex<Vec<(String, Arc<SignalingStats>)>>,
}

impl SignalingRegistry {
    /// Registers (or replaces, after a reload) the counters of route `name`.
    pub fn register(&self, name: &str, stats: Arc<SignalingStats>) {
        let mut r = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|(n, _)| n != name);
        r.push((name.to_string(), stats));
    }

    pub fn all(&self) -> Vec<(String, Arc<SignalingStats>)> {
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(std::time::Duration::from_millis(30));
        h.observe(std::time::Duration::from_millis(700));
        h.observe(std::time::Duration::from_secs(60));
        let (b, sum) = h.snapshot();
        assert_eq!(b[0], (0.05, 1));
        assert_eq!(b[3], (0.5, 1));
        assert_eq!(b[4], (1.0, 2));
        assert_eq!(b[8], (30.0, 2));
        assert_eq!(b[9], (f64::INFINITY, 3));
        assert!((sum - 60.73).abs() < 1e-6);
    }

    #[test]
    fn methods_and_classes() {
        assert!(SIP_METHODS.len() <= MAX_METHODS && RTSP_METHODS.len() <= MAX_METHODS);
        let s = SignalingStats::new(SignalingKind::Sip);
        s.request(b"INVITE");
        s.request(b"invite");
        s.request(b"BYE");
        s.response(183);
        s.response(200);
        s.response(999);
        let r = s.requests();
        assert_eq!(r[0], ("INVITE", 1));
        assert_eq!(r.iter().find(|x| x.0 == "other").unwrap().1, 1);
        assert_eq!(s.responses()[0], ("1xx", 1));
        assert_eq!(s.responses()[1], ("2xx", 1));
    }
}

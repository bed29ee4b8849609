//! Who may talk to the proxy: peer allow-lists per face, GB/T 28181 ID prefixes, and a
//! per-source request rate limit. Pure: the caller passes the time.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;

use crate::signaling::sip::{GbId, Head};

/// Most sources tracked by the rate limiter; past it, unknown sources are refused until
/// idle ones are swept (a flood of spoofed sources must not grow the table).
pub const MAX_SOURCES: usize = 4096;

/// Whether a GB/T 28181 party passes the `allow_ids` prefixes (empty list: everyone).
pub fn id_allowed(allow_ids: &[String], id: &str) -> bool {
    allow_ids.is_empty() || allow_ids.iter().any(|p| id.starts_with(p.as_str()))
}

/// From and To must both name 20-digit GB IDs that pass the prefixes, when any are set.
pub fn parties_allowed(allow_ids: &[String], head: &Head<'_>) -> bool {
    if allow_ids.is_empty() {
        return true;
    }
    let ok = |r: Result<crate::signaling::sip::NameAddr<'_>, _>| {
        r.ok()
            .and_then(|n| n.sip_uri().ok())
            .and_then(|u| u.user)
            .and_then(|u| GbId::parse(u).ok())
            .is_some_and(|id| id_allowed(allow_ids, id.as_str()))
    };
    ok(head.from()) && ok(head.to())
}

/// Whether `ip` may send to a face whose peers are `allowed` (empty: anyone of `domain`).
pub fn peer_allowed(allowed: &[Ipv4Net], in_domain: bool, ip: Ipv4Addr) -> bool {
    if allowed.is_empty() {
        in_domain
    } else {
        allowed.iter().any(|n| n.contains(&ip))
    }
}

/// A token bucket per source address: `rate` requests per second, bursts of `2 × rate`.
pub struct RateLimiter {
    rate: f64,
    buckets: HashMap<Ipv4Addr, (f64, Instant)>,
}

impl RateLimiter {
    /// `rate` 0 turns the limit off.
    pub fn new(rate: u32) -> RateLimiter {
        RateLimiter {
            rate: f64::from(rate),
            buckets: HashMap::new(),
        }
    }

    /// Takes one token for `ip`; `false`: over the limit, drop the request.
    pub fn allow(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let burst = self.rate * 2.0;
        if !self.buckets.contains_key(&ip) && self.buckets.len() >= MAX_SOURCES {
            self.sweep(now);
            if self.buckets.len() >= MAX_SOURCES {
                return false;
            }
        }
        let (tokens, last) = self.buckets.entry(ip).or_insert((burst, now));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * self.rate).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Forgets sources idle long enough to have a full bucket again.
    pub fn sweep(&mut self, now: Instant) {
        let full_after = Duration::from_secs_f64(2.0).max(Duration::from_secs(1));
        self.buckets
            .retain(|_, (_, last)| now.saturating_duration_since(*last) < full_after);
    }

    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_peers() {
        let ids = vec!["3402000000".to_string()];
        assert!(id_allowed(&ids, "34020000001320000001"));
        assert!(!id_allowed(&ids, "44020000001320000001"));
        assert!(id_allowed(&[], "anything"));
        let nets: Vec<Ipv4Net> = vec!["10.0.0.0/24".parse().unwrap()];
        assert!(peer_allowed(&nets, false, "10.0.0.7".parse().unwrap()));
        assert!(!peer_allowed(&nets, true, "10.0.1.7".parse().unwrap()));
        assert!(peer_allowed(&[], true, "10.0.1.7".parse().unwrap()));
        assert!(!peer_allowed(&[], false, "10.0.1.7".parse().unwrap()));
    }

    #[test]
    fn bucket_refills() {
        let mut r = RateLimiter::new(10);
        let t = Instant::now();
        let ip = "10.0.0.1".parse().unwrap();
        let passed = (0..100).filter(|_| r.allow(ip, t)).count();
        assert_eq!(passed, 20);
        assert!(r.allow(ip, t + Duration::from_millis(200)));
        assert!(RateLimiter::new(0).allow(ip, t));
    }
}

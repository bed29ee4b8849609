//! The gateway's clock for timers: milliseconds of `CLOCK_MONOTONIC`.
//!
//! Every timer — a route's last-seen time, media and session timeouts, worker heartbeats and
//! the watchdog, rate limits, the re-latch silence — reads [`now_ms`]. The wall clock may be
//! stepped (NTP, an operator); a step forward would end every call as "no media" and a step
//! backward would keep a dead worker looking alive. The wall clock is only for showing a time
//! to a person ([`unix_ms`]). A leaf module: it imports nothing of the gateway, so signaling
//! and control need not import the data path to tell the time.

use nix::time::{clock_gettime, ClockId};

/// Milliseconds of the monotonic clock (since boot; never 0 on a running system, so 0 can
/// mean "never" in the atomics that store these values).
#[inline]
pub fn now_ms() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux (the clock id is valid and the pointer ours).
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map_or(1, |t| {
            t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000
        })
        .max(1)
}

/// Whole seconds of the monotonic clock.
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// The wall-clock time (milliseconds since the Unix epoch) of a monotonic reading `mono_ms`,
/// for display only (it moves with the wall clock).
pub fn unix_ms(mono_ms: u64) -> u64 {
    wall_ms().saturating_sub(now_ms().saturating_sub(mono_ms))
}

/// Milliseconds of the wall clock since the Unix epoch (0 before it): a time to show or to
/// hand a peer, never a timer.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Microseconds of the wall clock, wrapping (the split link header's timestamp, compared
/// only with the peer half's).
pub fn wall_us() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u32)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_and_converts_to_the_wall_clock() {
        let a = now_ms();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = now_ms();
        assert!(b >= a + 5, "{a} → {b}");
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(unix_ms(b).abs_diff(wall) < 1000);
        assert!(unix_ms(b - 10_000).abs_diff(wall - 10_000) < 1000);
    }
}

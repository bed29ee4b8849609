//! Logging setup and rate limiting.
//!
//! Logs go to stderr, one line per event, for journald (which adds its own timestamps, so
//! we drop ours when `JOURNAL_STREAM` says journald is reading). Any line a packet can
//! trigger goes through a [`RateLimit`], so a flood cannot turn into a log flood.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use tracing_subscriber::EnvFilter;

/// Installs the stderr logger. `RUST_LOG` overrides the level (default `info`).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    // Colours only for a person at a terminal, never in files or the journal.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let _ = if journald {
        builder.without_time().with_ansi(false).try_init()
    } else {
        builder.try_init()
    };
}

/// Lets one event through per interval and counts the rest, so the next line that gets
/// through can say how many were suppressed.
#[derive(Debug)]
pub struct RateLimit {
    interval_ms: u64,
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    pub const fn new(interval_ms: u64) -> RateLimit {
        RateLimit {
            interval_ms,
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(suppressed since the last one)` when this event may be logged at `now_ms`.
    pub fn check(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(next, now_ms + self.interval_ms, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_and_counts_the_rest() {
        let r = RateLimit::new(1000);
        assert_eq!(r.check(5000), Some(0));
        for t in 5001..5100 {
            assert_eq!(r.check(t), None);
        }
        assert_eq!(r.check(6000), Some(99));
        assert_eq!(r.check(6001), None);
    }
}

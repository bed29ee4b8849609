//! Logging setup, the run-time log level and rate limiting.
//!
//! Logs go to stderr, one line per event. When stderr is the journal (`JOURNAL_STREAM` names
//! the same device and inode as fd 2, see systemd.exec(5)) each text line starts with its
//! syslog priority in the `<N>` form sd-daemon(3) describes, so `journalctl -p err -u vgate`
//! shows errors only, and our timestamps are dropped (journald adds its own).
//! `--log-format json` writes one JSON object per line for log shippers instead.
//! The filter can be changed while running ([`set_level`], `PUT /api/v1/log-level`).
//! Any line a packet can trigger goes through a [`RateLimit`], so a flood cannot turn into a
//! log flood.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event (with a `<N>` priority prefix under journald).
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, fields.
    Json,
}

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// The syslog priority of a tracing level (sd-daemon(3) `<N>` prefixes).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// True when fd 2 is the journal stream systemd connected (`JOURNAL_STREAM=dev:inode`).
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    match nix::sys::stat::fstat(std::io::stderr()) {
        Ok(st) => dev.parse() == Ok(st.st_dev) && ino.parse() == Ok(st.st_ino),
        Err(_) => false,
    }
}

/// Prefixes each line with `<N>`, its syslog priority.
struct Prioritized<F>(F);

impl<S, N, F> FormatEvent<S, N> for Prioritized<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(w, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, w, event)
    }
}

/// Installs the stderr logger. `RUST_LOG` sets the initial filter (default `info`).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let journald = stderr_is_journal();
    // Colours only for a person at a terminal, never in files or the journal.
    let ansi = !journald && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let base = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    let output = match (format, journald) {
        (LogFormat::Json, _) => base.json().boxed(),
        (LogFormat::Text, true) => base
            .event_format(Prioritized(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_target(false)
                    .with_ansi(false),
            ))
            .boxed(),
        (LogFormat::Text, false) => base.boxed(),
    };
    if tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .try_init()
        .is_ok()
    {
        let _ = FILTER.set(handle);
    }
}

/// Errors of the run-time log level.
#[derive(Debug, thiserror::Error)]
pub enum LogLevelError {
    #[error("cannot parse the log filter {spec:?}: {reason}; give a level (error, warn, info, debug, trace) or RUST_LOG directives such as info,vgate::signaling=debug")]
    Invalid { spec: String, reason: String },
    #[error(
        "the logger of this process cannot be changed at run time (it was not installed by vgate)"
    )]
    NotInstalled,
}

/// Replaces the log filter (a level or `RUST_LOG`-style directives) while running.
pub fn set_level(spec: &str) -> Result<String, LogLevelError> {
    let new = EnvFilter::try_new(spec.trim()).map_err(|e| LogLevelError::Invalid {
        spec: spec.to_string(),
        reason: e.to_string(),
    })?;
    let handle = FILTER.get().ok_or(LogLevelError::NotInstalled)?;
    handle
        .reload(new)
        .map_err(|_| LogLevelError::NotInstalled)?;
    Ok(level())
}

/// The log filter in force, as `RUST_LOG` directives.
pub fn level() -> String {
    FILTER
        .get()
        .and_then(|h| h.with_current(|f| f.to_string()).ok())
        .unwrap_or_else(|| "info".into())
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
    fn syslog_priorities() {
        assert_eq!(priority(&Level::ERROR), 3);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
        assert_eq!(priority(&Level::DEBUG), 7);
        assert_eq!(priority(&Level::TRACE), 7);
    }

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

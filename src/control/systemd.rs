//! systemd integration: `READY=1` once every worker is receiving, `WATCHDOG=1` only while
//! every worker is alive, `STATUS=` with a one-line summary, `RELOADING=1`/`STOPPING=1`.
//! Outside systemd (`NOTIFY_SOCKET` unset) every call is a no-op.

use sd_notify::NotifyState;

pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

fn notify(states: &[NotifyState<'_>]) {
    if enabled() {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!("cannot notify systemd: {e}");
        }
    }
}

pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn watchdog() {
    notify(&[NotifyState::Watchdog]);
}

pub fn status(status: &str) {
    notify(&[NotifyState::Status(status)]);
}

pub fn reloading() {
    // systemd ≥ 253 needs the monotonic time with RELOADING=1 (Type=notify-reload).
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

pub fn reloaded(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// The watchdog interval systemd asked for (`WATCHDOG_USEC`), halved as sd_watchdog_enabled(3)
/// advises; `None` when no watchdog is configured.
pub fn watchdog_interval() -> Option<std::time::Duration> {
    sd_notify::watchdog_enabled().map(|d| d / 2)
}

//! The one guard for a child process a test started (a peer such as sipp, iperf, ffmpeg or
//! a Python helper, usually through `ip netns exec … timeout …`): stopped and reaped on
//! drop, also when the test panics.
//!
//! Also the readings of a process the tests watch (memory, descriptors, threads) and
//! [`run_ok`], a command that must succeed.
//!
//! The stop is SIGTERM first, then SIGKILL after a grace: `timeout` passes a SIGTERM on to
//! the command it runs, while a SIGKILL of `timeout` itself would leave that command
//! running in its namespace.

use std::io::Read;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// How long a child gets between SIGTERM and SIGKILL when dropped.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// Runs `cmd` to its end and returns its stdout; panics naming `what`, with what it wrote
/// to stdout and stderr, if it cannot start or exits with a failure.
pub fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The number a line `key: N …` of `/proc/PID/status` gives (0 when unreadable).
fn status_number(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident set size of `pid`, KiB.
pub fn rss_kb(pid: u32) -> u64 {
    status_number(pid, "VmRSS")
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// What the open file descriptors of `pid` are (`socket:[…]` collapsed), for messages.
pub fn fd_targets(pid: u32) -> String {
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let t = std::fs::read_link(e.path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let k = t.split(':').next().unwrap_or("").to_owned();
        *kinds
            .entry(if k.starts_with('/') { t } else { k })
            .or_default() += 1;
    }
    format!("{kinds:?}")
}

/// Threads of `pid`.
pub fn threads(pid: u32) -> u64 {
    status_number(pid, "Threads")
}

/// A child process, stopped (SIGTERM, then SIGKILL) and reaped on drop.
pub struct Proc(Option<Child>);

impl Proc {
    /// Spawns `cmd`; panics (naming the program) if it cannot start.
    pub fn spawn(cmd: &mut Command) -> Proc {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {:?}: {e}", cmd.get_program()));
        Proc(Some(child))
    }

    pub fn new(child: Child) -> Proc {
        Proc(Some(child))
    }

    /// The child's pid (0 once it was reaped).
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// The child, while it was not reaped.
    pub fn child(&mut self) -> Option<&mut Child> {
        self.0.as_mut()
    }

    /// Sends `sig` to the child (nothing once it was reaped).
    pub fn signal(&self, sig: Signal) {
        if let Some(c) = &self.0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// Waits up to `within` for the child to exit by itself: `Some(success)` if it did (it is
    /// reaped then), `None` if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<bool> {
        let deadline = Instant::now() + within;
        loop {
            let c = self.0.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.0 = None;
                return Some(st.success());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, up to 10 s to exit, then SIGKILL: what it wrote to its piped outputs.
    pub fn stop(&mut self) -> Option<Output> {
        self.signal(Signal::SIGTERM);
        self.finish(Duration::from_secs(10))
    }

    /// SIGINT (iperf2 prints its reports on it), then its stdout once it exits.
    pub fn interrupt_and_output(self) -> String {
        self.signal(Signal::SIGINT);
        self.output()
    }

    /// Its stdout until it closes it (the child exits by itself), then reaps it.
    pub fn output(mut self) -> String {
        let mut out = String::new();
        if let Some(mut c) = self.0.take() {
            if let Some(mut o) = c.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            let _ = c.wait();
        }
        out
    }

    /// Waits up to `within` for the child to exit by itself (SIGKILL after that): its stdout.
    pub fn wait_output(&mut self, within: Duration) -> String {
        self.finish(within)
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Waits up to `within` for an exit, SIGKILL if none, then collects the outputs.
    fn finish(&mut self, within: Duration) -> Option<Output> {
        let deadline = Instant::now() + within;
        let c = self.0.as_mut()?;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut c = self.0.take()?;
        let _ = c.kill();
        c.wait_with_output().ok()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let Some(c) = self.0.as_mut() else {
            return;
        };
        if c.try_wait().ok().flatten().is_none() {
            self.signal(Signal::SIGTERM);
            if self.wait_exit(DROP_GRACE).is_none() {
                if let Some(c) = self.0.as_mut() {
                    let _ = c.kill();
                }
            }
        }
        if let Some(mut c) = self.0.take() {
            let _ = c.wait();
        }
    }
}

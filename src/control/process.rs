//! The process metrics every Prometheus client library exports (`process_*`), read from
//! `/proc/self` and the process CPU clock at scrape time.

use nix::time::{clock_gettime, ClockId};

/// One reading; `None` where `/proc` did not say.
#[derive(Debug, Default)]
pub struct Process {
    pub cpu_seconds: f64,
    pub resident_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

pub fn sample() -> Process {
    let cpu_seconds = clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
        .unwrap_or(0.0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    Process {
        cpu_seconds,
        resident_bytes: vm_rss(&status),
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64),
        max_fds: max_open_files(&limits),
        start_time_seconds: start_time(&stat, &boot, clock_ticks()),
    }
}

/// `VmRSS:  1234 kB` of /proc/self/status, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The soft limit of `Max open files` in /proc/self/limits.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn clock_ticks() -> Option<u64> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
}

/// Field 22 of /proc/self/stat (start time in clock ticks after boot) plus `btime` of
/// /proc/stat. The command name (field 2) may hold spaces, so fields count from its `)`.
fn start_time(stat: &str, boot: &str, ticks: Option<u64>) -> Option<f64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // After ")" come field 3 (state) onward: field 22 is the 20th.
    let started: u64 = after_comm.split_whitespace().nth(19)?.parse().ok()?;
    let btime: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(btime as f64 + started as f64 / ticks? as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        assert_eq!(
            vm_rss("Name:\tvgate\nVmRSS:\t    2048 kB\n"),
            Some(2048 * 1024)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Some(1024));
        let stat =
            "4242 (vg ate) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 9 0 250 1000 200";
        assert_eq!(
            start_time(stat, "cpu 1 2 3\nbtime 1700000000\n", Some(100)),
            Some(1_700_000_002.5)
        );
    }

    #[test]
    fn this_process_reads() {
        let p = sample();
        assert!(p.resident_bytes.unwrap() > 0);
        assert!(p.open_fds.unwrap() >= 3);
        assert!(p.max_fds.unwrap() >= p.open_fds.unwrap());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = p.start_time_seconds.unwrap();
        assert!(start <= now + 1.0 && start > now - 86400.0 * 365.0);
    }
}

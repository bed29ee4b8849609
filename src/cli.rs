//! Command line: what each subcommand does and how it reports. `--help` on each teaches it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::config::{self, Config, Mode};
use crate::control::admin::{AdminServer, ReloadRequest};
use crate::control::live::{totals_report, LiveView};
use crate::control::{systemd, ControlState};
use crate::demo::{self, DemoOptions};
use crate::engine::EngineKind;
use crate::gateway::Gateway;

#[derive(Parser, Debug)]
#[command(
    name = "vgate",
    version,
    about = "Inter-network video gateway: one-way RTP channels and SIP/RTSP signaling between two network domains",
    long_about = "vgate joins two network domains that must never be joined at the IP level (A: the video \
private network, B: the user network) and lets video cross under control. RTP media crosses on one-way \
channels (forward A→B, reverse B→A) through gateway ports looked up in port-keyed stream route tables.\n\n\
Start with `vgate demo` to see it relay traffic on loopback, then write a config \
(`vgate print-default > vgate.toml`), check it with `vgate check-config vgate.toml` and run it with \
`vgate run --config vgate.toml`."
)]
pub struct Cli {
    /// Log lines as text (with `<N>` priorities under journald) or JSON objects for log shippers.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "VGATE_LOG_FORMAT"
    )]
    pub log_format: crate::logging::LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the gateway until SIGINT/SIGTERM, then print totals.
    #[command(
        long_about = "Run the gateway. Without --config it runs the embedded loopback default \
(domain A 127.0.0.1, domain B 127.0.0.2, no privileges needed). At start it prints the mode, the \
engine in use and the CPU of each worker; every --stats-interval seconds a line of rates and drops; \
on SIGINT or SIGTERM the totals per channel and per route as key=value lines on stdout.\n\n\
Capture modes: stack (kernel UDP sockets, recvmmsg/sendmmsg), tnapi (one ring per RSS queue) and \
zc (zero copy per queue). A mode that cannot run here fails with the reason; vgate never falls back \
to another mode silently."
    )]
    Run {
        /// Config file (TOML). Default: the embedded loopback config.
        #[arg(short, long, env = "VGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Capture mode; overrides engine.mode of the config.
        #[arg(short, long, value_enum)]
        mode: Option<Mode>,
        /// Engine implementing the mode (e.g. afpacket or pfring for tnapi).
        #[arg(long, value_enum)]
        engine: Option<EngineKind>,
        /// Seconds between live statistics lines in the log; 0 turns them off.
        #[arg(long, default_value_t = 10)]
        stats_interval: u64,
    },
    /// Check a config file; exit 0 if valid, else name the file, line, key and the problem.
    #[command(
        long_about = "Check a config file without running anything. Exits 0 and prints a \
summary when it is valid; otherwise prints FILE:LINE:COLUMN: KEY: what is wrong and what to do, and \
exits 2. Checks include unknown keys, overlapping media port ranges, routes whose destination is in \
the domain they listen in, ports outside their range, and more channels than CPU cores."
    )]
    CheckConfig {
        /// The config file to check.
        file: PathBuf,
        /// Check for a machine with this many CPUs (the appliance), not this one.
        #[arg(long)]
        cpus: Option<usize>,
    },
    /// Run the gateway on the embedded default with its own traffic and live figures.
    #[command(
        long_about = "Run the gateway on the embedded loopback default and push its own \
RTP traffic through it: --streams streams of --rate Mbit/s each from domain A (127.0.0.1) through \
the forward channel to receivers in domain B (127.0.0.2). Every second: offered and delivered packet \
rates, loss, the latency the relay adds (p50/p99) and the gateway's CPU use. At the end a report; \
with --json the same as one JSON object on stdout (used by scripts/bench-stack.sh)."
    )]
    Demo {
        /// Number of streams.
        #[arg(long, default_value_t = 20)]
        streams: usize,
        /// Per-stream rate in Mbit/s (of UDP payload).
        #[arg(long, default_value_t = 10.0)]
        rate: f64,
        /// UDP payload per packet in bytes (1328 = RTP header + 7 MPEG-TS packets).
        #[arg(long, default_value_t = 1328)]
        payload: usize,
        /// Seconds to run; 0 runs until Ctrl-C.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Gateway worker threads (default: the embedded config's).
        #[arg(long)]
        queues: Option<usize>,
        /// Print the final report as JSON on stdout (live lines still go to stderr).
        #[arg(long)]
        json: bool,
        /// No live lines, only the report.
        #[arg(long)]
        quiet: bool,
    },
    /// Print the embedded default config, a starting point for your own.
    PrintDefault,
    /// Live view of a running vgate, refreshed every second (like top).
    #[command(
        long_about = "Live view of a running vgate, refreshed every second: per channel the \
forwarded packet rate, Gbit/s and drops by reason; per worker the packet rates and CPU use; ports \
used and free per domain; the streams with the worst loss. Ctrl-C ends it. Talks to the admin \
interface (control.listen of the config)."
    )]
    Stats {
        #[command(flatten)]
        admin: AdminArgs,
        /// Show this many screens, then exit (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
    /// List, add or remove stream routes of a running vgate.
    Routes {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        action: RoutesAction,
    },
    /// List or end sessions of a running vgate (ending one frees its ports).
    Sessions {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(subcommand)]
        action: SessionsAction,
    },
    /// Make a running vgate re-read its config file (like SIGHUP).
    #[command(
        long_about = "Make a running vgate re-read its config file. Static stream routes and \
signaling routes are applied without restarting workers or touching unchanged streams; an invalid \
file is rejected whole, the running configuration stays and the reason is printed."
    )]
    Reload {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show or change the log level of a running vgate.
    #[command(
        long_about = "Show the log filter of a running vgate, or replace it without a restart: a \
level (error, warn, info, debug, trace) or RUST_LOG directives such as `info,vgate::signaling=debug`. \
Message traces of signaling routes with `trace = true` show at debug level. The change lasts until \
vgate restarts."
    )]
    LogLevel {
        #[command(flatten)]
        admin: AdminArgs,
        /// The new filter; without it the current one is printed.
        level: Option<String>,
    },
    /// List the devices registered through each SIP route of a running vgate.
    Registrations {
        #[command(flatten)]
        admin: AdminArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 when a running vgate is healthy, else 1 with the reasons (keepalived's track_script).
    #[command(
        long_about = "Ask a running vgate whether it is healthy: every worker alive and receiving \
with a fresh heartbeat, and, on a hot-standby node ([ha]) that is the standby, its copy of the \
state store fresh. Exits 0 and prints `healthy` (and any warnings, such as an active whose state \
store is unreachable: it keeps forwarding); exits 1 and prints each problem when not, or when no \
vgate answers. Meant as keepalived's track_script (see docs/ha.md)."
    )]
    Health {
        #[command(flatten)]
        admin: AdminArgs,
        /// Keep watching instead: write 0 (healthy) or 1 (not, or no answer) into this file
        /// every time it changes, for keepalived's track_file (weight 0); runs until SIGTERM.
        #[arg(long)]
        track_file: Option<PathBuf>,
        /// With --track-file: milliseconds between two questions (each may take ten of them, at
        /// least a second; a vgate that exits is seen at once, its admin connection closes).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(20..=10_000))]
        every_ms: u64,
    },
    /// Tell a running vgate its hot-standby role (keepalived's notify hook).
    #[command(
        long_about = "Tell a running vgate ([ha]) its role in the pair: MASTER makes it the active \
node (it reads the state store one last time, then forwards), BACKUP or FAULT makes it a standby \
(it stops forwarding at once and keeps copying the active's state). Takes keepalived's notify \
arguments as they come (`notify_master \"vgate ha-notify MASTER\"`, or `notify \"vgate \
ha-notify\"`, which is called with TYPE NAME STATE PRIORITY): the first word that is MASTER, \
BACKUP, FAULT or STOP is the role. A standby whose copy of the state is stale (the state store \
has not answered within ha.stale_after_ms) refuses MASTER, says why and exits 1; --force lets it \
take over all the same (and stops its stale state failing `vgate health`, so keepalived gives it \
the addresses) until the state store answers again."
    )]
    HaNotify {
        #[command(flatten)]
        admin: AdminArgs,
        /// Take over even with a stale copy of the state (what changed since it went stale
        /// is lost); lasts until the state store answers again.
        #[arg(long)]
        force: bool,
        /// MASTER, BACKUP or FAULT (or keepalived's TYPE NAME STATE PRIORITY).
        #[arg(required = true, num_args = 1..)]
        args: Vec<String>,
    },
    /// Capture a route's next N refused packets into a pcap file, for forensics.
    #[command(
        long_about = "Capture the next --count packets a running vgate refuses on one stream \
route into a pcap file (tcpdump, tshark, Wireshark, scapy read it), with why each was refused.\n\n\
Taken: the refusals about a packet's content or origin: media validation (media_invalid, with the \
validator's reason such as nal_forbidden_bit or ps_private_stream, and media_stripped: a packet the \
strip action cut whole), not_rtp and source_mismatch. Each packet is written as it arrived, byte for \
byte (before any strip rewrite), behind Ethernet/IPv4/UDP headers with its real source and the \
gateway address and port it arrived on, stamped with the time it was refused. What crosses is never \
captured, nor what is dropped for other reasons (standby, oversize).\n\n\
The route is named as `vgate routes list` shows it: CHANNEL/PORT (forward/20000, reverse/30002), a \
port if only one channel has it, or the route's name. The gateway takes the packets into buffers it \
allocates when armed (at most 512 at a time; more are counted as capture_overflow while this command \
has not read them) and stops by itself after --count packets or --timeout seconds, even if this \
command is gone. One capture at a time per gateway.\n\n\
Progress (captured/N) goes to stderr; at the end a listing (number, time, source, destination, \
bytes, reason, validator reason) to stdout and to FILE.reasons.txt beside the pcap file. Ctrl-C \
stops the capture and keeps what it took. Exits 0 when all N were captured, 1 when the time limit or \
Ctrl-C came first (the file holds what was taken), 2 on an error (unknown route, another capture \
armed, no vgate running).\n\n\
Example: vgate capture-refused --route forward/20000 --count 100 --timeout 300 --out cam.pcap \
&& tshark -r cam.pcap"
    )]
    CaptureRefused {
        #[command(flatten)]
        admin: AdminArgs,
        /// The route: CHANNEL/PORT (forward/20000), a port, or its name.
        #[arg(long)]
        route: String,
        /// Refused packets to capture (1 to 10000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        count: u32,
        /// Seconds the capture stays armed at most (1 to 3600).
        #[arg(long, default_value_t = crate::control::capture::DEFAULT_TIMEOUT_S,
              value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout: u64,
        /// The pcap file to write (replaced if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write shell completions (bash, zsh, fish, ...) to stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (vgate.1 and one per subcommand) into a directory.
    #[command(hide = true)]
    Man {
        /// The directory to write into.
        dir: PathBuf,
    },
}

/// How to reach a running vgate's admin interface.
#[derive(clap::Args, Debug)]
pub struct AdminArgs {
    /// Admin address; default: control.listen of --config, else 127.0.0.1:9940.
    #[arg(long, env = "VGATE_ADMIN")]
    pub admin: Option<std::net::SocketAddr>,
    /// Config file to take the admin address and token from.
    #[arg(short, long, env = "VGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Admin token (default: control.token of --config).
    #[arg(long, env = "VGATE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum RoutesAction {
    /// List the live stream routes with their counters (a table; --json for scripts).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a stream route (ports are allocated when not given).
    Add {
        /// A name for the route.
        #[arg(long)]
        name: String,
        /// Domain the media arrives from: a or b.
        #[arg(long)]
        domain: String,
        /// Gateway port receiving the media.
        #[arg(long)]
        port: Option<u16>,
        /// Receiver in the other domain, ADDR:PORT.
        #[arg(long)]
        destination: String,
        /// Gateway port on the far side the media leaves from.
        #[arg(long)]
        egress_port: Option<u16>,
        /// Only this source (ADDR:PORT, port 0 = any port) is forwarded.
        #[arg(long)]
        expect_source: Option<String>,
        /// strict, latch or any (default: the config's).
        #[arg(long)]
        source_validation: Option<String>,
    },
    /// Remove a static or admin route (its ports are freed).
    Del {
        /// forward or reverse.
        channel: String,
        /// The gateway port of the route.
        port: u16,
    },
}

#[derive(Subcommand, Debug)]
pub enum SessionsAction {
    /// List the live sessions (a table; --json for scripts).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// End a session: its routes stop, its ports return to the pool.
    Kill {
        /// Session id (see `vgate sessions list`).
        id: u64,
    },
}

/// Runs a parsed command line.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::CheckConfig { file, cpus } => check_config(&file, cpus),
        Command::PrintDefault => {
            print!("{}", config::DEFAULT_TOML);
            ExitCode::SUCCESS
        }
        Command::Run {
            config,
            mode,
            engine,
            stats_interval,
        } => run(config, mode, engine, stats_interval),
        Command::Stats { admin, count } => with_client(&admin, |c| {
            let stop = stop_flag();
            crate::control::client::stats_loop(c, count, &stop)
        }),
        Command::Routes { admin, action } => with_client(&admin, |c| {
            let v = match action {
                RoutesAction::List { json } => {
                    let v = c.get("/api/v1/routes")?;
                    return print_listing(&v, json, crate::control::table::routes);
                }
                RoutesAction::Add {
                    name,
                    domain,
                    port,
                    destination,
                    egress_port,
                    expect_source,
                    source_validation,
                } => c.post(
                    "/api/v1/routes",
                    &serde_json::json!({
                        "name": name, "domain": domain, "port": port, "destination": destination,
                        "egress_port": egress_port, "expect_source": expect_source,
                        "source_validation": source_validation,
                    }),
                )?,
                RoutesAction::Del { channel, port } => {
                    c.delete(&format!("/api/v1/routes/{channel}/{port}"))?
                }
            };
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            Ok(())
        }),
        Command::Sessions { admin, action } => with_client(&admin, |c| {
            let v = match action {
                SessionsAction::List { json } => {
                    let v = c.get("/api/v1/sessions")?;
                    return print_listing(&v, json, crate::control::table::sessions);
                }
                SessionsAction::Kill { id } => c.delete(&format!("/api/v1/sessions/{id}"))?,
            };
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            Ok(())
        }),
        Command::CaptureRefused {
            admin,
            route,
            count,
            timeout,
            out,
        } => {
            let req = crate::control::capture::Request {
                route,
                count,
                timeout_s: timeout,
                out,
            };
            // None: failed (said why); Some(all N captured).
            let mut outcome = None;
            let code = with_client(&admin, |c| {
                let stop = stop_flag();
                match crate::control::capture::run(c, &req, &stop) {
                    Ok(o) => {
                        let (line, all) = crate::control::capture::summary(&o);
                        eprintln!("{line}");
                        outcome = Some(all);
                        Ok(())
                    }
                    Err(crate::control::capture::CaptureCliError::Client(e)) => Err(e),
                    Err(e) => {
                        eprintln!("vgate: {e}");
                        Ok(())
                    }
                }
            });
            match (code == ExitCode::SUCCESS, outcome) {
                (true, Some(true)) => ExitCode::SUCCESS,
                (true, Some(false)) => ExitCode::FAILURE,
                _ => ExitCode::from(2),
            }
        }
        Command::Registrations { admin, json } => with_client(&admin, |c| {
            let v = c.get("/api/v1/registrations")?;
            print_listing(&v, json, crate::control::table::registrations)
        }),
        Command::Reload { admin } => with_client(&admin, |c| {
            let v = c.post("/api/v1/reload", &serde_json::json!({}))?;
            println!("{}", v["summary"].as_str().unwrap_or("reloaded"));
            Ok(())
        }),
        Command::LogLevel { admin, level } => with_client(&admin, |c| {
            let v = match level {
                Some(l) => c.put("/api/v1/log-level", &serde_json::json!({ "level": l }))?,
                None => c.get("/api/v1/log-level")?,
            };
            println!("{}", v["level"].as_str().unwrap_or_default());
            Ok(())
        }),
        Command::Health {
            admin,
            track_file: None,
            ..
        } => health(&admin),
        Command::Health {
            admin,
            track_file: Some(file),
            every_ms,
        } => watch_health(&admin, &file, Duration::from_millis(every_ms)),
        Command::HaNotify { admin, force, args } => {
            let Some(role) = args
                .iter()
                .find(|a| crate::ha::Role::parse(a).is_some())
                .cloned()
            else {
                eprintln!("vgate ha-notify: no role in {args:?}; give MASTER, BACKUP or FAULT");
                return ExitCode::from(2);
            };
            let mut refused = false;
            let code = with_client(&admin, |c| {
                let v = c.post(
                    "/api/v1/ha/role",
                    &serde_json::json!({ "role": role, "force": force }),
                )?;
                println!(
                    "role requested: {} (in force: {})",
                    v["requested_role"].as_str().unwrap_or("?"),
                    v["role"].as_str().unwrap_or("?")
                );
                if let Some(why) = v["refused"].as_str() {
                    eprintln!("vgate ha-notify: takeover refused: {why}");
                    refused = true;
                }
                Ok(())
            });
            if refused {
                ExitCode::from(1)
            } else {
                code
            }
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "vgate", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man { dir } => match write_man_pages(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "vgate man: cannot write the man pages into {}: {e}",
                    dir.display()
                );
                ExitCode::FAILURE
            }
        },
        Command::Demo {
            streams,
            rate,
            payload,
            duration,
            queues,
            json,
            quiet,
        } => {
            let opts = DemoOptions {
                streams,
                mbps: rate,
                payload,
                duration: Duration::from_secs(duration),
                queues,
                live: !quiet,
            };
            demo_cmd(&opts, json)
        }
    }
}

/// `vgate health`: 0 healthy, 1 not (or nobody answers), each reason on its own line.
fn health(admin: &AdminArgs) -> ExitCode {
    let mut healthy = false;
    let code = with_client(admin, |c| {
        let v = match c.get("/api/v1/health") {
            Ok(v) => v,
            Err(crate::control::client::ClientError::Refused {
                status: 503,
                message,
            }) => {
                println!("unhealthy: {message}");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for w in v["warnings"].as_array().into_iter().flatten() {
            println!("warning: {}", w.as_str().unwrap_or_default());
        }
        healthy = v["healthy"].as_bool() == Some(true);
        if healthy {
            println!(
                "healthy: {} workers receiving, role {}",
                v["workers"],
                v["role"].as_str().unwrap_or("active")
            );
        } else {
            println!("unhealthy: {v}");
        }
        Ok(())
    });
    if code == ExitCode::SUCCESS && healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `vgate health --track-file FILE`: the health as keepalived's track_file wants it (0 OK,
/// 1 fault), asked every `every` and written when it changes, until SIGTERM. A vgate that
/// exits (a crash, `kill -9`) is seen at once, not at the next question: between questions
/// the watcher waits on an idle connection to the admin port ([`Tripwire`]), which the
/// kernel closes with the process, and then asks again (refused: written 1). A question
/// times out only after [`question_timeout`] (ten intervals, at least a second), so a vgate
/// slow to answer on a loaded machine is not taken for a dead one (a shorter timeout made
/// the pair fail over under load); a vgate that hangs is seen then.
///
/// [`Tripwire`]: crate::control::client::Tripwire
fn watch_health(admin: &AdminArgs, file: &std::path::Path, every: Duration) -> ExitCode {
    let stop = stop_flag();
    with_client(admin, |c| {
        let mut wire = crate::control::client::Tripwire::new(c.addr);
        let c = c.clone().with_timeout(question_timeout(every));
        let mut last: Option<bool> = None;
        while !stop.load(Relaxed) {
            let t0 = Instant::now();
            let (healthy, why) = match c.get("/api/v1/health") {
                Ok(v) => (
                    v["healthy"].as_bool() == Some(true),
                    v["problems"].to_string(),
                ),
                Err(e) => (false, e.to_string()),
            };
            if last != Some(healthy) {
                if let Err(e) = std::fs::write(file, if healthy { "0\n" } else { "1\n" }) {
                    eprintln!("vgate health: cannot write {}: {e}", file.display());
                } else if healthy {
                    eprintln!("vgate health: healthy ({} written 0)", file.display());
                } else {
                    eprintln!(
                        "vgate health: unhealthy ({} written 1): {why}",
                        file.display()
                    );
                }
                last = Some(healthy);
            }
            if wire.wait(every.saturating_sub(t0.elapsed())) && last == Some(true) {
                eprintln!("vgate health: the admin connection closed: asking at once");
            }
        }
        Ok(())
    })
}

/// How long one question of `vgate health --track-file` may take: ten intervals, at least a
/// second (a dead vgate is seen at once anyway: its port closes, and refuses).
fn question_timeout(every: Duration) -> Duration {
    (every * 10).max(Duration::from_secs(1))
}

/// Prints a listing as pretty JSON or as the table `render` makes of it.
fn print_listing(
    v: &serde_json::Value,
    json: bool,
    render: fn(&serde_json::Value) -> String,
) -> Result<(), crate::control::client::ClientError> {
    if json {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        print!("{}", render(v));
    }
    Ok(())
}

/// vgate.1 and vgate-SUBCOMMAND.1 for every visible subcommand.
fn write_man_pages(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    std::fs::write(dir.join("vgate.1"), &out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("vgate-{}", sub.get_name());
        let sub = sub.clone().name(name.clone());
        out.clear();
        clap_mangen::Man::new(sub).render(&mut out)?;
        std::fs::write(dir.join(format!("{name}.1")), &out)?;
    }
    Ok(())
}

/// Builds an admin client from the flags (or the config they name) and runs `f`.
fn with_client(
    a: &AdminArgs,
    f: impl FnOnce(&crate::control::client::Client) -> Result<(), crate::control::client::ClientError>,
) -> ExitCode {
    // The admin address and token of the config. A config that does not validate (the very
    // file a `vgate reload` is about to be refused for) still names them: read those two
    // keys alone, so the running vgate hears of the reload, refuses it and says why.
    let (listen, cfg_token) = match &a.config {
        Some(p) => match Config::load(p) {
            Ok(c) => (Some(c.control.listen), c.control.token),
            Err(e) => match admin_keys(p) {
                Some(keys) => keys,
                None => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            },
        },
        None => (None, None),
    };
    let addr = a
        .admin
        .or(listen)
        .unwrap_or_else(|| Config::embedded_default().control.listen);
    let token = a.token.clone().or(cfg_token);
    match f(&crate::control::client::Client::new(addr, token)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `control.listen` (default: the embedded one) and `control.token` of a TOML file that may
/// not be a valid config; `None` when the file cannot be read or is not TOML.
fn admin_keys(path: &std::path::Path) -> Option<(Option<std::net::SocketAddr>, Option<String>)> {
    let table: toml::Table = std::fs::read_to_string(path).ok()?.parse().ok()?;
    let control = table.get("control").and_then(|c| c.as_table());
    let get = |k: &str| control.and_then(|c| c.get(k)).and_then(|v| v.as_str());
    let listen = match get("listen") {
        Some(l) => Some(l.parse().ok()?),
        None => None,
    };
    Some((listen, get("token").map(str::to_string)))
}

fn check_config(file: &std::path::Path, cpus: Option<usize>) -> ExitCode {
    let machine = cpus.map_or_else(config::Cpus::this_machine, config::Cpus::first);
    // On the machine that runs it (no --cpus): what a half's engine-family link needs here.
    let here = |cfg: &Config| match (cpus, std::fs::read_to_string(file)) {
        (None, Ok(text)) => config::check_split_host(cfg, &text, &file.display().to_string()),
        _ => Ok(()),
    };
    match Config::load_on(file, &machine).and_then(|cfg| here(&cfg).map(|()| cfg)) {
        Ok(cfg) => {
            println!(
                "{}: ok: mode {}, {} queue(s) on CPU(s) {:?}, {} signaling route(s), {} static stream route(s); domain a {} ports {}, domain b {} ports {}",
                file.display(),
                cfg.engine.mode,
                cfg.engine.queues,
                cfg.engine.cpus,
                cfg.signaling.len(),
                cfg.streams.len(),
                cfg.domains[0].address,
                cfg.domains[0].media_ports,
                cfg.domains[1].address,
                cfg.domains[1].media_ports,
            );
            if let Some(s) = &cfg.split {
                let fec = |f: Option<crate::link::Fec>| {
                    f.map(|f| f.to_string()).unwrap_or_else(|| "off".into())
                };
                println!(
                    "{}: split half {}: domain {} is the link face (peer face {}); out link {} {} -> {} fec {}; in link {} {} <- {} fec {}; signaling link {}",
                    file.display(),
                    s.half,
                    s.link_face(),
                    s.peer_face,
                    s.out_link.interface,
                    s.out_link.local,
                    s.out_link.peer,
                    fec(s.out_link.fec),
                    s.in_link.interface,
                    s.in_link.local,
                    s.in_link.peer,
                    fec(s.in_link.fec),
                    s.signal.interface,
                );
                if let Some(w) = crate::config::split::unauthenticated_warning(s) {
                    eprintln!("{}: warning: {w}", file.display());
                }
            }
            // A TCP SIP route whose `max_message` alone caps TCP (a config from before
            // `max_tcp_message`): it works as before; say how to take larger messages.
            for r in cfg.signaling.iter().filter(|r| {
                r.kind == config::SignalingKind::Sip
                    && r.transport == config::Transport::Tcp
                    && r.policy.max_tcp_message == r.policy.max_message
                    && r.policy.max_tcp_message < config::MAX_TCP_MESSAGE
            }) {
                eprintln!(
                    "{}: note: route {}: max_message = {} also caps SIP over TCP (as before max_tcp_message existed); set max_tcp_message (default {}) for larger messages, e.g. a lower platform's one-MESSAGE Catalog (1 000 channels: some 340 KB)",
                    file.display(),
                    r.name,
                    r.policy.max_message,
                    config::MAX_TCP_MESSAGE,
                );
            }
            // On this machine, mode xdp: which egress interfaces take XDP redirects.
            if cfg.engine.mode == Mode::Xdp && cpus.is_none() {
                for line in crate::engine::xdp::egress_report(&cfg) {
                    println!("{}: {line}", file.display());
                }
            }
            // On this machine: the ring modes (every ring engine, PF_RING's included) hold
            // no socket per port, so the kernel must not hand the media ports out as
            // ephemeral ports (a warning, not a refusal). A split half still holds sockets.
            let ring = !matches!(cfg.engine.mode, Mode::Stack) && cfg.split.is_none();
            if ring && cpus.is_none() {
                let ranges: Vec<(u16, u16)> = cfg
                    .domains
                    .iter()
                    .map(|d| (d.media_ports.first, d.media_ports.last))
                    .collect();
                if let Some(advice) = crate::engine::ports::reserved_ports_advice(&ranges) {
                    if cfg.engine.reserve_ports {
                        eprintln!("{}: note: engine.reserve_ports = true: vgate reserves the media ranges at start (a warning if the kernel refuses, e.g. under ProtectKernelTunables=yes). Now: {advice}", file.display());
                    } else {
                        eprintln!("{}: warning: {advice}", file.display());
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// SIGINT and SIGTERM set the returned flag.
fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            tracing::warn!("cannot watch signal {sig}: {e}");
        }
    }
    stop
}

fn load(config: &Option<PathBuf>, mode: Option<Mode>) -> Result<Config, config::ConfigError> {
    let mut cfg = match config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    if let Some(m) = mode {
        cfg.engine.mode = m;
    }
    Ok(cfg)
}

fn run(
    config: Option<PathBuf>,
    mode: Option<Mode>,
    engine: Option<EngineKind>,
    stats_interval: u64,
) -> ExitCode {
    let cfg = match load(&config, mode) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let stop = stop_flag();
    let hup = Arc::new(AtomicBool::new(false));
    if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup)) {
        tracing::warn!("cannot watch SIGHUP, reload only through `vgate reload`: {e}");
    }
    // Before any thread starts: what this thread starts inherits it; workers pin themselves.
    // (The start-up affinity is read first: automatic CPUs of a reload come from it.)
    let _ = config::Cpus::this_machine();
    match crate::engine::keep_off_worker_cpus(&cfg.engine.cpus) {
        Some(rest) => tracing::info!(
            control_cpus = ?rest,
            worker_cpus = ?cfg.engine.cpus,
            "control threads kept off the worker CPUs"
        ),
        None if !cfg.engine.cpus.is_empty() => tracing::info!(
            worker_cpus = ?cfg.engine.cpus,
            "the workers take every allowed CPU: control threads share them"
        ),
        None => {}
    }
    let mut gw = match Gateway::start(cfg, engine) {
        Ok(gw) => gw,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let source = config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<embedded default>".into());
    tracing::info!(config = %source, "vgate running: {}", gw.describe());
    for w in gw.workers() {
        tracing::info!(
            worker = w.index,
            cpu = ?w.running_cpu(),
            pinned = w.pinned(),
            configured_cpu = ?w.cpu,
            "worker receiving"
        );
    }
    let stats = gw.worker_stats();
    let control = ControlState {
        config: Arc::new(std::sync::RwLock::new(Arc::clone(&gw.config))),
        routes: Arc::clone(&gw.routes),
        workers: stats.clone(),
        started: Instant::now(),
        engine: gw.describe(),
        signaling: Arc::clone(&gw.signaling_stats),
        split_signal: gw.split_signal_stats(),
        split: gw.split_stats(),
        neigh: gw.neigh_table(),
        xdp: gw.xdp_status(),
        reloads: Default::default(),
        ha: gw.ha_status(),
    };
    let (reload_tx, reload_rx) = crossbeam_channel::bounded::<ReloadRequest>(4);
    let admin = match AdminServer::start(control.clone(), reload_tx) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        routes = gw.routes.routes().len(),
        admin = %admin.addr,
        "static stream routes installed; a: {} ports {}, b: {} ports {}; admin interface: /metrics, /api/v1/...",
        gw.config.domains[0].address,
        gw.config.domains[0].media_ports,
        gw.config.domains[1].address,
        gw.config.domains[1].media_ports
    );
    systemd::ready(&format!("forwarding: {}", gw.describe()));
    let watchdog = systemd::watchdog_interval();
    let mut last_ping = Instant::now();
    let mut live = LiveView::new(&stats);
    let mut last = Instant::now();
    let mut failed = false;
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        let request = if hup.swap(false, Relaxed) {
            Some(None)
        } else {
            reload_rx.try_recv().ok().map(|r| Some(r.reply))
        };
        if let Some(reply) = request {
            systemd::reloading();
            let outcome = load(&config, mode)
                .map_err(|e| e.to_string())
                .and_then(|new| gw.reload(new));
            control.reloads.record(outcome.is_ok());
            match &outcome {
                Ok(summary) => {
                    control.set_config(Arc::clone(&gw.config));
                    tracing::info!("config reloaded: {summary}");
                }
                Err(reason) => {
                    tracing::error!("reload rejected, the running configuration stays: {reason}")
                }
            }
            systemd::reloaded(&format!("forwarding: {}", gw.describe()));
            if let Some(reply) = reply {
                let _ = reply.send(outcome);
            }
        }
        if let Some(every) = watchdog {
            // The ping depends on every worker being alive: a stuck worker stops it and
            // systemd restarts vgate.
            if last_ping.elapsed() >= every && control.healthy(crate::clock::now_ms()) {
                systemd::watchdog();
                last_ping = Instant::now();
            }
        }
        if stats_interval > 0 && last.elapsed() >= Duration::from_secs(stats_interval) {
            tracing::info!("{}", live.line(&stats));
            last = Instant::now();
        }
        if gw.workers().any(|w| w.exited.load(Relaxed)) {
            tracing::error!(
                "a worker stopped; shutting down so the service manager can restart vgate"
            );
            failed = true;
            break;
        }
    }
    systemd::stopping();
    tracing::info!("stopping");
    drop(admin);
    let routes = Arc::clone(&gw.routes);
    let split = gw.split_stats();
    let split_signal = gw.split_signal_stats();
    let workers = gw.shutdown();
    print!("{}", totals_report(&workers, &routes));
    if let Some(s) = split {
        print!("{}", s.report());
    }
    if let Some(s) = split_signal {
        println!("{}", s.report());
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The demo's screen is for a person: its live lines and report say what the routes did, so
/// the per-route log lines of the routes table (a `route started` line per stream, one
/// `session ended` line listing every route and port at the end) are left out unless
/// `RUST_LOG` asks for them (`RUST_LOG=debug vgate demo`). `vgate run` keeps them at info.
fn quiet_route_lines() {
    if std::env::var_os("RUST_LOG").is_none() {
        let _ = crate::logging::set_level("info,vgate::routes=warn");
    }
}

fn demo_cmd(opts: &DemoOptions, json: bool) -> ExitCode {
    quiet_route_lines();
    let stop = stop_flag();
    match demo::run(opts, &stop) {
        Ok(r) => {
            if json {
                println!("{}", r.to_json());
            } else {
                print!("{}", demo::render(&r));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgate demo: {e}");
            ExitCode::FAILURE
        }
    }
}

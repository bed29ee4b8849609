//! Command line: what each subcommand does and how it reports. `--help` on each teaches it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::config::{self, Config, Mode};
use crate::control::live::{totals_report, LiveView};
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
}

/// Runs a parsed command line.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
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

fn check_config(file: &std::path::Path) -> ExitCode {
    match Config::load(file) {
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

fn run(
    config: Option<PathBuf>,
    mode: Option<Mode>,
    engine: Option<EngineKind>,
    stats_interval: u64,
) -> ExitCode {
    let mut cfg = match &config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        None => Config::embedded_default(),
    };
    if let Some(m) = mode {
        cfg.engine.mode = m;
    }
    let stop = stop_flag();
    let gw = match Gateway::start(cfg, engine) {
        Ok(gw) => gw,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        config = %config.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "<embedded default>".into()),
        "vgate running: {}", gw.describe()
    );
    for w in gw.workers() {
        tracing::info!(worker = w.index, cpu = ?w.cpu, "worker receiving");
    }
    tracing::info!(
        routes = gw.routes.routes().len(),
        "static stream routes installed; a: {} ports {}, b: {} ports {}",
        gw.config.domains[0].address,
        gw.config.domains[0].media_ports,
        gw.config.domains[1].address,
        gw.config.domains[1].media_ports
    );
    let stats = gw.worker_stats();
    let mut live = LiveView::new(&stats);
    let mut last = Instant::now();
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if stats_interval > 0 && last.elapsed() >= Duration::from_secs(stats_interval) {
            tracing::info!("{}", live.line(&stats));
            last = Instant::now();
        }
        if gw.workers().any(|w| w.exited.load(Relaxed)) {
            tracing::error!(
                "a worker stopped; shutting down so the service manager can restart vgate"
            );
            let routes = Arc::clone(&gw.routes);
            let workers = gw.shutdown();
            print!("{}", totals_report(&workers, &routes));
            return ExitCode::FAILURE;
        }
    }
    tracing::info!("stopping");
    let routes = Arc::clone(&gw.routes);
    let workers = gw.shutdown();
    print!("{}", totals_report(&workers, &routes));
    ExitCode::SUCCESS
}

fn demo_cmd(opts: &DemoOptions, json: bool) -> ExitCode {
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

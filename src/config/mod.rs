//! Configuration: the TOML file an operator writes, checked into a [`Config`] the rest of vgate
//! can trust.
//!
//! Two layers: [`raw`] mirrors the file (serde, unknown keys rejected, values kept with their
//! byte spans), and [`validate`] turns it into [`Config`], reporting the first problem with the
//! file, line and key and what to do about it. Nothing here opens a socket or touches the
//! system; the only machine fact used is the number of CPUs, for the "more channels than
//! cores" check.

mod check;
pub mod ha;
mod raw;
pub mod split;
pub mod split_signal;
mod validate;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

use ipnet::Ipv4Net;

pub use check::Invalid;
pub use split::check_host as check_split_host;
pub use validate::{auto_cpus, validate};

/// The default re-latch silence (`security.relatch_after_ms`), as rtpengine's: long enough
/// that a live stream never loses its route, short enough for a restarted sender.
pub const DEFAULT_RELATCH_AFTER_MS: u64 = 2000;

/// The file compiled into the binary: a loopback gateway that runs without privileges.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// One of the two network domains the gateway joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DomainId {
    /// The video private network (cameras, NVRs, platforms).
    A,
    /// The user network (viewers, clients).
    B,
}

impl DomainId {
    /// Both domains, A first.
    pub const ALL: [DomainId; 2] = [DomainId::A, DomainId::B];

    /// The domain on the other side of the gateway.
    pub fn other(self) -> DomainId {
        match self {
            DomainId::A => DomainId::B,
            DomainId::B => DomainId::A,
        }
    }

    /// 0 for A, 1 for B: for arrays indexed by domain.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The name used in the config file and in metrics: `a` or `b`.
    pub fn name(self) -> &'static str {
        match self {
            DomainId::A => "a",
            DomainId::B => "b",
        }
    }
}

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An inclusive range of UDP ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    pub fn len(&self) -> usize {
        usize::from(self.last - self.first) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn overlaps(&self, other: &PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Capture mode, chosen once at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Kernel UDP sockets, batched with recvmmsg/sendmmsg.
    Stack,
    /// One ring per NIC RSS queue (PF_RING `dev@q`, or AF_PACKET fanout).
    Tnapi,
    /// Zero copy per queue (PF_RING ZC, or AF_XDP).
    Zc,
    /// Confirmed streams forwarded inside the kernel by an XDP program; the rest through
    /// AF_XDP as in `zc`.
    Xdp,
}

/// How mode tnapi's AF_PACKET rings hand packets over (`engine.tnapi.ring`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TnapiRing {
    /// TPACKET_V2: each frame reaches the worker as soon as the kernel wrote it; a wakeup
    /// takes every frame that is ready, so batches grow with the load and no timer adds
    /// latency. The default (measured in docs/bench-relay.md).
    #[default]
    V2,
    /// TPACKET_V3: blocks handed over when full or on the kernel's 1 ms block timer (fewer
    /// wakeups at moderate load, up to 1 ms added latency at a trickle).
    V3,
}

impl fmt::Display for TnapiRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TnapiRing::V2 => "v2",
            TnapiRing::V3 => "v3",
        })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Stack => "stack",
            Mode::Tnapi => "tnapi",
            Mode::Zc => "zc",
            Mode::Xdp => "xdp",
        })
    }
}

/// What a stream route does with packets from a source other than the expected one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourcePolicy {
    /// Only the expected source is forwarded; everything else is dropped and counted.
    Strict,
    /// The first source seen (or the expected one, if given) is kept; others are dropped.
    Latch,
    /// Any source is forwarded.
    Any,
}

impl fmt::Display for SourcePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourcePolicy::Strict => "strict",
            SourcePolicy::Latch => "latch",
            SourcePolicy::Any => "any",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalingKind {
    Sip,
    Rtsp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Udp,
    Tcp,
}

/// A checked domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    pub id: DomainId,
    /// The NIC facing this domain (used by the per-queue engines).
    pub interface: String,
    /// The gateway's own address in this domain.
    pub address: Ipv4Addr,
    /// Networks that belong to this domain.
    pub networks: Vec<Ipv4Net>,
    /// Gateway ports for media arriving from this domain.
    pub media_ports: PortRange,
}

impl Domain {
    /// Whether `addr` lives in this domain (its networks or the gateway's own address).
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        addr == self.address || self.networks.iter().any(|n| n.contains(&addr))
    }
}

/// Engine settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    pub mode: Mode,
    /// Worker threads, one per queue.
    pub queues: usize,
    /// CPU of each worker (same length as `queues`).
    pub cpus: Vec<usize>,
    /// Packets per receive/send system call.
    pub batch: usize,
    /// Largest UDP payload forwarded; anything longer is dropped as `oversize`.
    pub max_payload: usize,
    /// Mode tnapi on AF_PACKET: the ring version (`[engine.tnapi] ring`).
    pub tnapi_ring: TnapiRing,
    /// `engine.reserve_ports`: a ring mode holding no socket per port adds the media ranges
    /// to `net.ipv4.ip_local_reserved_ports` of its network namespace at start (a warning
    /// when refused). Off by default.
    pub reserve_ports: bool,
}

/// A static signaling route: where a proxy listens and where it forwards.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalingRoute {
    pub name: String,
    pub kind: SignalingKind,
    pub transport: Transport,
    pub listen_domain: DomainId,
    pub listen_port: u16,
    pub upstream: SocketAddrV4,
    /// RTSP settings; `Some` exactly for RTSP routes.
    pub rtsp: Option<RtspOptions>,
    /// Access control, limits and timers of the SIP proxy serving this route.
    pub policy: SignalingPolicy,
    /// Message traces at debug level (`trace = true`), see `signaling::proxy::trace`.
    pub trace: bool,
    /// Media validation of the sessions this route negotiates (`media_validate`, default
    /// `media.validate`).
    pub media_validate: MediaMode,
}

/// Default `max_tcp_message`: 1 MiB, a one-MESSAGE Catalog of some 3 000 channels.
pub const MAX_TCP_MESSAGE: usize = 1 << 20;
/// Largest `max_tcp_message` accepted (4 MiB, some 12 000 channels in one MESSAGE).
pub const MAX_TCP_MESSAGE_CAP: usize = 4 << 20;

/// Default `tcp_media_reconnect`: three reconnects at 1 s, 2 s and 4 s backoff, with margin.
pub const TCP_MEDIA_RECONNECT: std::time::Duration = std::time::Duration::from_secs(10);

/// Per-route access control, limits and timers of a SIP proxy.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalingPolicy {
    /// Peers allowed to talk to the listen side; empty: any address of the listen domain.
    pub allow_peers: Vec<Ipv4Net>,
    /// GB/T 28181 ID prefixes (digits) allowed in From and To; empty: any party.
    pub allow_ids: Vec<String>,
    /// Largest SIP message accepted over UDP, in bytes (one datagram: at most 65 535).
    pub max_message: usize,
    /// Largest SIP message accepted over TCP, in bytes (a framed message): a lower platform
    /// answering Catalog with 1 000+ channels in one MESSAGE needs hundreds of KB. Default
    /// [`MAX_TCP_MESSAGE`]; an older config that set only `max_message` keeps that limit.
    pub max_tcp_message: usize,
    /// How long an INVITE may wait for its final response before the call is abandoned.
    pub invite_timeout: std::time::Duration,
    /// How long an established call may carry no media before it is ended (BYE both sides);
    /// zero: never.
    pub media_timeout: std::time::Duration,
    /// How long a call keeps a passive TCP media leg (the peer is the TCP client) whose peer
    /// closed its connection, listening on the same gateway port for the peer's new one
    /// (GB/T 28181-2022 Annex D: the client reconnects at least 3 times, at least 1 s
    /// apart); past it the call ends with BYE. Default [`TCP_MEDIA_RECONNECT`].
    pub tcp_media_reconnect: std::time::Duration,
    /// Requests per second accepted from one source address; 0: no limit.
    pub rate_limit: u32,
    /// TCP connections accepted from one source address at a time.
    pub max_connections_per_source: usize,
    /// Port of the gateway's SIP socket on the upstream side (stable across restarts, so
    /// registrations made through it stay reachable). Default: the listen port.
    pub upstream_port: u16,
    /// Contacts one source address may hold in the binding table (SIP).
    pub max_bindings_per_source: usize,
    /// What the address fields of MANSCDP bodies become as they cross (SIP).
    pub manscdp_addresses: ManscdpAddresses,
    /// MANSCDP commands allowed in requests from the listen side; empty: any not denied.
    pub manscdp_allow: Vec<String>,
    /// MANSCDP commands refused with 403 in requests from the listen side.
    pub manscdp_deny: Vec<String>,
    /// MANSCDP commands refused with 403 in requests arriving from domain B (the user
    /// network), whichever face that is; default [`MANSCDP_DENY_FROM_B`].
    pub manscdp_deny_from_b: Vec<String>,
}

/// The MANSCDP commands refused from domain B unless a route's `manscdp_deny_from_b`
/// says otherwise: the GB/T 28181-2022 controls that destroy what a device holds (its
/// firmware, its recordings).
pub const MANSCDP_DENY_FROM_B: [&str; 2] = ["DeviceUpgrade", "FormatSDCard"];

/// What the address fields of a MANSCDP body (`<IPAddress>`, `<Port>`, an `<Address>`
/// holding an IP address) become when the body crosses the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ManscdpAddresses {
    /// The gateway's address (and SIP port) on the receiving side.
    #[default]
    Gateway,
    /// Emptied.
    Blank,
    /// Unchanged (the far domain learns the near domain's addresses).
    Keep,
}

impl Default for SignalingPolicy {
    fn default() -> Self {
        SignalingPolicy {
            allow_peers: Vec::new(),
            allow_ids: Vec::new(),
            max_message: 65_535,
            max_tcp_message: MAX_TCP_MESSAGE,
            invite_timeout: std::time::Duration::from_secs(32),
            media_timeout: std::time::Duration::from_secs(60),
            tcp_media_reconnect: TCP_MEDIA_RECONNECT,
            rate_limit: 1000,
            max_connections_per_source: 16,
            upstream_port: 0,
            max_bindings_per_source: 256,
            manscdp_addresses: ManscdpAddresses::Gateway,
            manscdp_allow: Vec::new(),
            manscdp_deny: Vec::new(),
            manscdp_deny_from_b: MANSCDP_DENY_FROM_B.map(String::from).to_vec(),
        }
    }
}

/// A secret from the config file (a password). `Debug` prints `***`; read it with
/// [`Secret::expose`] only where it is used.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// A username and its password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserPass {
    pub username: String,
    pub password: Secret,
}

/// One path prefix of an RTSP route and the upstream serving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RtspPath {
    /// Client-visible prefix, e.g. `/cam1` (`/` matches every path).
    pub prefix: String,
    pub upstream: SocketAddrV4,
    /// What replaces the prefix upstream, e.g. `/test`.
    pub upstream_path: String,
    /// Credentials vgate answers this upstream's challenges with.
    pub credentials: Option<UserPass>,
}

/// Default `max_sessions_per_source` of an RTSP route: a platform pulling every camera of a
/// site through one address holds a connection per stream.
pub const RTSP_SESSIONS_PER_SOURCE: usize = 1024;

/// RTSP settings of a signaling route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RtspOptions {
    /// Never empty: without `paths` in the file, one `/` path to the route's upstream.
    pub paths: Vec<RtspPath>,
    /// Clients must authenticate to vgate with one of these (Digest); empty: no check.
    pub client_users: Vec<UserPass>,
    pub client_realm: String,
    /// Seconds without a client request before a session is ended, when the server's
    /// `Session: ...;timeout=` names none.
    pub session_timeout: u32,
    /// Seconds a client may take to send one whole request (from its first byte, or from
    /// the connection for the first one) before the connection is closed.
    pub request_timeout: u32,
    /// Connections holding a media session (a track set up) one source address may have at
    /// a time; `max_connections_per_source` counts only the others.
    pub max_sessions_per_source: usize,
}

/// A static stream route from the config file.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticStream {
    pub name: String,
    /// Domain the media arrives from; it leaves into the other one.
    pub domain: DomainId,
    /// Gateway port in `domain` that receives the media.
    pub port: u16,
    /// Receiver in the other domain.
    pub destination: SocketAddrV4,
    /// Gateway port in the other domain the media is sent from; `None`: allocated.
    pub egress_port: Option<u16>,
    /// Only this source is forwarded under `strict`; the initial latch under `latch`.
    /// Port 0 accepts any port of that address.
    pub expect_source: Option<SocketAddrV4>,
    pub policy: SourcePolicy,
    /// Drop datagrams that are not RTP version 2.
    pub rtp_only: bool,
    /// What the media validator checks on this route (`stream_route.media`); `None`: not
    /// validated (a static route names its codec to be validated).
    pub media: Option<crate::media::Rule>,
}

/// What the media validator does with a route's packets ([`crate::media`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaMode {
    /// Not validated.
    Off,
    /// Validated; violations are counted (by reason) and logged, the packets still cross.
    Count,
    /// Validated; violations are counted, logged and dropped (`media_invalid`).
    Enforce,
    /// As `enforce`, but what can soundly be cut out of a packet (PS padding and private
    /// streams, SEI user data) is removed and the rest forwarded (`media_stripped`).
    Strip,
}

impl MediaMode {
    pub fn name(self) -> &'static str {
        match self {
            MediaMode::Off => "off",
            MediaMode::Count => "count",
            MediaMode::Enforce => "enforce",
            MediaMode::Strip => "strip",
        }
    }

    /// Whether a refused packet is dropped (`enforce`, `strip`), not only counted.
    pub fn enforces(self) -> bool {
        matches!(self, MediaMode::Enforce | MediaMode::Strip)
    }

    /// The rule for a stream negotiated as `spec` under `policy`; `None` when off.
    pub fn rule(
        self,
        spec: crate::media::StreamSpec,
        policy: crate::media::Policy,
    ) -> Option<crate::media::Rule> {
        (self != MediaMode::Off).then_some(crate::media::Rule {
            enforce: self.enforces(),
            spec,
            policy: crate::media::Policy {
                strip: self == MediaMode::Strip,
                ..policy
            },
        })
    }
}

impl fmt::Display for MediaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `[media]`: the default of every route's media validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediaConfig {
    /// For signaled sessions (SIP, RTSP), unless their signaling route says otherwise
    /// (`media_validate`), and for static routes that name a codec.
    pub validate: MediaMode,
    pub policy: crate::media::Policy,
}

impl Default for MediaConfig {
    /// `count`: every release before media validation forwarded whatever crossed; a config
    /// written for one must still run the same (count shows what `enforce` would drop).
    fn default() -> Self {
        MediaConfig {
            validate: MediaMode::Count,
            policy: crate::media::Policy::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Security {
    pub source_validation: SourcePolicy,
    pub rtp_only: bool,
    /// Under `latch`: how long (ms) the latched source must have forwarded nothing before
    /// another source may take the route; 0: never (the first source keeps it for good).
    pub relatch_after_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Control {
    /// Management address (admin interface, metrics).
    pub listen: std::net::SocketAddr,
    /// Token the admin interface requires (`Authorization: Bearer …`); always set when
    /// `listen` is not a loopback address.
    pub token: Option<String>,
    pub per_stream_metrics: bool,
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Indexed by [`DomainId::index`].
    pub domains: [Domain; 2],
    pub engine: EngineConfig,
    pub security: Security,
    pub control: Control,
    pub signaling: Vec<SignalingRoute>,
    pub streams: Vec<StaticStream>,
    /// `[media]`: media validation defaults.
    pub media: MediaConfig,
    /// `Some`: this process is one half of a split appliance (`[split]`).
    pub split: Option<crate::config::split::SplitConfig>,
    /// `Some`: this gateway is one node of a hot-standby pair (`[ha]`); it starts as the
    /// standby and forwards only while it is told it is the active one.
    pub ha: Option<crate::config::ha::HaConfig>,
}

impl Config {
    /// The longest packet a TCP media leg ([`crate::edge`]) puts on a channel:
    /// `engine.max_payload` on a single host (the far side is a UDP datagram on a domain);
    /// in a split half the larger of it and `split.out_link.max_datagram`, since the leg's
    /// packets toward the link face are cut into link frames (and its domain side is TCP).
    pub fn leg_max_payload(&self) -> usize {
        match &self.split {
            Some(s) => self.engine.max_payload.max(s.out_link.max_datagram),
            None => self.engine.max_payload,
        }
    }

    pub fn domain(&self, id: DomainId) -> &Domain {
        &self.domains[id.index()]
    }

    /// The domain `addr` belongs to, if any.
    pub fn domain_of(&self, addr: Ipv4Addr) -> Option<DomainId> {
        DomainId::ALL
            .into_iter()
            .find(|d| self.domain(*d).contains(addr))
    }

    /// The domain whose media range holds `port`, if any (the ranges never overlap).
    pub fn domain_of_port(&self, port: u16) -> Option<DomainId> {
        DomainId::ALL
            .into_iter()
            .find(|d| self.domain(*d).media_ports.contains(port))
    }

    /// The embedded default.
    pub fn embedded_default() -> Config {
        match parse(DEFAULT_TOML, "<embedded default>") {
            Ok(cfg) => cfg,
            // The default is a compile-time constant covered by a unit test.
            Err(e) => panic!("embedded default config is invalid: {e}"),
        }
    }

    /// Reads and validates a config file for this machine.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_on(path, &Cpus::this_machine())
    }

    /// Reads and validates a config file for a machine with `cpus` CPUs (0 to `cpus - 1`,
    /// all online and allowed).
    pub fn load_for(path: &Path, cpus: usize) -> Result<Config, ConfigError> {
        Config::load_on(path, &Cpus::first(cpus))
    }

    /// Reads and validates a config file for a machine with the CPUs `cpus`.
    pub fn load_on(path: &Path, cpus: &Cpus) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read the file: {e}"),
        })?;
        parse_on(&text, &path.display().to_string(), cpus)
    }
}

/// Parses and validates `text` for this machine; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
    parse_on(text, file, &Cpus::this_machine())
}

/// Parses and validates `text` for a machine with `cpus` CPUs (0 to `cpus - 1`).
pub fn parse_for(text: &str, file: &str, cpus: usize) -> Result<Config, ConfigError> {
    parse_on(text, file, &Cpus::first(cpus))
}

/// Parses and validates `text` for a machine with the CPUs `cpus`.
pub fn parse_on(text: &str, file: &str, cpus: &Cpus) -> Result<Config, ConfigError> {
    let raw: raw::RawConfig = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
        ConfigError {
            file: file.to_string(),
            line,
            column,
            key: String::new(),
            message: e.message().trim_end().to_string(),
        }
    })?;
    validate(&raw, cpus).map_err(|e| ConfigError {
        file: file.to_string(),
        line: e
            .span
            .as_ref()
            .map(|s| line_col(text, s.start).0)
            .unwrap_or(0),
        column: e
            .span
            .as_ref()
            .map(|s| line_col(text, s.start).1)
            .unwrap_or(0),
        key: e.key,
        message: e.message,
    })
}

/// CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The CPUs `engine.cpus` is checked against and automatic CPUs are chosen from.
///
/// `online` is the machine's (`/sys/devices/system/cpu/online`): a worker may be pinned to
/// any of them, also outside this process's start-up affinity (`taskset`, systemd's
/// `CPUAffinity=`) and on isolated CPUs (`isolcpus=`), which is where an appliance puts its
/// workers. `allowed` is the start-up affinity, where automatic CPUs are taken from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpus {
    pub online: Vec<usize>,
    pub allowed: Vec<usize>,
}

impl Cpus {
    /// This machine: online CPUs from sysfs, the allowed ones from the affinity mask as it
    /// was at the first call (start-up: `vgate run` later keeps its control threads off the
    /// worker CPUs, and a reload must still choose the same automatic CPUs).
    pub fn this_machine() -> Cpus {
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|t| parse_cpu_list(&t))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| (0..available_cpus()).collect());
        static START: std::sync::OnceLock<Option<Vec<usize>>> = std::sync::OnceLock::new();
        let allowed = START
            .get_or_init(|| {
                nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
                    .map(|set| {
                        (0..nix::sched::CpuSet::count())
                            .filter(|&c| set.is_set(c).unwrap_or(false))
                            .collect::<Vec<_>>()
                    })
                    .ok()
                    .filter(|v| !v.is_empty())
            })
            .clone()
            .unwrap_or_else(|| online.clone());
        Cpus { online, allowed }
    }

    /// CPUs 0 to `n - 1`, all online and allowed (`check-config --cpus N`, tests).
    pub fn first(n: usize) -> Cpus {
        let all: Vec<usize> = (0..n.max(1)).collect();
        Cpus {
            online: all.clone(),
            allowed: all,
        }
    }

    /// The online list in the kernel's notation ("0-3,6").
    pub fn online_list(&self) -> String {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.online.len() {
            let start = self.online[i];
            let mut end = start;
            while i + 1 < self.online.len() && self.online[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            out.push(if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            });
            i += 1;
        }
        out.join(",")
    }
}

/// A kernel CPU list ("0-3,6,8-9") as CPU numbers; `None` when malformed.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                v.extend(a..=b);
            }
            None => v.push(part.parse().ok()?),
        }
    }
    v.sort_unstable();
    v.dedup();
    Some(v)
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}

/// What is wrong with a config file, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the problem has no single place (e.g. a missing section).
    pub line: usize,
    pub column: usize,
    /// Dotted path of the key, e.g. `stream_route[2].destination`.
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

#[cfg(test)]
mod tests;

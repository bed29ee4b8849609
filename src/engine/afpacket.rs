//! AF_PACKET TPACKET_V3 or TPACKET_V2 rings with fanout: the `tnapi` engine where PF_RING is
//! absent.
//!
//! Owns: opening one ring per RX queue, waiting for and walking filled blocks, ring
//! statistics and the classic BPF port-range filter. Must not touch: routing decisions or
//! packet contents beyond the ring's own per-packet headers — frames are handed out as
//! `&[u8]` for [`crate::wire`] to parse. All `unsafe` is in `engine::sys::afpacket`.
//!
//! # One ring per RX queue
//!
//! [`PacketRing::open`] with [`Fanout::Qm`] joins the ring to a fanout group whose kernel
//! demultiplexer sends a packet received on RX queue *q* to member `q % members`. Members
//! are numbered **in the order the sockets joined** (and when a member leaves, the last
//! member takes its slot), so rings must be opened in queue order 0, 1, … n−1 and live and
//! die together. [`PacketRing::open_queues`] does exactly that; prefer it.
//!
//! # Why `ETH_P_IP` and not `ETH_P_ALL`
//!
//! The socket is bound with `ETH_P_IP`: the kernel then delivers only IPv4 frames (no
//! ARP/IPv6/LLDP taking ring space and parse time), and never the host's own outgoing
//! packets (only `ETH_P_ALL` taps see transmitted frames; `PACKET_IGNORE_OUTGOING` and the
//! fanout flag of the same name are still set, as a second guard). The price: an `ETH_P_IP`
//! socket is served after the `netdev` ingress hook and after the IP stack's own handler,
//! so media drop rules must live in the `inet` family (see `engine::nft`), never in a
//! `netdev ingress` chain, which would hide the packets from the ring too. The socket is
//! created with protocol 0 and only bound with `ETH_P_IP` to the interface, so it never
//! receives frames from other interfaces in between.
//!
//! # Latency: V3 blocks or V2 frames ([`RingVersion`])
//!
//! A TPACKET_V3 block reaches user space when it is full or when `block_timeout_ms` expires
//! (the kernel's retire timer, in whole milliseconds): under load blocks fill in
//! microseconds; at a trickle each packet may wait up to the timeout, and the socket is
//! woken once per block. A TPACKET_V2 ring hands over each frame the moment it is written
//! (and wakes the socket per frame unless user space is already draining): no added latency,
//! and batching comes from the load (a wakeup takes every frame that is ready). In this
//! API a V2 frame is a "block" holding one frame, so callers walk both the same way.

use super::sys::afpacket as sys;
use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::ops::{AddAssign, RangeInclusive};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// How a fanout group spreads packets over its member rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fanout {
    /// `PACKET_FANOUT_QM`: RX queue *q* → member *q* (join order). One ring per RSS queue.
    Qm,
    /// `PACKET_FANOUT_HASH`: by flow hash (all packets of a flow to one member).
    Hash,
    /// `PACKET_FANOUT_CPU`: by the CPU that received the packet.
    Cpu,
    /// `PACKET_FANOUT_LB`: round robin (breaks per-flow order: not for RTP).
    Lb,
}

impl Fanout {
    fn kernel_mode(self) -> u32 {
        match self {
            Fanout::Qm => libc::PACKET_FANOUT_QM,
            Fanout::Hash => libc::PACKET_FANOUT_HASH,
            Fanout::Cpu => libc::PACKET_FANOUT_CPU,
            Fanout::Lb => libc::PACKET_FANOUT_LB,
        }
    }
}

/// Which fanout group a ring joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutGroup {
    /// This id (joined if it exists with the same mode and interface, created otherwise).
    Id(u16),
    /// A new group whose id the kernel picks (`PACKET_FANOUT_FLAG_UNIQUEID`).
    Unique,
}

/// One destination the ring filter keeps: UDP to `ports`, and to `addr` when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DstMatch {
    pub addr: Option<Ipv4Addr>,
    pub ports: RangeInclusive<u16>,
}

/// The TPACKET version of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RingVersion {
    /// Blocks of variable-size frames, handed over when full or on the block timer.
    #[default]
    V3,
    /// Fixed-size frames, each handed over as soon as it is written.
    V2,
}

/// Ring geometry. See `Documentation/networking/packet_mmap.rst`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingParams {
    /// TPACKET_V3 (blocks) or TPACKET_V2 (frames).
    pub version: RingVersion,
    /// Bytes per block: a power of two and a multiple of the page size.
    pub block_size: u32,
    /// Number of blocks in the ring.
    pub block_count: u32,
    /// The TPACKET frame size: a multiple of 16, at least the TPACKET header, dividing
    /// `block_size`. TPACKET_V3 packs packets of any size into blocks; this only sets the
    /// kernel's accounting of `tp_frame_nr`. TPACKET_V2: the slot of one packet (a longer
    /// one is truncated to fit, see [`Frame::truncated`]).
    pub frame_size: u32,
    /// V3: a block that has packets is handed to user space after this long even if not
    /// full. Not used by V2.
    pub block_timeout_ms: u32,
    /// Classic BPF filter: keep only IPv4/UDP matching one of these destinations. Empty:
    /// no filter, every IPv4 frame.
    pub filter: Vec<DstMatch>,
}

impl Default for RingParams {
    /// 16 blocks of 256 KiB (4 MiB per ring), 2 KiB frames, 1 ms block timeout, no filter.
    fn default() -> Self {
        RingParams {
            version: RingVersion::V3,
            block_size: 1 << 18,
            block_count: 16,
            frame_size: 2048,
            block_timeout_ms: 1,
            filter: Vec::new(),
        }
    }
}

/// Errors of the AF_PACKET engine; each message says what the operator can do.
#[derive(Debug, thiserror::Error)]
pub enum AfPacketError {
    #[error("opening an AF_PACKET socket needs CAP_NET_RAW (run as root or grant the capability, e.g. AmbientCapabilities=CAP_NET_RAW in the systemd unit)")]
    NeedsCapNetRaw,
    #[error("this kernel has no AF_PACKET support (CONFIG_PACKET): use the stack engine")]
    NoAfPacket,
    #[error("no interface named {ifname:?} in this network namespace: check `ip link` and the domain's interface in the config")]
    NoSuchInterface { ifname: String },
    #[error("{ifname:?} is not a valid interface name (1 to 15 bytes, no NUL, '/' or whitespace)")]
    BadInterfaceName { ifname: String },
    #[error("invalid ring parameters: {0}; fix the engine section of the config")]
    BadParams(&'static str),
    #[error(
        "invalid destination port filter {lo}-{hi}: the low port must not exceed the high port"
    )]
    BadPortRange { lo: u16, hi: u16 },
    #[error("opening the AF_PACKET socket failed: {0}")]
    Socket(#[source] io::Error),
    #[error("the kernel refused a ring of {block_count} blocks of {block_size} bytes ({source}): lower block_count or block_size")]
    RingSetup {
        block_count: u32,
        block_size: u32,
        source: io::Error,
    },
    #[error("mapping the {bytes}-byte ring failed ({source}): lower block_count or block_size, or check the memory limits of the service")]
    Mmap { bytes: usize, source: io::Error },
    #[error("binding the ring to {ifname:?} failed ({source}): is the interface up and in this namespace?")]
    Bind { ifname: String, source: io::Error },
    #[error("joining fanout group {group} ({mode:?}) on {ifname:?} failed ({source}): {hint}")]
    FanoutJoin {
        group: u16,
        mode: Fanout,
        ifname: String,
        hint: &'static str,
        source: io::Error,
    },
    #[error("setting {option} on the ring failed ({source}): {hint}")]
    SocketOption {
        option: &'static str,
        hint: &'static str,
        source: io::Error,
    },
    #[error("waiting for packets on the ring failed: {0}")]
    Poll(#[source] io::Error),
    #[error("reading the ring statistics (PACKET_STATISTICS) failed: {0}")]
    Stats(#[source] io::Error),
}

/// One TPACKET_V3 or V2 receive ring bound to an interface and joined to a fanout group.
///
/// `Send` (a sniffer thread owns it) but not `Sync`: blocks must be consumed in order by one
/// thread, and a received frame borrows the ring until its block is dropped.
///
/// ```compile_fail
/// fn sync<T: Sync>() {}
/// sync::<vgate::engine::afpacket::PacketRing>();
/// ```
pub struct PacketRing {
    // Field order: the mapping is unmapped before the socket is closed.
    map: sys::RingMap,
    fd: OwnedFd,
    next_block: usize,
    ifindex: u32,
    version: RingVersion,
}

/// `(ifname, ifindex)` after validation.
fn resolve_ifname(ifname: &str) -> Result<u32, AfPacketError> {
    let bad = || AfPacketError::BadInterfaceName {
        ifname: ifname.to_owned(),
    };
    if ifname.is_empty()
        || ifname.len() >= libc::IFNAMSIZ
        || ifname.bytes().any(|b| b == b'/' || b.is_ascii_whitespace())
    {
        return Err(bad());
    }
    let c = CString::new(ifname).map_err(|_| bad())?;
    sys::if_nametoindex(&c).map_err(|e| match e.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::ENXIO) => AfPacketError::NoSuchInterface {
            ifname: ifname.to_owned(),
        },
        _ => AfPacketError::Bind {
            ifname: ifname.to_owned(),
            source: e,
        },
    })
}

fn check_params(p: &RingParams) -> Result<(), AfPacketError> {
    use AfPacketError::BadParams;
    let page = sys::page_size() as u64;
    let bs = u64::from(p.block_size);
    if bs == 0 || !bs.is_power_of_two() || !bs.is_multiple_of(page) {
        return Err(BadParams(
            "block_size must be a power of two and a multiple of the page size",
        ));
    }
    if p.block_count == 0 {
        return Err(BadParams("block_count must be at least 1"));
    }
    let hdr = match p.version {
        RingVersion::V3 => libc::TPACKET3_HDRLEN,
        RingVersion::V2 => libc::TPACKET2_HDRLEN,
    } as u32;
    if p.frame_size < hdr
        || !p.frame_size.is_multiple_of(16)
        || !p.block_size.is_multiple_of(p.frame_size)
    {
        return Err(BadParams(
            "frame_size must be a multiple of 16, at least the TPACKET header, and divide block_size",
        ));
    }
    let total = bs * u64::from(p.block_count);
    if total > u64::from(u32::MAX) || total > usize::MAX as u64 {
        return Err(BadParams("block_size * block_count must stay below 4 GiB"));
    }
    if p.version == RingVersion::V3 && p.block_timeout_ms == 0 {
        return Err(BadParams(
            "block_timeout_ms must be at least 1 (0 lets the kernel pick ~8 ms)",
        ));
    }
    for m in &p.filter {
        if m.ports.start() > m.ports.end() {
            return Err(AfPacketError::BadPortRange {
                lo: *m.ports.start(),
                hi: *m.ports.end(),
            });
        }
    }
    Ok(())
}

fn opt_err(option: &'static str, hint: &'static str) -> impl FnOnce(io::Error) -> AfPacketError {
    move |source| AfPacketError::SocketOption {
        option,
        hint,
        source,
    }
}

impl PacketRing {
    /// Open a ring on `ifname` and join fanout group `fanout_group` in `fanout_mode`
    /// ([`FanoutGroup::Unique`]: a new group with an id no other socket of the namespace
    /// uses; read it back with [`PacketRing::fanout_id`]).
    ///
    /// Order of operations: socket (protocol 0: receives nothing yet) → `PACKET_VERSION`
    /// (V3 or V2, `params.version`) → a drop-everything filter → `PACKET_RX_RING` → mmap → bind(ifindex, `ETH_P_IP`)
    /// → `PACKET_IGNORE_OUTGOING` → `PACKET_FANOUT` → the real filter (or none). The
    /// drop-everything filter keeps the ring empty between `bind` and the fanout join, when
    /// the socket would otherwise see every queue's packets.
    ///
    /// With [`Fanout::Qm`] the ring becomes member number "rings already in the group" —
    /// open queue 0 first (see the module doc, or use [`PacketRing::open_queues`]).
    #[doc(alias = "PACKET_FANOUT")]
    pub fn open(
        ifname: &str,
        fanout_group: FanoutGroup,
        fanout_mode: Fanout,
        params: &RingParams,
    ) -> Result<PacketRing, AfPacketError> {
        check_params(params)?;
        let ifindex = resolve_ifname(ifname)?;
        let filter = if params.filter.is_empty() {
            None
        } else {
            Some(udp_dst_filter(&params.filter)?)
        };

        let fd = sys::packet_socket().map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => AfPacketError::NeedsCapNetRaw,
            Some(libc::EAFNOSUPPORT) => AfPacketError::NoAfPacket,
            _ => AfPacketError::Socket(e),
        })?;
        let s = fd.as_fd();
        let (version, option) = match params.version {
            RingVersion::V3 => (
                libc::tpacket_versions::TPACKET_V3,
                "PACKET_VERSION=TPACKET_V3",
            ),
            RingVersion::V2 => (
                libc::tpacket_versions::TPACKET_V2,
                "PACKET_VERSION=TPACKET_V2",
            ),
        };
        sys::set_opt(
            s,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &(version as libc::c_int),
        )
        .map_err(opt_err(
            option,
            "the kernel needs TPACKET_V3 (Linux 3.2 or later) or TPACKET_V2 (2.6.27)",
        ))?;
        sys::attach_filter(s, &to_sock_filter(&DROP_ALL)).map_err(opt_err(
            "SO_ATTACH_FILTER (drop all)",
            "classic BPF socket filters must be enabled in the kernel",
        ))?;

        let frame_nr = (params.block_size / params.frame_size) * params.block_count;
        let set = match params.version {
            RingVersion::V3 => {
                let req = libc::tpacket_req3 {
                    tp_block_size: params.block_size,
                    tp_block_nr: params.block_count,
                    tp_frame_size: params.frame_size,
                    tp_frame_nr: frame_nr,
                    tp_retire_blk_tov: params.block_timeout_ms,
                    tp_sizeof_priv: 0,
                    tp_feature_req_word: libc::TP_FT_REQ_FILL_RXHASH,
                };
                sys::set_opt(s, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
            }
            RingVersion::V2 => {
                let req = libc::tpacket_req {
                    tp_block_size: params.block_size,
                    tp_block_nr: params.block_count,
                    tp_frame_size: params.frame_size,
                    tp_frame_nr: frame_nr,
                };
                sys::set_opt(s, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
            }
        };
        set.map_err(|source| AfPacketError::RingSetup {
            block_count: params.block_count,
            block_size: params.block_size,
            source,
        })?;
        let bytes = params.block_size as usize * params.block_count as usize;
        // V3: the slots are the blocks. V2: the frames (`frame_size` divides `block_size`,
        // so they lie back to back).
        let map = match params.version {
            RingVersion::V3 => sys::RingMap::map(
                s,
                params.block_size as usize,
                params.block_count as usize,
                sys::BLOCK_STATUS_OFFSET,
            ),
            RingVersion::V2 => sys::RingMap::map(
                s,
                params.frame_size as usize,
                frame_nr as usize,
                sys::FRAME_STATUS_OFFSET,
            ),
        }
        .map_err(|source| AfPacketError::Mmap { bytes, source })?;

        sys::bind_ll(s, ifindex, libc::ETH_P_IP as u16).map_err(|e| match e.raw_os_error() {
            Some(libc::ENODEV) => AfPacketError::NoSuchInterface {
                ifname: ifname.to_owned(),
            },
            _ => AfPacketError::Bind {
                ifname: ifname.to_owned(),
                source: e,
            },
        })?;
        sys::set_opt(s, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1).map_err(opt_err(
            "PACKET_IGNORE_OUTGOING",
            "the kernel needs Linux 4.20 or later",
        ))?;

        // IGNORE_OUTGOING must be a group flag too: a fanout group delivers through its own
        // hook, which ignores the per-socket option.
        let mut type_flags = fanout_mode.kernel_mode() | libc::PACKET_FANOUT_FLAG_IGNORE_OUTGOING;
        let id = match fanout_group {
            FanoutGroup::Id(id) => id,
            FanoutGroup::Unique => {
                // The kernel picks an id no group of this namespace has; never joins
                // someone else's group by accident.
                type_flags |= libc::PACKET_FANOUT_FLAG_UNIQUEID;
                0
            }
        };
        let arg = (u32::from(id) | (type_flags << 16)) as libc::c_int;
        sys::set_opt(s, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EINVAL) => "a group with this id already exists in this network namespace with another mode, interface or protocol (another vgate instance or capture tool?): choose another fanout group id",
                Some(libc::ENOSPC) => "the group is full (at most 256 members)",
                Some(libc::ENOMEM) => "the kernel is out of memory",
                Some(libc::EALREADY) => "the socket is already in a fanout group",
                _ => "check that the interface is up",
            };
            AfPacketError::FanoutJoin {
                group: id,
                mode: fanout_mode,
                ifname: ifname.to_owned(),
                hint,
                source: e,
            }
        })?;

        let hint = "classic BPF socket filters must be enabled in the kernel";
        match filter {
            Some(prog) => sys::attach_filter(s, &to_sock_filter(&prog))
                .map_err(opt_err("SO_ATTACH_FILTER (udp destination filter)", hint))?,
            None => sys::detach_filter(s).map_err(opt_err("SO_DETACH_FILTER", hint))?,
        }
        Ok(PacketRing {
            map,
            fd,
            next_block: 0,
            ifindex,
            version: params.version,
        })
    }

    /// Open `queues` rings on `ifname` in queue order, all in one [`Fanout::Qm`] group
    /// (`fanout_group`, or a new unique one when `None`): element *q* receives RX queue
    /// *q* (and *q + queues*, … when the interface has more queues than rings).
    pub fn open_queues(
        ifname: &str,
        fanout_group: Option<u16>,
        queues: u16,
        params: &RingParams,
    ) -> Result<Vec<PacketRing>, AfPacketError> {
        let mut rings: Vec<PacketRing> = Vec::with_capacity(usize::from(queues));
        let mut group = fanout_group.map_or(FanoutGroup::Unique, FanoutGroup::Id);
        for _ in 0..queues {
            let ring = PacketRing::open(ifname, group, Fanout::Qm, params)?;
            if group == FanoutGroup::Unique {
                group = FanoutGroup::Id(ring.fanout_id()?);
            }
            rings.push(ring);
        }
        Ok(rings)
    }

    /// The id of the fanout group the ring belongs to.
    pub fn fanout_id(&self) -> Result<u16, AfPacketError> {
        let v = sys::get_opt_int(self.fd.as_fd(), libc::SOL_PACKET, libc::PACKET_FANOUT).map_err(
            opt_err(
                "PACKET_FANOUT (read)",
                "the kernel needs Linux 3.1 or later",
            ),
        )?;
        Ok(v as u32 as u16)
    }

    /// The number of RX queues of `ifname` as its driver reports them (`ethtool -l`), or
    /// `None` when the driver does not say (`lo`, some virtual devices: one queue).
    pub fn rx_queues(ifname: &str) -> Result<Option<u32>, AfPacketError> {
        resolve_ifname(ifname)?;
        let c = CString::new(ifname).map_err(|_| AfPacketError::BadInterfaceName {
            ifname: ifname.to_owned(),
        })?;
        let fd = sys::packet_socket().map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => AfPacketError::NeedsCapNetRaw,
            Some(libc::EAFNOSUPPORT) => AfPacketError::NoAfPacket,
            _ => AfPacketError::Socket(e),
        })?;
        match sys::rx_queues(fd.as_fd(), &c) {
            Ok(0) => Ok(None),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(None),
            Err(e) => Err(AfPacketError::SocketOption {
                option: "SIOCETHTOOL ETHTOOL_GCHANNELS",
                hint: "could not read the interface's RX queue count",
                source: e,
            }),
        }
    }

    /// The interface index the ring is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Wait up to `timeout_ms` (negative: forever, 0: don't wait) for the next filled block.
    ///
    /// `Ok(None)` on timeout. The block goes back to the kernel when the returned [`Block`]
    /// is dropped; keep it only as long as its frames are needed.
    pub fn poll_block(&mut self, timeout_ms: i32) -> Result<Option<Block<'_>>, AfPacketError> {
        let idx = self.next_block;
        if !self.map.is_ready(idx) {
            if !sys::poll_readable(self.fd.as_fd(), timeout_ms).map_err(AfPacketError::Poll)? {
                return Ok(None);
            }
            // poll(2) may report readiness for another reason (an error, a block the kernel
            // is about to close): only the status word counts.
            if !self.map.is_ready(idx) {
                return Ok(None);
            }
        }
        self.next_block = (idx + 1) % self.map.block_count();
        let v = self.version;
        Ok(self.map.take(idx).map(|raw| Block::new(raw, v)))
    }

    /// The next filled block if the kernel has handed it over, without a system call (for
    /// a caller that waits with epoll on [`AsFd::as_fd`]).
    pub fn try_block(&mut self) -> Option<Block<'_>> {
        let idx = self.next_block;
        if !self.map.is_ready(idx) {
            return None;
        }
        self.next_block = (idx + 1) % self.map.block_count();
        let v = self.version;
        self.map.take(idx).map(|raw| Block::new(raw, v))
    }

    /// Up to `max` filled blocks (V2: frames) in ring order, without a system call; they go
    /// back to the kernel together when the returned [`Blocks`] is dropped, so frames of all
    /// of them can be sent in one batch first.
    pub fn try_blocks(&mut self, max: usize) -> Blocks<'_> {
        let first = self.next_block;
        let count = self.map.block_count();
        let version = self.version;
        let raw = self.map.take_run(first, max);
        self.next_block = (first + raw.len()) % count;
        Blocks { raw, version }
    }

    /// Read and reset the kernel's counters: the values are deltas since the last call (or
    /// since the ring was opened); add them up with `+=`. A V2 ring never freezes
    /// (`freeze_q_cnt` stays 0).
    #[doc(alias = "PACKET_STATISTICS")]
    pub fn stats(&mut self) -> Result<RingStats, AfPacketError> {
        let st = sys::packet_stats_v3(self.fd.as_fd()).map_err(AfPacketError::Stats)?;
        Ok(RingStats {
            packets: u64::from(st.tp_packets),
            drops: u64::from(st.tp_drops),
            freeze_q_cnt: u64::from(st.tp_freeze_q_cnt),
        })
    }

    /// Replace the ring's filter with a UDP destination filter (empty: remove it).
    pub fn set_filter(&mut self, matches: &[DstMatch]) -> Result<(), AfPacketError> {
        let hint = "classic BPF socket filters must be enabled in the kernel";
        if matches.is_empty() {
            return sys::detach_filter(self.fd.as_fd()).map_err(opt_err("SO_DETACH_FILTER", hint));
        }
        let prog = udp_dst_filter(matches)?;
        sys::attach_filter(self.fd.as_fd(), &to_sock_filter(&prog))
            .map_err(opt_err("SO_ATTACH_FILTER (udp destination filter)", hint))
    }
}

impl AsFd for PacketRing {
    /// For epoll-based waiting on several rings; readable when a block is ready.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl std::fmt::Debug for PacketRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketRing")
            .field("ifindex", &self.ifindex)
            .field("blocks", &self.map.block_count())
            .field("next_block", &self.next_block)
            .finish()
    }
}

/// Kernel ring counters over one interval (see [`PacketRing::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Packets that reached the ring's socket, **including** `drops` (the kernel adds them).
    pub packets: u64,
    /// Packets dropped because the ring was full (no free block).
    pub drops: u64,
    /// Times the ring froze: every block was owned by user space.
    pub freeze_q_cnt: u64,
}

impl AddAssign for RingStats {
    fn add_assign(&mut self, rhs: RingStats) {
        self.packets += rhs.packets;
        self.drops += rhs.drops;
        self.freeze_q_cnt += rhs.freeze_q_cnt;
    }
}

// ---- blocks and frames -------------------------------------------------------------------

mod bd {
    //! Offsets inside `tpacket_block_desc` (all native-endian).
    use std::mem::offset_of;
    const H: usize = offset_of!(libc::tpacket_block_desc, hdr);
    pub const BLOCK_STATUS: usize = H + offset_of!(libc::tpacket_hdr_v1, block_status);
    pub const NUM_PKTS: usize = H + offset_of!(libc::tpacket_hdr_v1, num_pkts);
    pub const FIRST_PKT: usize = H + offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt);
    pub const SEQ_NUM: usize = H + offset_of!(libc::tpacket_hdr_v1, seq_num);
}

mod ph {
    //! Offsets inside `tpacket3_hdr` (all native-endian).
    use libc::tpacket3_hdr as H;
    use std::mem::{offset_of, size_of};
    pub const NEXT_OFFSET: usize = offset_of!(H, tp_next_offset);
    pub const SEC: usize = offset_of!(H, tp_sec);
    pub const NSEC: usize = offset_of!(H, tp_nsec);
    pub const SNAPLEN: usize = offset_of!(H, tp_snaplen);
    pub const LEN: usize = offset_of!(H, tp_len);
    pub const STATUS: usize = offset_of!(H, tp_status);
    pub const MAC: usize = offset_of!(H, tp_mac);
    pub const RXHASH: usize =
        offset_of!(H, hv1) + offset_of!(libc::tpacket_hdr_variant1, tp_rxhash);
    pub const VLAN_TCI: usize =
        offset_of!(H, hv1) + offset_of!(libc::tpacket_hdr_variant1, tp_vlan_tci);
    pub const SIZE: usize = size_of::<H>();
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([s[0], s[1]]))
}

/// A filled block (V2: one frame) owned by user space. Hands it back to the kernel on drop.
///
/// The block's offsets come from memory shared with the kernel; they are bounds-checked
/// while iterating, so a corrupt block ends the iteration instead of panicking.
pub struct Block<'r> {
    raw: sys::RawBlock<'r>,
    version: RingVersion,
}

impl<'r> Block<'r> {
    fn new(raw: sys::RawBlock<'r>, version: RingVersion) -> Self {
        Block { raw, version }
    }

    /// Number of packets the kernel put in the block (V2: 1).
    pub fn num_packets(&self) -> u32 {
        match self.version {
            RingVersion::V3 => ne_u32(self.raw.bytes(), bd::NUM_PKTS).unwrap_or(0),
            RingVersion::V2 => 1,
        }
    }

    /// The block's sequence number (increments by one per block the kernel closes; V2: 0).
    pub fn seq_num(&self) -> u64 {
        if self.version == RingVersion::V2 {
            return 0;
        }
        self.raw
            .bytes()
            .get(bd::SEQ_NUM..bd::SEQ_NUM + 8)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    }

    /// True if the kernel closed the block because of the timeout rather than because it
    /// was full.
    pub fn timed_out(&self) -> bool {
        self.version == RingVersion::V3
            && ne_u32(self.raw.bytes(), bd::BLOCK_STATUS).unwrap_or(0) & libc::TP_STATUS_BLK_TMO
                != 0
    }

    /// The frames of the block, in arrival order.
    pub fn frames(&self) -> Frames<'_> {
        Frames::of_slot(self.raw.bytes(), self.version)
    }
}

/// Consecutive filled blocks owned by user space (see [`PacketRing::try_blocks`]); all go
/// back to the kernel on drop.
pub struct Blocks<'r> {
    raw: sys::RawRun<'r>,
    version: RingVersion,
}

impl Blocks<'_> {
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.len() == 0
    }

    /// The frames of block `k` (`k < len()`), in arrival order.
    pub fn frames(&self, k: usize) -> Frames<'_> {
        Frames::of_slot(self.raw.bytes(k), self.version)
    }
}

impl std::fmt::Debug for Block<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("seq_num", &self.seq_num())
            .field("num_packets", &self.num_packets())
            .finish()
    }
}

/// Iterator over the frames of a [`Block`].
#[derive(Debug, Clone)]
pub struct Frames<'b> {
    block: &'b [u8],
    pos: usize,
    left: u32,
    version: RingVersion,
}

impl<'b> Iterator for Frames<'b> {
    type Item = Frame<'b>;

    fn next(&mut self) -> Option<Frame<'b>> {
        if self.left == 0 {
            return None;
        }
        let frame = match self.version {
            RingVersion::V3 => self.parse_at(self.pos),
            RingVersion::V2 => parse_v2(self.block).map(|f| (f, 0)),
        };
        match frame {
            Some((f, next)) => {
                self.left -= 1;
                if next == 0 && self.left > 0 {
                    self.left = 0; // corrupt chain: stop rather than loop
                }
                self.pos += next as usize;
                Some(f)
            }
            None => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left as usize))
    }
}

impl<'b> Frames<'b> {
    /// The frames of a whole slot: a V3 block (descriptor included) or one V2 frame.
    fn of_slot(b: &'b [u8], version: RingVersion) -> Frames<'b> {
        match version {
            RingVersion::V3 => Frames {
                block: b,
                pos: ne_u32(b, bd::FIRST_PKT).unwrap_or(0) as usize,
                left: ne_u32(b, bd::NUM_PKTS).unwrap_or(0),
                version,
            },
            RingVersion::V2 => Frames {
                block: b,
                pos: 0,
                left: 1,
                version,
            },
        }
    }

    /// Parse the `tpacket3_hdr` at `pos`; `None` if any part lies outside the block.
    fn parse_at(&self, pos: usize) -> Option<(Frame<'b>, u32)> {
        let b = self.block;
        let hdr = b.get(pos..pos.checked_add(ph::SIZE)?)?;
        let snaplen = ne_u32(hdr, ph::SNAPLEN)? as usize;
        let mac = usize::from(ne_u16(hdr, ph::MAC)?);
        let start = pos.checked_add(mac)?;
        let data = b.get(start..start.checked_add(snaplen)?)?;
        let status = ne_u32(hdr, ph::STATUS)?;
        let vlan_tci = if status & libc::TP_STATUS_VLAN_VALID != 0 {
            Some(ne_u32(hdr, ph::VLAN_TCI)? as u16)
        } else {
            None
        };
        let frame = Frame {
            data,
            wire_len: ne_u32(hdr, ph::LEN)?,
            status,
            vlan_tci,
            rxhash: ne_u32(hdr, ph::RXHASH)?,
            sec: ne_u32(hdr, ph::SEC)?,
            nsec: ne_u32(hdr, ph::NSEC)?,
        };
        Some((frame, ne_u32(hdr, ph::NEXT_OFFSET)?))
    }
}

mod ph2 {
    //! Offsets inside `tpacket2_hdr` (all native-endian).
    use libc::tpacket2_hdr as H;
    use std::mem::{offset_of, size_of};
    pub const STATUS: usize = offset_of!(H, tp_status);
    pub const LEN: usize = offset_of!(H, tp_len);
    pub const SNAPLEN: usize = offset_of!(H, tp_snaplen);
    pub const MAC: usize = offset_of!(H, tp_mac);
    pub const SEC: usize = offset_of!(H, tp_sec);
    pub const NSEC: usize = offset_of!(H, tp_nsec);
    pub const VLAN_TCI: usize = offset_of!(H, tp_vlan_tci);
    pub const SIZE: usize = size_of::<H>();
}

/// Parses the V2 frame slot `b` (`tpacket2_hdr` first); `None` if any part lies outside it.
fn parse_v2(b: &[u8]) -> Option<Frame<'_>> {
    let hdr = b.get(..ph2::SIZE)?;
    let snaplen = ne_u32(hdr, ph2::SNAPLEN)? as usize;
    let mac = usize::from(ne_u16(hdr, ph2::MAC)?);
    let data = b.get(mac..mac.checked_add(snaplen)?)?;
    let status = ne_u32(hdr, ph2::STATUS)?;
    let vlan_tci = if status & libc::TP_STATUS_VLAN_VALID != 0 {
        Some(ne_u16(hdr, ph2::VLAN_TCI)?)
    } else {
        None
    };
    Some(Frame {
        data,
        wire_len: ne_u32(hdr, ph2::LEN)?,
        status,
        vlan_tci,
        rxhash: 0,
        sec: ne_u32(hdr, ph2::SEC)?,
        nsec: ne_u32(hdr, ph2::NSEC)?,
    })
}

/// One captured frame and its ring metadata.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'b> {
    /// The captured bytes from the Ethernet header on (`tp_mac`, `tp_snaplen`). A VLAN tag
    /// stripped by the NIC/driver is not in here: see [`Frame::vlan_tci`].
    pub data: &'b [u8],
    /// Length on the wire; more than `data.len()` if the capture was truncated.
    pub wire_len: u32,
    /// `tp_status` flags (`TP_STATUS_*`).
    pub status: u32,
    /// The VLAN TCI the kernel stripped into metadata (`TP_STATUS_VLAN_VALID`).
    pub vlan_tci: Option<u16>,
    /// The kernel's flow hash of the packet (`tp_rxhash`), 0 if none was computed (always
    /// 0 on a V2 ring, which has no such field).
    pub rxhash: u32,
    pub sec: u32,
    pub nsec: u32,
}

impl Frame<'_> {
    /// `TP_STATUS_LOSING`: the ring dropped packets since the statistics were last read.
    pub fn losing(&self) -> bool {
        self.status & libc::TP_STATUS_LOSING != 0
    }

    /// `TP_STATUS_CSUMNOTREADY`: a local sender's offloaded checksum is not filled in yet;
    /// do not verify the UDP checksum of this frame.
    pub fn csum_not_ready(&self) -> bool {
        self.status & libc::TP_STATUS_CSUMNOTREADY != 0
    }

    /// True if the capture holds fewer bytes than the frame had on the wire.
    pub fn truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.wire_len)
    }
}

// ---- classic BPF -------------------------------------------------------------------------

/// One classic BPF instruction (`struct sock_filter`), built in safe code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Classic BPF opcode parts (`linux/filter.h`, `linux/bpf_common.h`).
pub mod bpf {
    pub const LD: u16 = 0x00;
    pub const LDX: u16 = 0x01;
    pub const JMP: u16 = 0x05;
    pub const RET: u16 = 0x06;
    pub const W: u16 = 0x00;
    pub const H: u16 = 0x08;
    pub const B: u16 = 0x10;
    pub const ABS: u16 = 0x20;
    pub const IND: u16 = 0x40;
    pub const MSH: u16 = 0xa0;
    pub const JEQ: u16 = 0x10;
    pub const JGT: u16 = 0x20;
    pub const JGE: u16 = 0x30;
    pub const JSET: u16 = 0x40;
    pub const K: u16 = 0x00;
}

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInsn {
    BpfInsn { code, jt, jf, k }
}

/// "Return 0": keep nothing. Attached while a ring is being set up.
const DROP_ALL: [BpfInsn; 1] = [insn(bpf::RET | bpf::K, 0, 0, 0)];

/// Classic BPF program accepting only unfragmented-or-first-fragment IPv4/UDP frames whose
/// destination port is in `lo..=hi` (see [`udp_dst_filter`]).
pub fn udp_dport_filter(lo: u16, hi: u16) -> Result<Vec<BpfInsn>, AfPacketError> {
    udp_dst_filter(&[DstMatch {
        addr: None,
        ports: lo..=hi,
    }])
}

/// Classic BPF program accepting only unfragmented-or-first-fragment IPv4/UDP frames that
/// match one of `matches` (destination port in range, and destination address when given),
/// evaluated on the frame from its Ethernet header (as an `AF_PACKET`/`SOCK_RAW` socket sees
/// it; a stripped VLAN tag is not in the bytes).
///
/// Non-first fragments have no UDP header and are refused; first fragments pass so that
/// user space counts them under its drop reason.
pub fn udp_dst_filter(matches: &[DstMatch]) -> Result<Vec<BpfInsn>, AfPacketError> {
    use bpf::*;
    for m in matches {
        if m.ports.start() > m.ports.end() {
            return Err(AfPacketError::BadPortRange {
                lo: *m.ports.start(),
                hi: *m.ports.end(),
            });
        }
    }
    const PREFIX: usize = 7;
    let block_len = |m: &DstMatch| if m.addr.is_some() { 5 } else { 3 };
    let drop_at = PREFIX + matches.iter().map(block_len).sum::<usize>();
    let accept_at = drop_at + 1;
    if accept_at > 255 {
        return Err(AfPacketError::BadParams(
            "too many destinations for one ring filter",
        ));
    }
    // Jump offsets are relative to the next instruction.
    let to = |from: usize, target: usize| (target - from - 1) as u8;
    let mut p = vec![
        // 0: A = ethertype (half-word at byte 12)
        insn(LD | H | ABS, 0, 0, 12),
        // 1: IPv4? continue : DROP
        insn(JMP | JEQ | K, 0, to(1, drop_at), 0x0800),
        // 2: A = IP protocol (byte 14 + 9)
        insn(LD | B | ABS, 0, 0, 23),
        // 3: UDP? continue : DROP
        insn(JMP | JEQ | K, 0, to(3, drop_at), 17),
        // 4: A = flags + fragment offset (half-word at 14 + 6)
        insn(LD | H | ABS, 0, 0, 20),
        // 5: fragment offset != 0 (not the first fragment)? DROP : continue
        insn(JMP | JSET | K, to(5, drop_at), 0, 0x1fff),
        // 6: X = IP header length = 4 * (byte 14 & 0x0f)
        insn(LDX | B | MSH, 0, 0, 14),
    ];
    for m in matches {
        let at = p.len();
        let next = at + block_len(m);
        let (lo, hi) = (u32::from(*m.ports.start()), u32::from(*m.ports.end()));
        // A = UDP destination port: half-word at X + 14 (Ethernet) + 2
        p.push(insn(LD | H | IND, 0, 0, 16));
        // port >= lo? continue : next match
        p.push(insn(JMP | JGE | K, 0, to(at + 1, next), lo));
        match m.addr {
            None => {
                // port > hi? next match : ACCEPT
                p.push(insn(
                    JMP | JGT | K,
                    to(at + 2, next),
                    to(at + 2, accept_at),
                    hi,
                ));
            }
            Some(addr) => {
                p.push(insn(JMP | JGT | K, to(at + 2, next), 0, hi));
                // A = destination address (word at 14 + 16)
                p.push(insn(LD | W | ABS, 0, 0, 30));
                p.push(insn(
                    JMP | JEQ | K,
                    to(at + 4, accept_at),
                    to(at + 4, next),
                    u32::from(addr),
                ));
            }
        }
    }
    // DROP
    p.push(insn(RET | K, 0, 0, 0));
    // ACCEPT: keep the whole frame (the ring's block size still bounds it)
    p.push(insn(RET | K, 0, 0, u32::MAX));
    debug_assert_eq!(p.len(), accept_at + 1);
    Ok(p)
}

fn to_sock_filter(prog: &[BpfInsn]) -> Vec<libc::sock_filter> {
    prog.iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::testutil::udp4_frame;
    use std::net::Ipv4Addr;

    /// A classic BPF interpreter for the opcodes the filter uses, with the kernel's
    /// semantics for out-of-bounds loads (the program returns 0).
    fn run(prog: &[BpfInsn], pkt: &[u8]) -> u32 {
        use bpf::*;
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let load = |at: usize, n: usize| -> Option<u32> {
            let s = pkt.get(at..at + n)?;
            Some(s.iter().fold(0u32, |acc, b| acc << 8 | u32::from(*b)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            let size = |c: u16| match c & 0x18 {
                H => 2,
                B => 1,
                _ => 4,
            };
            match i.code & 0x07 {
                LD => {
                    let at = match i.code & 0xe0 {
                        ABS => i.k as usize,
                        IND => x as usize + i.k as usize,
                        m => panic!("mode {m:#x}"),
                    };
                    match load(at, size(i.code)) {
                        Some(v) => a = v,
                        None => return 0,
                    }
                }
                LDX => {
                    assert_eq!(i.code & 0xe0, MSH);
                    match load(i.k as usize, 1) {
                        Some(v) => x = 4 * (v & 0xf),
                        None => return 0,
                    }
                }
                JMP => {
                    let t = match i.code & 0xf0 {
                        JEQ => a == i.k,
                        JGT => a > i.k,
                        JGE => a >= i.k,
                        JSET => a & i.k != 0,
                        op => panic!("jmp {op:#x}"),
                    };
                    pc += usize::from(if t { i.jt } else { i.jf });
                }
                RET => return i.k,
                c => panic!("class {c:#x}"),
            }
        }
    }

    const S: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
    const D: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 1);

    #[test]
    fn bpf_filter_accepts_only_the_range() {
        let prog = udp_dport_filter(20000, 20099).unwrap();
        for (port, keep) in [
            (19999, false),
            (20000, true),
            (20050, true),
            (20099, true),
            (20100, false),
        ] {
            let f = udp4_frame(None, (S, 5004), (D, port), b"rtp");
            assert_eq!(run(&prog, &f) != 0, keep, "port {port}");
        }
        // IP options move the UDP header: X must follow the IHL.
        let mut f = udp4_frame(None, (S, 5004), (D, 20001), b"rtp");
        f[14] = 0x46;
        f.splice(34..34, [1, 1, 1, 1]);
        assert_ne!(run(&prog, &f), 0);
        f[34 + 4 + 2..34 + 4 + 4].copy_from_slice(&30000u16.to_be_bytes());
        assert_eq!(run(&prog, &f), 0);
    }

    #[test]
    fn bpf_filter_refuses_other_traffic() {
        let prog = udp_dport_filter(20000, 20099).unwrap();
        let good = udp4_frame(None, (S, 5004), (D, 20000), b"rtp");
        let mut tcp = good.clone();
        tcp[23] = 6;
        assert_eq!(run(&prog, &tcp), 0);
        let mut v6 = good.clone();
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(run(&prog, &v6), 0);
        let mut later_frag = good.clone();
        later_frag[20..22].copy_from_slice(&0x0001u16.to_be_bytes());
        assert_eq!(run(&prog, &later_frag), 0);
        let mut first_frag = good.clone();
        first_frag[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
        assert_ne!(run(&prog, &first_frag), 0);
        // The program reads up to the destination port, byte 38.
        for n in 0..38 {
            assert_eq!(run(&prog, &good[..n]), 0, "prefix {n}");
        }
        assert_eq!(run(&DROP_ALL, &good), 0);
        assert!(udp_dport_filter(2, 1).is_err());
        let single = udp_dport_filter(20000, 20000).unwrap();
        assert_ne!(run(&single, &good), 0);
    }

    #[test]
    fn bpf_filter_matches_address_and_range_per_domain() {
        let other = Ipv4Addr::new(10, 201, 2, 1);
        let prog = udp_dst_filter(&[
            DstMatch {
                addr: Some(D),
                ports: 20000..=20099,
            },
            DstMatch {
                addr: Some(other),
                ports: 30000..=30099,
            },
        ])
        .unwrap();
        for (dst, port, keep) in [
            (D, 20000, true),
            (D, 20099, true),
            (D, 30000, false),
            (other, 30050, true),
            (other, 20050, false),
            (S, 20050, false),
            (D, 19999, false),
            (other, 30100, false),
        ] {
            let f = udp4_frame(None, (S, 5004), (dst, port), b"rtp");
            assert_eq!(run(&prog, &f) != 0, keep, "{dst}:{port}");
        }
        let mut tcp = udp4_frame(None, (S, 5004), (D, 20000), b"rtp");
        tcp[23] = 6;
        assert_eq!(run(&prog, &tcp), 0);
    }

    #[test]
    fn ring_is_send() {
        fn send<T: Send>() {}
        send::<PacketRing>();
        // Not `Sync`: see the `compile_fail` example on `PacketRing`.
    }

    #[test]
    fn params_are_checked() {
        let ok = RingParams::default();
        assert!(check_params(&ok).is_ok());
        let bad = [
            RingParams {
                block_size: 1000,
                ..ok.clone()
            },
            RingParams {
                block_size: 3 * 4096,
                ..ok.clone()
            },
            RingParams {
                block_count: 0,
                ..ok.clone()
            },
            RingParams {
                frame_size: 40,
                ..ok.clone()
            },
            RingParams {
                frame_size: 2050,
                ..ok.clone()
            },
            RingParams {
                block_timeout_ms: 0,
                ..ok.clone()
            },
            RingParams {
                version: RingVersion::V2,
                frame_size: 32,
                ..ok.clone()
            },
            RingParams {
                block_size: 1 << 30,
                block_count: 8,
                ..ok.clone()
            },
        ];
        for p in bad {
            assert!(
                matches!(check_params(&p), Err(AfPacketError::BadParams(_))),
                "{p:?}"
            );
        }
        // A V2 ring has no block timer.
        let v2 = RingParams {
            version: RingVersion::V2,
            block_timeout_ms: 0,
            ..ok.clone()
        };
        assert!(check_params(&v2).is_ok());
        #[allow(clippy::reversed_empty_ranges)]
        let r = RingParams {
            filter: vec![DstMatch {
                addr: None,
                ports: 10..=9,
            }],
            ..ok
        };
        assert!(matches!(
            check_params(&r),
            Err(AfPacketError::BadPortRange { lo: 10, hi: 9 })
        ));
    }

    #[test]
    fn interface_names_are_checked() {
        for n in ["", "a/b", "has space", "sixteen-chars-xx", "nul\0"] {
            assert!(
                matches!(
                    resolve_ifname(n),
                    Err(AfPacketError::BadInterfaceName { .. })
                ),
                "{n:?}"
            );
        }
        assert!(matches!(
            resolve_ifname("vgnosuchif0"),
            Err(AfPacketError::NoSuchInterface { .. })
        ));
    }

    /// A synthetic block laid out like the kernel's, walked by `Frames`.
    fn frames(blk: &[u8]) -> Vec<Frame<'_>> {
        let left = ne_u32(blk, bd::NUM_PKTS).unwrap();
        let pos = ne_u32(blk, bd::FIRST_PKT).unwrap() as usize;
        Frames {
            block: blk,
            pos,
            left,
            version: RingVersion::V3,
        }
        .collect()
    }

    /// A real ring on `lo`: rounds of several blocks taken at once see every datagram once,
    /// and give their blocks back (the ring is smaller than what passes through it, so a
    /// block kept would freeze it and lose the later rounds). Needs CAP_NET_RAW.
    #[test]
    fn try_blocks_takes_several_blocks_and_gives_them_all_back() {
        rounds_through_a_small_ring(RingVersion::V3);
    }

    /// The same with a V2 ring: 16 frames of 2 KiB, 48 datagrams through it.
    #[test]
    fn try_blocks_takes_several_v2_frames_and_gives_them_all_back() {
        rounds_through_a_small_ring(RingVersion::V2);
    }

    fn rounds_through_a_small_ring(version: RingVersion) {
        use std::net::UdpSocket;
        use std::time::{Duration, Instant};
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sink.local_addr().unwrap().port();
        let params = RingParams {
            version,
            block_size: 4096,
            block_count: 8,
            frame_size: 2048,
            block_timeout_ms: 1,
            filter: vec![DstMatch {
                addr: Some(Ipv4Addr::LOCALHOST),
                ports: port..=port,
            }],
        };
        let mut ring = match PacketRing::open("lo", FanoutGroup::Unique, Fanout::Hash, &params) {
            Ok(r) => r,
            Err(e) => {
                crate::test_did_not_run(
                    "try_blocks on a real ring",
                    format!("no AF_PACKET ring on lo ({e})"),
                );
                return;
            }
        };
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (mut seen, mut multi) = (Vec::new(), 0);
        for round in 0..4u8 {
            // 12 datagrams of 1000 bytes: about 4 blocks of 4 KiB, so 16 blocks in all
            // through a ring of 8.
            for i in 0..12u8 {
                sender
                    .send_to(&[round * 16 + i; 1000], ("127.0.0.1", port))
                    .unwrap();
            }
            let until = Instant::now() + Duration::from_secs(5);
            let want = 12 * (usize::from(round) + 1);
            while seen.len() < want && Instant::now() < until {
                let blocks = ring.try_blocks(16);
                multi += usize::from(blocks.len() > 1);
                for k in 0..blocks.len() {
                    for f in blocks.frames(k) {
                        assert!(!f.truncated(), "{version:?}: a 1000-byte datagram fits");
                        if let Ok(d) = crate::wire::parse_udp4(f.data) {
                            if d.dst_port == port {
                                assert_eq!(d.payload.len(), 1000);
                                seen.push(d.payload[0]);
                            }
                        }
                    }
                }
                drop(blocks);
                std::thread::sleep(Duration::from_millis(3));
            }
            assert_eq!(seen.len(), want, "round {round}: every datagram once");
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 48, "no datagram twice: {seen:?}");
        assert_eq!(
            ring.stats().unwrap().drops,
            0,
            "the ring never ran out of blocks"
        );
        eprintln!("rounds that took more than one block: {multi}");
    }

    #[test]
    fn a_v2_slot_holds_one_frame_and_its_bounds_are_checked() {
        let mut slot = vec![0u8; 2048];
        let w = |slot: &mut Vec<u8>, off: usize, v: u32| {
            slot[off..off + 4].copy_from_slice(&v.to_ne_bytes())
        };
        let status =
            libc::TP_STATUS_USER | libc::TP_STATUS_CSUMNOTREADY | libc::TP_STATUS_VLAN_VALID;
        w(&mut slot, ph2::STATUS, status);
        w(&mut slot, ph2::LEN, 110);
        w(&mut slot, ph2::SNAPLEN, 100);
        w(&mut slot, ph2::SEC, 7);
        w(&mut slot, ph2::NSEC, 9);
        slot[ph2::MAC..ph2::MAC + 2].copy_from_slice(&82u16.to_ne_bytes());
        slot[ph2::VLAN_TCI..ph2::VLAN_TCI + 2].copy_from_slice(&0x2005u16.to_ne_bytes());
        slot[82] = 0xab;
        let got: Vec<Frame<'_>> = Frames::of_slot(&slot, RingVersion::V2).collect();
        assert_eq!(got.len(), 1);
        let f = got[0];
        assert_eq!((f.data.len(), f.data[0], f.wire_len), (100, 0xab, 110));
        assert!(f.truncated() && f.csum_not_ready());
        assert_eq!(
            (f.vlan_tci, f.rxhash, f.sec, f.nsec),
            (Some(0x2005), 0, 7, 9)
        );
        // A snap length past the slot's end ends the walk, no panic.
        w(&mut slot, ph2::SNAPLEN, 2000);
        assert_eq!(Frames::of_slot(&slot, RingVersion::V2).count(), 0);
        assert_eq!(Frames::of_slot(&slot[..10], RingVersion::V2).count(), 0);
    }

    #[test]
    fn frames_walk_and_bounds() {
        let mut blk = vec![0u8; 4096];
        let first = 48usize;
        blk[bd::NUM_PKTS..bd::NUM_PKTS + 4].copy_from_slice(&2u32.to_ne_bytes());
        blk[bd::FIRST_PKT..bd::FIRST_PKT + 4].copy_from_slice(&(first as u32).to_ne_bytes());
        let put = |blk: &mut Vec<u8>, pos: usize, next: u32, snap: u32, status: u32| {
            let w = |blk: &mut Vec<u8>, off: usize, v: u32| {
                blk[pos + off..pos + off + 4].copy_from_slice(&v.to_ne_bytes())
            };
            w(blk, ph::NEXT_OFFSET, next);
            w(blk, ph::SNAPLEN, snap);
            w(blk, ph::LEN, snap + 10);
            w(blk, ph::STATUS, status);
            w(blk, ph::VLAN_TCI, 0x2005);
            w(blk, ph::RXHASH, 0xdead_beef);
            blk[pos + ph::MAC..pos + ph::MAC + 2].copy_from_slice(&66u16.to_ne_bytes());
        };
        put(
            &mut blk,
            first,
            256,
            60,
            libc::TP_STATUS_USER | libc::TP_STATUS_VLAN_VALID,
        );
        put(
            &mut blk,
            first + 256,
            0,
            100,
            libc::TP_STATUS_USER | libc::TP_STATUS_LOSING,
        );
        let v = frames(&blk);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].data.len(), v[0].vlan_tci, v[0].rxhash),
            (60, Some(0x2005), 0xdead_beef)
        );
        assert!(v[0].truncated() && !v[0].losing());
        assert_eq!((v[1].data.len(), v[1].vlan_tci), (100, None));
        assert!(v[1].losing());
        // Snaplen running past the block: iteration stops, no panic.
        let mut bad = blk.clone();
        bad[first + 256 + ph::SNAPLEN..first + 256 + ph::SNAPLEN + 4]
            .copy_from_slice(&5000u32.to_ne_bytes());
        assert_eq!(frames(&bad).len(), 1);
        // More packets announced than chained: stops at the zero next-offset.
        let mut bad = blk.clone();
        bad[bd::NUM_PKTS..bd::NUM_PKTS + 4].copy_from_slice(&9u32.to_ne_bytes());
        assert_eq!(frames(&bad).len(), 2);
        // First packet offset outside the block.
        let mut bad = blk;
        bad[bd::FIRST_PKT..bd::FIRST_PKT + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(frames(&bad).len(), 0);
    }
}

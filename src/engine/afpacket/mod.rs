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

mod blocks;
mod filter;
#[cfg(test)]
mod tests;

pub use blocks::{Block, Blocks, Frame, FrameMut, Frames, FramesMut};
pub use filter::{bpf, udp_dport_filter, udp_dst_filter, BpfInsn};
use filter::{to_sock_filter, DROP_ALL};

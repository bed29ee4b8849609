//! Link send and receive: the sockets of the two one-way links, the per-worker sender and
//! the receiving worker, and the link counters.
//!
//! **Outgoing link.** Every engine worker owns a [`LinkTx`] (its own FEC encoder, frame
//! slots and send batch): the worker pushes the datagrams it forwards to the link face and
//! flushes once per wakeup ([`crate::engine::worker::Datapath::flush`]), so a wakeup's media
//! costs one send on the link. The worker's lane number goes in the header, so the receiver
//! keeps one FEC state per sending worker and no worker ever waits for another. The link is
//! sent with the engine family of the mode ([`LinkFamily`]):
//!
//! - `stack`: one UDP socket bound to our link address and tied to the link's interface
//!   (`SO_BINDTODEVICE`), `sendmmsg`; the peer's MAC from the config is installed as a
//!   *permanent* neighbour entry, so the kernel never sends an ARP request on the link.
//! - `tnapi`: one AF_PACKET socket bound to the link interface (protocol 0: it receives
//!   nothing) with `PACKET_QDISC_BYPASS` and `PACKET_VNET_HDR`, opened as mode tnapi opens
//!   its own ([`psys::packet_tx_socket`]). Per frame, a `virtio_net_hdr`, the Ethernet
//!   (peer MAC from the config, our MAC read from the interface), IPv4 and UDP headers are
//!   written by the one frame writer ([`FrameEnds::write_vnet`], shared with mode tnapi) in
//!   a header buffer of a [`FrameBatch`], the link frame follows from the encoder's slot
//!   (no copy), and the UDP checksum is left to the device or to the kernel just before the
//!   driver; the wakeup's frames go out with one `sendmmsg`. No kernel route, neighbour or
//!   qdisc is involved. (A `PACKET_TX_RING` would save the `sendmmsg` but not a copy of
//!   each frame, into the ring instead of an skb; not built — see `docs/split.md`.)
//! - `zc`: one AF_XDP socket per worker on the link interface, queue = lane (copy mode
//!   where the driver has no zero-copy, e.g. veth), no XDP program (TX only): each frame is
//!   built in a UMEM chunk (the same headers with the UDP checksum computed here, then the
//!   link frame) and the TX ring is kicked
//!   once per wakeup. The interface needs a TX queue per engine worker.
//!
//! `VGATE_LINK_TX=udp` in the environment sends the link with the UDP socket in every mode
//! (for side-by-side benchmarks); the family in use is in the stats (`out_link.tx`) and the
//! shutdown line (`tx=`).
//!
//! **Incoming link.** One UDP socket bound to our link address on the incoming link's
//! interface, read by its own pinned worker ([`HalfLinks::start_receiver`]) with `recvmmsg`. Each
//! datagram is checked (source = the configured peer, then the [`LinkPacket`] view), fed to
//! the [`Decoder`], and each datagram it yields is delivered to the link face as if it had
//! arrived from `(peer face, source port)` on gateway port `destination port`: route lookup,
//! [`crate::channel::inspect`] and the route's egress socket, exactly as a domain packet.
//! The incoming link keeps a kernel UDP socket in every mode: it is one socket per half
//! (not per queue), the kernel checks the IPv4/UDP headers and the destination, and a ring
//! or an AF_XDP socket there would need a filter or an XDP program on the receive-only
//! interface for the little it would save on the receiving half.
//! Delivery is batched per wakeup: the datagrams a wakeup yields are copied into the
//! worker's preallocated delivery buffer and sent at the end of the wakeup
//! ([`Datapath::flush`]) with one `sendmmsg` per run of one route (one egress socket and
//! destination); a full buffer is sent at once.
//!
//! What keeps the links one-way on the host (no ARP answers, no IPv6, no ICMP out of the
//! receive-only interface) is the host's interface setup, not this process: it must hold
//! while vgate is stopped or restarting too. See `scripts/split-bed.sh` (`harden_link`) and
//! the README's split section.

use std::ffi::CString;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use nix::sys::eventfd::EventFd;
use nix::sys::socket::{setsockopt, sockopt};

use crate::channel::{inspect, Admitted};
use crate::clock::now_ms;
use crate::config::split::{Half, LinkConfig, SplitConfig};
use crate::config::DomainId;
use crate::engine::frames::account;
use crate::engine::ports::{Cmd, PortRegistry};
use crate::engine::sys::afpacket as psys;
use crate::engine::sys::afxdp::{self as xsys, BindMode, Xsk, XskParams};
use crate::engine::sys::mmsg::{FrameBatch, RecvBatch, SendOutcome, SliceBatch};
use crate::engine::worker::{spawn, Datapath, EgressSockets, Poller, Shell};
use crate::engine::{EngineError, EngineKind, Worker};
use crate::link::auth::{next_epoch, LinkAuth, TRAILER_LEN};
use crate::link::fec::{Decoder, DecoderCounts, Encoder, Fec, FRAME_CAP, HEADROOM};
use crate::link::frag::{self, JoinCounts, Joiner};
use crate::link::reorder::{Release, WAIT_BOUNDS_MS};
use crate::link::replay::{Refusal, Replay, Taken};
use crate::logging::RateLimit;
use crate::routes::{Channel, Routes, StreamRoute};
use crate::stats::link::{LinkCounters, LinkDrop, REORDER_RELEASES, REORDER_WAITS};
use crate::stats::{DropReason, Tally};
use crate::wire::link::{HeaderError, LinkPacket, StreamHeader, MAX_DATAGRAM};
use crate::wire::mac_string;
use crate::wire::{FrameEnds, UdpChecksum};

/// A partial FEC block older than this is closed (its repair frames sent) when the sender
/// goes quiet, so the tail of a burst is protected without waiting for more traffic.
pub const CLOSE_BLOCK_MS: u64 = crate::link::fec::CLOSE_MS;
pub use crate::config::split::{DEFAULT_REORDER_MS, SETTLE_MS};
/// Receive batches read per wakeup before looking at commands again.
const BUDGET: usize = 8;
/// The incoming link socket's token in the worker's epoll set.
const LINK: u64 = 1;

mod edge_lane;
mod open;
mod rx;
mod stats;
mod tx;
pub use edge_lane::*;
pub use open::*;
use rx::*;
pub use stats::*;
pub use tx::*;

#[cfg(test)]
mod tests;

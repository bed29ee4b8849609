//! One tnapi worker's data path: ring *q* of every interface walked block by block, each
//! round's runs sent through the UDP sockets or built into frames on a packet socket.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

use super::TxIface;
use crate::clock::now_ms;
use crate::config::DomainId;
use crate::engine::afpacket::{Blocks, PacketRing};
use crate::engine::frames::{account, classify, drop_frame, wire_reason, Parked, Run, Targets};
use crate::engine::link::LinkTx;
use crate::engine::neigh::Neighbours;
use crate::engine::ports::Cmd;
use crate::engine::sys::afpacket as psys;
use crate::engine::sys::mmsg::{FrameBatch, FrameScope, FrameStatus, SliceBatch, SliceScope};
use crate::engine::worker::{Datapath, EgressSockets, Poller, Shell};
use crate::logging::RateLimit;
use crate::routes::Channel;
use crate::stats::{DropReason, Tally};
use crate::wire::{parse_udp4, FrameEnds};

pub(super) struct WorkerRing {
    pub(super) ring: PacketRing,
    /// Domains whose media arrive on this ring's interface.
    pub(super) domains: Vec<DomainId>,
    /// The channel that counts what cannot be classified (malformed frames, ring drops).
    pub(super) fallback: Channel,
}

/// One afpacket worker: ring *q* of every interface, and the egress sockets.
pub(super) struct RingPath {
    /// Blocks taken from one ring per round.
    pub(super) budget: usize,
    pub(super) rings: Vec<WorkerRing>,
    pub(super) local: EgressSockets,
    /// Runs of packets for one route through the UDP sockets.
    pub(super) tx: SliceBatch,
    /// Per egress domain: its packet socket, when frames are built by vgate.
    pub(super) ptx: [Option<PacketTx>; 2],
    /// Next hops (when some egress interface takes frames built by vgate).
    pub(super) neigh: Option<Neighbours>,
    /// The runs of one round, closed once the round's frames are sent.
    pub(super) pending: Vec<Parked>,
    /// IPv4 identification of the next frame built here.
    pub(super) ident: u16,
    pub(super) targets: Targets,
    pub(super) max_payload: usize,
    /// Split half: the link-face domain and this worker's sender on the outgoing link.
    pub(super) link: Option<(DomainId, LinkTx)>,
}

/// Frames per packet-socket `sendmmsg` (a full round of 4 KiB blocks is 128).
pub(super) const TX_FRAMES: usize = 256;

/// A packet socket on one egress interface and the frames queued on it.
pub(super) struct PacketTx {
    pub(super) fd: OwnedFd,
    pub(super) ifindex: u32,
    pub(super) mac: [u8; 6],
    pub(super) src: Ipv4Addr,
    pub(super) max_udp: usize,
    pub(super) batch: FrameBatch,
    /// Per queued frame: the index of its run in the round and its payload length.
    pub(super) owner: Vec<(u32, u32)>,
}

impl PacketTx {
    /// A socket on `t` for frames from the gateway's address `src` there.
    pub(super) fn open(t: &TxIface, src: Ipv4Addr, frames: usize) -> io::Result<PacketTx> {
        Ok(PacketTx {
            fd: psys::packet_tx_socket(t.ifindex)?,
            ifindex: t.ifindex,
            mac: t.mac,
            src,
            max_udp: t.max_udp,
            batch: FrameBatch::new(frames, t.ifindex),
            owner: Vec::with_capacity(frames),
        })
    }
}

impl Datapath for RingPath {
    fn register(&mut self, poller: &Poller) -> io::Result<()> {
        for (i, r) in self.rings.iter().enumerate() {
            poller.add(r.ring.as_fd(), i as u64)?;
        }
        Ok(())
    }

    fn poll(&mut self, shell: &Shell) -> bool {
        let mut busy = false;
        for r in self.rings.iter_mut() {
            let mut blocks = r.ring.try_blocks(self.budget);
            if blocks.is_empty() {
                continue;
            }
            busy = true;
            let mut chan = [Tally::default(); 2];
            let round = Round {
                shell,
                targets: &self.targets,
                max_payload: self.max_payload,
                domains: &r.domains,
                fallback: r.fallback,
                local: &self.local,
                now: now_ms(),
            };
            round.forward(
                &mut blocks,
                &mut self.tx,
                &mut self.ptx,
                &mut self.neigh,
                &mut self.pending,
                &mut self.ident,
                self.link.as_mut(),
                &mut chan,
            );
            // The blocks go back to the kernel only after every send of their payloads.
            drop(blocks);
            for c in Channel::ALL {
                if !chan[c.index()].is_empty() {
                    shell.stats.channel(c).add(&chan[c.index()]);
                }
            }
        }
        busy
    }

    fn command(&mut self, _shell: &Shell, _poller: &Poller, cmd: Cmd) {
        self.local.apply(cmd);
    }

    /// Before sleeping: the link's open FEC block is closed if due.
    fn idle(&mut self, _shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(crate::clock::now_ms());
        }
    }

    /// Sleeps no longer than the link's open FEC block may stay open.
    fn idle_ms(&self) -> u16 {
        match &self.link {
            Some((_, l)) => l.sleep_ms(crate::clock::now_ms(), 100),
            None => 100,
        }
    }

    /// The wakeup's link frames go out together.
    fn flush(&mut self, _shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.flush();
        }
    }

    /// Reads (and resets) the kernel's ring counters into the worker's figures.
    fn sample(&mut self, shell: &Shell) {
        if let Some((_, l)) = self.link.as_mut() {
            l.idle(now_ms());
        }
        for r in self.rings.iter_mut() {
            match r.ring.stats() {
                Ok(s) => {
                    if s.drops > 0 {
                        shell.stats.ring_drops.fetch_add(s.drops, Relaxed);
                        shell
                            .stats
                            .channel(r.fallback)
                            .drop(DropReason::RxOverflow, s.drops);
                    }
                    if s.freeze_q_cnt > 0 {
                        shell.stats.ring_freezes.fetch_add(s.freeze_q_cnt, Relaxed);
                    }
                }
                Err(e) => tracing::warn!(worker = shell.index, "{e}"),
            }
        }
    }
}

/// What one round of blocks from one ring shares.
struct Round<'a> {
    shell: &'a Shell,
    targets: &'a Targets,
    max_payload: usize,
    /// Domains whose media arrive on the ring's interface.
    domains: &'a [DomainId],
    fallback: Channel,
    local: &'a EgressSockets,
    now: u64,
}

impl Round<'_> {
    /// Forwards the frames of `blocks`: by packet socket, one `sendmmsg` per egress
    /// interface for the whole round (more only if it holds more than [`TX_FRAMES`]), or
    /// through the route's UDP socket, one `sendmmsg` per run; adds per-channel figures to
    /// `chan`. Each run's figures go to its route once its frames' fate is known.
    #[allow(clippy::too_many_arguments)]
    fn forward<'b>(
        &self,
        blocks: &'b mut Blocks<'_>,
        tx: &mut SliceBatch,
        ptx: &mut [Option<PacketTx>; 2],
        neigh: &mut Option<Neighbours>,
        pending: &mut Vec<Parked>,
        ident: &mut u16,
        mut link: Option<&mut (DomainId, LinkTx)>,
        chan: &mut [Tally; 2],
    ) {
        let now = self.now;
        let ts = crate::clock::wall_us();
        let media = &mut *self.shell.media.borrow_mut();
        let mut scope: SliceScope<'_, 'b> = tx.scope();
        let [p0, p1] = ptx;
        let mut outs: [Option<Out<'_, 'b>>; 2] =
            [p0.as_mut().map(Out::new), p1.as_mut().map(Out::new)];
        let mut run: Option<Run<'_>> = None;
        // The current run's next hop, looked up once per run.
        let mut hop: Option<Option<[u8; 6]>> = None;
        for frames in blocks.frames_mut() {
            for f in frames {
                let truncated = f.truncated();
                let data = f.data;
                let d = match parse_udp4(data) {
                    Ok(d) => d,
                    Err(e) => {
                        drop_frame(chan, self.fallback, data.len(), wire_reason(e));
                        continue;
                    }
                };
                let Some(channel) = classify(self.targets, self.domains, d.dst_addr, d.dst_port)
                else {
                    // The ring filter lets only our destinations through; this is its guard.
                    drop_frame(chan, self.fallback, d.payload.len(), DropReason::NoRoute);
                    continue;
                };
                if !Run::continues(&run, channel, d.dst_port) {
                    if let Some(r) = run.take() {
                        finish_run(r, &mut scope, pending);
                    }
                    run = Some(Run::start(
                        &self.shell.routes,
                        self.local,
                        channel,
                        d.dst_port,
                        now,
                    ));
                    hop = None;
                }
                let Some(r) = run.as_mut() else { continue };
                // The kernel vouches for checksums it validated or has not filled in yet (a
                // local sender's offload); otherwise both are checked.
                let skip_udp =
                    f.status & (libc::TP_STATUS_CSUM_VALID | libc::TP_STATUS_CSUMNOTREADY) != 0;
                let ok = d.checksums_ok(skip_udp);
                let src = SocketAddrV4::new(d.src_addr, d.src_port);
                // The payload stays in the ring block (sent from there); a stripping route
                // has it rewritten there.
                let (at, n) = (d.payload_at, d.payload.len());
                let payload = &mut data[at..at + n];
                let Some((dest, fd, len)) =
                    r.admit(src, payload, ok, truncated, self.max_payload, media)
                else {
                    continue;
                };
                let payload: &'b [u8] = &payload[..len];
                let Some(route) = r.route.as_deref() else {
                    continue;
                };
                if let Some((_, l)) = link.as_mut().filter(|(face, _)| *face == channel.egress()) {
                    // Split half: the far side is the peer half, down the outgoing link.
                    l.forward(route, payload, now, ts, &mut r.tally);
                    continue;
                }
                if let Some(o) = outs[channel.egress().index()].as_mut() {
                    let mac =
                        *hop.get_or_insert_with(|| neigh.as_mut()?.get(*dest.ip(), o.ifindex, now));
                    if let (Some(mac), true) = (mac, payload.len() <= o.max_udp) {
                        if o.scope.is_full() {
                            o.flush(pending, Some(&mut r.tally));
                        }
                        let id = *ident;
                        *ident = ident.wrapping_add(1);
                        let port = route.egress_port;
                        o.push(payload, mac, port, dest, id, pending.len());
                        continue;
                    }
                }
                // Through the kernel: it resolves the neighbour (and fragments).
                if scope.is_full() {
                    let out = fd.send(&mut scope, dest);
                    account(&mut r.tally, &out, r.route.as_deref());
                }
                scope.push(payload);
            }
        }
        if let Some(r) = run.take() {
            finish_run(r, &mut scope, pending);
        }
        for o in outs.iter_mut().flatten() {
            o.flush(pending, None);
        }
        for p in pending.drain(..) {
            p.close(now, chan);
        }
        // A split half's link frames go out once per wakeup (`Datapath::flush`).
    }
}

/// Sends what a run queued on its UDP socket, then parks it until the round's frames are
/// sent.
fn finish_run(mut r: Run<'_>, scope: &mut SliceScope<'_, '_>, pending: &mut Vec<Parked>) {
    if let (Some(dest), Some(fd)) = (r.route.as_ref().map(|r| r.dest), r.egress) {
        let out = fd.send(scope, dest);
        account(&mut r.tally, &out, r.route.as_deref());
    }
    scope.clear();
    pending.push(r.park());
}

static TX_ERRORS: RateLimit = RateLimit::new(5000);

/// One egress interface's packet socket during a round.
struct Out<'s, 'p> {
    fd: BorrowedFd<'s>,
    ifindex: u32,
    mac: [u8; 6],
    src: Ipv4Addr,
    max_udp: usize,
    scope: FrameScope<'s, 'p>,
    owner: &'s mut Vec<(u32, u32)>,
}

impl<'s, 'p> Out<'s, 'p> {
    fn new(p: &'s mut PacketTx) -> Out<'s, 'p> {
        let PacketTx {
            fd,
            ifindex,
            mac,
            src,
            max_udp,
            batch,
            owner,
        } = p;
        owner.clear();
        Out {
            fd: (*fd).as_fd(),
            ifindex: *ifindex,
            mac: *mac,
            src: *src,
            max_udp: *max_udp,
            scope: batch.scope(),
            owner,
        }
    }

    /// Queues `payload` for `dest` from the gateway's port `sport`, next hop `hop`, on
    /// behalf of run `run` of the round.
    fn push(
        &mut self,
        payload: &'p [u8],
        hop: [u8; 6],
        sport: u16,
        dest: SocketAddrV4,
        id: u16,
        run: usize,
    ) {
        let ends = FrameEnds {
            dst_mac: hop,
            src_mac: self.mac,
            src: SocketAddrV4::new(self.src, sport),
            dst: dest,
        };
        if self
            .scope
            .push(payload, |h| ends.write_vnet(h, id, payload.len()))
        {
            self.owner.push((run as u32, payload.len() as u32));
        }
    }

    /// Sends what is queued and counts each frame on its run: `pending[run]`, or `cur` for
    /// the run still open (the one numbered `pending.len()`).
    fn flush(&mut self, pending: &mut [Parked], mut cur: Option<&mut Tally>) {
        if self.scope.is_empty() {
            return;
        }
        let out = self.scope.send(self.fd);
        for (i, &(run, len)) in self.owner.iter().enumerate() {
            let t = match pending.get_mut(run as usize) {
                Some(p) => &mut p.tally,
                None => match cur.as_deref_mut() {
                    Some(t) => t,
                    None => continue,
                },
            };
            match self.scope.status(i) {
                FrameStatus::Sent => {
                    t.tx_packets += 1;
                    t.tx_bytes += u64::from(len);
                }
                FrameStatus::QueueFull => t.drop(DropReason::QueueFull),
                FrameStatus::Error => t.drop(DropReason::SendError),
            }
        }
        self.owner.clear();
        if let Some(code) = out.last_error {
            if let Some(suppressed) = TX_ERRORS.check(now_ms()) {
                let e = io::Error::from_raw_os_error(code);
                tracing::warn!(
                    ifindex = self.ifindex,
                    suppressed,
                    "packet socket send failed: {e}"
                );
            }
        }
    }
}

//! The signaling connection ([`Conn`]): accepting or dialing it, the hello and the
//! authenticated frames read from it, a newer connection replacing the current one, sending
//! and flushing frames, the timers (dial retry, handshake timeout, the peer's silence,
//! heartbeats, announcements) and losing the peer.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddrV4, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use nix::sys::epoll::{EpollEvent, EpollFlags};

use crate::signaling::split::frame::{
    FrameError, Hello, Keys, Kind, Opener, Role, Sealer, HELLO_LEN, MAGIC,
};

use super::sock::{connect_from, random, v4, want_writable, write_pending};
use super::{Loop, BATCH, CONN, HANDSHAKE_TIMEOUT, MAX_OUT, MIRROR_IDLE, PENDING};

/// One connection on the signaling link.
pub(super) struct Conn {
    sock: TcpStream,
    connected: bool,
    started: Instant,
    ours: Hello,
    theirs: Option<Hello>,
    inbuf: Vec<u8>,
    pub(super) out: Vec<u8>,
    pub(super) sealer: Option<Sealer>,
    opener: Option<Opener>,
    pub(super) authed: bool,
    pub(super) last_tx: Instant,
    want_out: bool,
}

impl Conn {
    fn new(sock: TcpStream, connected: bool, role: Role, instance: [u8; 16]) -> Conn {
        let ours = Hello {
            role,
            instance,
            nonce: random(),
        };
        let now = Instant::now();
        let mut c = Conn {
            sock,
            connected,
            started: now,
            ours,
            theirs: None,
            inbuf: Vec::with_capacity(64 * 1024),
            out: Vec::with_capacity(64 * 1024),
            sealer: None,
            opener: None,
            authed: false,
            last_tx: now,
            want_out: false,
        };
        if connected {
            c.out.extend_from_slice(&ours.encode());
        }
        c
    }
}

/// What happened to the connection after reading from it.
pub(super) enum ConnOutcome {
    Open,
    Closed,
    Failed(FrameError),
}

impl Loop {
    pub(super) fn accept_conn(&mut self) {
        for _ in 0..BATCH {
            let Some(l) = &self.listener else { return };
            match l.accept() {
                Ok((s, from)) => {
                    if self.standby {
                        // The pair's active holds the link (nothing reaches a standby that
                        // does not hold the address; this one closes what does).
                        drop(s);
                        continue;
                    }
                    if v4(from).map(|a| *a.ip()) != Some(*self.cfg.link.peer.ip()) {
                        self.stats.refused.fetch_add(1, Relaxed);
                        static LOG: crate::logging::RateLimit =
                            crate::logging::RateLimit::new(10_000);
                        if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                            tracing::warn!(from = %from, suppressed, "split signaling link: connection from an address other than the peer refused");
                        }
                        continue;
                    }
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    let slot = if self.conns[0].is_none() { 0 } else { 1 };
                    if let Some(old) = self.conns[slot].take() {
                        // A newer handshake replaces one still in progress.
                        let _ = self.epoll.delete(old.sock.as_fd());
                        self.stats.refused.fetch_add(1, Relaxed);
                    }
                    self.install_conn(slot, Conn::new(s, true, Role::Listener, self.instance));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn install_conn(&mut self, slot: usize, c: Conn) {
        let token = if slot == 0 { CONN } else { PENDING };
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT;
        if self
            .epoll
            .add(c.sock.as_fd(), EpollEvent::new(flags, token))
            .is_ok()
        {
            let mut c = c;
            c.want_out = true;
            self.conns[slot] = Some(c);
        }
    }

    fn dial(&mut self) {
        let from = SocketAddrV4::new(*self.cfg.link.local.ip(), 0);
        match connect_from(from, self.cfg.link.peer, &self.cfg.link.interface) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                self.install_conn(0, Conn::new(s, false, Role::Dialer, self.instance));
            }
            Err(e) => {
                static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(30_000);
                if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                    tracing::warn!(peer = %self.cfg.link.peer, suppressed, "split signaling link: cannot connect to the peer ({e}); retrying");
                }
            }
        }
    }

    pub(super) fn conn_event(&mut self, slot: usize, flags: EpollFlags) {
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        if !c.connected {
            if flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            {
                match c.sock.take_error() {
                    Ok(None) if !flags.contains(EpollFlags::EPOLLERR) => {
                        c.connected = true;
                        let hello = c.ours.encode();
                        c.out.extend_from_slice(&hello);
                    }
                    _ => {
                        self.drop_conn(slot, None);
                        return;
                    }
                }
            } else {
                return;
            }
        }
        if flags.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
            match self.read_conn(slot) {
                ConnOutcome::Open => {}
                ConnOutcome::Closed => self.drop_conn(slot, None),
                ConnOutcome::Failed(e) => self.drop_conn(slot, Some(e)),
            }
        }
    }

    fn read_conn(&mut self, slot: usize) -> ConnOutcome {
        for _ in 0..BATCH {
            let Some(c) = self.conns[slot].as_mut() else {
                return ConnOutcome::Closed;
            };
            let n = match c.sock.read(&mut self.buf) {
                Ok(0) => {
                    return if !c.inbuf.is_empty() {
                        ConnOutcome::Failed(FrameError::Truncated)
                    } else {
                        ConnOutcome::Closed
                    };
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return ConnOutcome::Open,
                Err(_) => return ConnOutcome::Closed,
            };
            self.stats.bytes_in.fetch_add(n as u64, Relaxed);
            c.inbuf.extend_from_slice(&self.buf[..n]);
            if let Err(e) = self.process_conn(slot) {
                return ConnOutcome::Failed(e);
            }
        }
        ConnOutcome::Open
    }

    /// Takes the hello and every complete frame out of the connection's input.
    fn process_conn(&mut self, slot: usize) -> Result<(), FrameError> {
        let Some(c) = self.conns[slot].as_mut() else {
            return Ok(());
        };
        if c.theirs.is_none() {
            let have = c.inbuf.len().min(4);
            if c.inbuf[..have] != MAGIC[..have] {
                return Err(FrameError::NotVgate);
            }
            if c.inbuf.len() < HELLO_LEN {
                return Ok(());
            }
            let mut h = [0u8; HELLO_LEN];
            h.copy_from_slice(&c.inbuf[..HELLO_LEN]);
            let theirs = Hello::parse(&h)?;
            let keys = Keys::derive(self.cfg.link.key.expose(), &c.ours, &theirs)?;
            c.inbuf.drain(..HELLO_LEN);
            c.theirs = Some(theirs);
            let mut sealer = Sealer::new(keys.send);
            let (udp, tcp) = self.announce.lock().map(|a| a.clone()).unwrap_or_default();
            self.sent_gen = self.announce_gen.load(Relaxed);
            sealer.announce(&mut c.out, &udp, &tcp);
            self.stats.frames_out.fetch_add(1, Relaxed);
            c.sealer = Some(sealer);
            c.opener = Some(Opener::new(keys.recv));
        }
        let mut input = std::mem::take(&mut c.inbuf);
        let mut opener = c.opener.take();
        let mut used = 0;
        let mut result = Ok(());
        if let Some(op) = opener.as_mut() {
            loop {
                match op.open(&input[used..]) {
                    Ok(Some((frame, len))) => {
                        used += len;
                        self.stats.frames_in.fetch_add(1, Relaxed);
                        self.last_rx = Instant::now();
                        self.stats
                            .peer_last_ms
                            .store(crate::clock::wall_ms(), Relaxed);
                        if op.accepted() == 1 {
                            self.on_authenticated(slot);
                        }
                        // After a pending connection took over it lives in slot 0.
                        let s = if self.conns[slot].is_some() { slot } else { 0 };
                        self.on_frame(s, frame);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        input.drain(..used);
        let s = if self.conns[slot].is_some() { slot } else { 0 };
        if let Some(c) = self.conns[s].as_mut() {
            c.inbuf = input;
            if c.opener.is_none() {
                c.opener = opener;
            }
        }
        result
    }

    fn on_authenticated(&mut self, slot: usize) {
        let theirs = self.conns[slot].as_ref().and_then(|c| c.theirs);
        if slot == 1 {
            // The new connection replaces the old one and everything carried on it.
            self.close_conn(0);
            self.conns[0] = self.conns[1].take();
            if let Some(c) = &self.conns[0] {
                let mut ev = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT, CONN);
                let _ = self.epoll.modify(c.sock.as_fd(), &mut ev);
            }
        }
        if let Some(c) = self.conns[0].as_mut() {
            c.authed = true;
        }
        self.stats.connects.fetch_add(1, Relaxed);
        let instance = theirs.map(|h| h.instance);
        if self.peer_instance.is_some()
            && self.peer_instance == instance
            && !self.peer_up
            && !self.lost
        {
            // The same instance on a new connection: a reconnection, or the peer's pair took
            // over with its state (it presents the pair's id); nothing ends.
            self.stats.peer_resumed.fetch_add(1, Relaxed);
        }
        if self.peer_instance.is_some() && self.peer_instance != instance {
            self.stats.peer_restarts.fetch_add(1, Relaxed);
            tracing::warn!("split signaling link: the peer half restarted");
            if !self.lost {
                self.lose_peer("the peer half restarted");
            }
        }
        self.peer_instance = instance;
        self.peer_up = true;
        self.lost = false;
        self.stats.peer_up.store(1, Relaxed);
        tracing::info!(peer = %self.cfg.link.peer, "split signaling link: peer authenticated, up");
    }

    /// Closes the connection in `slot` and, for the active one, every stream carried on it.
    pub(super) fn close_conn(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].take() {
            let _ = self.epoll.delete(c.sock.as_fd());
            if slot == 0 {
                let ids: Vec<u32> = self.streams.keys().copied().collect();
                for id in ids {
                    self.close_stream(id, false);
                }
                if self.peer_up {
                    self.peer_up = false;
                    self.down_since = Instant::now();
                    self.stats.peer_up.store(0, Relaxed);
                }
            }
        }
    }

    fn drop_conn(&mut self, slot: usize, err: Option<FrameError>) {
        if let Some(e) = err {
            let c = &self.stats;
            match e.counter() {
                "auth_failures" => c.auth_failures.fetch_add(1, Relaxed),
                "replays" => c.replays.fetch_add(1, Relaxed),
                "truncated" => c.truncated.fetch_add(1, Relaxed),
                "refused" => c.refused.fetch_add(1, Relaxed),
                _ => c.malformed.fetch_add(1, Relaxed),
            };
            c.resets.fetch_add(1, Relaxed);
            static LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);
            if let Some(suppressed) = LOG.check(crate::clock::now_ms()) {
                tracing::warn!(suppressed, "split signaling link: connection reset: {e}");
            }
        } else if self.conns[slot].as_ref().is_some_and(|c| c.authed) {
            tracing::warn!("split signaling link: connection to the peer closed");
        }
        self.close_conn(slot);
        self.next_dial = Instant::now() + self.retry();
    }

    pub(super) fn retry(&self) -> Duration {
        self.cfg.link.heartbeat.min(Duration::from_secs(1))
    }

    /// The peer is gone (silent, said goodbye, or restarted): end every signaled session
    /// crossing the link and forget its ports until it announces them again.
    pub(super) fn lose_peer(&mut self, why: &str) {
        self.lost = true;
        self.stats.peer_lost.fetch_add(1, Relaxed);
        let n = self.events.end_sessions(why);
        self.stats.sessions_ended.fetch_add(n as u64, Relaxed);
        tracing::warn!(
            sessions = n,
            "split signaling link: {why}; ending the sessions that cross the link"
        );
        self.udp.clear();
        self.tcp_listeners.clear();
    }

    pub(super) fn send_frame(
        &mut self,
        f: impl FnOnce(&mut Sealer, &mut Vec<u8>) -> usize,
    ) -> bool {
        let Some(c) = self.conns[0].as_mut() else {
            return false;
        };
        if !c.authed || c.out.len() > MAX_OUT {
            return false;
        }
        let Some(s) = c.sealer.as_mut() else {
            return false;
        };
        f(s, &mut c.out);
        c.last_tx = Instant::now();
        self.stats.frames_out.fetch_add(1, Relaxed);
        true
    }

    pub(super) fn flush_conns(&mut self) {
        for slot in 0..2 {
            let mut failed = false;
            if let Some(c) = self.conns[slot].as_mut() {
                if c.connected {
                    match write_pending(&mut c.sock, &mut c.out) {
                        Ok(n) => {
                            self.stats.bytes_out.fetch_add(n as u64, Relaxed);
                        }
                        Err(()) => failed = true,
                    }
                }
                let want = !c.connected || !c.out.is_empty();
                let token = if slot == 0 { CONN } else { PENDING };
                want_writable(&self.epoll, &c.sock, token, want, &mut c.want_out);
            }
            if failed {
                self.drop_conn(slot, None);
            }
        }
        self.flush_streams();
    }

    /// A pair's node follows its role: the standby drops the link (ending nothing: the new
    /// active carries the sessions on), the new active takes the pair's instance id.
    fn follow_role(&mut self) {
        let standby = self.events.standby();
        if standby && !self.standby {
            tracing::info!("split signaling link: this node is the pair's standby now: the link is left to the active");
            self.close_conn(1);
            self.close_conn(0);
            self.peer_instance = None;
            self.lost = true;
            self.udp.clear();
            self.tcp_listeners.clear();
        } else if !standby && self.standby {
            if let Some(id) = self.events.inherited_instance() {
                if id != self.instance {
                    self.instance = id;
                    self.stats.identity_inherited.fetch_add(1, Relaxed);
                    tracing::info!("split signaling link: this node is the pair's active now: it presents the pair's instance id (the peer keeps the sessions)");
                }
            }
            self.next_dial = Instant::now();
        }
        self.standby = standby;
        let id = if standby {
            self.events.inherited_instance().unwrap_or(self.instance)
        } else {
            self.instance
        };
        self.events.presenting(id);
    }

    pub(super) fn timers(&mut self) {
        self.follow_role();
        if self.standby {
            return;
        }
        let now = Instant::now();
        if self.cfg.role == Role::Dialer && self.conns[0].is_none() && now >= self.next_dial {
            self.next_dial = now + self.retry();
            self.dial();
        }
        for slot in 0..2 {
            if let Some(c) = &self.conns[slot] {
                if !c.authed && now.duration_since(c.started) > HANDSHAKE_TIMEOUT {
                    self.stats.refused.fetch_add(1, Relaxed);
                    self.drop_conn(slot, None);
                }
            }
        }
        if self.peer_up && now.duration_since(self.last_rx) > self.cfg.link.dead_after {
            self.close_conn(0);
            self.next_dial = now;
            self.lose_peer("the peer half is silent");
        }
        if !self.peer_up
            && !self.lost
            && now.duration_since(self.down_since) > self.cfg.link.dead_after
        {
            self.lose_peer("the peer half is unreachable");
        }
        let gen = self.announce_gen.load(Relaxed);
        if gen != self.sent_gen && self.peer_up {
            let (udp, tcp) = self.announce.lock().map(|a| a.clone()).unwrap_or_default();
            if self.send_frame(|s, out| s.announce(out, &udp, &tcp)) {
                self.sent_gen = gen;
            }
        }
        let heartbeat_due = self.conns[0]
            .as_ref()
            .is_some_and(|c| c.authed && now.duration_since(c.last_tx) >= self.cfg.link.heartbeat);
        if heartbeat_due && self.send_frame(|s, out| s.seal(out, Kind::Heartbeat, &[])) {
            self.stats.heartbeats_out.fetch_add(1, Relaxed);
        }
        if now.duration_since(self.last_sweep) > Duration::from_secs(1) {
            self.last_sweep = now;
            self.udp
                .retain(|_, f| f.announced || now.duration_since(f.last_used) < MIRROR_IDLE);
        }
    }

    /// A stopping half tells the peer, which ends its sessions at once; a pair's node does
    /// not: the pair's other node may take over with them (the peer waits `dead_after`).
    pub(super) fn goodbye(&mut self) {
        if self.events.paired() {
            return;
        }
        if self.send_frame(|s, out| s.seal(out, Kind::Goodbye, &[])) {
            if let Some(c) = self.conns[0].as_mut() {
                let _ = c.sock.set_nonblocking(false);
                let _ = c.sock.set_write_timeout(Some(Duration::from_millis(300)));
                let _ = c.sock.write_all(&c.out);
                let _ = c.sock.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

//! Next-hop MAC addresses for the frames vgate builds itself (mode tnapi's packet-socket
//! transmit, mode zc's AF_XDP transmit), resolved off the data path.
//!
//! Owns: the resolver thread, the table it publishes and the workers' read handles. Must
//! not touch: the frames themselves, or the kernel's tables (it only reads them, over
//! netlink).
//!
//! # Shape
//!
//! - [`NeighResolver::start`] spawns one thread per engine (`vgate-neigh`, in the network
//!   namespace of the caller, like every thread it spawns). It owns every netlink exchange:
//!   the kernel's route to a destination (its next hop and interface) and the neighbour
//!   table of that interface.
//! - It publishes what it learnt in a [`NeighTable`]: a fixed array of slots, one writer
//!   (the resolver), any number of readers, each slot guarded by a sequence counter, so a
//!   worker's lookup is a few atomic loads: no lock, no system call, no allocation.
//! - A worker holds a [`Neighbours`] handle. A lookup that finds nothing (or an unresolved
//!   entry) returns `None` at once — the caller sends through the kernel instead (the
//!   worker's raw socket of the egress domain, or the port's UDP socket where ports hold
//!   sockets; the kernel resolves by itself) — and posts the destination on a bounded queue (dropped when full,
//!   counted); it never blocks.
//! - The resolver answers a posted destination at once, retries an unresolved one every
//!   [`RETRY_MS`] (so a neighbour that appears later is used within that), and refreshes
//!   every resolved one every [`REFRESH_MS`] with one neighbour dump per interface (not one
//!   per destination). A destination nobody asked for in [`FORGET_MS`] is dropped from the
//!   table, so the table holds the destinations in use, not every one ever seen.
//! - The table is never filled beyond 3/4 of its slots ([`NeighTable::set`] refuses, counted
//!   as `table_full`), so a worker's miss ends at an empty slot after a short probe; while it
//!   is that full the resolver drops new destinations before asking the kernel (counted too),
//!   so a refused destination costs no netlink exchange. Those destinations go through the
//!   kernel's socket until entries are forgotten. Every probe and move loop is bounded by the
//!   slot count.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use super::sys::bpf;
use crate::clock::now_ms;

/// Slots of the published table: destinations (per interface) resolvable at once.
pub const TABLE_SLOTS: usize = 1 << 14;
/// Misses a worker can post before the resolver takes them.
pub const QUEUE: usize = 1024;
/// An unresolved destination is tried again after this long.
pub const RETRY_MS: u64 = 200;
/// A resolved destination's route and neighbour are read again after this long.
pub const REFRESH_MS: u64 = 5000;
/// A destination no worker asked for in this long leaves the table.
pub const FORGET_MS: u64 = 60_000;
/// A worker re-posts a miss for the same destination at most this often.
const REPOST_MS: u64 = 50;

/// The table key of `dst` out of `ifindex`; 0 (an empty slot) only for interface 0, which
/// does not exist and is never looked up.
fn key(dst: Ipv4Addr, ifindex: u32) -> u64 {
    (u64::from(u32::from(dst)) << 32) | u64::from(ifindex)
}

fn hash(k: u64) -> usize {
    // Fibonacci hashing of the key's bits.
    (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
}

/// A MAC in the low 48 bits, with bit 48 set when it is valid.
const VALID: u64 = 1 << 48;

fn pack_mac(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac);
    u64::from_le_bytes(b) | VALID
}

fn unpack_mac(v: u64) -> Option<[u8; 6]> {
    if v & VALID == 0 {
        return None;
    }
    let b = v.to_le_bytes();
    Some([b[0], b[1], b[2], b[3], b[4], b[5]])
}

#[derive(Default)]
struct Slot {
    /// Odd while the resolver rewrites the slot.
    seq: AtomicU32,
    key: AtomicU64,
    mac: AtomicU64,
    /// When a worker last asked (ms, coarse: written at most once a second per slot).
    used: AtomicU64,
}

/// The published next hops: written by the resolver only, read by any worker.
pub struct NeighTable {
    slots: Box<[Slot]>,
    /// Misses that did not fit the queue.
    pub queue_full: AtomicU64,
    /// New destinations refused because the table held [`NeighTable::capacity`] entries.
    pub table_full: AtomicU64,
    /// Entries in the table (written by the resolver only).
    occupied: AtomicUsize,
}

impl NeighTable {
    fn new(slots: usize) -> NeighTable {
        NeighTable {
            slots: (0..slots.next_power_of_two())
                .map(|_| Slot::default())
                .collect(),
            queue_full: AtomicU64::new(0),
            table_full: AtomicU64::new(0),
            occupied: AtomicUsize::new(0),
        }
    }

    /// The most entries the table takes: 3/4 of its slots, so probe chains stay short and
    /// always end at an empty slot.
    pub fn capacity(&self) -> usize {
        self.slots.len() / 4 * 3
    }

    /// Entries in the table now (the resolver's count; no walk).
    pub fn entries(&self) -> usize {
        self.occupied.load(Ordering::Relaxed)
    }

    /// Whether a new destination would be refused now.
    fn is_full(&self) -> bool {
        self.occupied.load(Ordering::Relaxed) >= self.capacity()
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Reader: the slot holding `k` and its MAC word, consistently read. Probes until an
    /// empty slot (the resolver never leaves a hole inside a probe chain: see `remove`). A
    /// slot the resolver is rewriting right now counts as a miss: the reader never waits
    /// for the writer (which may have been preempted mid-write).
    fn find(&self, k: u64) -> Option<(usize, u64)> {
        let mask = self.mask();
        let mut i = hash(k) & mask;
        for _ in 0..self.slots.len() {
            let s = &self.slots[i];
            let v1 = s.seq.load(Ordering::Acquire);
            let sk = s.key.load(Ordering::Relaxed);
            let mac = s.mac.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if v1 & 1 == 1 || s.seq.load(Ordering::Relaxed) != v1 {
                return None;
            }
            if sk == k {
                return Some((i, mac));
            }
            if sk == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Resolver: rewrites slot `i` (one writer, so the sequence counter is its own).
    fn write(&self, i: usize, k: u64, mac: u64) {
        let s = &self.slots[i];
        let v = s.seq.load(Ordering::Relaxed);
        s.seq.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        s.key.store(k, Ordering::Relaxed);
        s.mac.store(mac, Ordering::Relaxed);
        s.seq.store(v.wrapping_add(2), Ordering::Release);
    }

    /// Resolver: sets `k`'s MAC word, inserting it; `false` (counted as `table_full`) when
    /// the table already holds [`NeighTable::capacity`] entries.
    fn set(&self, k: u64, mac: u64) -> bool {
        if let Some((i, old)) = self.find(k) {
            if old != mac {
                self.write(i, k, mac);
            }
            return true;
        }
        if self.is_full() {
            self.table_full.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let mask = self.mask();
        let mut i = hash(k) & mask;
        for _ in 0..self.slots.len() {
            if self.slots[i].key.load(Ordering::Relaxed) == 0 {
                self.slots[i].used.store(now_ms(), Ordering::Relaxed);
                self.write(i, k, mac);
                self.occupied.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            i = (i + 1) & mask;
        }
        false
    }

    /// Resolver: removes `k`, moving later members of its probe chain back (linear-probing
    /// deletion), so readers never meet a hole before their key. A reader that races a move
    /// may miss an entry once (it then posts a miss and uses the kernel's socket).
    fn remove(&self, k: u64) {
        let Some((mut hole, _)) = self.find(k) else {
            return;
        };
        let mask = self.mask();
        let mut j = hole;
        // Bounded: a table is never full (see `set`), but a loop that could spin forever on
        // the resolver would stop every lookup with it.
        for _ in 1..self.slots.len() {
            j = (j + 1) & mask;
            let jk = self.slots[j].key.load(Ordering::Relaxed);
            if jk == 0 {
                break;
            }
            let home = hash(jk) & mask;
            // Does j's home lie cyclically in (hole, j]? Then it stays.
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                let mac = self.slots[j].mac.load(Ordering::Relaxed);
                let used = self.slots[j].used.load(Ordering::Relaxed);
                self.write(hole, jk, mac);
                self.slots[hole].used.store(used, Ordering::Relaxed);
                hole = j;
            }
        }
        self.write(hole, 0, 0);
        self.occupied.fetch_sub(1, Ordering::Relaxed);
    }

    fn used(&self, k: u64) -> Option<u64> {
        self.find(k)
            .map(|(i, _)| self.slots[i].used.load(Ordering::Relaxed))
    }

    /// Entries in the table (for tests; walks every slot — metrics read `entries`).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.key.load(Ordering::Relaxed) != 0)
            .count()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A worker's view of the next hops: lookups in the published table, misses posted to the
/// resolver. Never blocks, never makes a system call (but the resolver's wakeup when its
/// queue was empty).
pub struct Neighbours {
    table: Arc<NeighTable>,
    tx: Sender<(Ipv4Addr, u32)>,
    last_miss: (u64, u64),
}

impl Neighbours {
    /// The MAC of `dst`'s next hop out of `ifindex`; `None` while unknown or unresolved
    /// (then posted to the resolver, at most every [`REPOST_MS`] for one destination).
    pub fn get(&mut self, dst: Ipv4Addr, ifindex: u32, now: u64) -> Option<[u8; 6]> {
        if ifindex == 0 {
            return None;
        }
        let k = key(dst, ifindex);
        match self.table.find(k) {
            Some((i, mac)) => {
                let s = &self.table.slots[i];
                if now >= s.used.load(Ordering::Relaxed) + 1000 {
                    s.used.store(now, Ordering::Relaxed);
                }
                if let Some(m) = unpack_mac(mac) {
                    return Some(m);
                }
                // Known but unresolved: the resolver retries it on its own.
                None
            }
            None => {
                self.post(k, dst, ifindex, now);
                None
            }
        }
    }

    fn post(&mut self, k: u64, dst: Ipv4Addr, ifindex: u32, now: u64) {
        if self.last_miss.0 == k && now < self.last_miss.1 + REPOST_MS {
            return;
        }
        self.last_miss = (k, now);
        match self.tx.try_send((dst, ifindex)) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                self.table.queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The resolver thread of one engine; workers get [`Neighbours`] handles from it. The thread
/// ends when every handle is gone.
pub struct NeighResolver {
    table: Arc<NeighTable>,
    tx: Sender<(Ipv4Addr, u32)>,
}

impl NeighResolver {
    /// Spawns the resolver (in the caller's network namespace); it stops when `stop` is set
    /// or every handle (and this value) is dropped.
    pub fn start(stop: Arc<AtomicBool>) -> io::Result<NeighResolver> {
        Self::start_with(stop, TABLE_SLOTS, resolve_with_netlink)
    }

    /// [`NeighResolver::start`] with a table of `slots` and another way to resolve (tests).
    pub fn start_with<F>(stop: Arc<AtomicBool>, slots: usize, resolve: F) -> io::Result<Self>
    where
        F: FnMut(&[(Ipv4Addr, u32)]) -> Vec<Option<[u8; 6]>> + Send + 'static,
    {
        let table = Arc::new(NeighTable::new(slots));
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let t = Arc::clone(&table);
        std::thread::Builder::new()
            .name("vgate-neigh".into())
            .spawn(move || run(&t, &rx, &stop, resolve))?;
        Ok(NeighResolver { table, tx })
    }

    /// A worker's handle.
    pub fn handle(&self) -> Neighbours {
        Neighbours {
            table: Arc::clone(&self.table),
            tx: self.tx.clone(),
            last_miss: (0, 0),
        }
    }

    pub fn table(&self) -> &Arc<NeighTable> {
        &self.table
    }
}

/// What the resolver remembers of one destination.
struct Known {
    /// When it was last resolved (or tried).
    at: u64,
    resolved: bool,
}

fn run<F>(table: &NeighTable, rx: &Receiver<(Ipv4Addr, u32)>, stop: &AtomicBool, mut resolve: F)
where
    F: FnMut(&[(Ipv4Addr, u32)]) -> Vec<Option<[u8; 6]>>,
{
    let mut known: HashMap<(Ipv4Addr, u32), Known> = HashMap::new();
    let mut due: Vec<(Ipv4Addr, u32)> = Vec::new();
    let mut next_sweep = 0;
    while !stop.load(Ordering::Relaxed) {
        due.clear();
        match rx.recv_timeout(Duration::from_millis(RETRY_MS / 2)) {
            Ok(d) => due.push(d),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(d) = rx.try_recv() {
            due.push(d);
        }
        let now = now_ms();
        // A posted destination already tried recently waits for its turn below.
        due.retain(|d| known.get(d).is_none_or(|k| now >= k.at + RETRY_MS));
        if now >= next_sweep {
            next_sweep = now + RETRY_MS;
            let mut gone = Vec::new();
            for (d, k) in &known {
                let used = table.used(key(d.0, d.1)).unwrap_or(0);
                if now >= used + FORGET_MS {
                    gone.push(*d);
                } else if now >= k.at + if k.resolved { REFRESH_MS } else { RETRY_MS } {
                    due.push(*d);
                }
            }
            for d in gone {
                known.remove(&d);
                table.remove(key(d.0, d.1));
            }
        }
        if due.is_empty() {
            continue;
        }
        due.sort_unstable_by_key(|d| (d.1, u32::from(d.0)));
        due.dedup();
        if table.is_full() {
            // No room for a new destination: refuse it before asking the kernel (a worker
            // re-posts it, and it would be asked again every time).
            let before = due.len();
            due.retain(|d| known.contains_key(d));
            table
                .table_full
                .fetch_add((before - due.len()) as u64, Ordering::Relaxed);
            if due.is_empty() {
                continue;
            }
        }
        let macs = resolve(&due);
        for (d, mac) in due.iter().zip(macs) {
            let word = mac.map_or(0, pack_mac);
            if table.set(key(d.0, d.1), word) {
                known.insert(
                    *d,
                    Known {
                        at: now,
                        resolved: mac.is_some(),
                    },
                );
            }
        }
    }
}

/// Resolves `dests` (sorted by interface) over netlink: one route lookup per destination,
/// one neighbour dump per interface.
fn resolve_with_netlink(dests: &[(Ipv4Addr, u32)]) -> Vec<Option<[u8; 6]>> {
    let mut dumps: HashMap<u32, Vec<(Ipv4Addr, [u8; 6])>> = HashMap::new();
    dests
        .iter()
        .map(|&(dst, ifindex)| {
            let hop = route_hop(dst, ifindex)?;
            let table = dumps
                .entry(ifindex)
                .or_insert_with(|| neighbours_on(ifindex).unwrap_or_default());
            table.iter().find(|(ip, _)| *ip == hop).map(|(_, m)| *m)
        })
        .collect()
}

/// The next hop of `dst` (the kernel's route: gateway or on-link) and its MAC in the
/// neighbour table, when the route leaves through `ifindex` and the entry is valid. One
/// synchronous netlink exchange each: for the control side (mode xdp's route installer, when
/// the resolver's table does not have it yet), never a worker.
pub(super) fn resolve_next_hop(dst: Ipv4Addr, ifindex: u32) -> Option<[u8; 6]> {
    let hop = route_hop(dst, ifindex)?;
    neighbours_on(ifindex)?
        .into_iter()
        .find(|(ip, _)| *ip == hop)
        .map(|(_, m)| m)
}

/// The next hop the kernel's route to `dst` names, if that route leaves through `ifindex`.
fn route_hop(dst: Ipv4Addr, ifindex: u32) -> Option<Ipv4Addr> {
    const RTA_DST: u16 = 1;
    const RTA_OIF: u16 = 4;
    const RTA_GATEWAY: u16 = 5;
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags(u32)
    let mut body = vec![libc::AF_INET as u8, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    bpf::push_attr(&mut body, RTA_DST, &dst.octets());
    let req = bpf::nl_message(libc::RTM_GETROUTE, libc::NLM_F_REQUEST as u16, &body);
    let reply = bpf::nl_exchange(&req).ok()?;
    let (_, route) = reply.iter().find(|(t, _)| *t == libc::RTM_NEWROUTE)?;
    let mut hop = dst;
    let mut oif = 0;
    for (t, v) in bpf::attrs(route.get(12..)?) {
        match t {
            RTA_GATEWAY if v.len() == 4 => hop = Ipv4Addr::new(v[0], v[1], v[2], v[3]),
            RTA_OIF if v.len() == 4 => oif = u32::from_ne_bytes([v[0], v[1], v[2], v[3]]),
            _ => {}
        }
    }
    (oif == ifindex).then_some(hop)
}

/// The valid IPv4 neighbour entries of `ifindex` (one dump).
fn neighbours_on(ifindex: u32) -> Option<Vec<(Ipv4Addr, [u8; 6])>> {
    // struct ndmsg: family, pad, pad16, ifindex(i32), state(u16), flags, type
    let mut nd = vec![libc::AF_INET as u8, 0, 0, 0];
    nd.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    nd.extend_from_slice(&[0, 0, 0, 0]);
    let req = bpf::nl_message(
        libc::RTM_GETNEIGH,
        (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
        &nd,
    );
    const NUD_VALID: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;
    let mut out = Vec::new();
    for (t, m) in bpf::nl_exchange(&req).ok()? {
        if t != libc::RTM_NEWNEIGH || m.len() < 12 {
            continue;
        }
        let idx = i32::from_ne_bytes([m[4], m[5], m[6], m[7]]) as u32;
        let state = u16::from_ne_bytes([m[8], m[9]]);
        if idx != ifindex || state & NUD_VALID == 0 {
            continue;
        }
        let mut ip = None;
        let mut mac = None;
        for (a, v) in bpf::attrs(&m[12..]) {
            match a {
                x if x == libc::NDA_DST && v.len() == 4 => {
                    ip = Some(Ipv4Addr::new(v[0], v[1], v[2], v[3]))
                }
                x if x == libc::NDA_LLADDR && v.len() == 6 => {
                    mac = Some([v[0], v[1], v[2], v[3], v[4], v[5]])
                }
                _ => {}
            }
        }
        if let (Some(ip), Some(mac)) = (ip, mac) {
            out.push((ip, mac));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Instant;

    #[test]
    fn macs_pack_and_unpack() {
        let m = [0x02, 0xab, 0, 0xff, 7, 1];
        assert_eq!(unpack_mac(pack_mac(m)), Some(m));
        assert_eq!(unpack_mac(0), None, "unresolved");
        assert_eq!(unpack_mac(pack_mac([0; 6])), Some([0; 6]));
    }

    /// Inserts, updates and removes in a small table whose probe chains collide and wrap:
    /// every key left is still found after each removal.
    #[test]
    fn table_keeps_probe_chains_whole_across_removals() {
        let t = NeighTable::new(16);
        let keys: Vec<u64> = (1..=12u32)
            .map(|i| key(Ipv4Addr::from(0x0a00_0000 + i * 16), 3))
            .collect();
        for (n, &k) in keys.iter().enumerate() {
            assert!(t.set(k, pack_mac([n as u8; 6])));
        }
        assert_eq!(t.len(), 12);
        assert!(t.set(keys[0], 0), "update to unresolved");
        assert_eq!(t.find(keys[0]).map(|f| f.1), Some(0));
        for (n, &k) in keys.iter().enumerate().step_by(2) {
            t.remove(k);
            assert!(t.find(k).is_none(), "{n} removed");
            for (m, &other) in keys.iter().enumerate() {
                let gone = m % 2 == 0 && m <= n;
                assert_eq!(t.find(other).is_none(), gone, "key {m} after removing {n}");
            }
        }
        assert_eq!(t.len(), 6);
    }

    /// Runs `f` on another thread and fails (instead of hanging) if it does not return.
    fn returns_within_10s(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "did not return (or panicked)"
        );
    }

    /// A table filled as far as it goes refuses (and counts) new destinations at 3/4 of its
    /// slots, still answers misses, and every removal returns and keeps the rest findable.
    #[test]
    fn a_filled_table_refuses_new_destinations_and_removals_return() {
        returns_within_10s(|| {
            let t = NeighTable::new(64);
            let keys: Vec<u64> = (1..=200u32)
                .map(|i| key(Ipv4Addr::from(0x0a00_0000 + i), 2))
                .collect();
            let stored: Vec<u64> = keys.iter().copied().filter(|&k| t.set(k, 0)).collect();
            assert_eq!(stored.len(), 48, "3/4 of 64 slots");
            assert_eq!(t.len(), 48);
            assert_eq!(t.table_full.load(Ordering::Relaxed), 200 - 48);
            assert!(t.set(stored[0], pack_mac([1; 6])), "an update still fits");
            assert!(t.find(keys[199]).is_none(), "a miss ends");
            for (n, &k) in stored.iter().enumerate() {
                t.remove(k);
                assert!(stored[n + 1..].iter().all(|&o| t.find(o).is_some()));
            }
            assert!(t.is_empty());
            assert!(t.set(keys[199], 0), "room again");
        });
        // Every slot taken (only `write` can do that): a removal still returns.
        returns_within_10s(|| {
            let t = NeighTable::new(16);
            for i in 0..16 {
                t.write(i, key(Ipv4Addr::from(i as u32 + 1), 1), 0);
            }
            t.remove(key(Ipv4Addr::from(1), 1));
            assert!(t.find(key(Ipv4Addr::from(1), 1)).is_none());
        });
    }

    /// While the table is full the resolver refuses new destinations without asking the
    /// kernel for them.
    #[test]
    fn a_full_table_costs_no_netlink_exchange() {
        let asked: Arc<Mutex<Vec<Ipv4Addr>>> = Arc::default();
        let a = Arc::clone(&asked);
        let stop = Arc::new(AtomicBool::new(false));
        let r = NeighResolver::start_with(Arc::clone(&stop), 16, move |dests| {
            a.lock().unwrap().extend(dests.iter().map(|d| d.0));
            dests.iter().map(|_| Some([2, 0, 0, 0, 0, 9])).collect()
        })
        .unwrap();
        let mut w = r.handle();
        for i in 1..=12u32 {
            let d = Ipv4Addr::from(i);
            assert!(wait_for(|| w.get(d, 1, now_ms()).is_some()), "{d}");
        }
        assert_eq!(r.table().len(), 12);
        let extra = Ipv4Addr::from(99);
        let _ = w.get(extra, 1, now_ms());
        assert!(wait_for(|| r.table().table_full.load(Ordering::Relaxed) > 0));
        assert!(!asked.lock().unwrap().contains(&extra));
        stop.store(true, Ordering::Relaxed);
    }

    fn wait_for(mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A worker's miss returns at once and reaches the resolver; a neighbour that appears
    /// later is picked up by the resolver's own retry, without another miss.
    #[test]
    fn a_miss_is_resolved_off_the_worker_and_a_late_neighbour_is_picked_up() {
        let present: Arc<Mutex<HashMap<Ipv4Addr, [u8; 6]>>> = Arc::default();
        let asked: Arc<Mutex<Vec<Ipv4Addr>>> = Arc::default();
        let (p, a) = (Arc::clone(&present), Arc::clone(&asked));
        let stop = Arc::new(AtomicBool::new(false));
        let r = NeighResolver::start_with(Arc::clone(&stop), 64, move |dests| {
            let p = p.lock().unwrap();
            a.lock().unwrap().extend(dests.iter().map(|d| d.0));
            dests.iter().map(|d| p.get(&d.0).copied()).collect()
        })
        .unwrap();
        let mut w = r.handle();
        let (x, y) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        present.lock().unwrap().insert(x, [2, 0, 0, 0, 0, 1]);
        assert_eq!(
            w.get(x, 4, now_ms()),
            None,
            "first lookup: a miss, not a wait"
        );
        assert!(wait_for(
            || w.get(x, 4, now_ms()) == Some([2, 0, 0, 0, 0, 1])
        ));
        assert_eq!(w.get(y, 4, now_ms()), None);
        assert!(wait_for(|| asked.lock().unwrap().contains(&y)));
        assert_eq!(w.get(y, 4, now_ms()), None, "unresolved");
        let asks = asked.lock().unwrap().len();
        present.lock().unwrap().insert(y, [2, 0, 0, 0, 0, 2]);
        assert!(wait_for(
            || w.get(y, 4, now_ms()) == Some([2, 0, 0, 0, 0, 2])
        ));
        assert!(
            asked.lock().unwrap().len() > asks,
            "retried by the resolver"
        );
        assert_eq!(w.get(x, 5, now_ms()), None, "per interface");
        assert_eq!(
            w.get(x, 0, now_ms()),
            None,
            "interface 0 is never looked up"
        );
        stop.store(true, Ordering::Relaxed);
        assert_eq!(r.table().queue_full.load(Ordering::Relaxed), 0);
    }

    /// Lookups from several threads while the resolver rewrites and moves entries never
    /// return a MAC that belongs to another destination.
    #[test]
    fn readers_never_see_another_destinations_mac() {
        let t = Arc::new(NeighTable::new(64));
        let mac_of = |i: u32| pack_mac([i as u8, (i >> 8) as u8, 0xee, 0, 0, 1]);
        let stop = Arc::new(AtomicBool::new(false));
        // Entries readers find whatever the scheduling: present before they start, and
        // every reader makes at least one pass (the stop flag is read after a pass).
        for i in 1..48u32 {
            t.set(key(Ipv4Addr::from(i * 64), 1), mac_of(i));
        }
        let started = Arc::new(std::sync::Barrier::new(3));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (t, stop, started) = (Arc::clone(&t), Arc::clone(&stop), Arc::clone(&started));
                std::thread::spawn(move || {
                    let mut hits = 0u64;
                    started.wait();
                    loop {
                        for i in 1..48u32 {
                            if let Some((_, m)) = t.find(key(Ipv4Addr::from(i * 64), 1)) {
                                assert!(m == 0 || m == mac_of(i), "key {i}");
                                hits += 1;
                            }
                        }
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                    hits
                })
            })
            .collect();
        started.wait();
        for round in 0..2000u32 {
            for i in 1..48u32 {
                let k = key(Ipv4Addr::from(i * 64), 1);
                if (i + round) % 3 == 0 {
                    t.remove(k);
                } else {
                    t.set(k, if round % 2 == 0 { mac_of(i) } else { 0 });
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    }
}

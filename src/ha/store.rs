//! The state store: one Redis server both nodes of a pair reach, spoken to by the HA thread
//! only (never a worker). Keys, under `ha.key_prefix`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `PREFIX:sessions` | hash | state-store key (`a:20000`) → [`super::record::SessionRecord`] as JSON; `sip/ROUTE/b/TOKEN` (a binding) and `sip/ROUTE/c/HEX` (a confirmed call) → a SIP proxy's record, `split/signal/agent` → a split half's signaling identity ([`crate::routes::board`]) |
//! | `PREFIX:seq` | string | bumped with every change of `sessions`, set to a new epoch (`wall ms << 16`) by a whole rewrite (the standby re-reads when it moved) |
//! | `PREFIX:meta` | hash | `node` (the writer), `heartbeat_ms` (its wall clock at its last write), `epoch` (its lease's), `gen` (the writer's generation: set by its last whole rewrite) |
//! | `PREFIX:lease` | string, `PX ha.lease_ms` | `EPOCH NODE`: the node allowed to forward and write; renewed by every batch |
//! | `PREFIX:epoch` | string | the last lease epoch handed out (`INCR`): every new holder gets a larger one |
//!
//! Fencing: every write is one Lua script that first checks the lease is still `EPOCH NODE`
//! of the writer (renewing it) and refuses the whole batch otherwise, so a node whose lease
//! was taken (a newer epoch) can no longer overwrite the new holder's records, and learns
//! at its next batch that it must stop forwarding.
//!
//! The same script reads `gen` back: a value other than the one the writer's last whole
//! rewrite set means the store lost what it wrote (`FLUSHALL`/`FLUSHDB`, a Redis restarted
//! empty behind a proxy or a moved address, a replica promoted before it had everything) and
//! the active rewrites the whole at the next tick. Such a store lost the lease and the epoch
//! counter too: the holder's batch finds no lease and a counter below its epoch, so it takes
//! the lease again with its own epoch and sets the counter to it (a node that takes the
//! lease later gets a newer one). A standby reading a Redis *replica* (`ha.redis` on its own
//! node, `replicaof` the active's) checks `ROLE` each read: a replica whose link to its
//! master is down holds a copy that no longer moves, so the read fails (the standby turns
//! stale) until the link is up again.
//!
//! Every call has a short timeout, so a Redis that went away costs the HA thread at most
//! that, and reconnection is tried at most twice a second.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use redis::{Client, Connection};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
const IO_TIMEOUT: Duration = Duration::from_millis(500);
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// What the standby reads: the writer's heartbeat and, when `seq` moved, the sessions.
pub struct Read {
    pub seq: u64,
    pub node: Option<String>,
    pub heartbeat_ms: Option<u64>,
    /// The lease as the store holds it (`EPOCH NODE`), `None`: nobody holds it.
    pub lease: Option<String>,
    /// `None`: `seq` did not move since the last read.
    pub sessions: Option<BTreeMap<String, String>>,
}

/// The lease, as a call on it found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lease {
    /// This node holds it, with this epoch.
    Ours(u64),
    /// Another node holds it (`EPOCH NODE`, or empty: it expired and a newer epoch was
    /// handed out since), for `ttl_ms` more.
    Held { holder: String, ttl_ms: i64 },
}

impl Lease {
    fn parse(a: &str) -> Result<Lease, String> {
        let mut w = a.splitn(3, ' ');
        match (w.next(), w.next(), w.next()) {
            (Some("OURS"), Some(e), None) => e
                .parse()
                .map(Lease::Ours)
                .map_err(|_| format!("unexpected lease answer {a:?}")),
            (Some("HELD"), Some(t), h) => Ok(Lease::Held {
                holder: h.unwrap_or("").to_string(),
                ttl_ms: t.parse().unwrap_or(-1),
            }),
            _ => Err(format!("unexpected lease answer {a:?}")),
        }
    }

    /// A write's answer: the lease and, when ours, the generation held before the batch
    /// (`OURS EPOCH GEN`; an empty GEN: none).
    fn parse_written(a: &str) -> Result<(Lease, Option<String>), String> {
        match a.strip_prefix("OURS ").and_then(|r| r.split_once(' ')) {
            Some((e, gen)) => Ok((
                Lease::parse(&format!("OURS {e}"))?,
                Some(gen.to_string()).filter(|g| !g.is_empty()),
            )),
            None => Lease::parse(a).map(|l| (l, None)),
        }
    }
}

/// KEYS lease, epoch; ARGV node, lease_ms, steal. Free, this node's own remnant, or
/// `steal`: a new epoch is this node's.
const ACQUIRE: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur and ARGV[3] ~= '1' and string.match(cur, '^%d+ (.*)$') ~= ARGV[1] then
  return 'HELD ' .. redis.call('PTTL', KEYS[1]) .. ' ' .. cur
end
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], e .. ' ' .. ARGV[1], 'PX', ARGV[2])
return 'OURS ' .. e
"#;

/// KEYS lease; ARGV `EPOCH NODE`.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// KEYS lease, epoch, sessions, seq, meta; ARGV node, epoch, lease_ms, full, wall_ms,
/// new seq (full), gen, nset, nset (key, value) pairs, then the keys to delete. Answers
/// `OURS EPOCH GEN`, GEN the generation `meta` held before the batch (empty: none). The lease must
/// be `EPOCH NODE` (renewed), or expired with no newer epoch handed out (taken again; a
/// Redis that came back empty has a smaller counter: set to ours), else nothing is written.
const WRITE: &str = r#"
local want = ARGV[2] .. ' ' .. ARGV[1]
local cur = redis.call('GET', KEYS[1])
if cur ~= want then
  if cur then return 'HELD ' .. redis.call('PTTL', KEYS[1]) .. ' ' .. cur end
  local top = tonumber(redis.call('GET', KEYS[2]) or '0')
  if top > tonumber(ARGV[2]) then return 'HELD 0' end
  if top < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
  redis.call('SET', KEYS[1], want, 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
local held = redis.call('HGET', KEYS[5], 'gen')
local full = ARGV[4] == '1'
if full then redis.call('DEL', KEYS[3]) end
local nset = tonumber(ARGV[8])
local i = 9
for _ = 1, nset do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local ndel = #ARGV - i + 1
while i <= #ARGV do
  redis.call('HDEL', KEYS[3], ARGV[i])
  i = i + 1
end
if full then
  redis.call('SET', KEYS[4], ARGV[6])
elseif nset + ndel > 0 then
  redis.call('INCR', KEYS[4])
end
redis.call('HSET', KEYS[5], 'node', ARGV[1], 'heartbeat_ms', ARGV[5], 'epoch', ARGV[2], 'gen', ARGV[7])
return 'OURS ' .. ARGV[2] .. ' ' .. (held or '')
"#;

pub struct Store {
    addr: SocketAddr,
    client: Option<Client>,
    con: Option<Connection>,
    next_try: Instant,
    sessions: String,
    seq: String,
    meta: String,
    lease: String,
    epoch: String,
    /// The last error, for the status.
    pub last_error: Option<String>,
}

impl Store {
    pub fn new(addr: SocketAddr, prefix: &str) -> Store {
        Store {
            addr,
            client: Client::open(format!("redis://{addr}/")).ok(),
            con: None,
            next_try: Instant::now(),
            sessions: format!("{prefix}:sessions"),
            seq: format!("{prefix}:seq"),
            meta: format!("{prefix}:meta"),
            lease: format!("{prefix}:lease"),
            epoch: format!("{prefix}:epoch"),
            last_error: None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection, made anew when there is none (at most every [`RETRY_AFTER`]).
    fn con(&mut self) -> Result<&mut Connection, String> {
        if self.con.is_none() {
            if Instant::now() < self.next_try {
                return Err(self
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "not connected".into()));
            }
            self.next_try = Instant::now() + RETRY_AFTER;
            let client = self.client.as_ref().ok_or("bad Redis address")?;
            let con = client
                .get_connection_with_timeout(CONNECT_TIMEOUT)
                .map_err(|e| e.to_string())?;
            con.set_read_timeout(Some(IO_TIMEOUT))
                .map_err(|e| e.to_string())?;
            con.set_write_timeout(Some(IO_TIMEOUT))
                .map_err(|e| e.to_string())?;
            self.con = Some(con);
        }
        self.con.as_mut().ok_or_else(|| "not connected".into())
    }

    fn outcome<T>(&mut self, r: Result<T, String>) -> Result<T, String> {
        match &r {
            Ok(_) => self.last_error = None,
            Err(e) => {
                // A timeout or a reset leaves the connection in an unknown state: make anew.
                self.con = None;
                self.last_error = Some(e.clone());
            }
        }
        r
    }

    /// Takes the lease: free (or a remnant of this node's), or `steal` (a takeover: the
    /// old holder's next batch is refused and it stops forwarding). A new epoch each time.
    pub fn acquire(&mut self, node: &str, lease_ms: u64, steal: bool) -> Result<Lease, String> {
        let mut c = redis::cmd("EVAL");
        c.arg(ACQUIRE)
            .arg(2)
            .arg(&self.lease)
            .arg(&self.epoch)
            .arg(node)
            .arg(lease_ms)
            .arg(u8::from(steal));
        let r = self
            .con()
            .and_then(|con| c.query::<String>(con).map_err(|e| e.to_string()))
            .and_then(|a| Lease::parse(&a));
        self.outcome(r)
    }

    /// Gives the lease up if this node still holds it (a demotion: the peer need not wait
    /// for it to expire).
    pub fn release(&mut self, node: &str, epoch: u64) -> Result<(), String> {
        let mut c = redis::cmd("EVAL");
        c.arg(RELEASE)
            .arg(1)
            .arg(&self.lease)
            .arg(format!("{epoch} {node}"));
        let r = self
            .con()
            .and_then(|con| c.query::<i64>(con).map(|_| ()).map_err(|e| e.to_string()));
        self.outcome(r)
    }

    /// Writes a batch atomically, fenced by the lease `epoch` (renewed for `lease_ms`):
    /// `full` replaces every session (a new writer, or after the store was away), else `set`
    /// and `del` change the ones that moved. Always refreshes the heartbeat. A lease another
    /// node holds (or a newer epoch) refuses the whole batch: [`Lease::Held`]. Sets the
    /// generation `gen`; with [`Lease::Ours`], the generation the store held before the
    /// batch (read in the same script): the caller compares it with its own.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        node: &str,
        (epoch, lease_ms): (u64, u64),
        gen: &str,
        full: bool,
        set: &[(&str, &str)],
        del: &[&str],
        wall_ms: u64,
    ) -> Result<(Lease, Option<String>), String> {
        let mut c = redis::cmd("EVAL");
        c.arg(WRITE)
            .arg(5)
            .arg(&self.lease)
            .arg(&self.epoch)
            .arg(&self.sessions)
            .arg(&self.seq)
            .arg(&self.meta)
            .arg(node)
            .arg(epoch)
            .arg(lease_ms)
            .arg(u8::from(full))
            .arg(wall_ms)
            // A new epoch of `seq`, never one a standby could have seen before (a Redis that
            // came back empty would otherwise count from 1 again).
            .arg(wall_ms << 16)
            .arg(gen)
            .arg(set.len());
        for (k, v) in set {
            c.arg(*k).arg(*v);
        }
        for k in del {
            c.arg(*k);
        }
        let r = self
            .con()
            .and_then(|con| c.query::<String>(con).map_err(|e| e.to_string()))
            .and_then(|a| Lease::parse_written(&a));
        self.outcome(r)
    }

    /// Reads the heartbeat and `seq`, and the sessions when `seq` is not `last_seq`.
    pub fn read(&mut self, last_seq: Option<u64>) -> Result<Read, String> {
        let (sessions_key, seq_key, meta_key, lease_key) = (
            self.sessions.clone(),
            self.seq.clone(),
            self.meta.clone(),
            self.lease.clone(),
        );
        let addr = self.addr;
        let r = self.con().and_then(|con| {
            // A server without ROLE (a proxy in front of Redis) answers an error: read as
            // before. Its own round trip, so that error spoils nothing else; a connection
            // that failed or timed out is made anew (a late answer must not be read as the
            // next command's).
            match redis::cmd("ROLE").query::<redis::Value>(con) {
                Ok(role) => {
                    if let Some(why) = replica_not_current(&role) {
                        return Err(format!("the Redis at {addr} {why}"));
                    }
                }
                Err(e) if e.is_io_error() || e.is_timeout() || e.is_unrecoverable_error() => {
                    return Err(e.to_string());
                }
                Err(_) => {}
            }
            #[allow(clippy::type_complexity)]
            let (seq, node, hb, lease): (
                Option<u64>,
                Option<String>,
                Option<u64>,
                Option<String>,
            ) = redis::pipe()
                .cmd("GET")
                .arg(&seq_key)
                .cmd("HGET")
                .arg(&meta_key)
                .arg("node")
                .cmd("HGET")
                .arg(&meta_key)
                .arg("heartbeat_ms")
                .cmd("GET")
                .arg(&lease_key)
                .query(con)
                .map_err(|e| e.to_string())?;
            // No `seq`: nobody wrote, or the store was flushed. The copies held here stay
            // until a writer writes again (its whole rewrite follows a flush within a
            // heartbeat): removing them would free ports a takeover now needs.
            let unwritten = seq.is_none();
            let seq = seq.unwrap_or(0);
            let sessions = if unwritten || Some(seq) == last_seq {
                None
            } else {
                Some(
                    redis::cmd("HGETALL")
                        .arg(&sessions_key)
                        .query::<BTreeMap<String, String>>(con)
                        .map_err(|e| e.to_string())?,
                )
            };
            Ok(Read {
                seq,
                node,
                heartbeat_ms: hb,
                lease,
                sessions,
            })
        });
        self.outcome(r)
    }
}

/// Why the Redis whose `ROLE` answer is `role` holds a copy that no longer moves: a replica
/// whose link to its master is not `connected`. `None` for a master, a linked replica, or an
/// answer this code does not know (a Redis without `ROLE`: read as before).
fn replica_not_current(role: &redis::Value) -> Option<String> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    };
    let Value::Array(items) = role else {
        return None;
    };
    if items.first().and_then(text).as_deref() != Some("slave") {
        return None;
    }
    let state = items.get(3).and_then(text).unwrap_or_default();
    if state == "connected" {
        return None;
    }
    let master = format!(
        "{}:{}",
        items.get(1).and_then(text).unwrap_or_default(),
        items.get(2).and_then(text).unwrap_or_default()
    );
    Some(format!(
        "is a replica of {master} and its link to it is `{state}`: its copy is not current (is the active node's Redis down?)"
    ))
}

#[cfg(test)]
mod tests {
    use super::{replica_not_current, Lease};
    use redis::Value;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_replica_cut_from_its_master_is_not_current() {
        let replica = |state: &str| {
            Value::Array(vec![
                bulk("slave"),
                bulk("10.9.0.11"),
                Value::Int(6379),
                bulk(state),
                Value::Int(-1),
            ])
        };
        assert_eq!(replica_not_current(&replica("connected")), None);
        for state in ["connect", "connecting", "sync"] {
            let why = replica_not_current(&replica(state)).expect(state);
            assert!(
                why.contains("10.9.0.11:6379") && why.contains(state),
                "{why}"
            );
        }
        let master = Value::Array(vec![bulk("master"), Value::Int(100), Value::Array(vec![])]);
        assert_eq!(replica_not_current(&master), None);
        assert_eq!(replica_not_current(&Value::Nil), None);
    }

    #[test]
    fn a_write_s_answer_gives_the_lease_and_the_generation_held_before() {
        let ours = |e, g: Option<&str>| Ok((Lease::Ours(e), g.map(str::to_string)));
        assert_eq!(
            Lease::parse_written("OURS 7 n1:1700"),
            ours(7, Some("n1:1700"))
        );
        // A node name with a space stays whole; an empty generation: the store had none.
        assert_eq!(Lease::parse_written("OURS 7 a b:1"), ours(7, Some("a b:1")));
        assert_eq!(Lease::parse_written("OURS 7 "), ours(7, None));
        assert_eq!(
            Lease::parse_written("HELD 300 8 n2"),
            Ok((
                Lease::Held {
                    holder: "8 n2".into(),
                    ttl_ms: 300
                },
                None
            ))
        );
        assert!(Lease::parse_written("OURS x g").is_err());
        assert!(Lease::parse_written("OK").is_err());
    }
}

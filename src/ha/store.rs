//! The state store: one Redis server both nodes of a pair reach, spoken to by the HA thread
//! only (never a worker). Keys, under `ha.key_prefix`:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `PREFIX:sessions` | hash | state-store key (`a:20000`) → [`super::record::SessionRecord`] as JSON; `sip/ROUTE/b/TOKEN` (a binding) and `sip/ROUTE/c/HEX` (a confirmed call) → a SIP proxy's record ([`crate::routes::board`]) |
//! | `PREFIX:seq` | string | bumped with every change of `sessions`, set to a new epoch (`wall ms << 16`) by a whole rewrite (the standby re-reads when it moved) |
//! | `PREFIX:meta` | hash | `node` (the writer), `heartbeat_ms` (its wall clock at its last write), `gen` (the writer's generation: set by its last whole rewrite) |
//!
//! Every batch of the active reads `gen` back inside its `MULTI`: a value other than the one
//! its last whole rewrite set means the store lost what it wrote (`FLUSHALL`/`FLUSHDB`, a
//! Redis restarted empty behind a proxy or a moved address, a replica promoted before it had
//! everything, another writer) and the active rewrites the whole at once. A standby reading
//! a Redis *replica* (`ha.redis` on its own node, `replicaof` the active's) checks `ROLE`
//! each read: a replica whose link to its master is down holds a copy that no longer
//! moves, so the read fails (the standby turns stale) until the link is up again.
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
    /// `None`: `seq` did not move since the last read.
    pub sessions: Option<BTreeMap<String, String>>,
}

pub struct Store {
    addr: SocketAddr,
    client: Option<Client>,
    con: Option<Connection>,
    next_try: Instant,
    sessions: String,
    seq: String,
    meta: String,
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

    /// Writes a batch atomically: `full` replaces every session (a new writer, or after the
    /// store was away), else `set` and `del` change the ones that moved. Always refreshes
    /// the heartbeat and sets the generation `gen`. Returns the generation the store held
    /// before the batch (read in the same transaction): the caller compares it with its own.
    pub fn write(
        &mut self,
        node: &str,
        gen: &str,
        full: bool,
        set: &[(&str, &str)],
        del: &[&str],
        wall_ms: u64,
    ) -> Result<Option<String>, String> {
        let mut p = redis::pipe();
        p.atomic();
        p.cmd("HGET").arg(&self.meta).arg("gen");
        if full {
            p.cmd("DEL").arg(&self.sessions).ignore();
        }
        if !set.is_empty() {
            let mut c = redis::cmd("HSET");
            c.arg(&self.sessions);
            for (k, v) in set {
                c.arg(*k).arg(*v);
            }
            p.add_command(c).ignore();
        }
        if !del.is_empty() {
            p.cmd("HDEL").arg(&self.sessions).arg(del).ignore();
        }
        if full {
            // A new epoch, never one a standby could have seen before (a Redis that came
            // back empty would otherwise count from 1 again).
            p.cmd("SET").arg(&self.seq).arg(wall_ms << 16).ignore();
        } else if !set.is_empty() || !del.is_empty() {
            p.cmd("INCR").arg(&self.seq).ignore();
        }
        p.cmd("HSET")
            .arg(&self.meta)
            .arg("node")
            .arg(node)
            .arg("heartbeat_ms")
            .arg(wall_ms)
            .arg("gen")
            .arg(gen)
            .ignore();
        let r = self.con().and_then(|con| {
            p.query::<(Option<String>,)>(con)
                .map(|(held,)| held)
                .map_err(|e| e.to_string())
        });
        self.outcome(r)
    }

    /// Reads the heartbeat and `seq`, and the sessions when `seq` is not `last_seq`.
    pub fn read(&mut self, last_seq: Option<u64>) -> Result<Read, String> {
        let (sessions_key, seq_key, meta_key) =
            (self.sessions.clone(), self.seq.clone(), self.meta.clone());
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
            let (seq, node, hb): (Option<u64>, Option<String>, Option<u64>) = redis::pipe()
                .cmd("GET")
                .arg(&seq_key)
                .cmd("HGET")
                .arg(&meta_key)
                .arg("node")
                .cmd("HGET")
                .arg(&meta_key)
                .arg("heartbeat_ms")
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
    use super::replica_not_current;
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
}

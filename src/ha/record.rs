//! What one session looks like in the state store, and the two directions: the active's
//! tables into records ([`snapshot`]), records into the standby's tables ([`Replicas::apply`]).
//! No I/O: the tables in, the tables changed.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddrV4;

use serde::{Deserialize, Serialize};

use crate::config::{DomainId, SourcePolicy};
use crate::routes::{RouteError, RouteSpec, Routes, SessionId, SessionKind};

/// One session as the state store holds it: its ports and its stream routes with their
/// latched sources. The key is its lowest port (`a:20000`): ports belong to one session at a
/// time on both nodes, so the key is the same on the active and on the standby.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    /// `admin` (a static route added at run time) or the kind it is a copy of (`sip`, `rtsp`).
    pub kind: String,
    pub label: String,
    /// `a:PORT` / `b:PORT`, sorted.
    pub ports: Vec<String>,
    pub routes: Vec<RouteRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRecord {
    pub ingress: String,
    pub port: u16,
    pub dest: SocketAddrV4,
    pub egress_port: u16,
    pub policy: String,
    pub expected: Option<SocketAddrV4>,
    pub rtp_only: bool,
    pub label: String,
    pub latched: Option<SocketAddrV4>,
    /// The route's media validation ([`crate::media::Rule`]); `None`: not validated.
    pub media: Option<super::media_rule::RuleRecord>,
}

impl SessionRecord {
    /// The same session but for the latched sources (which change on the packet path
    /// without the routes being made anew).
    fn same_shape(&self, other: &SessionRecord) -> bool {
        let strip = |r: &SessionRecord| {
            let mut r = r.clone();
            r.routes.iter_mut().for_each(|x| x.latched = None);
            r
        };
        strip(self) == strip(other)
    }
}

/// Whether sessions of `kind` go to the state store: the config's static routes are on both
/// nodes already, the demo's own streams nowhere.
fn replicated(kind: SessionKind) -> bool {
    matches!(
        kind,
        SessionKind::Admin | SessionKind::Sip | SessionKind::Rtsp | SessionKind::Replica
    )
}

fn domain(s: &str) -> Option<DomainId> {
    match s {
        "a" => Some(DomainId::A),
        "b" => Some(DomainId::B),
        _ => None,
    }
}

fn policy(s: &str) -> Option<SourcePolicy> {
    match s {
        "strict" => Some(SourcePolicy::Strict),
        "latch" => Some(SourcePolicy::Latch),
        "any" => Some(SourcePolicy::Any),
        _ => None,
    }
}

/// The sessions of `routes` that go to the state store, by key, with their local ids.
pub fn snapshot(routes: &Routes) -> BTreeMap<String, (SessionId, SessionRecord)> {
    let mut out = BTreeMap::new();
    for s in routes.sessions() {
        if !replicated(s.kind) || s.ports.is_empty() {
            continue;
        }
        let mut ports = s.ports.clone();
        ports.sort();
        let key = format!("{}:{}", ports[0].0, ports[0].1);
        let kind = match s.kind {
            // A copy keeps the kind of what it copies, so a third node sees the same.
            SessionKind::Replica => s.label.split(':').next().unwrap_or("sip").to_string(),
            k => k.name().to_string(),
        };
        let routes_of: Vec<RouteRecord> = s
            .routes
            .iter()
            .filter_map(|(c, p)| routes.lookup(*c, *p))
            .map(|r| RouteRecord {
                ingress: r.channel.ingress().name().to_string(),
                port: r.port,
                dest: r.dest,
                egress_port: r.egress_port,
                policy: r.policy.to_string(),
                expected: r.expected,
                rtp_only: r.rtp_only,
                label: r.label.to_string(),
                latched: r.latched(),
                media: r.media.as_ref().map(super::media_rule::RuleRecord::of),
            })
            .collect();
        let rec = SessionRecord {
            kind,
            label: s.label.clone(),
            ports: ports.iter().map(|(d, p)| format!("{d}:{p}")).collect(),
            routes: routes_of,
        };
        out.insert(key, (s.id, rec));
    }
    out
}

/// What one [`Replicas::apply`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub installed: usize,
    pub removed: usize,
    pub relatched: usize,
    /// Sessions that could not be installed here, with the reason.
    pub failed: Vec<(String, String)>,
}

/// The sessions a standby holds as copies of the active's, by state-store key.
#[derive(Debug, Default)]
pub struct Replicas {
    local: HashMap<String, (SessionId, SessionRecord)>,
}

impl Replicas {
    /// Takes this node's own replicated sessions as the copies (a node that was active and
    /// is a standby now: what the new active writes replaces them).
    pub fn adopt(routes: &Routes) -> Replicas {
        Replicas {
            local: snapshot(routes).into_iter().collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.local.len()
    }

    pub fn is_empty(&self) -> bool {
        self.local.is_empty()
    }

    /// Makes the tables hold `desired` (the state store's sessions): copies gone from it end,
    /// new or changed ones are installed (ports reserved and opened, routes added, latched
    /// sources set), a latched source that moved is updated in place.
    pub fn apply(&mut self, routes: &Routes, desired: &BTreeMap<String, SessionRecord>) -> Applied {
        let mut done = Applied::default();
        let gone: Vec<String> = self
            .local
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some((id, _)) = self.local.remove(&k) {
                let _ = routes.close_session(id);
                done.removed += 1;
            }
        }
        for (key, rec) in desired {
            match self.local.get_mut(key) {
                Some((id, old)) if old.same_shape(rec) && routes.session(*id).is_some() => {
                    if old != rec {
                        for r in &rec.routes {
                            let c = domain(&r.ingress).map(crate::routes::Channel::from_ingress);
                            if let Some(route) = c.and_then(|c| routes.lookup(c, r.port)) {
                                route.set_latched(r.latched);
                            }
                        }
                        *old = rec.clone();
                        done.relatched += 1;
                    }
                    continue;
                }
                Some((id, _)) => {
                    let _ = routes.close_session(*id);
                    self.local.remove(key);
                    done.removed += 1;
                }
                None => {}
            }
            match install(routes, rec) {
                Ok(id) => {
                    self.local.insert(key.clone(), (id, rec.clone()));
                    done.installed += 1;
                }
                Err(e) => done.failed.push((key.clone(), e)),
            }
        }
        done
    }
}

/// Installs one record as a session here: `admin` stays an admin session (an operator can
/// remove it as before), a copied SIP or RTSP session becomes a `replica` (no dialog here).
fn install(routes: &Routes, rec: &SessionRecord) -> Result<SessionId, String> {
    let (kind, label) = match rec.kind.as_str() {
        "admin" => (SessionKind::Admin, rec.label.clone()),
        _ => (SessionKind::Replica, rec.label.clone()),
    };
    let id = routes.open_session(kind, label);
    let res = (|| -> Result<(), String> {
        for p in &rec.ports {
            let (d, port) = p
                .split_once(':')
                .and_then(|(d, n)| Some((domain(d)?, n.parse::<u16>().ok()?)))
                .ok_or_else(|| format!("bad port {p:?} in the state store"))?;
            routes
                .reserve_port(id, d, port)
                .map_err(|e: RouteError| e.to_string())?;
        }
        for r in &rec.routes {
            let spec = RouteSpec {
                ingress: domain(&r.ingress).ok_or("bad ingress domain in the state store")?,
                port: r.port,
                dest: r.dest,
                egress_port: r.egress_port,
                policy: policy(&r.policy).ok_or("bad source policy in the state store")?,
                expected: r.expected,
                rtp_only: r.rtp_only,
                label: r.label.clone(),
                media: r.media.as_ref().map(|m| m.rule()).transpose()?,
            };
            let route = routes.add_route(id, spec).map_err(|e| e.to_string())?;
            route.set_latched(r.latched);
        }
        Ok(())
    })();
    match res {
        Ok(()) => Ok(id),
        Err(e) => {
            let _ = routes.close_session(id);
            Err(e)
        }
    }
}

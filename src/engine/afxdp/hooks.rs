//! The route observer ([`PortHooks`] of the engine): keeps the XDP program's port map and
//! the fast path in step with the route tables.

use super::*;

// ---- route observer -----------------------------------------------------------------------

/// The engine's [`PortHooks`]: the port registry (no socket per port unless a `sockets`
/// variant or a split half needs them) plus the `vgate_ports`
/// map and, in mode xdp, the fast path's entries, updated as routes come and go.
pub(super) struct XdpHooks {
    pub(super) registry: Arc<PortRegistry>,
    pub(super) ports: Mutex<PortMap>,
    pub(super) fast: Option<Arc<FastPath>>,
}

pub(super) struct PortMap {
    pub(super) map: Arc<Map>,
    /// What the map holds, so an update is one write.
    pub(super) flags: Vec<u32>,
}

pub(super) static MAP_ERRORS: RateLimit = RateLimit::new(5000);

impl XdpHooks {
    /// Lets the XDP program pass (`on`) or drop the port's media for `channel`; on an error
    /// the map and `flags` are as they were.
    pub(super) fn set(&self, channel: Channel, port: u16, on: bool) -> io::Result<()> {
        let mut p = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        let b = bit(channel.ingress());
        let old = p.flags[usize::from(port)];
        let new = if on { old | b } else { old & !b };
        if new == old {
            return Ok(());
        }
        p.map
            .update(&u32::from(port).to_ne_bytes(), &new.to_ne_bytes())
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("could not update the XDP port map (vgate_ports) for port {port}: {e}"),
                )
            })?;
        p.flags[usize::from(port)] = new;
        Ok(())
    }
}

impl PortHooks for XdpHooks {
    fn open_port(&self, domain: DomainId, port: u16) -> io::Result<()> {
        self.registry.open_port(domain, port)
    }
    fn close_port(&self, domain: DomainId, port: u16) {
        self.registry.close_port(domain, port)
    }
    /// A failed port-map update refuses the route: installed, the XDP program would drop
    /// its media as `no_route`.
    fn route_added(&self, route: &Arc<StreamRoute>) -> io::Result<()> {
        self.set(route.channel, route.port, true)?;
        if let Some(f) = &self.fast {
            // A route whose receiver is a stream leg stays on the slow path: only user
            // space can hand its packets to the leg's sink.
            if route.edge.is_none() {
                f.added(route, now_ms());
            }
        }
        Ok(())
    }
    /// A failed update leaves the port passed to the workers, which count its media
    /// `no_route` (they find no route): logged, rate-limited.
    fn route_removed(&self, route: &StreamRoute) {
        if let Some(f) = &self.fast {
            f.removed(route);
        }
        if let Err(e) = self.set(route.channel, route.port, false) {
            if let Some(suppressed) = MAP_ERRORS.check(now_ms()) {
                tracing::error!(port = route.port, suppressed, "{e}");
            }
        }
    }
}

//! Port allocation from one domain's media range.
//!
//! RTP takes an even port and RTCP the odd one above it (RFC 3550 §11), so dynamic sessions
//! get pairs. Allocation walks from a cursor that keeps moving forward, so a port just freed
//! is the last to be handed out again: late packets of an ended session then hit a closed
//! port instead of a new session.

use crate::config::PortRange;

/// Why a port could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("no free port pair left in {range} ({used} of {total} ports in use); end some sessions or widen media_ports")]
    Exhausted {
        range: PortRange,
        used: usize,
        total: usize,
    },
    #[error("port {port} is outside the media range {range}")]
    OutOfRange { port: u16, range: PortRange },
    #[error("port {port} is already in use")]
    InUse { port: u16 },
}

/// A bitmap of the ports of one range.
#[derive(Debug, Clone)]
pub struct PortAllocator {
    range: PortRange,
    used: Vec<u64>,
    in_use: usize,
    cursor: u16,
}

impl PortAllocator {
    pub fn new(range: PortRange) -> Self {
        let words = range.len().div_ceil(64);
        PortAllocator {
            range,
            used: vec![0; words],
            in_use: 0,
            cursor: range.first,
        }
    }

    pub fn range(&self) -> PortRange {
        self.range
    }

    pub fn used(&self) -> usize {
        self.in_use
    }

    pub fn free(&self) -> usize {
        self.range.len() - self.in_use
    }

    fn bit(&self, port: u16) -> (usize, u64) {
        let i = usize::from(port - self.range.first);
        (i / 64, 1u64 << (i % 64))
    }

    pub fn is_used(&self, port: u16) -> bool {
        if !self.range.contains(port) {
            return false;
        }
        let (w, b) = self.bit(port);
        self.used[w] & b != 0
    }

    fn set(&mut self, port: u16, on: bool) {
        let (w, b) = self.bit(port);
        if on {
            self.used[w] |= b;
            self.in_use += 1;
        } else {
            self.used[w] &= !b;
            self.in_use -= 1;
        }
    }

    /// Takes one specific port (static routes, egress ports chosen by the operator).
    pub fn reserve(&mut self, port: u16) -> Result<(), AllocError> {
        if !self.range.contains(port) {
            return Err(AllocError::OutOfRange {
                port,
                range: self.range,
            });
        }
        if self.is_used(port) {
            return Err(AllocError::InUse { port });
        }
        self.set(port, true);
        Ok(())
    }

    /// Takes an even port and the odd one above it; returns the even one.
    pub fn alloc_pair(&mut self) -> Result<u16, AllocError> {
        self.alloc_pair_where(|_| true)
    }

    /// Like [`alloc_pair`](Self::alloc_pair), skipping pairs whose even port `usable`
    /// refuses (e.g. ports another program holds).
    pub fn alloc_pair_where(
        &mut self,
        mut usable: impl FnMut(u16) -> bool,
    ) -> Result<u16, AllocError> {
        let first = self.range.first + (self.range.first % 2);
        let pairs = usize::from(self.range.last.saturating_sub(first)).div_ceil(2);
        let mut p = self.cursor + (self.cursor % 2);
        for _ in 0..pairs {
            if p < first || p >= self.range.last {
                p = first;
            }
            if !self.is_used(p) && !self.is_used(p + 1) && usable(p) {
                self.set(p, true);
                self.set(p + 1, true);
                self.cursor = p.wrapping_add(2);
                return Ok(p);
            }
            p += 2;
        }
        Err(self.exhausted())
    }

    /// Takes any single free port.
    pub fn alloc_one(&mut self) -> Result<u16, AllocError> {
        let n = self.range.len();
        let mut p = self.cursor;
        for _ in 0..n {
            if !self.range.contains(p) {
                p = self.range.first;
            }
            if !self.is_used(p) {
                self.set(p, true);
                self.cursor = p.wrapping_add(1);
                return Ok(p);
            }
            p = p.wrapping_add(1);
        }
        Err(self.exhausted())
    }

    fn exhausted(&self) -> AllocError {
        AllocError::Exhausted {
            range: self.range,
            used: self.in_use,
            total: self.range.len(),
        }
    }

    /// Gives a port back. Releasing a port that is not taken is a no-op (and reported), so a
    /// double free can never corrupt the count.
    pub fn release(&mut self, port: u16) -> bool {
        if self.is_used(port) {
            self.set(port, false);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u16, last: u16) -> PortRange {
        PortRange { first, last }
    }

    #[test]
    fn pairs_are_even_odd_and_distinct() {
        let mut a = PortAllocator::new(range(20000, 20009));
        let mut got = Vec::new();
        for _ in 0..5 {
            let p = a.alloc_pair().unwrap();
            assert_eq!(p % 2, 0);
            assert!(a.is_used(p) && a.is_used(p + 1));
            got.push(p);
        }
        got.sort();
        assert_eq!(got, vec![20000, 20002, 20004, 20006, 20008]);
        assert_eq!(a.free(), 0);
    }

    #[test]
    fn exhaustion_is_an_error_not_a_panic() {
        let mut a = PortAllocator::new(range(20000, 20003));
        a.alloc_pair().unwrap();
        a.alloc_pair().unwrap();
        let e = a.alloc_pair().unwrap_err();
        assert!(
            matches!(
                e,
                AllocError::Exhausted {
                    used: 4,
                    total: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("widen media_ports"));
        assert!(a.alloc_one().is_err());
    }

    #[test]
    fn released_ports_come_back_last() {
        let mut a = PortAllocator::new(range(20000, 20007));
        let p1 = a.alloc_pair().unwrap();
        assert!(a.release(p1) && a.release(p1 + 1));
        let p2 = a.alloc_pair().unwrap();
        assert_ne!(p1, p2, "a just-freed pair is not reused first");
        a.alloc_pair().unwrap();
        a.alloc_pair().unwrap();
        assert_eq!(
            a.alloc_pair().unwrap(),
            p1,
            "but it is reused once the rest is taken"
        );
        assert!(!a.release(20001 + 8), "out of range release is refused");
    }

    #[test]
    fn double_release_keeps_counts_right() {
        let mut a = PortAllocator::new(range(20000, 20003));
        a.reserve(20001).unwrap();
        assert!(a.release(20001));
        assert!(!a.release(20001));
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn reserve_checks_range_and_use() {
        let mut a = PortAllocator::new(range(20000, 20009));
        assert_eq!(
            a.reserve(19999).unwrap_err(),
            AllocError::OutOfRange {
                port: 19999,
                range: a.range()
            }
        );
        a.reserve(20004).unwrap();
        assert_eq!(
            a.reserve(20004).unwrap_err(),
            AllocError::InUse { port: 20004 }
        );
        // The pair 20004/20005 is now broken, so pairs skip it.
        let mut pairs = Vec::new();
        while let Ok(p) = a.alloc_pair() {
            pairs.push(p);
        }
        assert!(!pairs.contains(&20004));
        assert_eq!(pairs.len(), 4);
        assert_eq!(a.alloc_one().unwrap(), 20005);
    }

    #[test]
    fn unusable_ports_are_skipped() {
        let mut a = PortAllocator::new(range(20000, 20005));
        let p = a.alloc_pair_where(|p| p != 20000).unwrap();
        assert_eq!(p, 20002);
        assert!(!a.is_used(20000));
    }

    #[test]
    fn odd_first_port_range() {
        // Validation refuses odd starts, but the allocator must still be safe with them.
        let mut a = PortAllocator::new(range(20001, 20004));
        assert_eq!(a.alloc_pair().unwrap(), 20002);
        assert!(a.alloc_pair().is_err());
    }
}

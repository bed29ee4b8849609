//! Authenticating link frames ([`LinkAuth`]): every frame on a one-way media link ends with
//! an *auth trailer*, the sending lane's epoch and a MAC over the frame and the epoch.
//!
//! ```text
//!  frame (lane header, stream header, media; or a repair shard) | epoch u64 BE | tag (16)
//! ```
//!
//! - The MAC is GMAC: AES-256-GCM with no plaintext, the frame and the epoch as associated
//!   data, nonce = the epoch's low 56 bits, the lane and the sequence. Chosen over keyed
//!   BLAKE3, Poly1305 (ChaCha20-Poly1305) and HMAC-SHA256 by `cargo bench --bench
//!   link_auth` (figures in `docs/split.md`): with AES-NI and PCLMULQDQ it is 2.5 to 5
//!   times faster. Its nonce never repeats under one key: each direction has its own key,
//!   a lane's epoch is unique in the process and grows across restarts, a sequence wrap
//!   moves the epoch on.
//! - The key is per link and per direction: [`LinkKey::derive`] makes it from the
//!   configured `key` (or `key_file`) of `split.out_link` / `split.in_link` and the
//!   direction (`a>b` or `b>a`), so one key written in both links still gives two keys.
//! - The epoch ([`next_epoch`]) is the sender's wall clock in microseconds when its lane
//!   started, kept strictly increasing in the process; the lane adds one each time its
//!   32-bit sequence wraps. The receiver's [`super::replay`] window accepts only an epoch
//!   at least as new as the newest it has seen on that lane.
//! - Without a key the trailer carries the epoch and a zero tag that nobody checks (a link
//!   configured before keys existed keeps working, with a warning at start and in
//!   `check-config`); the replay window still works, against duplicates and replays, but
//!   anyone on the link can forge frames.
//!
//! Pure logic: no I/O, no allocation, no clock but [`next_epoch`]'s at a lane's start.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use aes_gcm::aead::{AeadInOut, KeyInit};
use aes_gcm::Aes256Gcm;

/// Bytes of the epoch in the trailer.
pub const EPOCH_LEN: usize = 8;
/// Bytes of the MAC in the trailer.
pub const TAG_LEN: usize = 16;
/// Bytes every link frame carries after the frame proper.
pub const TRAILER_LEN: usize = EPOCH_LEN + TAG_LEN;
const _: () = assert!(TRAILER_LEN == crate::wire::link::TRAILER_LEN);

/// A link's key for one direction (32 bytes, derived). `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkKey([u8; 32]);

impl LinkKey {
    /// The key of the link from half `from` to the other, made from the configured bytes.
    pub fn derive(configured: &[u8], from: &str) -> LinkKey {
        let context = match from {
            "a" => "vgate 2026 one-way link frames a>b",
            _ => "vgate 2026 one-way link frames b>a",
        };
        LinkKey(blake3::derive_key(context, configured))
    }

    /// A key of these bytes as they are (tests, benchmarks).
    pub fn raw(bytes: [u8; 32]) -> LinkKey {
        LinkKey(bytes)
    }
}

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<link key>")
    }
}

/// Why a frame's trailer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// Shorter than a trailer.
    Short,
    /// The MAC does not match: forged, or sent with another key.
    BadMac,
}

/// One link direction's sealing and opening of frames.
#[derive(Clone)]
pub struct LinkAuth {
    gcm: Option<Box<Aes256Gcm>>,
}

impl std::fmt::Debug for LinkAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LinkAuth {{ keyed: {} }}", self.keyed())
    }
}

/// The frame's GMAC nonce: the epoch's low 56 bits, the lane (byte 4), the sequence
/// (bytes 8..12): unique per key as long as epochs are (see the module doc).
fn nonce(wire: &[u8], epoch: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..7].copy_from_slice(&epoch.to_be_bytes()[1..]);
    if wire.len() >= 12 {
        n[7] = wire[4];
        n[8..12].copy_from_slice(&wire[8..12]);
    }
    n
}

impl LinkAuth {
    /// `None`: frames carry a zero tag and are not checked (an unauthenticated link).
    pub fn new(key: Option<&LinkKey>) -> LinkAuth {
        LinkAuth {
            gcm: key.map(|k| Box::new(Aes256Gcm::new(&k.0.into()))),
        }
    }

    pub fn keyed(&self) -> bool {
        self.gcm.is_some()
    }

    fn tag(gcm: &Aes256Gcm, covered: &[u8], epoch: u64) -> [u8; TAG_LEN] {
        let n = nonce(covered, epoch);
        // No plaintext: GMAC over `covered` (frame and epoch) as associated data. It only
        // fails for inputs of gigabytes.
        gcm.encrypt_inout_detached(&n.into(), covered, (&mut [][..]).into())
            .map(|t| t.into())
            .unwrap_or([0xff; TAG_LEN])
    }

    /// Writes the trailer: `wire` is a frame followed by [`TRAILER_LEN`] bytes of room.
    pub fn seal(&self, wire: &mut [u8], epoch: u64) {
        let Some(at) = wire.len().checked_sub(TRAILER_LEN) else {
            debug_assert!(false, "a sealed frame has room for its trailer");
            return;
        };
        wire[at..at + EPOCH_LEN].copy_from_slice(&epoch.to_be_bytes());
        let tag_at = at + EPOCH_LEN;
        match &self.gcm {
            Some(g) => {
                let t = Self::tag(g, &wire[..tag_at], epoch);
                wire[tag_at..].copy_from_slice(&t);
            }
            None => wire[tag_at..].fill(0),
        }
    }

    /// Checks a received frame's trailer: the frame without it and the epoch it carries.
    pub fn open<'a>(&self, wire: &'a [u8]) -> Result<(&'a [u8], u64), AuthError> {
        let at = wire
            .len()
            .checked_sub(TRAILER_LEN)
            .ok_or(AuthError::Short)?;
        let tag_at = at + EPOCH_LEN;
        let mut e = [0u8; EPOCH_LEN];
        e.copy_from_slice(&wire[at..tag_at]);
        let epoch = u64::from_be_bytes(e);
        if let Some(g) = &self.gcm {
            let t = Self::tag(g, &wire[..tag_at], epoch);
            // Every byte compared, whatever the first difference (no early exit to time).
            let diff = t
                .iter()
                .zip(&wire[tag_at..])
                .fold(0u8, |d, (a, b)| d | (a ^ b));
            if std::hint::black_box(diff) != 0 {
                return Err(AuthError::BadMac);
            }
        }
        Ok((&wire[..at], epoch))
    }
}

static LAST_EPOCH: AtomicU64 = AtomicU64::new(0);

/// A new lane's epoch: the wall clock in microseconds, strictly greater than any epoch this
/// process made before (two lanes, or an engine restarted within the process, never share
/// one; a sender restarted later starts above the one before as long as its clock did not
/// step back by more than the time between the starts).
pub fn next_epoch(wall_us: u64) -> u64 {
    let mut last = LAST_EPOCH.load(Relaxed);
    loop {
        // Room for 2^20 sequence wraps of the lanes started before.
        let e = wall_us.max(last.saturating_add(1 << 20));
        match LAST_EPOCH.compare_exchange_weak(last, e, Relaxed, Relaxed) {
            Ok(_) => return e,
            Err(l) => last = l,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: usize) -> Vec<u8> {
        (0..n + TRAILER_LEN).map(|i| i as u8).collect()
    }

    #[test]
    fn a_sealed_frame_opens_and_gives_its_epoch() {
        let auth = LinkAuth::new(Some(&LinkKey::raw([3; 32])));
        let mut f = frame(100);
        auth.seal(&mut f, 42);
        let (body, epoch) = auth.open(&f).unwrap();
        assert_eq!((body.len(), epoch), (100, 42));
        assert_eq!(body, &frame(100)[..100]);
    }

    #[test]
    fn any_changed_byte_or_another_key_is_refused() {
        let auth = LinkAuth::new(Some(&LinkKey::raw([3; 32])));
        let mut f = frame(60);
        auth.seal(&mut f, 7);
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x10;
            assert_eq!(auth.open(&g), Err(AuthError::BadMac), "byte {i}");
        }
        let other = LinkAuth::new(Some(&LinkKey::raw([4; 32])));
        assert_eq!(other.open(&f), Err(AuthError::BadMac));
        // An unauthenticated sender's frame (zero tag) is refused by a keyed receiver.
        LinkAuth::new(None).seal(&mut f, 7);
        assert_eq!(auth.open(&f), Err(AuthError::BadMac));
        assert_eq!(auth.open(&f[..TRAILER_LEN - 1]), Err(AuthError::Short));
    }

    #[test]
    fn without_a_key_the_trailer_carries_the_epoch_only() {
        let auth = LinkAuth::new(None);
        let mut f = frame(10);
        auth.seal(&mut f, u64::MAX - 1);
        assert!(f[10 + EPOCH_LEN..].iter().all(|&b| b == 0));
        assert_eq!(auth.open(&f).unwrap().1, u64::MAX - 1);
    }

    #[test]
    fn directions_get_different_keys() {
        let k = [9u8; 40];
        assert_ne!(LinkKey::derive(&k, "a"), LinkKey::derive(&k, "b"));
        assert_eq!(LinkKey::derive(&k, "a"), LinkKey::derive(&k, "a"));
    }

    #[test]
    fn epochs_only_grow() {
        let a = next_epoch(1000);
        let b = next_epoch(1000);
        let c = next_epoch(0);
        assert!(a < b && b < c, "{a} {b} {c}");
        assert!(next_epoch(u64::MAX / 2) >= u64::MAX / 2);
    }
}

//! The safe wrapper: [`Library`] (libpfring.so, loaded once), [`Ring`] (one owned PF_RING
//! handle, closed on drop) and [`Packet`] (a received frame borrowing its ring).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::ffi;

/// `pfring_open` flags (the `PF_RING_*` bits of `pfring.h`).
pub mod flags {
    use crate::ffi;
    /// Open the device in promiscuous mode.
    pub const PROMISC: u32 = ffi::PF_RING_PROMISC;
    /// Program the NIC's RSS hash to be symmetric (ZC drivers only).
    pub const ZC_SYMMETRIC_RSS: u32 = ffi::PF_RING_ZC_SYMMETRIC_RSS;
    /// Fill the extended header of each packet (slower; vgate does not need it).
    pub const LONG_HEADER: u32 = ffi::PF_RING_LONG_HEADER;
    /// Do not parse packets in the kernel (vgate parses them itself).
    pub const DO_NOT_PARSE: u32 = ffi::PF_RING_DO_NOT_PARSE;
    /// Do not timestamp packets (vgate does not use PF_RING's timestamps).
    pub const DO_NOT_TIMESTAMP: u32 = ffi::PF_RING_DO_NOT_TIMESTAMP;
}

/// The library names tried, in order: the development link, then the runtime soname that
/// PF_RING's `make install` creates (`libpfring.so.8`), for machines with only the runtime.
const NAMES: &[&str] = &["libpfring.so", "libpfring.so.8"];

/// libpcap's names (Debian's soname is `libpcap.so.0.8`, most others `libpcap.so.1`).
const PCAP_NAMES: &[&str] = &["libpcap.so.1", "libpcap.so.0.8", "libpcap.so"];

/// Why a PF_RING call failed. Each message says what to do next.
#[derive(Debug)]
pub enum Error {
    /// `libpfring.so` could not be loaded (absent, or missing a function the binding needs).
    NotInstalled { detail: String },
    /// `pfring_open` failed with `EAFNOSUPPORT` (errno 97): no PF_RING socket family in the
    /// kernel, i.e. `pf_ring.ko` is not loaded.
    ModuleNotLoaded { device: String },
    /// `pfring_open` failed for another reason.
    Open { device: String, source: io::Error },
    /// A device name (or filter, or application name) with a NUL byte in it.
    BadName { device: String },
    /// A call on an open ring returned a negative PF_RING code.
    Call {
        call: &'static str,
        device: String,
        code: i32,
        errno: Option<io::Error>,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotInstalled { detail } => write!(
                f,
                "libpfring.so not found: install PF_RING's userland library (ldconfig) or set \
                 LD_LIBRARY_PATH ({detail})"
            ),
            Error::ModuleNotLoaded { device } => write!(
                f,
                "cannot open PF_RING device {device}: pf_ring.ko is not loaded (modprobe \
                 pf_ring) — pfring_open failed with errno 97, EAFNOSUPPORT"
            ),
            Error::Open { device, source } => {
                write!(f, "cannot open PF_RING device {device}: {source}")
            }
            Error::BadName { device } => {
                write!(f, "PF_RING argument {device:?} contains a NUL byte")
            }
            Error::Call {
                call,
                device,
                code,
                errno,
            } => {
                write!(
                    f,
                    "{call} on {device} failed: {} ({code})",
                    code_name(*code)
                )?;
                match errno {
                    Some(e) => write!(f, ": {e}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Open { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The name of a negative PF_RING return code (`PF_RING_ERROR_*` of `linux/pf_ring.h`).
fn code_name(code: i32) -> &'static str {
    match code {
        ffi::PF_RING_ERROR_GENERIC => "generic error",
        ffi::PF_RING_ERROR_INVALID_ARGUMENT => "invalid argument",
        ffi::PF_RING_ERROR_NO_PKT_AVAILABLE => "no packet available",
        ffi::PF_RING_ERROR_NO_TX_SLOT_AVAILABLE => "no TX slot available",
        ffi::PF_RING_ERROR_WRONG_CONFIGURATION => "wrong configuration",
        ffi::PF_RING_ERROR_END_OF_DEMO_MODE => "end of ZC demo mode (no licence for this NIC)",
        ffi::PF_RING_ERROR_NOT_SUPPORTED => "not supported by this device or module",
        ffi::PF_RING_ERROR_INVALID_LIB_VERSION => "library and kernel module versions differ",
        ffi::PF_RING_ERROR_UNKNOWN_ADAPTER => "unknown adapter",
        ffi::PF_RING_ERROR_NOT_ENOUGH_MEMORY => "not enough memory",
        ffi::PF_RING_ERROR_INVALID_STATUS => "invalid status",
        ffi::PF_RING_ERROR_RING_NOT_ENABLED => "ring not enabled",
        ffi::PF_RING_ERROR_BAD_IFNAME => "bad interface name",
        ffi::PF_RING_ERROR_MOD_NOT_LOADED => "pf_ring.ko is not loaded (modprobe pf_ring)",
        ffi::PF_RING_ERROR_UNABLE_TO_MAP => "unable to map the ring",
        ffi::PF_RING_ERROR_UNABLE_TO_GET_INFO => "unable to get device information",
        ffi::PF_RING_ERROR_MMAP_FAILURE => "mmap failed",
        ffi::PF_RING_ERROR_INIT_FAILURE => "initialisation failed",
        _ => "PF_RING error",
    }
}

/// The one place return codes become results: a non-negative code is the call's value; a
/// negative one is a PF_RING error, with errno when the library set it (it is cleared before
/// each call, so a value here belongs to this call).
fn cvt(call: &'static str, device: &str, rc: c_int) -> Result<u32, Error> {
    if rc >= 0 {
        return Ok(rc as u32);
    }
    let e = io::Error::last_os_error();
    Err(Error::Call {
        call,
        device: device.to_owned(),
        code: rc,
        errno: (e.raw_os_error() != Some(0)).then_some(e),
    })
}

fn clear_errno() {
    // SAFETY:
    // - __errno_location returns the calling thread's errno slot, valid for the thread's
    //   lifetime; writing an int to it is what C code does with `errno = 0`.
    unsafe { *libc::__errno_location() = 0 };
}

/// libpfring.so, loaded once and shared by every ring (each ring holds an `Arc`, so the
/// library outlives them).
pub struct Library {
    api: ffi::PfRing,
    name: &'static str,
    /// Kept loaded for libpfring's references into it (see [`Library::load`]).
    _pcap: Option<libloading::os::unix::Library>,
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library").field("name", &self.name).finish()
    }
}

impl Library {
    /// Loads `libpfring.so` (then `libpfring.so.8`) through the dynamic loader's usual search
    /// (`LD_LIBRARY_PATH`, the ldconfig cache) and resolves every function of the binding.
    ///
    /// libpfring.so calls into libpcap (its `pcap:` module and BPF filters) without naming
    /// it as a dependency: PF_RING's own tools link libpcap themselves. So libpcap is loaded
    /// first with `RTLD_GLOBAL`, and libpfring with `RTLD_NOW`, so that a symbol that cannot
    /// be resolved fails here, with its name, instead of killing the process at first use.
    pub fn load() -> Result<Arc<Library>, Error> {
        use libloading::os::unix::{Library as Dl, RTLD_GLOBAL, RTLD_NOW};
        let mut why = Vec::new();
        let pcap = PCAP_NAMES.iter().find_map(|n| {
            // SAFETY:
            // - libpcap is a plain C library whose initialisers have no preconditions; it
            //   stays loaded as long as this `Library` (field `_pcap`).
            unsafe { Dl::open(Some(n), RTLD_NOW | RTLD_GLOBAL) }.ok()
        });
        if pcap.is_none() {
            why.push("libpcap not found (libpfring's pcap: module needs it)".to_owned());
        }
        for name in NAMES {
            // SAFETY:
            // - Loading runs libpfring's initialisers, which only set up its own state.
            // - `from_library` (generated) resolves each symbol with the C signature bindgen
            //   read from pfring.h, the header the library was built from.
            let api = unsafe { Dl::open(Some(name), RTLD_NOW) }
                .and_then(|l| unsafe { ffi::PfRing::from_library(l) });
            match api {
                Ok(api) => {
                    return Ok(Arc::new(Library {
                        api,
                        name,
                        _pcap: pcap,
                    }))
                }
                Err(e) => why.push(format!("{name}: {e}")),
            }
        }
        Err(Error::NotInstalled {
            detail: why.join("; "),
        })
    }

    /// The file name it was loaded as.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// Which packets a ring sees (`packet_direction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    RxAndTx,
    /// Received packets only: a gateway must not see its own transmissions.
    RxOnly,
    TxOnly,
}

/// What a ring is used for (`socket_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketMode {
    SendAndRecv,
    SendOnly,
    /// Receive only: no TX ring is set up.
    RecvOnly,
}

/// Ring counters (`pfring_stat`), cumulative since the ring was enabled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub recv: u64,
    /// Packets the ring had no room for.
    pub drop: u64,
}

/// A received packet: the captured bytes, in the ring's slot until the next receive (hence
/// the borrow), and the header fields copied out of the packed `pfring_pkthdr`.
#[derive(Debug)]
pub struct Packet<'r> {
    /// The captured bytes from the Ethernet header on (`caplen` of them).
    pub data: &'r [u8],
    /// Bytes captured.
    pub caplen: u32,
    /// Length on the wire; more than `caplen` when the capture was cut at the ring's caplen.
    pub len: u32,
    /// Receive time since the Unix epoch; zero where the ring does not timestamp (zero copy,
    /// or `DO_NOT_TIMESTAMP`).
    pub ts: Duration,
    /// The kernel marked the frame's checksums as verified or still to be filled in
    /// (`PKT_FLAGS_CHECKSUM_OK`: `skb_csum_unnecessary`, e.g. a NIC with RX checksum offload,
    /// or a datagram a local sender left `CHECKSUM_PARTIAL` on a veth). Where it is unset (no
    /// offload, zero-copy devices) the UDP checksum must be verified in software; where it is
    /// set, the field may hold only the pseudo-header sum and must not be.
    pub checksum_ok: bool,
}

impl Packet<'_> {
    /// Whether the packet was longer than what was captured.
    pub fn truncated(&self) -> bool {
        self.len > self.caplen
    }
}

/// An open PF_RING handle (`pfring *`), closed on drop.
///
/// `Send` (it may be opened on one thread and read on the worker that owns it) but not
/// `Sync`: PF_RING's zero-copy receive is not reentrant, so one thread uses a ring at a time,
/// and every call takes `&mut self`.
pub struct Ring {
    ptr: NonNull<ffi::pfring>,
    lib: Arc<Library>,
    device: String,
}

// SAFETY:
// - A `pfring` handle is plain heap state plus file descriptors and mappings owned by it;
//   libpfring keeps no thread-local or thread-affine state for it, so it may be used and
//   closed from another thread than the one that opened it.
// - `Ring` is not `Sync` (`NonNull` is not) and every call takes `&mut self`, so two threads
//   never use the handle at once, which is the non-reentrancy PF_RING requires without
//   PF_RING_REENTRANT.
unsafe impl Send for Ring {}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("device", &self.device)
            .finish()
    }
}

impl Ring {
    /// Opens `device` (`eth0`, `eth0@2`, `zc:eth0@2`, `pcap:eth0`, …) with capture length
    /// `caplen` and `pfring_open` `flags` (see [`flags`]).
    #[doc(alias = "pfring_open")]
    pub fn open(lib: &Arc<Library>, device: &str, caplen: u32, flags: u32) -> Result<Ring, Error> {
        let name = CString::new(device).map_err(|_| Error::BadName {
            device: device.to_owned(),
        })?;
        clear_errno();
        // SAFETY:
        // - `name` is a NUL-terminated string that outlives the call; pfring_open copies it.
        // - caplen and flags are plain integers; the result is NULL or a handle we now own.
        let ptr = unsafe { lib.api.pfring_open(name.as_ptr(), caplen, flags) };
        match NonNull::new(ptr) {
            Some(ptr) => Ok(Ring {
                ptr,
                lib: Arc::clone(lib),
                device: device.to_owned(),
            }),
            None => {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EAFNOSUPPORT) {
                    Err(Error::ModuleNotLoaded {
                        device: device.to_owned(),
                    })
                } else {
                    Err(Error::Open {
                        device: device.to_owned(),
                        source: e,
                    })
                }
            }
        }
    }

    /// The device name it was opened with.
    pub fn device(&self) -> &str {
        &self.device
    }

    fn raw(&self) -> *mut ffi::pfring {
        self.ptr.as_ptr()
    }

    /// Starts capture (`pfring_enable_ring`): after direction, socket mode and watermark.
    #[doc(alias = "pfring_enable_ring")]
    pub fn enable(&mut self) -> Result<(), Error> {
        clear_errno();
        // SAFETY:
        // - `raw()` is the live handle this `Ring` owns, used by this thread only (&mut).
        let rc = unsafe { self.lib.api.pfring_enable_ring(self.raw()) };
        cvt("pfring_enable_ring", &self.device, rc).map(drop)
    }

    #[doc(alias = "pfring_set_direction")]
    pub fn set_direction(&mut self, d: Direction) -> Result<(), Error> {
        use ffi::packet_direction as pd;
        let d = match d {
            Direction::RxAndTx => pd::rx_and_tx_direction,
            Direction::RxOnly => pd::rx_only_direction,
            Direction::TxOnly => pd::tx_only_direction,
        };
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `d` is one of the enum's declared values.
        let rc = unsafe { self.lib.api.pfring_set_direction(self.raw(), d) };
        cvt("pfring_set_direction", &self.device, rc).map(drop)
    }

    #[doc(alias = "pfring_set_socket_mode")]
    pub fn set_socket_mode(&mut self, m: SocketMode) -> Result<(), Error> {
        use ffi::socket_mode as sm;
        let m = match m {
            SocketMode::SendAndRecv => sm::send_and_recv_mode,
            SocketMode::SendOnly => sm::send_only_mode,
            SocketMode::RecvOnly => sm::recv_only_mode,
        };
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `m` is one of the enum's declared values.
        let rc = unsafe { self.lib.api.pfring_set_socket_mode(self.raw(), m) };
        cvt("pfring_set_socket_mode", &self.device, rc).map(drop)
    }

    /// Packets that must be waiting before a poll returns (latency against wake-ups).
    #[doc(alias = "pfring_set_poll_watermark")]
    pub fn set_poll_watermark(&mut self, watermark: u16) -> Result<(), Error> {
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; the watermark is a plain integer.
        let rc = unsafe {
            self.lib
                .api
                .pfring_set_poll_watermark(self.raw(), watermark)
        };
        cvt("pfring_set_poll_watermark", &self.device, rc).map(drop)
    }

    /// How long a blocking receive waits in poll(), in milliseconds.
    #[doc(alias = "pfring_set_poll_duration")]
    pub fn set_poll_duration(&mut self, ms: u32) -> Result<(), Error> {
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; the duration is a plain integer.
        let rc = unsafe { self.lib.api.pfring_set_poll_duration(self.raw(), ms) };
        cvt("pfring_set_poll_duration", &self.device, rc).map(drop)
    }

    /// The name shown for this ring in `/proc/net/pf_ring`.
    #[doc(alias = "pfring_set_application_name")]
    pub fn set_application_name(&mut self, name: &str) -> Result<(), Error> {
        let mut name = CString::new(name)
            .map_err(|_| Error::BadName {
                device: name.to_owned(),
            })?
            .into_bytes_with_nul();
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `name` is a NUL-terminated buffer that lives
        //   across the call (the C prototype takes `char *` but the library copies it).
        let rc = unsafe {
            self.lib
                .api
                .pfring_set_application_name(self.raw(), name.as_mut_ptr().cast())
        };
        cvt("pfring_set_application_name", &self.device, rc).map(drop)
    }

    /// Installs a BPF filter given in tcpdump syntax (needs libpfring built with BPF).
    #[doc(alias = "pfring_set_bpf_filter")]
    pub fn set_bpf_filter(&mut self, expr: &str) -> Result<(), Error> {
        let expr = CString::new(expr).map_err(|_| Error::BadName {
            device: expr.to_owned(),
        })?;
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `expr` is NUL-terminated and outlives the call.
        let rc = unsafe {
            self.lib
                .api
                .pfring_set_bpf_filter(self.raw(), expr.as_ptr())
        };
        cvt("pfring_set_bpf_filter", &self.device, rc).map(drop)
    }

    /// RX channels (queues) of the device (1 for devices without several).
    #[doc(alias = "pfring_get_num_rx_channels")]
    pub fn rx_channels(&mut self) -> u8 {
        // SAFETY:
        // - live, exclusively borrowed handle; the call only reads the ring's state.
        unsafe { self.lib.api.pfring_get_num_rx_channels(self.raw()) }
    }

    /// A descriptor to wait on with poll/epoll, when the device has one (`pcap:` and some ZC
    /// devices have none).
    #[doc(alias = "pfring_get_selectable_fd")]
    pub fn selectable_fd(&mut self) -> Option<BorrowedFd<'_>> {
        // SAFETY:
        // - live, exclusively borrowed handle; the call only reads the ring's state.
        let fd = unsafe { self.lib.api.pfring_get_selectable_fd(self.raw()) };
        if fd < 0 {
            return None;
        }
        // SAFETY:
        // - `fd` is a descriptor the ring owns and keeps open until pfring_close, which only
        //   `Drop` calls; the returned borrow cannot outlive `&mut self`, hence the ring.
        Some(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Waits up to `ms` milliseconds for packets (`pfring_poll`); `true` when some are ready.
    #[doc(alias = "pfring_poll")]
    pub fn poll(&mut self, ms: u32) -> Result<bool, Error> {
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; the duration is a plain integer.
        let rc = unsafe { self.lib.api.pfring_poll(self.raw(), ms) };
        cvt("pfring_poll", &self.device, rc).map(|n| n > 0)
    }

    /// Receives one packet, zero copy: `Ok(None)` when none is waiting (or a blocking wait
    /// timed out). The packet borrows the ring until the next call.
    #[doc(alias = "pfring_recv")]
    pub fn recv(&mut self, wait: bool) -> Result<Option<Packet<'_>>, Error> {
        let mut buf: *mut u8 = std::ptr::null_mut();
        let mut hdr = ffi::pfring_pkthdr::default();
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `buf` and `hdr` are writable locals.
        // - buffer_len 0 asks for zero copy: `buf` is set to the packet in the ring's slot,
        //   which stays valid until the next receive on this ring.
        let rc = unsafe {
            self.lib
                .api
                .pfring_recv(self.raw(), &mut buf, 0, &mut hdr, u8::from(wait))
        };
        if cvt("pfring_recv", &self.device, rc)? == 0 {
            return Ok(None);
        }
        // `hdr` is packed: copy each field out by value (never take a reference into it).
        let (caplen, len, ts, flags) = (hdr.caplen, hdr.len, hdr.ts, hdr.extended_hdr.flags);
        if buf.is_null() {
            return Err(Error::Call {
                call: "pfring_recv",
                device: self.device.clone(),
                code: ffi::PF_RING_ERROR_GENERIC,
                errno: Some(io::Error::other("a packet was reported with no buffer")),
            });
        }
        // SAFETY:
        // - On success libpfring points `buf` at `caplen` captured bytes in the ring's slot.
        // - The slot is not reused before the next receive on this ring, which needs
        //   `&mut self` again: the returned packet's borrow of `self` keeps that from
        //   happening while the slice lives. Nothing writes the slot meanwhile from our side.
        let data = unsafe { std::slice::from_raw_parts(buf, caplen as usize) };
        Ok(Some(Packet {
            data,
            caplen,
            len,
            ts: Duration::new(
                u64::try_from(ts.tv_sec).unwrap_or(0),
                u32::try_from(ts.tv_usec.clamp(0, 999_999)).unwrap_or(0) * 1000,
            ),
            checksum_ok: flags & ffi::PKT_FLAGS_CHECKSUM_OK != 0,
        }))
    }

    /// Sends one frame (`pfring_send`); `Ok(false)` when the TX ring has no free slot.
    #[doc(alias = "pfring_send")]
    pub fn send(&mut self, frame: &[u8], flush: bool) -> Result<bool, Error> {
        let len = u32::try_from(frame.len()).map_err(|_| Error::Call {
            call: "pfring_send",
            device: self.device.clone(),
            code: ffi::PF_RING_ERROR_INVALID_ARGUMENT,
            errno: None,
        })?;
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `frame` is `len` readable bytes for the whole
        //   call. The prototype says `char *`, but pfring_send only reads the packet.
        let rc = unsafe {
            self.lib.api.pfring_send(
                self.raw(),
                frame.as_ptr().cast_mut().cast(),
                len,
                u8::from(flush),
            )
        };
        if rc == ffi::PF_RING_ERROR_NO_TX_SLOT_AVAILABLE {
            return Ok(false);
        }
        cvt("pfring_send", &self.device, rc).map(|_| true)
    }

    /// Hands the frames queued by [`Ring::send`] with `flush == false` to the device (one
    /// doorbell for a batch).
    #[doc(alias = "pfring_flush_tx_packets")]
    pub fn flush_tx(&mut self) -> Result<(), Error> {
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; the call only touches the ring's TX state.
        let rc = unsafe { self.lib.api.pfring_flush_tx_packets(self.raw()) };
        cvt("pfring_flush_tx_packets", &self.device, rc).map(drop)
    }

    /// The ring's counters (`pfring_stats`).
    #[doc(alias = "pfring_stats")]
    pub fn stats(&mut self) -> Result<Stats, Error> {
        let mut s = ffi::pfring_stat::default();
        clear_errno();
        // SAFETY:
        // - live, exclusively borrowed handle; `s` is a writable pfring_stat.
        let rc = unsafe { self.lib.api.pfring_stats(self.raw(), &mut s) };
        cvt("pfring_stats", &self.device, rc)?;
        Ok(Stats {
            recv: s.recv,
            drop: s.drop,
        })
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // What the ring holds in this process before it is closed: its socket and the
        // socket's mappings (see `release_leftovers`).
        // SAFETY:
        // - live, exclusively borrowed handle; the call only reads the ring's state.
        let fd = unsafe { self.lib.api.pfring_get_selectable_fd(self.raw()) };
        let held = socket_inode(fd).map(|ino| (fd, ino));
        // SAFETY:
        // - The handle is live and owned by this `Ring` alone; after this call nothing uses
        //   it (no packet can borrow a ring being dropped), and the library (held by `lib`)
        //   is still loaded.
        unsafe { self.lib.api.pfring_close(self.ptr.as_ptr()) };
        if let Some((fd, ino)) = held {
            release_leftovers(fd, ino);
        }
    }
}

/// The inode of socket `fd`, if `fd` is an open socket.
fn socket_inode(fd: c_int) -> Option<u64> {
    if fd < 0 {
        return None;
    }
    // SAFETY:
    // - `st` is a writable, zeroed stat buffer; fstat writes it or fails, touching nothing
    //   else, whatever `fd` is.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstat(fd, &mut st) };
    (rc == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK).then_some(st.st_ino)
}

/// The address ranges `/proc/self/maps` (`maps`) shows mapped from socket inode `ino`.
fn socket_mappings(maps: &str, ino: u64) -> Vec<(usize, usize)> {
    let want = format!("socket:[{ino}]");
    maps.lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(want.as_str()))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (b > a).then_some((a, b - a))
        })
        .collect()
}

/// Closes what `pfring_close` left of a standard ring: libpfring 8.x built without Redis
/// (`HAVE_DL_REDIS`, the default) calls the module's close — `munmap` of the ring and
/// `close` of its socket — only when `PF_RING_RUNTIME_MANAGER` is set, because of an `#ifdef`
/// inside an unbraced `if` (`pfring.c`, `pfring_close`). Found in the guest check: an
/// in-process gateway's rings stayed in `/proc/net/pf_ring` after it stopped, and a ring
/// left open when its network namespace goes makes pf_ring.ko leak its /proc entry and lock
/// up at exit. Only what still is the same socket (same inode at the same descriptor) and
/// still mapped from it is released, so a fixed libpfring (which closed them, and whose
/// descriptor number or addresses may since be reused) is left alone.
fn release_leftovers(fd: c_int, ino: u64) {
    if socket_inode(fd) != Some(ino) {
        return;
    }
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for (addr, len) in socket_mappings(&maps, ino) {
            // SAFETY:
            // - The range is mapped from the ring's own socket (inode `ino`, checked just
            //   now), which the freed `pfring` handle was the only user of: nothing in this
            //   process refers to it any more.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        }
    }
    // SAFETY:
    // - `fd` is still the ring's socket (same inode), owned by the freed handle alone.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn the_packed_header_is_laid_out_as_in_c() {
        // struct timeval (16) + caplen (4) + len (4) + the packed extended header, no padding.
        assert_eq!(offset_of!(ffi::pfring_pkthdr, caplen), 16);
        assert_eq!(offset_of!(ffi::pfring_pkthdr, len), 20);
        assert_eq!(offset_of!(ffi::pfring_pkthdr, extended_hdr), 24);
        assert_eq!(std::mem::align_of::<ffi::pfring_pkthdr>(), 1);
        assert_eq!(size_of::<ffi::pfring_stat>(), 24);
    }

    #[test]
    fn module_not_loaded_says_what_to_do() {
        let e = Error::ModuleNotLoaded {
            device: "veth0@1".into(),
        }
        .to_string();
        assert!(e.contains("veth0@1"), "{e}");
        assert!(
            e.contains("pf_ring.ko is not loaded (modprobe pf_ring)"),
            "{e}"
        );
        let e = Error::NotInstalled { detail: "x".into() }.to_string();
        assert!(
            e.starts_with(
                "libpfring.so not found: install PF_RING's userland library (ldconfig) or set \
                 LD_LIBRARY_PATH"
            ),
            "{e}"
        );
    }

    #[test]
    fn finds_the_mappings_of_one_socket() {
        let maps = "\
7f11e74d4000-7f11e7b1f000 rw-s 00000000 00:08 12334                      socket:[12334]
7f11e7b1f000-7f11e816a000 rw-s 00000000 00:08 12332                      socket:[12332]
7f11e816a000-7f11e87b5000 r--p 00000000 08:01 1233                       /usr/lib/libx.so
7f11e87b5000-7f11e8e00000 rw-s 00000000 00:08 12334                      socket:[12334]
";
        assert_eq!(
            socket_mappings(maps, 12334),
            vec![
                (0x7f11e74d4000, 0x7f11e7b1f000 - 0x7f11e74d4000),
                (0x7f11e87b5000, 0x7f11e8e00000 - 0x7f11e87b5000)
            ]
        );
        assert!(socket_mappings(maps, 1233).is_empty());
        assert!(socket_mappings(maps, 99).is_empty());
        assert_eq!(socket_inode(-1), None);
    }

    #[test]
    fn releases_only_what_is_still_the_same_socket() {
        use std::os::fd::AsRawFd;
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = s.as_raw_fd();
        let ino = socket_inode(fd).expect("a socket has an inode");
        // Another inode at this descriptor: not the ring's, left open.
        release_leftovers(fd, ino + 1);
        assert_eq!(socket_inode(fd), Some(ino));
        // The ring's socket: closed (then forgotten here, so it is not closed twice).
        release_leftovers(fd, ino);
        // (A parallel test may have the number again by now, never this inode.)
        assert_ne!(socket_inode(fd), Some(ino));
        std::mem::forget(s);
    }

    #[test]
    fn cvt_keeps_values_and_names_codes() {
        assert_eq!(cvt("x", "d", 3).unwrap(), 3);
        let e = cvt("pfring_enable_ring", "d", ffi::PF_RING_ERROR_NOT_SUPPORTED)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pfring_enable_ring on d failed: not supported"),
            "{e}"
        );
    }
}

//! Interface facts read through `ioctl`s and `uname`: RX queue count (`ETHTOOL_GCHANNELS`),
//! driver, MAC address, MTU, index, kernel release.

use super::cvt;
use std::ffi::CStr;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct ifreq` as `SIOCETHTOOL`/`SIOCGIFHWADDR` read it: the name and a 24-byte union.
#[repr(C)]
pub(super) struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: [u8; 24],
}

fn ifreq(name: &CStr) -> IfReq {
    let mut r = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: [0; 24],
    };
    for (d, s) in r
        .name
        .iter_mut()
        .zip(name.to_bytes().iter().take(libc::IFNAMSIZ - 1))
    {
        *d = *s as libc::c_char;
    }
    r
}

fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes plain integers.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: just returned by socket(2): open, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Default)]
pub(super) struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// The number of RX queues of `name` (`ETHTOOL_GCHANNELS`: combined + rx-only); `None` when
/// the driver does not report channels.
pub(crate) fn rx_queues(name: &CStr) -> io::Result<Option<u32>> {
    let sock = inet_socket()?;
    let mut ch = EthtoolChannels {
        cmd: 0x3c, // ETHTOOL_GCHANNELS
        ..Default::default()
    };
    let mut req = ifreq(name);
    let p = (&mut ch as *mut EthtoolChannels) as usize;
    req.data[..size_of::<usize>()].copy_from_slice(&p.to_ne_bytes());
    // SAFETY:
    // - `req` is a live ifreq whose union holds a pointer to `ch`, a live, writable
    //   `ethtool_channels` that the kernel fills during the call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            return Ok(None);
        }
        return Err(e);
    }
    let n = ch.combined_count + ch.rx_count;
    Ok(if n == 0 { None } else { Some(n) })
}

/// `struct ethtool_drvinfo`.
#[repr(C)]
pub(super) struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// The driver of interface `name` (`ETHTOOL_GDRVINFO`), e.g. `veth`, `virtio_net`.
pub(crate) fn driver(name: &CStr) -> io::Result<String> {
    let sock = inet_socket()?;
    let mut info = EthtoolDrvinfo {
        cmd: 0x03, // ETHTOOL_GDRVINFO
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    let mut req = ifreq(name);
    let p = (&mut info as *mut EthtoolDrvinfo) as usize;
    req.data[..size_of::<usize>()].copy_from_slice(&p.to_ne_bytes());
    // SAFETY:
    // - `req` is a live ifreq whose union holds a pointer to `info`, a live, writable
    //   `ethtool_drvinfo` that the kernel fills during the call.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut req) })?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// The running kernel's release (`uname -r`), e.g. `6.18.4-arch1`.
pub(crate) fn kernel_release() -> io::Result<String> {
    let mut u = MaybeUninit::<libc::utsname>::zeroed();
    // SAFETY: `u` is a writable utsname the kernel fills during the call.
    cvt(unsafe { libc::uname(u.as_mut_ptr()) })?;
    // SAFETY: zero-initialised, then filled by the kernel (each field NUL-terminated).
    let u = unsafe { u.assume_init() };
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The hardware address of interface `name` (`SIOCGIFHWADDR`).
pub(crate) fn hw_addr(name: &CStr) -> io::Result<[u8; 6]> {
    let sock = inet_socket()?;
    let mut req = ifreq(name);
    // SAFETY: `req` is a live, writable ifreq; the kernel writes a sockaddr into its union.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR as _, &mut req) })?;
    // struct sockaddr: sa_family (2 bytes), then the address.
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&req.data[2..8]);
    Ok(mac)
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
pub(crate) fn mtu(name: &CStr) -> io::Result<u32> {
    let sock = inet_socket()?;
    let mut req = ifreq(name);
    // SAFETY: `req` is a live, writable ifreq; the kernel writes an int into its union.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) })?;
    Ok(i32::from_ne_bytes([req.data[0], req.data[1], req.data[2], req.data[3]]).max(0) as u32)
}

/// `if_nametoindex(3)`.
pub(crate) fn if_nametoindex(name: &CStr) -> io::Result<u32> {
    // SAFETY: `name` is a valid NUL-terminated string read during the call.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if idx == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(idx)
    }
}

//! Unsafe core of the XDP side of the `afxdp` engine: the `bpf(2)` system call (maps,
//! program load with its verifier log, `BPF_LINK_CREATE` for XDP, program info) and the
//! netlink `IFLA_XDP` requests that find and remove a program left on an interface.
//!
//! Owns: every `bpf(2)` attribute layout and raw fd this engine gets from the kernel. Must
//! not touch: what the program does (its instructions are built in `engine::afxdp`), policy,
//! operator messages.
//!
//! Each `bpf_attr` variant is a `repr(C)` struct holding only the fields used, in the
//! kernel's order; the kernel accepts a shorter attribute and treats the rest as zero.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    bind, recv, send, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_int = 17;
const BPF_MAP_LOOKUP_BATCH: libc::c_int = 24;
const BPF_LINK_CREATE: libc::c_int = 28;

pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub(crate) const BPF_MAP_TYPE_DEVMAP: u32 = 14;
pub(crate) const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
/// `enum bpf_attach_type`: `BPF_XDP`.
const BPF_XDP: u32 = 37;

/// `XDP_FLAGS_*` of `<linux/if_link.h>`.
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
pub(crate) const XDP_FLAGS_HW_MODE: u32 = 1 << 3;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;

/// One eBPF instruction (`struct bpf_insn`): opcode, dst:4|src:4 registers, offset, imm.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The `batch` member of `bpf_attr` (the `BPF_MAP_*_BATCH` commands).
#[repr(C)]
#[derive(Default)]
struct MapBatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct GetIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C)]
#[derive(Default)]
struct RawTpAttr {
    name: u64,
    prog_fd: u32,
    /// Explicit, so the 4 tail bytes handed to `bpf(2)` are zero: kernels before 6.10 refuse
    /// (EINVAL) an attr whose bytes past the fields they know are not.
    _pad: u32,
}

/// The head of `struct bpf_map_info`, up to and including `id`.
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
}

/// The head of `struct bpf_prog_info`, up to and including `name`.
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

/// Attribute structs that may be handed to `bpf(2)` by address.
trait BpfAttr {}
impl BpfAttr for MapCreateAttr {}
impl BpfAttr for MapElemAttr {}
impl BpfAttr for MapBatchAttr {}
impl BpfAttr for ProgLoadAttr {}
impl BpfAttr for LinkCreateAttr {}
impl BpfAttr for GetIdAttr {}
impl BpfAttr for InfoAttr {}
impl BpfAttr for RawTpAttr {}

/// `bpf(cmd, attr, sizeof attr)`, `EINTR` retried; the non-negative result.
///
/// # Safety
/// Every pointer stored in `attr` (as a `u64`) must be valid for what `cmd` does with it
/// (reads of `insn_cnt` instructions, writes of `log_size` bytes, …) for the duration of the
/// call.
unsafe fn sys_bpf<A: BpfAttr>(cmd: libc::c_int, attr: &mut A) -> io::Result<libc::c_long> {
    loop {
        // SAFETY:
        // - `attr` is a live, writable `repr(C)` attribute of `size_of::<A>()` bytes in the
        //   kernel's layout (the kernel writes some of them back, e.g. log_true_size);
        // - the pointers inside it are valid per this function's contract.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                (attr as *mut A).cast::<libc::c_void>(),
                size_of::<A>() as libc::c_uint,
            )
        };
        if r >= 0 {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// An fd returned by a successful `bpf(2)` call, owned from here on.
fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY:
    // - `fd` is the result of a successful bpf(2) call that returns a new descriptor
    //   (MAP_CREATE, PROG_LOAD, LINK_CREATE, *_GET_FD_BY_ID), so it is open and ours alone;
    // - it becomes owned (closed on drop) here, once.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(name.bytes().take(15)) {
        *o = b;
    }
    out
}

/// A BPF map; closed (and freed by the kernel once no program uses it) on drop.
#[derive(Debug)]
pub(crate) struct Map {
    fd: OwnedFd,
    key_size: usize,
    /// Bytes a lookup writes: the value size, or for a per-CPU map one 8-byte-aligned value
    /// per possible CPU.
    lookup_len: usize,
}

/// The number of possible CPUs (`/sys/devices/system/cpu/possible`, e.g. `0-3` or `0,2-5`):
/// how many values a per-CPU map holds per key (the kernel counts the CPUs in the mask,
/// `num_possible_cpus()`, not the highest + 1).
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    count_cpus(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "cannot parse possible CPUs"))
}

/// The CPUs in a CPU list (`0-3`, `0,2-5`): the sum of each range's length.
fn count_cpus(text: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in text.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        n = n.checked_add(b.checked_sub(a)? + 1)?;
    }
    Some(n)
}

impl Map {
    /// `BPF_MAP_CREATE` of `map_type` with `key_size`/`value_size` byte keys and values.
    pub(crate) fn create(
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        name: &str,
    ) -> io::Result<Map> {
        let mut attr = MapCreateAttr {
            map_type,
            key_size,
            value_size,
            max_entries,
            map_name: name16(name),
            ..Default::default()
        };
        let lookup_len = if map_type == BPF_MAP_TYPE_PERCPU_ARRAY {
            (value_size as usize).div_ceil(8) * 8 * possible_cpus()?
        } else {
            value_size as usize
        };
        // SAFETY: MAP_CREATE reads only plain integers and the inline name.
        let fd = unsafe { sys_bpf(BPF_MAP_CREATE, &mut attr) }?;
        Ok(Map {
            fd: owned(fd),
            key_size: key_size as usize,
            lookup_len,
        })
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The map's id (`BPF_OBJ_GET_INFO_BY_FD`): how the kernel's tracepoints name it.
    pub(crate) fn id(&self) -> io::Result<u32> {
        let mut info = MapInfo::default();
        let mut attr = InfoAttr {
            bpf_fd: self.fd.as_raw_fd() as u32,
            info_len: size_of::<MapInfo>() as u32,
            info: (&mut info as *mut MapInfo) as u64,
        };
        // SAFETY: `info` is writable for `info_len` bytes during the call; the kernel writes
        // at most that many.
        unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
        Ok(info.id)
    }

    /// `BPF_MAP_UPDATE_ELEM(key, value, BPF_ANY)`; the key size is the map's, the value
    /// [`Map::lookup_len`] bytes (for a per-CPU map one value per possible CPU).
    pub(crate) fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        if key.len() != self.key_size || value.len() != self.lookup_len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` and `value` are live slices of exactly the map's key size and of what
        // the kernel reads as the value for this map type (checked above); UPDATE only reads
        // them during the call.
        unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }?;
        Ok(())
    }

    /// Bytes [`Map::lookup`] writes (see `lookup_len`).
    pub(crate) fn lookup_len(&self) -> usize {
        self.lookup_len
    }

    /// `BPF_MAP_LOOKUP_ELEM(key)` into `out`, which is [`Map::lookup_len`] bytes: the value,
    /// or for a per-CPU map one value per possible CPU, each padded to 8 bytes.
    pub(crate) fn lookup(&self, key: &[u8], out: &mut [u8]) -> io::Result<()> {
        if key.len() != self.key_size || out.len() != self.lookup_len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: out.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` is a live slice of the map's key size and `out` a live, writable
        // slice of exactly what the kernel writes for this map type (both checked above);
        // LOOKUP reads the key and writes the value during the call only.
        unsafe { sys_bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) }?;
        Ok(())
    }

    /// `BPF_MAP_LOOKUP_BATCH`: up to `keys.len() / key size` entries in key order, starting
    /// after `after` (a key the previous call returned last), or at the first key with
    /// `None`. `values` holds [`Map::lookup_len`] bytes per key. Returns how many entries were
    /// read and whether the map has more after them (`false` once the last key was read).
    /// One system call however many entries: for reading many per-CPU counters at once.
    pub(crate) fn lookup_batch(
        &self,
        after: Option<&[u8]>,
        keys: &mut [u8],
        values: &mut [u8],
    ) -> io::Result<(usize, bool)> {
        let count = keys.len() / self.key_size.max(1);
        if after.is_some_and(|k| k.len() != self.key_size)
            || keys.len() != count * self.key_size
            || values.len() != count * self.lookup_len
            || count == 0
            || count > u32::MAX as usize
            || self.key_size > 64
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // Where the kernel writes the last key read (key_size bytes; not used: the caller
        // knows its keys).
        let mut next = [0u8; 64];
        let mut attr = MapBatchAttr {
            in_batch: after.map_or(0, |k| k.as_ptr() as u64),
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: count as u32,
            map_fd: self.fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: `after` (when given) is a live slice of the map's key size, `next` a live
        // buffer of at least that size;
        // `keys` and `values` are live, writable slices of `count` keys and `count` values as
        // the kernel writes them for this map type (all checked above); the call reads
        // `after`, writes `next`, `keys`, `values` and `attr.count` during the call only.
        match unsafe { sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
            Ok(_) => Ok(((attr.count as usize).min(count), true)),
            // The end of the map: `count` says what was read before it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                Ok(((attr.count as usize).min(count), false))
            }
            Err(e) => Err(e),
        }
    }
}

/// Why a program did not load: the errno and the verifier's own words.
#[derive(Debug)]
pub(crate) struct LoadError {
    pub(crate) source: io::Error,
    pub(crate) log: String,
}

/// A loaded BPF program; unloaded when its fd and every attachment are gone.
#[derive(Debug)]
pub(crate) struct Prog {
    fd: OwnedFd,
}

impl Prog {
    /// `BPF_PROG_LOAD` of an XDP program. On failure the verifier log (level 1) is returned.
    pub(crate) fn load_xdp(insns: &[Insn], name: &str) -> Result<Prog, LoadError> {
        Prog::load(insns, name, BPF_PROG_TYPE_XDP, BPF_XDP)
    }

    /// `BPF_PROG_LOAD` of a raw-tracepoint program (its context: the tracepoint's arguments,
    /// one `u64` each). Loading one needs CAP_PERFMON besides CAP_BPF.
    pub(crate) fn load_raw_tracepoint(insns: &[Insn], name: &str) -> Result<Prog, LoadError> {
        Prog::load(insns, name, BPF_PROG_TYPE_RAW_TRACEPOINT, 0)
    }

    fn load(
        insns: &[Insn],
        name: &str,
        prog_type: u32,
        expected_attach_type: u32,
    ) -> Result<Prog, LoadError> {
        let license = c"GPL";
        let mut log = vec![0u8; 1 << 20];
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            prog_name: name16(name),
            expected_attach_type,
            ..Default::default()
        };
        // SAFETY: `insns` is readable for `insn_cnt` instructions and `license` is a
        // NUL-terminated string; both outlive the call. No log buffer on the first try.
        match unsafe { sys_bpf(BPF_PROG_LOAD, &mut attr) } {
            Ok(fd) => return Ok(Prog { fd: owned(fd) }),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return Err(LoadError {
                    source: e,
                    log: String::new(),
                })
            }
            Err(_) => {}
        }
        // Load again with the verifier log on, to say why.
        attr.log_level = 1;
        attr.log_size = log.len() as u32;
        attr.log_buf = log.as_mut_ptr() as u64;
        // SAFETY: as above, and `log` is writable for `log_size` bytes during the call.
        match unsafe { sys_bpf(BPF_PROG_LOAD, &mut attr) } {
            Ok(fd) => Ok(Prog { fd: owned(fd) }),
            Err(source) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err(LoadError {
                    source,
                    log: String::from_utf8_lossy(&log[..end]).trim_end().to_owned(),
                })
            }
        }
    }
}

impl Prog {
    /// The program's id (what `bpftool prog show id N` and `BPF_PROG_GET_FD_BY_ID` take).
    pub(crate) fn id(&self) -> io::Result<u32> {
        let mut info = ProgInfo::default();
        let mut attr = InfoAttr {
            bpf_fd: self.fd.as_raw_fd() as u32,
            info_len: size_of::<ProgInfo>() as u32,
            info: (&mut info as *mut ProgInfo) as u64,
        };
        // SAFETY: `info` is writable for `info_len` bytes during the call; the kernel writes
        // at most that many.
        unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
        Ok(info.id)
    }
}

/// A program attached to an interface through a BPF link: detached when the link fd is
/// closed — on drop, and by the kernel if the process dies.
#[derive(Debug)]
pub(crate) struct XdpLink {
    _fd: OwnedFd,
}

/// A raw-tracepoint program attached through its own fd: detached when the fd is closed —
/// on drop, and by the kernel if the process dies.
#[derive(Debug)]
pub(crate) struct TpLink {
    _fd: OwnedFd,
}

/// `BPF_RAW_TRACEPOINT_OPEN`: attaches `prog` (a raw-tracepoint program) to the kernel
/// tracepoint `name` (e.g. `xdp_devmap_xmit`).
pub(crate) fn raw_tracepoint(prog: &Prog, name: &std::ffi::CStr) -> io::Result<TpLink> {
    let mut attr = RawTpAttr {
        name: name.as_ptr() as u64,
        prog_fd: prog.fd.as_raw_fd() as u32,
        _pad: 0,
    };
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the rest are plain
    // integers.
    let fd = unsafe { sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr) }?;
    Ok(TpLink { _fd: owned(fd) })
}

/// `BPF_LINK_CREATE` attaching `prog` at `ifindex`'s XDP hook in the mode `flags` selects.
pub(crate) fn xdp_link(prog: &Prog, ifindex: u32, flags: u32) -> io::Result<XdpLink> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.fd.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags,
    };
    // SAFETY: LINK_CREATE reads only plain integers.
    let fd = unsafe { sys_bpf(BPF_LINK_CREATE, &mut attr) }?;
    Ok(XdpLink { _fd: owned(fd) })
}

/// An fd for the loaded program with id `id`, and its name.
pub(crate) fn prog_by_id(id: u32) -> io::Result<(OwnedFd, String)> {
    let mut attr = GetIdAttr {
        id,
        ..Default::default()
    };
    // SAFETY: GET_FD_BY_ID reads only plain integers.
    let fd = owned(unsafe { sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) }?);
    let mut info = ProgInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<ProgInfo>() as u32,
        info: (&mut info as *mut ProgInfo) as u64,
    };
    // SAFETY: `info` is writable for `info_len` bytes during the call; the kernel writes at
    // most that many.
    unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    let end = info.name.iter().position(|&b| b == 0).unwrap_or(16);
    Ok((fd, String::from_utf8_lossy(&info.name[..end]).into_owned()))
}

// ---- netlink: IFLA_XDP -------------------------------------------------------------------

const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_EXPECTED_FD: u16 = 8;
const NLA_F_NESTED: u16 = 1 << 15;
const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;

/// What `RTM_GETLINK` says is on an interface's XDP hook.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct XdpState {
    /// `XDP_ATTACHED_*`: 0 none, 1 driver, 2 generic (skb), 3 offloaded, 4 several.
    pub(crate) attached: u8,
    /// The program id, when one program is attached.
    pub(crate) prog_id: u32,
}

fn nl_socket() -> io::Result<OwnedFd> {
    nl_socket_of(SockProtocol::NetlinkRoute)
}

fn nl_socket_of(proto: SockProtocol) -> io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        proto,
    )?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
    Ok(fd)
}

pub(crate) fn push_attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(data);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// A netlink request: header (sequence 1) + `body`.
pub(crate) fn nl_message(msg_type: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDRLEN + body.len());
    let len = (NLMSG_HDRLEN + body.len()) as u32;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&msg_type.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid
    m.extend_from_slice(body);
    m
}

/// A link request: `ifinfomsg` for `ifindex` + `attrs`.
fn link_request(msg_type: u16, flags: u16, ifindex: u32, attrs: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(IFINFOMSG_LEN + attrs.len());
    b.push(libc::AF_UNSPEC as u8); // ifi_family
    b.push(0);
    b.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    b.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // ifi_flags
    b.extend_from_slice(&0u32.to_ne_bytes()); // ifi_change
    b.extend_from_slice(attrs);
    nl_message(msg_type, flags, &b)
}

/// Iterates the attributes in `buf`: (type without flags, payload).
pub(crate) fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        let next = (len + 3) & !3;
        buf = &buf[next.min(buf.len())..];
        Some((kind, data))
    })
}

/// Sends `req` and collects the reply messages (type, payload) until `NLMSG_DONE` or, for a
/// request with `NLM_F_ACK`, the ack. An error reply becomes `Err`.
pub(crate) fn nl_exchange(req: &[u8]) -> io::Result<Vec<(u16, Vec<u8>)>> {
    nl_exchange_on(nl_socket()?, req)
}

fn nl_exchange_on(fd: OwnedFd, req: &[u8]) -> io::Result<Vec<(u16, Vec<u8>)>> {
    send(fd.as_raw_fd(), req, MsgFlags::empty())?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        let mut rest = &buf[..n];
        while rest.len() >= NLMSG_HDRLEN {
            let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap_or_default()) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            let flags = u16::from_ne_bytes([rest[6], rest[7]]);
            if len < NLMSG_HDRLEN || len > rest.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "short netlink reply",
                ));
            }
            let payload = &rest[NLMSG_HDRLEN..len];
            match kind as libc::c_int {
                libc::NLMSG_DONE => return Ok(out),
                libc::NLMSG_ERROR => {
                    let code = payload
                        .get(0..4)
                        .map(|b| i32::from_ne_bytes(b.try_into().unwrap_or_default()))
                        .unwrap_or(-libc::EIO);
                    if code == 0 {
                        return Ok(out);
                    }
                    return Err(io::Error::from_raw_os_error(-code));
                }
                _ => out.push((kind, payload.to_vec())),
            }
            if flags & libc::NLM_F_MULTI as u16 == 0 && req_wants_one(req) {
                return Ok(out);
            }
            rest = &rest[((len + 3) & !3).min(rest.len())..];
        }
    }
}

fn req_wants_one(req: &[u8]) -> bool {
    let flags = u16::from_ne_bytes([req[6], req[7]]);
    flags & (libc::NLM_F_DUMP as u16) == 0 && flags & (libc::NLM_F_ACK as u16) == 0
}

/// `NETDEV_XDP_ACT_NDO_XMIT` of the netdev family's `xdp-features`: the device takes frames
/// other devices' XDP programs redirect to it (`ndo_xdp_xmit`).
pub(crate) const XDP_ACT_NDO_XMIT: u64 = 4;

/// The `xdp-features` bits (`NETDEV_XDP_ACT_*`) the kernel reports for `ifindex` through the
/// generic netlink family `netdev` (Linux 6.3 and later; an older kernel has no such family:
/// `Err`). On veth the bit [`XDP_ACT_NDO_XMIT`] follows the peer: set only while the peer has
/// an XDP program or GRO on.
pub(crate) fn xdp_features(ifindex: u32) -> io::Result<u64> {
    const GENL_ID_CTRL: u16 = 0x10;
    const CTRL_CMD_GETFAMILY: u8 = 3;
    const CTRL_ATTR_FAMILY_ID: u16 = 1;
    const CTRL_ATTR_FAMILY_NAME: u16 = 2;
    const NETDEV_CMD_DEV_GET: u8 = 1;
    const NETDEV_A_DEV_IFINDEX: u16 = 1;
    const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
    let genl = |family: u16, cmd: u8, attrs: &[u8]| {
        // struct genlmsghdr: cmd, version, reserved u16
        let mut b = vec![cmd, 1, 0, 0];
        b.extend_from_slice(attrs);
        nl_message(family, libc::NLM_F_REQUEST as u16, &b)
    };
    let first = |reply: Vec<(u16, Vec<u8>)>, want: u16| -> Option<Vec<u8>> {
        reply
            .into_iter()
            .find(|(_, m)| m.len() >= 4)
            .and_then(|(_, m)| {
                attrs(&m[4..])
                    .find(|(t, _)| *t == want)
                    .map(|(_, v)| v.to_vec())
            })
    };
    let missing = |what: &str| io::Error::new(io::ErrorKind::NotFound, what.to_owned());
    let mut name = Vec::new();
    push_attr(&mut name, CTRL_ATTR_FAMILY_NAME, b"netdev\0");
    let req = genl(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, &name);
    let reply = nl_exchange_on(nl_socket_of(SockProtocol::NetlinkGeneric)?, &req)?;
    let id = first(reply, CTRL_ATTR_FAMILY_ID)
        .and_then(|v| Some(u16::from_ne_bytes(v.get(0..2)?.try_into().ok()?)))
        .ok_or_else(|| missing("no netdev netlink family"))?;
    let mut dev = Vec::new();
    push_attr(&mut dev, NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
    let reply = nl_exchange_on(
        nl_socket_of(SockProtocol::NetlinkGeneric)?,
        &genl(id, NETDEV_CMD_DEV_GET, &dev),
    )?;
    first(reply, NETDEV_A_DEV_XDP_FEATURES)
        .and_then(|v| Some(u64::from_ne_bytes(v.get(0..8)?.try_into().ok()?)))
        .ok_or_else(|| missing("no xdp-features in the netdev reply"))
}

/// What is attached at `ifindex`'s XDP hook.
pub(crate) fn xdp_state(ifindex: u32) -> io::Result<XdpState> {
    let req = link_request(libc::RTM_GETLINK, libc::NLM_F_REQUEST as u16, ifindex, &[]);
    let mut st = XdpState::default();
    for (kind, payload) in nl_exchange(&req)? {
        if kind != libc::RTM_NEWLINK || payload.len() < IFINFOMSG_LEN {
            continue;
        }
        for (t, d) in attrs(&payload[IFINFOMSG_LEN..]) {
            if t != libc::IFLA_XDP {
                continue;
            }
            for (x, v) in attrs(d) {
                match x {
                    IFLA_XDP_ATTACHED => st.attached = v.first().copied().unwrap_or(0),
                    IFLA_XDP_PROG_ID if v.len() >= 4 => {
                        st.prog_id = u32::from_ne_bytes([v[0], v[1], v[2], v[3]])
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(st)
}

fn set_xdp(ifindex: u32, fd: i32, flags: u32, expected: Option<i32>) -> io::Result<()> {
    let mut inner = Vec::new();
    push_attr(&mut inner, IFLA_XDP_FD, &fd.to_ne_bytes());
    push_attr(&mut inner, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    if let Some(e) = expected {
        push_attr(&mut inner, IFLA_XDP_EXPECTED_FD, &e.to_ne_bytes());
    }
    let mut a = Vec::new();
    push_attr(&mut a, libc::IFLA_XDP | NLA_F_NESTED, &inner);
    let req = link_request(
        libc::RTM_SETLINK,
        (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
        ifindex,
        &a,
    );
    nl_exchange(&req).map(|_| ())
}

/// Detaches exactly the program `expected` from `ifindex`'s hook in `mode` (an
/// `XDP_FLAGS_*_MODE`), with `XDP_FLAGS_REPLACE`: if another program took its place in the
/// meantime the kernel refuses (`EEXIST`) instead of removing that one. A program attached
/// through a link held by a live process cannot be detached this way (`EBUSY`).
pub(crate) fn xdp_detach_expected(
    ifindex: u32,
    expected: BorrowedFd<'_>,
    mode: u32,
) -> io::Result<()> {
    set_xdp(
        ifindex,
        -1,
        mode | XDP_FLAGS_REPLACE,
        Some(expected.as_raw_fd()),
    )
}

/// Attaches `prog` at `ifindex` through netlink (no link: it stays after the process exits).
/// What an older or crashed attacher leaves behind; vgate itself attaches with
/// [`xdp_link`].
pub(crate) fn xdp_attach_legacy(ifindex: u32, prog: &Prog, mode: u32) -> io::Result<()> {
    set_xdp(ifindex, prog.fd.as_raw_fd(), mode, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpus_are_counted_in_the_mask() {
        assert_eq!(count_cpus("0-3\n"), Some(4));
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0,2-5"), Some(5), "a hole is not counted");
        assert_eq!(count_cpus("4-7"), Some(4));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus("x"), None);
        assert_eq!(count_cpus(""), None);
    }

    #[test]
    fn attribute_layouts_match_the_kernel() {
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, prog_name), 48);
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(std::mem::offset_of!(MapCreateAttr, map_name), 28);
        assert_eq!(std::mem::offset_of!(MapElemAttr, key), 8);
        assert_eq!(std::mem::offset_of!(ProgInfo, name), 64);
        assert_eq!(size_of::<Insn>(), 8);
        // No implicit padding in any attr handed to bpf(2): every byte is a named field,
        // so zero-initialising the fields zeroes everything the kernel checks.
        assert_eq!(
            std::mem::offset_of!(RawTpAttr, _pad) + 4,
            size_of::<RawTpAttr>()
        );
        assert_eq!(
            std::mem::offset_of!(MapElemAttr, flags) + 8,
            size_of::<MapElemAttr>()
        );
        assert_eq!(
            std::mem::offset_of!(MapCreateAttr, map_name) + 16,
            size_of::<MapCreateAttr>()
        );
        assert_eq!(
            std::mem::offset_of!(ProgLoadAttr, expected_attach_type) + 4,
            size_of::<ProgLoadAttr>()
        );
        assert_eq!(
            std::mem::offset_of!(LinkCreateAttr, flags) + 4,
            size_of::<LinkCreateAttr>()
        );
        assert_eq!(
            std::mem::offset_of!(GetIdAttr, open_flags) + 4,
            size_of::<GetIdAttr>()
        );
        assert_eq!(
            std::mem::offset_of!(InfoAttr, info) + 8,
            size_of::<InfoAttr>()
        );
        assert_eq!(std::mem::offset_of!(MapBatchAttr, count), 32);
        assert_eq!(std::mem::offset_of!(MapBatchAttr, elem_flags), 40);
        assert_eq!(
            std::mem::offset_of!(MapBatchAttr, flags) + 8,
            size_of::<MapBatchAttr>()
        );
    }

    #[test]
    fn netlink_attributes_round_trip() {
        let mut b = Vec::new();
        push_attr(&mut b, 3, &[1, 2, 3]);
        push_attr(&mut b, 4 | NLA_F_NESTED, &7u32.to_ne_bytes());
        let got: Vec<_> = attrs(&b).collect();
        assert_eq!(
            got,
            vec![(3, &[1u8, 2, 3][..]), (4, &7u32.to_ne_bytes()[..])]
        );
        assert_eq!(attrs(&[9, 0, 1]).count(), 0, "short buffer");
    }
}

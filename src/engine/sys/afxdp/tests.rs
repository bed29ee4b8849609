use super::netdev::{EthtoolChannels, EthtoolDrvinfo, IfReq};
use super::*;
use std::process::Command;

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// Deletes the namespace when the test ends, however it ends.
struct Ns(String);
impl Drop for Ns {
    fn drop(&mut self) {
        ip(&["netns", "del", &self.0]);
    }
}

/// A real copy-mode socket on a veth in a namespace of its own: a frame the device drops
/// (peer down, so no carrier: `NET_XMIT_DROP`, the kick gets `EBUSY`) is counted in
/// `tx_busy_drops`; with the interface down the kick fails (`ENETDOWN`), the frame stays
/// on the ring and the second `tx_stalled` check reports it.
#[test]
fn tx_kick_counts_device_drops_and_a_stalled_ring() {
    if !nix::unistd::geteuid().is_root() {
        crate::test_did_not_run(
            "tx_kick_counts_device_drops_and_a_stalled_ring",
            "needs root",
        );
        return;
    }
    let name = format!("vgzcfix{}", std::process::id());
    assert!(ip(&["netns", "add", &name]), "ip netns add {name}");
    let _ns = Ns(name.clone());
    let n = |args: &[&str]| {
        let mut a = vec!["-n", name.as_str()];
        a.extend_from_slice(args);
        assert!(ip(&a), "ip {a:?}");
    };
    n(&["link", "add", "xa", "type", "veth", "peer", "name", "xb"]);
    n(&["link", "set", "xa", "up"]);
    // xb stays down: xa is up without carrier.
    let file = std::fs::File::open(format!("/run/netns/{name}")).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let ifindex = if_nametoindex(c"xa").unwrap();
        let p = XskParams {
            frame_size: 2048,
            frames: 64,
            ring: 32,
        };
        let mut x = Xsk::open(ifindex, 0, p, BindMode::Copy, false).expect("copy-mode socket");
        let push = |x: &mut Xsk| {
            let mut f = x.tx_frame().expect("a TX frame");
            x.tx_buf(&mut f)[..60].fill(0xff);
            assert!(x.tx_push(f, 60, None));
        };
        push(&mut x);
        x.tx_kick().expect("a device drop is not an error");
        assert_eq!(x.tx_busy_drops(), 1, "the frame the device dropped");
        assert!(x.tx_stopped());
        assert_eq!(x.tx_queued(), 0);
        // Interface down: the kernel refuses to take the frame.
        assert!(ip(&["link", "set", "xa", "down"]));
        push(&mut x);
        let e = x.tx_kick().expect_err("ENETDOWN");
        assert_eq!(e.raw_os_error(), Some(libc::ENETDOWN), "{e}");
        assert_eq!(x.tx_queued(), 1);
        assert!(!x.tx_stalled(), "first sight of the waiting frame");
        let _ = x.tx_kick();
        assert!(x.tx_stalled(), "no progress since the last check");
        assert_eq!(x.tx_busy_drops(), 1);
    })
    .join()
    .unwrap();
}

#[test]
fn layouts() {
    assert_eq!(size_of::<libc::xdp_desc>(), 16);
    assert_eq!(size_of::<IfReq>(), 40);
    assert_eq!(size_of::<EthtoolChannels>(), 36);
    assert_eq!(size_of::<EthtoolDrvinfo>(), 196);
}

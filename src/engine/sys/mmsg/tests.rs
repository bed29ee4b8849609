use super::raw::raw_udp_socket_with;
use super::send::GSO;
use super::*;
use std::io;
use std::net::Ipv4Addr;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;

#[test]
fn raw_socket_drops_what_arrived_before_its_filter() {
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let SocketAddr4(dst) = SocketAddr4::of(&sink);
    let mut sent = 0;
    let raw = raw_udp_socket_with(Ipv4Addr::LOCALHOST, |_| {
        // Delivered locally: the unfiltered raw socket queues a copy of each.
        for _ in 0..3 {
            sent += sender.send_to(b"early", dst).map_or(0, |_| 1);
        }
    });
    let Ok(raw) = raw else {
        crate::test_did_not_run(
            "raw_socket_drops_what_arrived_before_its_filter",
            "no CAP_NET_RAW",
        );
        return;
    };
    assert_eq!(sent, 3);
    let mut buf = [0u8; 64];
    assert_eq!(
        sink.recv(&mut buf).unwrap(),
        5,
        "the datagrams were delivered"
    );
    // SAFETY: `buf` is live and writable for its length during the call.
    let r = unsafe {
        libc::recv(
            raw.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    assert_eq!(r, -1, "the raw socket's queue is empty");
    assert_eq!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::EAGAIN)
    );
}

#[test]
fn relays_a_batch_between_real_sockets() {
    let rx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let SocketAddr4(dst) = SocketAddr4::of(&rx_sock);
    for i in 0..5u8 {
        sender.send_to(&[i; 100], dst).unwrap();
    }
    sender.send_to(&[9u8; 300], dst).unwrap();
    let mut rb = RecvBatch::new(8, 200);
    // Datagrams are queued synchronously on loopback.
    assert_eq!(rb.recv(rx_sock.as_fd()).unwrap(), 6);
    assert_eq!(rb.payload(2), &[2u8; 100][..]);
    assert!(rb.truncated(5));
    assert_eq!(rb.payload(5).len(), 200);
    assert_eq!(rb.source(0), SocketAddr4::of(&sender).0);

    let mut sb = SendBatch::new(8);
    let out = sb.send(tx_sock.as_fd(), &rb, &[0, 1, 2], SocketAddr4::of(&sink).0);
    assert_eq!(out.sent, 3);
    assert_eq!(out.sent_bytes, 300);
    let mut buf = [0u8; 512];
    for i in 0..3u8 {
        let (n, from) = sink.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[i; 100][..]);
        assert_eq!(from, tx_sock.local_addr().unwrap());
    }
    assert_eq!(
        rb.recv(rx_sock.as_fd()).unwrap(),
        0,
        "nothing more was waiting"
    );
    // Reused headers: lengths and flags from the earlier batches do not leak into later
    // ones, whichever of them the kernel wrote.
    for round in [7usize, 2, 8] {
        for i in 0..round {
            sender.send_to(&[i as u8; 50], dst).unwrap();
        }
        assert_eq!(rb.recv(rx_sock.as_fd()).unwrap(), round);
        for i in 0..round {
            assert_eq!(rb.payload(i), &[i as u8; 50][..], "round {round}");
            assert!(!rb.truncated(i), "round {round}");
            assert_eq!(rb.source(i), SocketAddr4::of(&sender).0);
        }
    }
}

#[test]
fn slice_batch_sends_borrowed_payloads_in_order() {
    let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let block: Vec<u8> = (0..=255u8).collect();
    let mut sb = SliceBatch::new(3);
    let mut scope = sb.scope();
    for i in 0..3 {
        assert!(scope.push(&block[i * 10..i * 10 + 10]));
    }
    assert!(scope.is_full() && !scope.push(&block[..1]));
    let out = scope.send(tx_sock.as_fd(), SocketAddr4::of(&sink).0);
    assert_eq!((out.sent, out.sent_bytes), (3, 30));
    assert!(scope.push(&block[100..150]));
    assert_eq!(
        scope.send(tx_sock.as_fd(), SocketAddr4::of(&sink).0).sent,
        1
    );
    let mut buf = [0u8; 512];
    for want in [
        &block[0..10],
        &block[10..20],
        &block[20..30],
        &block[100..150],
    ] {
        let (n, from) = sink.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], want);
        assert_eq!(from, tx_sock.local_addr().unwrap());
    }
}

#[test]
fn runs_of_equal_sizes_arrive_as_the_same_datagrams() {
    let rx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    // Runs (GSO messages where the kernel takes them), a shorter datagram ending a run, a
    // longer one starting the next, one too big to be a segment, and 70 equal ones (more
    // than one message's worth of segments).
    let mut sizes = vec![100, 100, 100, 50, 100, 200, 200, 1500, 30, 1, 1];
    sizes.extend(std::iter::repeat_n(1316, 70));
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|b| (b + i) as u8).collect())
        .collect();
    let SocketAddr4(dst) = SocketAddr4::of(&rx_sock);
    for d in &data {
        sender.send_to(d, dst).unwrap();
    }
    let mut rb = RecvBatch::new(sizes.len(), 2048);
    // Datagrams are queued synchronously on loopback.
    assert_eq!(rb.recv(rx_sock.as_fd()).unwrap(), sizes.len());
    let all: Vec<u16> = (0..sizes.len() as u16).collect();
    let mut sb = SendBatch::new(sizes.len());
    let out = sb.send(tx_sock.as_fd(), &rb, &all, SocketAddr4::of(&sink).0);
    assert_eq!(out.sent, sizes.len(), "{out:?}");
    assert_eq!(out.sent_bytes, sizes.iter().sum::<usize>());
    assert!(GSO.load(Relaxed), "loopback takes UDP GSO messages");
    let mut buf = [0u8; 2048];
    for want in &data {
        let n = sink.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &want[..], "datagram of {} bytes", want.len());
    }
}

struct SocketAddr4(SocketAddrV4);
impl SocketAddr4 {
    fn of(s: &UdpSocket) -> SocketAddr4 {
        match s.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => SocketAddr4(a),
            _ => unreachable!(),
        }
    }
}

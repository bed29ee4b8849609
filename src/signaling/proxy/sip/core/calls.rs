//! Naming a call for logs, sessions and metrics.

/// The name of a call's session and routes (logs, `vgate sessions list`, the `route` label of
/// per-stream metrics): the GB/T 28181 channel the INVITE asks for (its Request-URI user) and
/// the SSRC its SDP offers (`y=`), which an operator finds in the platform's own screens; the
/// Call-ID (rewritten at the boundary, so of no use to them) only when the Request-URI has no
/// user.
pub(super) fn call_label(route: &str, uri: Option<&[u8]>, body: &[u8], call_id: &[u8]) -> String {
    let clean = |b: &[u8]| -> String {
        String::from_utf8_lossy(b)
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(48)
            .collect()
    };
    let user = uri
        .map(|u| {
            let u = u
                .strip_prefix(b"sips:")
                .or_else(|| u.strip_prefix(b"sip:"))
                .unwrap_or(u);
            match u.iter().position(|c| *c == b'@') {
                Some(at) => &u[..at],
                None => &[][..],
            }
        })
        .filter(|u| !u.is_empty());
    let Some(user) = user else {
        return format!("sip:{route}:{}", clean(call_id));
    };
    let ssrc = crate::signaling::sdp::parse(body)
        .ok()
        .and_then(|sdp| sdp.media.iter().find_map(|m| m.ssrc))
        .map(|y| clean(y.as_bytes()));
    match ssrc {
        Some(y) if !y.is_empty() => format!("sip:{route}:{} y={y}", clean(user)),
        _ => format!("sip:{route}:{}", clean(user)),
    }
}

#[cfg(test)]
mod call_label_tests {
    use super::call_label;

    #[test]
    fn calls_are_named_by_gb_channel_and_ssrc() {
        let sdp = b"v=0\r\no=34020000002000000001 0 0 IN IP4 10.1.0.9\r\ns=Play\r\nc=IN IP4 10.1.0.9\r\nt=0 0\r\nm=video 6000 RTP/AVP 96\r\na=recvonly\r\na=rtpmap:96 PS/90000\r\ny=0100000001\r\n";
        let uri = Some(&b"sip:34020000001320000001@3402000000"[..]);
        assert_eq!(
            call_label("gb", uri, sdp, b"abc@10.1.0.9"),
            "sip:gb:34020000001320000001 y=0100000001"
        );
        assert_eq!(
            call_label("gb", uri, b"", b"abc@10.1.0.9"),
            "sip:gb:34020000001320000001"
        );
        // No user in the Request-URI: the Call-ID is all there is.
        assert_eq!(
            call_label("gb", Some(b"sip:10.2.0.1:5060"), sdp, b"abc@10.1.0.9"),
            "sip:gb:abc@10.1.0.9"
        );
    }
}

//! The RTSP client side shared by the RTSP tests (`rtsp_netns`, the hostile peers): the text
//! of a request and the session a reply names.

/// Request `method url` with CSeq `cseq`, the `Session` header when a session is known, then
/// the `extra` header lines (each ending in CRLF) and the blank line.
pub fn request(method: &str, url: &str, cseq: u32, session: Option<&str>, extra: &str) -> String {
    let session = session
        .map(|s| format!("Session: {s}\r\n"))
        .unwrap_or_default();
    format!("{method} {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{session}{extra}\r\n")
}

//! The admin interface client of the tests: `GET` a path (on the host or inside a network
//! namespace), send a request with a body (`POST`), read one Prometheus sample or the sum
//! of a family's samples.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::in_netns;

/// `GET path` at `addr` (`host:port`): the body, or the error if nothing answers.
pub fn try_get(addr: &str, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    // HTTP/1.0: the server then sends the body as it is. To an HTTP/1.1 request it sends
    // a body over 32 KiB chunked (tiny_http), which this reader does not decode: /metrics
    // outgrew that with the media and HA families, and the chunk lines cut samples.
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// `GET path` at `addr`: the body; panics if the admin interface does not answer.
pub fn get(addr: &str, path: &str) -> String {
    try_get(addr, path).unwrap_or_else(|e| panic!("admin interface {addr}: {e}"))
}

/// [`get`] from inside network namespace `ns`.
pub fn get_in(ns: &str, addr: &str, path: &str) -> String {
    let (addr, path) = (addr.to_owned(), path.to_owned());
    in_netns(ns, move || get(&addr, &path))
}

/// [`get`], the body parsed as JSON.
pub fn get_json(addr: &str, path: &str) -> serde_json::Value {
    let body = get(addr, path);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// [`get_json`] from inside network namespace `ns`.
pub fn get_json_in(ns: &str, addr: &str, path: &str) -> serde_json::Value {
    let (addr, path) = (addr.to_owned(), path.to_owned());
    in_netns(ns, move || get_json(&addr, &path))
}

/// The value of the sample `series` (name and labels exactly, as `name{k="v"}`) in a
/// Prometheus text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Sum of the Prometheus samples of `family` whose labels contain every one of `labels`.
pub fn metric(text: &str, family: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `POST path` with a JSON `body` at `addr`: the whole response (status line first).
pub fn post(addr: &str, path: &str, body: &str) -> String {
    request(addr, "POST", path, body)
}

/// `METHOD path` with a JSON `body` at `addr`: the whole response (status line first,
/// `HTTP/1.1`; the answers to these are short, never chunked).
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("admin interface {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

//! Byte classes and small scanners shared by the SIP parsers (RFC 3261 §25.1).
//!
//! Every function here takes a slice and returns sub-slices or offsets found by
//! searching it, so no caller has to index raw bytes.

use super::SipError;

/// `token` characters: alphanum and `-.!%*_+`'~`.
pub(crate) fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(&b)
}

/// A non-empty run of token characters.
pub(crate) fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_token_char(b))
}

/// Linear whitespace inside a header value. CR and LF count because a value may
/// contain folding (CRLF followed by SP/HTAB), already checked by the message parser.
pub(crate) fn is_lws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

pub(crate) fn trim_lws_start(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| is_lws(b)).count();
    s.get(n..).unwrap_or_default()
}

pub(crate) fn trim_lws_end(s: &[u8]) -> &[u8] {
    let n = s.iter().rev().take_while(|&&b| is_lws(b)).count();
    s.get(..s.len() - n).unwrap_or_default()
}

pub(crate) fn trim_lws(s: &[u8]) -> &[u8] {
    trim_lws_end(trim_lws_start(s))
}

/// Splits `s` after the longest prefix whose bytes satisfy `pred`.
pub(crate) fn take_while(s: &[u8], pred: impl Fn(u8) -> bool) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|&&b| pred(b)).count();
    split_at(s, n)
}

/// `split_at` that cannot panic: an index past the end splits at the end.
pub(crate) fn split_at(s: &[u8], at: usize) -> (&[u8], &[u8]) {
    let at = at.min(s.len());
    (
        s.get(..at).unwrap_or_default(),
        s.get(at..).unwrap_or_default(),
    )
}

/// First byte of `s`, if any.
pub(crate) fn first(s: &[u8]) -> Option<u8> {
    s.first().copied()
}

/// `s` without its first byte (empty stays empty).
pub(crate) fn rest(s: &[u8]) -> &[u8] {
    s.get(1..).unwrap_or_default()
}

pub(crate) fn find_byte(s: &[u8], b: u8) -> Option<usize> {
    s.iter().position(|&x| x == b)
}

pub(crate) fn find_seq(s: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    s.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn contains_lws(s: &[u8]) -> bool {
    s.iter().any(|&b| is_lws(b))
}

/// Length of the quoted-string at the start of `s` (which must start with `"`),
/// closing quote included. A backslash escapes the next byte (quoted-pair), except
/// CR and LF which RFC 3261 does not allow there.
pub(crate) fn quoted_len(s: &[u8]) -> Result<usize, SipError> {
    if first(s) != Some(b'"') {
        return Err(SipError::BadParams("expected a quoted string"));
    }
    let mut i = 1;
    while let Some(&b) = s.get(i) {
        match b {
            b'"' => return Ok(i + 1),
            b'\\' => match s.get(i + 1) {
                Some(b'\r' | b'\n') | None => break,
                Some(_) => i += 2,
            },
            _ => i += 1,
        }
    }
    Err(SipError::BadParams("unterminated quoted string"))
}

/// Offset of the first comma in `s` that is outside quoted strings and `<...>`:
/// where a comma-separated header list splits. `None` when there is none, or when a
/// quote is left open (the remainder is then one value, and its own parser rejects it).
pub(crate) fn top_level_comma(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    let mut in_angle = false;
    while let Some(&b) = s.get(i) {
        match b {
            b'"' if !in_angle => i += quoted_len(s.get(i..)?).ok()?,
            b'<' => {
                in_angle = true;
                i += 1;
            }
            b'>' => {
                in_angle = false;
                i += 1;
            }
            b',' if !in_angle => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// Values of a comma-separated header list, each trimmed of LWS. An empty element
/// (`a,,b`, or an empty header) is yielded as an empty slice so validation can see it.
#[derive(Debug, Clone)]
pub struct CommaValues<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> CommaValues<'a> {
    pub(crate) fn new(value: &'a [u8]) -> Self {
        CommaValues { rest: Some(value) }
    }
}

impl<'a> Iterator for CommaValues<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.rest?;
        match top_level_comma(s) {
            Some(i) => {
                let (item, tail) = split_at(s, i);
                self.rest = Some(rest(tail));
                Some(trim_lws(item))
            }
            None => {
                self.rest = None;
                Some(trim_lws(s))
            }
        }
    }
}

/// Decimal digits to a number no larger than `max`; `None` for empty input,
/// any non-digit, or overflow (however many digits are sent).
pub(crate) fn parse_decimal(s: &[u8], max: u64) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        if n > max {
            return None;
        }
    }
    Some(n)
}

/// Case-insensitive ASCII comparison.
pub(crate) fn eq_ic(a: &[u8], b: &[u8]) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// True if `s` holds no byte that could end or split a header line when written.
pub(crate) fn is_safe_value(s: &[u8]) -> bool {
    !s.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0))
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]
mod tests {
    use super::*;

    #[test]
    fn comma_split_respects_quotes_and_angles() {
        let v: Vec<_> = CommaValues::new(b"\"a, b\" <sip:x,y@h>;p=1 , <sip:z@h>, ").collect();
        assert_eq!(v, vec![&b"\"a, b\" <sip:x,y@h>;p=1"[..], b"<sip:z@h>", b""]);
    }

    #[test]
    fn quoted_len_handles_escapes() {
        assert_eq!(quoted_len(br#""J \\\"" x"#), Ok(8));
        assert!(quoted_len(b"\"open").is_err());
    }

    #[test]
    fn decimal_overflow_is_none() {
        assert_eq!(parse_decimal(b"0068", 255), Some(68));
        assert_eq!(parse_decimal(b"36893488147419103232", u64::MAX), None);
        assert_eq!(parse_decimal(b"-1", 10), None);
    }
}

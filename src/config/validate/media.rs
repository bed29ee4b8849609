//! `[media]` (media validation defaults) and a static route's `media = { ... }`: the mode,
//! the policy keys, and what a static route carries (codec, payload types, clock rate, SSRC).

use toml::Spanned;

use crate::config::check::{invalid, Invalid};
use crate::config::raw::{RawMedia, RawStreamMedia};
use crate::config::{MediaConfig, MediaMode};
use crate::media::{Codec, Policy, Rule, StreamSpec, MAX_FORMATS};

use super::Result;

/// The policy keys `[media]` and a route's `media` share.
struct PolicyKeys<'a> {
    allow_extension: Option<bool>,
    allow_padding: Option<bool>,
    allow_unknown_codec: Option<bool>,
    allow_filler: Option<bool>,
    sei_user_data_max: Option<&'a Spanned<i64>>,
    sei_user_data_per_s: Option<&'a Spanned<i64>>,
}

fn policy(base: Policy, k: &PolicyKeys<'_>, key: &dyn Fn(&str) -> String) -> Result<Policy> {
    let mut p = base;
    p.allow_extension = k.allow_extension.unwrap_or(p.allow_extension);
    p.allow_padding = k.allow_padding.unwrap_or(p.allow_padding);
    p.allow_unknown_codec = k.allow_unknown_codec.unwrap_or(p.allow_unknown_codec);
    p.allow_filler = k.allow_filler.unwrap_or(p.allow_filler);
    if let Some(v) = k.sei_user_data_max {
        p.sei_user_data_max = u16::try_from(*v.get_ref())
            .ok()
            .filter(|n| *n <= 16384)
            .ok_or_else(|| {
                invalid(
                    v,
                    key("sei_user_data_max"),
                    "expected 0 to 16384 bytes for the largest SEI user-data message (0 refuses all SEI user data; the default 2560 passes the x264 and x265 banners)",
                )
            })?;
    }
    if let Some(v) = k.sei_user_data_per_s {
        p.sei_user_data_per_s = u32::try_from(*v.get_ref())
            .ok()
            .filter(|n| *n <= 1_000_000)
            .ok_or_else(|| {
                invalid(
                    v,
                    key("sei_user_data_per_s"),
                    "expected 0 to 1000000 bytes per second of SEI user data on one stream (the default is 8192)",
                )
            })?;
    }
    Ok(p)
}

/// `[media]`.
pub(super) fn media(raw: &RawMedia) -> Result<MediaConfig> {
    let key = |k: &str| format!("media.{k}");
    let keys = PolicyKeys {
        allow_extension: raw.allow_extension,
        allow_padding: raw.allow_padding,
        allow_unknown_codec: raw.allow_unknown_codec,
        allow_filler: raw.allow_filler,
        sei_user_data_max: raw.sei_user_data_max.as_ref(),
        sei_user_data_per_s: raw.sei_user_data_per_s.as_ref(),
    };
    let d = MediaConfig::default();
    Ok(MediaConfig {
        validate: raw.validate.as_ref().map_or(d.validate, |v| *v.get_ref()),
        policy: policy(d.policy, &keys, &key)?,
    })
}

/// The codec names a static route's `media.codec` takes.
const CODECS: &str = "ps, h264, h265, mp2t, jpeg, pcmu, pcma, aac";

fn codec(s: &Spanned<String>, key: String) -> Result<Codec> {
    let name = s.get_ref();
    let c = match name.to_ascii_lowercase().as_str() {
        "aac" => Codec::Aac,
        other => Codec::from_rtpmap(other),
    };
    if c == Codec::Unknown {
        return Err(invalid(
            s,
            key,
            format!("unknown codec \"{name}\"; the validator knows {CODECS}"),
        ));
    }
    Ok(c)
}

/// A static route's media rule: `None` when the route is not validated. `i` is the route's
/// index, `at` its name (where an error without a key of its own points).
pub(super) fn stream_media(
    i: usize,
    raw: Option<&Spanned<RawStreamMedia>>,
    global: &MediaConfig,
    at: &Spanned<String>,
) -> Result<Option<Rule>> {
    let key = |k: &str| format!("stream_route[{i}].media.{k}");
    let Some(spanned) = raw else {
        if global.validate.enforces() {
            return Err(invalid(
                at,
                format!("stream_route[{i}].media"),
                format!("media.validate is \"{}\" but this route does not say what it carries; add media = {{ codec = \"h264\", payload_types = [96] }} (or the route's codec), or media = {{ validate = \"off\" }} to let it cross unchecked", global.validate),
            ));
        }
        // A static route that names no codec is not validated under `count`: there is
        // nothing to check it against (and configs from before validation name none).
        return Ok(None);
    };
    let m = spanned.get_ref();
    let mode = m
        .validate
        .as_ref()
        .map_or(global.validate, |v| *v.get_ref());
    if mode == MediaMode::Off {
        return Ok(None);
    }
    let Some(codec_at) = &m.codec else {
        return Err(Invalid {
            span: Some(spanned.span()),
            key: key("codec"),
            message: format!(
                "media validation needs the codec this route carries: add codec = \"...\" (one of {CODECS}), or validate = \"off\""
            ),
        });
    };
    let codec = codec(codec_at, key("codec"))?;
    let (static_pt, static_rate) = match codec.static_pt() {
        Some((pt, rate)) => (Some(pt), Some(rate)),
        None => (None, None),
    };
    let mut pts = Vec::new();
    for (j, p) in m.payload_types.iter().enumerate() {
        let pt = u8::try_from(*p.get_ref())
            .ok()
            .filter(|n| *n < 128)
            .ok_or_else(|| {
                invalid(
                    p,
                    format!("stream_route[{i}].media.payload_types[{j}]"),
                    "expected an RTP payload type from 0 to 127",
                )
            })?;
        pts.push(pt);
    }
    if pts.len() > MAX_FORMATS {
        return Err(invalid(
            codec_at,
            key("payload_types"),
            format!("at most {MAX_FORMATS} payload types per route"),
        ));
    }
    if pts.is_empty() {
        match static_pt {
            Some(pt) => pts.push(pt),
            None => {
                return Err(invalid(
                    codec_at,
                    key("payload_types"),
                    format!(
                        "codec \"{}\" has no static payload type: add payload_types = [96] (the ones the sender uses)",
                        codec_at.get_ref()
                    ),
                ))
            }
        }
    }
    let clock_rate = match &m.clock_rate {
        Some(c) => u32::try_from(*c.get_ref())
            .ok()
            .filter(|n| (1000..=192_000).contains(n))
            .ok_or_else(|| {
                invalid(
                    c,
                    key("clock_rate"),
                    "expected an RTP clock rate from 1000 to 192000 Hz",
                )
            })?,
        None => match (codec, static_rate) {
            (_, Some(r)) => r,
            (Codec::Aac, None) => {
                return Err(invalid(
                    codec_at,
                    key("clock_rate"),
                    "AAC's RTP clock is its sample rate: add clock_rate = 48000 (or the encoder's rate)",
                ))
            }
            _ => 90000,
        },
    };
    let ssrc = match &m.ssrc {
        None => None,
        Some(v) => Some(u32::try_from(*v.get_ref()).map_err(|_| {
            invalid(
                v,
                key("ssrc"),
                "expected the SSRC as a number from 0 to 4294967295",
            )
        })?),
    };
    let keys = PolicyKeys {
        allow_extension: m.allow_extension,
        allow_padding: m.allow_padding,
        allow_unknown_codec: m.allow_unknown_codec,
        allow_filler: m.allow_filler,
        sei_user_data_max: m.sei_user_data_max.as_ref(),
        sei_user_data_per_s: m.sei_user_data_per_s.as_ref(),
    };
    let policy = policy(global.policy, &keys, &key)?;
    let spec = pts.iter().fold(StreamSpec::new(ssrc), |s, &pt| {
        s.with(pt, codec, clock_rate)
    });
    Ok(mode.rule(spec, policy))
}

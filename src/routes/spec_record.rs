//! A media [`StreamSpec`] (the formats and SSRC an SDP negotiated, the RTCP flags) as the
//! state store's JSON records hold it: in a route's media rule ([`crate::ha`]'s session
//! records) and in a SIP call's `m=` slots (the SIP proxy's call records), so a copy
//! validates and re-negotiates as its original did.

use serde::{Deserialize, Serialize};

use crate::media::{Codec, StreamSpec};

const CODECS: [(Codec, &str); 9] = [
    (Codec::Ps, "ps"),
    (Codec::H264, "h264"),
    (Codec::H265, "h265"),
    (Codec::Mp2t, "mp2t"),
    (Codec::Jpeg, "jpeg"),
    (Codec::Pcmu, "pcmu"),
    (Codec::Pcma, "pcma"),
    (Codec::Aac, "aac"),
    (Codec::Unknown, "unknown"),
];

/// A codec's name in the records.
pub fn codec_name(c: Codec) -> &'static str {
    // Exhaustive: a new codec must get its name here.
    match c {
        Codec::Ps | Codec::H264 | Codec::H265 | Codec::Mp2t | Codec::Jpeg => {}
        Codec::Pcmu | Codec::Pcma | Codec::Aac | Codec::Unknown => {}
    }
    CODECS
        .iter()
        .find(|(k, _)| *k == c)
        .map_or("unknown", |(_, n)| n)
}

/// The codec a record names; `None`: one this build does not know.
pub fn codec_of(name: &str) -> Option<Codec> {
    CODECS.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecRecord {
    pub ssrc: Option<u32>,
    /// (payload type, codec, clock rate).
    pub formats: Vec<(u8, String, u32)>,
    #[serde(default)]
    pub in_band_parameter_sets: bool,
    #[serde(default)]
    pub rtcp_mux: bool,
    #[serde(default)]
    pub rtcp: bool,
}

impl SpecRecord {
    pub fn of(spec: &StreamSpec) -> SpecRecord {
        SpecRecord {
            ssrc: spec.ssrc,
            formats: spec
                .formats()
                .iter()
                .map(|f| (f.pt, codec_name(f.codec).to_string(), f.clock_rate))
                .collect(),
            in_band_parameter_sets: spec.in_band_parameter_sets,
            rtcp_mux: spec.rtcp_mux,
            rtcp: spec.rtcp,
        }
    }

    /// The spec back; `Err` names a codec this build does not know.
    pub fn spec(&self) -> Result<StreamSpec, String> {
        let mut spec = StreamSpec::new(self.ssrc);
        for (pt, name, clock) in &self.formats {
            let codec = codec_of(name)
                .ok_or_else(|| format!("unknown codec {name:?} in the state store"))?;
            spec = spec.with(*pt, codec, *clock);
        }
        spec.in_band_parameter_sets = self.in_band_parameter_sets;
        spec.rtcp_mux = self.rtcp_mux;
        spec.rtcp = self.rtcp;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_goes_through_a_record_unchanged() {
        let mut spec = StreamSpec::new(Some(0x0100_0001))
            .with(96, Codec::Ps, 90000)
            .with(98, Codec::H264, 90000)
            .with(0, Codec::Pcmu, 8000);
        spec.rtcp_mux = true;
        let json = serde_json::to_string(&SpecRecord::of(&spec)).unwrap();
        let back: SpecRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.spec().unwrap(), spec);
        for (c, n) in CODECS {
            assert_eq!(codec_name(c), n);
            assert_eq!(codec_of(n), Some(c));
        }
        let mut bad = back.clone();
        bad.formats[0].1 = "vp9".into();
        assert!(bad.spec().unwrap_err().contains("vp9"));
    }
}

//! A route's media validation rule ([`crate::media::Rule`]) as the state store holds it, so
//! that a copy validates exactly as the original did: the negotiated formats and SSRC, the
//! policy, `enforce` or count. Every field is named here (no `..`): a field added to the
//! rule fails to compile until it is carried too.

use serde::{Deserialize, Serialize};

use crate::media::{Policy, Rule};
use crate::routes::spec_record::SpecRecord;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleRecord {
    pub enforce: bool,
    pub ssrc: Option<u32>,
    /// (payload type, codec, clock rate).
    pub formats: Vec<(u8, String, u32)>,
    pub policy: PolicyRecord,
    /// The spec's flags ([`StreamSpec`]); absent in a record of an earlier release: off.
    #[serde(default)]
    pub in_band_parameter_sets: bool,
    #[serde(default)]
    pub rtcp_mux: bool,
    #[serde(default)]
    pub rtcp: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRecord {
    pub allow_extension: bool,
    pub allow_padding: bool,
    pub allow_unknown_codec: bool,
    pub allow_filler: bool,
    pub sei_user_data_max: u16,
    pub sei_user_data_per_s: u32,
    pub h264_nal_types: u32,
    pub h265_nal_types: u64,
    pub ssrc_relearn_after_ms: u64,
    pub max_seq_gap: u16,
    pub max_audio_ptime_ms: u32,
    pub ts_startup_grace: u16,
    /// The `strip` action; absent in a record of an earlier release (off), and left out
    /// when off so that a record without it stays readable by that release.
    #[serde(default, skip_serializing_if = "is_false")]
    pub strip: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl RuleRecord {
    pub fn of(rule: &Rule) -> RuleRecord {
        let Rule {
            enforce,
            spec,
            policy,
        } = *rule;
        let Policy {
            allow_extension,
            allow_padding,
            allow_unknown_codec,
            allow_filler,
            sei_user_data_max,
            sei_user_data_per_s,
            h264_nal_types,
            h265_nal_types,
            ssrc_relearn_after_ms,
            max_seq_gap,
            max_audio_ptime_ms,
            ts_startup_grace,
            strip,
        } = policy;
        let SpecRecord {
            ssrc,
            formats,
            in_band_parameter_sets,
            rtcp_mux,
            rtcp,
        } = SpecRecord::of(&spec);
        RuleRecord {
            enforce,
            ssrc,
            formats,
            in_band_parameter_sets,
            rtcp_mux,
            rtcp,
            policy: PolicyRecord {
                allow_extension,
                allow_padding,
                allow_unknown_codec,
                allow_filler,
                sei_user_data_max,
                sei_user_data_per_s,
                h264_nal_types,
                h265_nal_types,
                ssrc_relearn_after_ms,
                max_seq_gap,
                max_audio_ptime_ms,
                ts_startup_grace,
                strip,
            },
        }
    }

    /// The rule back; `Err` names a codec this build does not know (the copy is then not
    /// installed rather than installed unvalidated).
    pub fn rule(&self) -> Result<Rule, String> {
        let spec = SpecRecord {
            ssrc: self.ssrc,
            formats: self.formats.clone(),
            in_band_parameter_sets: self.in_band_parameter_sets,
            rtcp_mux: self.rtcp_mux,
            rtcp: self.rtcp,
        }
        .spec()?;
        let p = &self.policy;
        Ok(Rule {
            enforce: self.enforce,
            spec,
            policy: Policy {
                allow_extension: p.allow_extension,
                allow_padding: p.allow_padding,
                allow_unknown_codec: p.allow_unknown_codec,
                allow_filler: p.allow_filler,
                sei_user_data_max: p.sei_user_data_max,
                sei_user_data_per_s: p.sei_user_data_per_s,
                h264_nal_types: p.h264_nal_types,
                h265_nal_types: p.h265_nal_types,
                ssrc_relearn_after_ms: p.ssrc_relearn_after_ms,
                max_seq_gap: p.max_seq_gap,
                max_audio_ptime_ms: p.max_audio_ptime_ms,
                ts_startup_grace: p.ts_startup_grace,
                strip: p.strip,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{Codec, StreamSpec};

    #[test]
    fn a_rule_goes_through_the_store_unchanged() {
        let rule = Rule {
            enforce: true,
            spec: StreamSpec::new(Some(0x0100_0001))
                .with(96, Codec::Ps, 90000)
                .with(98, Codec::H264, 90000)
                .with(0, Codec::Pcmu, 8000),
            policy: Policy {
                allow_padding: true,
                max_seq_gap: 77,
                strip: true,
                ..Policy::default()
            },
        };
        let json = serde_json::to_string(&RuleRecord::of(&rule)).unwrap();
        let back: RuleRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.rule().unwrap(), rule);
        let mut bad = back.clone();
        bad.formats[0].1 = "vp9".into();
        assert!(bad.rule().unwrap_err().contains("vp9"));
    }
}

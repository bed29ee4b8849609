//! The text writer of one exposition ([`Out`]): `# HELP`/`# TYPE` lines from the declared
//! families, samples with escaped label values, and the shapes repeated across families
//! (rx/tx packets, one sample per drop reason, histogram buckets).

use std::fmt::Write as _;

use crate::stats::{DropReason, Snapshot};

use super::{FAMILIES, HA_FAMILIES, SPLIT_FAMILIES};

/// One exposition being written.
pub(super) struct Out {
    pub(super) text: String,
}

impl Out {
    pub(super) fn family(&mut self, name: &str) {
        let (n, kind, help) = FAMILIES
            .iter()
            .chain(SPLIT_FAMILIES)
            .chain(HA_FAMILIES)
            .find(|f| f.0 == name)
            .copied()
            .unwrap_or((name, "untyped", ""));
        let _ = writeln!(self.text, "# HELP {n} {help}\n# TYPE {n} {kind}");
    }

    /// The `_bucket`, `_sum` and `_count` samples of one histogram series labelled `label`.
    pub(super) fn histogram(
        &mut self,
        fam: &str,
        label: (&str, &str),
        h: &crate::stats::Histogram,
    ) {
        let (buckets, sum) = h.snapshot();
        for (le, n) in &buckets {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            self.sample(&format!("{fam}_bucket"), &[label, ("le", &le)], n);
        }
        self.sample(&format!("{fam}_sum"), &[label], format!("{sum:.6}"));
        let count = buckets.last().map_or(0, |b| b.1);
        self.sample(&format!("{fam}_count"), &[label], count);
    }

    pub(super) fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl std::fmt::Display,
    ) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    pub(super) fn packets(&mut self, name: &str, labels: &[(&str, &str)], s: &Snapshot) {
        for (dir, v) in [("rx", s.rx_packets), ("tx", s.tx_packets)] {
            let mut l = labels.to_vec();
            l.push(("direction", dir));
            self.sample(name, &l, v);
        }
    }

    pub(super) fn drops(&mut self, name: &str, labels: &[(&str, &str)], s: &Snapshot) {
        for r in DropReason::ALL {
            let mut l = labels.to_vec();
            l.push(("reason", r.name()));
            self.sample(name, &l, s.drop_count(r));
        }
    }
}

/// Label values escape backslash, double quote and newline.
pub(super) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

//! Metrics that a Prometheus server and Grafana accept: a live scrape of `vgate run` (SIP
//! and RTSP routes, per-stream metrics, traffic) passes `promtool check metrics`; the alert
//! rules pass `promtool check rules` and their unit tests (`promtool test rules`); every
//! metric a dashboard query or an alert names is in the live scrape.
//!
//! Exception: the split-appliance panels and alerts read families only a split half exports
//! (`vgate_link_*`, `vgate_split_*`). The single-box vgate of the first test checks those
//! names against the families the metrics module declares for a split half
//! (`vgate::control::metrics::SPLIT_FAMILIES`); `split_half_scrape_feeds_the_split_panel_and_alerts`
//! then scrapes a running split half (the namespace bed of tests/common/split.rs; root) and
//! checks them against that live scrape, which passes `promtool check metrics` too.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::proc::run_ok;
use common::split::{half_config, start_half, SplitBed};
use common::vgate::{loopback_cam_route, loopback_config, loopback_gb_route, Vgate};

const NET: u8 = 31;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn config() -> String {
    let (net, gb, cam) = (NET, loopback_gb_route(NET), loopback_cam_route(NET));
    loopback_config(net, &[], &[])
        + &format!(
            r#"per_stream_metrics = true
[security]
source_validation = "latch"
{gb}[[signaling_route]]
name = "cam"
type = "rtsp"
transport = "tcp"
listen_domain = "b"
listen_port = 8554
upstream = "127.0.{net}.1:8554"
[[signaling_route.paths]]
prefix = "/cam1"
upstream_path = "/test"
{cam}"#
        )
}

fn scrape() -> String {
    let mut resp = ureq::get(&format!("http://127.0.{NET}.1:9941/metrics"))
        .call()
        .expect("the admin interface answers");
    resp.body_mut().read_to_string().unwrap()
}

/// The families a scrape declares (`# TYPE name kind`).
fn families(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The metric names a PromQL expression reads: identifiers that are not functions (followed
/// by `(`), not keywords, not label names or values (inside `{}`), not durations (`[5m]`),
/// not grouping labels (`by (...)`) and not Grafana variables (`$__rate_interval`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    /// The keywords a grouping label list follows, then the other keywords.
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "inf", "nan"];
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    let mut after_grouping = false;
    while i < b.len() {
        let c = b[i];
        match c {
            b'{' | b'[' | b'"' => {
                let close = match c {
                    b'{' => b'}',
                    b'[' => b']',
                    _ => b'"',
                };
                i += 1;
                while i < b.len() && b[i] != close {
                    i += 1;
                }
                i += 1;
            }
            b'(' if after_grouping => {
                while i < b.len() && b[i] != b')' {
                    i += 1;
                }
                i += 1;
                after_grouping = false;
            }
            b'$' => {
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let mut j = i;
                while j < b.len() && b[j] == b' ' {
                    j += 1;
                }
                // A function call, or an aggregation with its grouping first (`sum by (x) (`).
                let next: String = expr[j..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                let is_call = (j < b.len() && b[j] == b'(') || next == "by" || next == "without";
                let lower = word.to_ascii_lowercase();
                if GROUPING.contains(&lower.as_str()) {
                    after_grouping = true;
                    i = j;
                } else if !is_call && !KEYWORDS.contains(&lower.as_str()) {
                    out.insert(word.to_string());
                }
            }
            c if c.is_ascii_digit() => {
                // A number, possibly a duration or in exponent form: skip it whole.
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Every `expr` of the Grafana dashboard.
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if k == "expr" {
                        out.push(v.as_str().expect("expr is a string").to_string());
                    } else {
                        walk(v, out);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(dashboard, &mut exprs);
    exprs
}

/// Every `expr:` of the rules file, block scalars (`expr: |`) included.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if let Some((indent, rest)) = l.split_once("expr:") {
            let rest = rest.trim();
            if rest == "|" || rest == ">" {
                let base = indent.len();
                let mut e = String::new();
                i += 1;
                while i < lines.len()
                    && (lines[i].trim().is_empty()
                        || lines[i].len() - lines[i].trim_start().len() > base)
                {
                    e.push_str(lines[i].trim());
                    e.push(' ');
                    i += 1;
                }
                exprs.push(e);
                continue;
            }
            exprs.push(rest.to_string());
        }
        i += 1;
    }
    exprs
}

#[test]
fn promql_names_are_found() {
    let n = metric_names(
        r#"sum by (channel, reason) (rate(vgate_x_total{instance=~"$instance",a="b c"}[$__rate_interval])) / clamp_min(vgate_y + up, 1) > 0.01"#,
    );
    assert_eq!(
        n.into_iter().collect::<Vec<_>>(),
        ["up", "vgate_x_total", "vgate_y"]
    );
    let y = "  - alert: A\n    expr: |\n      rate(a_total[5m])\n        / b\n    for: 5m\n  - alert: B\n    expr: c == 0\n";
    assert_eq!(rule_exprs(y), ["rate(a_total[5m]) / b ", "c == 0"]);
}

#[test]
fn live_scrape_passes_promtool_and_feeds_every_dashboard_and_alert() {
    require!(false, &[("promtool", "prometheus")]);
    let vg = Vgate::start(&config());
    // A few RTP packets through the static route, so per-stream series carry an SSRC.
    let rx = UdpSocket::bind(format!("127.0.{NET}.2:40000")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let tx = UdpSocket::bind(format!("127.0.{NET}.1:0")).unwrap();
    let mut buf = [0u8; 2048];
    for seq in [1u16, 2, 4, 3, 3] {
        let mut p = vec![0x80, 96];
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0x12, 0x34]);
        p.extend_from_slice(&[0u8; 100]);
        tx.send_to(&p, format!("127.0.{NET}.1:20000")).unwrap();
        rx.recv_from(&mut buf).expect("the relay forwards");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut text = scrape();
    while !text.contains("vgate_rtp_duplicate_packets_total{channel=\"forward\"} 1")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        text = scrape();
    }
    assert!(
        text.contains("vgate_rtp_reordered_packets_total{channel=\"forward\"} 1"),
        "{text}"
    );
    assert!(text.contains("ssrc=\"0x00001234\""), "{text}");
    assert!(text.contains("vgate_build_info{version=\""), "{text}");
    // Time to first packet: declared and exported per signaled session kind (observations
    // are tested in routes::tests and sip_golden, where a call route gets traffic).
    for kind in ["sip", "rtsp"] {
        assert!(
            text.contains(&format!(
                "vgate_media_first_packet_seconds_count{{kind=\"{kind}\"}} "
            )),
            "{text}"
        );
    }

    // promtool lints the exposition as Prometheus would ingest it.
    promtool_check_metrics(&text);
    let have = families(&text);
    assert!(have.len() > 30, "{have:?}");

    // The dashboard: valid JSON whose every query reads metrics vgate exports.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("monitoring/grafana/vgate.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let exprs = dash_and_rules(&dash);
    assert!(exprs.len() > 20, "{exprs:?}");
    let split: BTreeSet<&str> = vgate::control::metrics::SPLIT_FAMILIES
        .iter()
        .map(|(name, _, _)| *name)
        .collect();
    let mut split_used = BTreeSet::new();
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no metric in {e}");
        for n in names {
            // `up` is the scrape's own health, written by Prometheus; a histogram's series
            // are its family name plus _bucket, _sum or _count.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .filter(|f| text.contains(&format!("# TYPE {f} histogram\n")))
                .unwrap_or(&n);
            if !have.contains(family) && split.contains(family) {
                // Only a split half exports it (see the module doc).
                split_used.insert(family.to_string());
                continue;
            }
            assert!(
                n == "up" || have.contains(family),
                "{n} (in `{e}`) is not in a live scrape of vgate nor a split half's family"
            );
        }
    }
    // The split panel and alerts read the peer state, the link traffic and FEC losses.
    for f in [
        "vgate_split_peer_up",
        "vgate_split_signal_total",
        "vgate_link_bytes_total",
        "vgate_link_packets_total",
        "vgate_link_fec_total",
        "vgate_link_drops_total",
        "vgate_link_wrong_direction_packets",
    ] {
        assert!(
            split_used.contains(f),
            "no dashboard query or alert reads {f}"
        );
    }
    drop(vg);
}

/// `promtool check metrics` on an exposition: no complaint at all.
fn promtool_check_metrics(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn split_half_scrape_feeds_the_split_panel_and_alerts() {
    let test = "split_half_scrape_feeds_the_split_panel_and_alerts";
    require!(
        test,
        true,
        &[
            ("ip", "iproute2"),
            ("nft", "nftables"),
            ("promtool", "prometheus"),
        ],
    );
    let bed = SplitBed::up();
    // Half A alone: its links and signaling agent export every split family (the peer
    // half need not run; vgate_split_peer_up is then 0).
    let half = start_half(&bed, "a", &half_config(&bed, "a", "8+2", "8+2", ""));
    let text = common::split::admin_get(&bed, "a", "/metrics");
    promtool_check_metrics(&text);
    let have = families(&text);
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("monitoring/grafana/vgate.json")).unwrap(),
    )
    .unwrap();
    let split: BTreeSet<&str> = vgate::control::metrics::SPLIT_FAMILIES
        .iter()
        .map(|(name, _, _)| *name)
        .collect();
    let mut used = BTreeSet::new();
    for e in dash_and_rules(&dash) {
        for n in metric_names(&e) {
            if split.contains(n.as_str()) {
                assert!(
                    have.contains(&n),
                    "{n} (in `{e}`) is not in a live scrape of a split half:\n{text}"
                );
                used.insert(n);
            }
        }
    }
    assert!(used.len() >= 6, "{used:?}");
    drop(half);
}

fn dash_and_rules(dash: &serde_json::Value) -> Vec<String> {
    let rules =
        std::fs::read_to_string(repo().join("monitoring/prometheus/vgate-alerts.yml")).unwrap();
    let mut all = dashboard_exprs(dash);
    let r = rule_exprs(&rules);
    assert!(r.len() >= 5, "{r:?}");
    all.extend(r);
    all
}

#[test]
fn alert_rules_check_and_fire() {
    require!(false, &[("promtool", "prometheus")]);
    let dir = repo().join("monitoring/prometheus");
    for args in [
        &["check", "rules", "vgate-alerts.yml"][..],
        &["test", "rules", "vgate-alerts.test.yml"][..],
    ] {
        run_ok(
            Command::new("promtool").args(args).current_dir(&dir),
            &format!("promtool {args:?}"),
        );
    }
}

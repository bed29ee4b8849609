//! Plain-text tables of the admin listings, for `vgate routes list`, `sessions list` and
//! `registrations` (`--json` prints the listing as it came instead). Columns are as wide as
//! their widest cell, like `ip -br` or `kamcmd ul.dump`'s short form.

use std::fmt::Write as _;

use serde_json::Value;

/// Left-aligned columns separated by two spaces; `-` for an empty cell.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count().max(1));
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let c = if c.is_empty() { "-" } else { c };
            if i + 1 < width.len() {
                let _ = write!(l, "{c:<w$}  ", w = width[i]);
            } else {
                l.push_str(c);
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

/// A JSON value as a cell: strings bare, null empty.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// `GET /api/v1/routes` as a table.
pub fn routes(v: &Value) -> String {
    let rows: Vec<Vec<String>> = list(v, "routes")
        .iter()
        .map(|r| {
            let c = &r["counters"];
            let drops: u64 = c["drops"]
                .as_object()
                .map(|d| d.values().map(count).sum())
                .unwrap_or(0);
            let source = match (&r["latched_source"], &r["expect_source"]) {
                (Value::String(l), _) => format!("{l} (latched)"),
                (_, e) => cell(e),
            };
            vec![
                cell(&r["channel"]),
                cell(&r["port"]),
                cell(&r["name"]),
                cell(&r["destination"]),
                cell(&r["source_validation"]),
                source,
                cell(&r["session"]),
                count(&c["rx_packets"]).to_string(),
                count(&c["tx_packets"]).to_string(),
                drops.to_string(),
                count(&r["rtp"]["lost"]).to_string(),
            ]
        })
        .collect();
    render(
        &[
            "CHANNEL",
            "PORT",
            "NAME",
            "DESTINATION",
            "VALIDATION",
            "SOURCE",
            "SESSION",
            "RX",
            "TX",
            "DROPS",
            "LOST",
        ],
        &rows,
    )
}

/// `GET /api/v1/sessions` as a table.
pub fn sessions(v: &Value) -> String {
    let join = |v: &Value| {
        v.as_array()
            .map(|a| a.iter().map(cell).collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    };
    let rows: Vec<Vec<String>> = list(v, "sessions")
        .iter()
        .map(|s| {
            vec![
                cell(&s["id"]),
                cell(&s["kind"]),
                format!("{}s", count(&s["age_seconds"])),
                join(&s["ports"]),
                join(&s["routes"]),
                cell(&s["label"]),
            ]
        })
        .collect();
    render(&["ID", "KIND", "AGE", "PORTS", "ROUTES", "LABEL"], &rows)
}

/// `GET /api/v1/registrations` as a table.
pub fn registrations(v: &Value) -> String {
    let rows: Vec<Vec<String>> = list(v, "registrations")
        .iter()
        .map(|r| {
            vec![
                cell(&r["route"]),
                cell(&r["id"]),
                cell(&r["domain"]),
                cell(&r["contact"]),
                cell(&r["peer"]),
                cell(&r["binding"]),
                format!("{}s", count(&r["expires_in_seconds"])),
            ]
        })
        .collect();
    render(
        &[
            "ROUTE", "ID", "DOMAIN", "CONTACT", "PEER", "BINDING", "EXPIRES",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_align_and_empty_cells_show_a_dash() {
        let t = render(
            &["A", "LONG"],
            &[
                vec!["xyz".into(), "1".into()],
                vec![String::new(), "22".into()],
            ],
        );
        assert_eq!(t, "A    LONG\nxyz  1\n-    22\n");
    }

    #[test]
    fn routes_table_sums_drops() {
        let v = json!({ "routes": [{
            "channel": "forward", "port": 30000, "name": "cam1", "destination": "10.0.0.2:5004",
            "source_validation": "latch", "expect_source": null, "latched_source": "10.0.0.9:4000",
            "session": 3, "counters": { "rx_packets": 10, "tx_packets": 9,
            "drops": { "no_route": 1, "source": 2 } }, "rtp": { "lost": 4 },
        }]});
        let t = routes(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("CHANNEL  PORT   NAME"));
        let cells: Vec<&str> = lines[1]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells,
            [
                "forward",
                "30000",
                "cam1",
                "10.0.0.2:5004",
                "latch",
                "10.0.0.9:4000 (latched)",
                "3",
                "10",
                "9",
                "3",
                "4"
            ]
        );
    }

    #[test]
    fn sessions_table() {
        let v = json!({ "sessions": [{ "id": 7, "kind": "sip", "label": "call x",
            "age_seconds": 12, "ports": ["a:30000", "b:40000"], "routes": ["forward:30000"] }]});
        assert_eq!(
            sessions(&v),
            "ID  KIND  AGE  PORTS            ROUTES         LABEL\n\
             7   sip   12s  a:30000,b:40000  forward:30000  call x\n"
        );
    }
}

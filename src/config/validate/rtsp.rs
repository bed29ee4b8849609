//! The RTSP options of a signaling route: path prefixes, upstream paths, users and
//! credentials.

use std::net::SocketAddrV4;

use toml::Spanned;

use crate::config::check::{invalid, parse_sockaddr, Invalid};
use crate::config::raw::{RawSecret, RawSignalingRoute};
use crate::config::{Domain, DomainId, RtspOptions, RtspPath, Secret, Transport, UserPass};

use super::fields::check_far_side;
use super::Result;

pub(super) fn rtsp_options(
    i: usize,
    r: &RawSignalingRoute,
    domains: &[Domain; 2],
    listen_domain: DomainId,
    upstream: SocketAddrV4,
) -> Result<RtspOptions> {
    let key = |k: &str| format!("signaling_route[{i}].{k}");
    if r.transport != Transport::Tcp {
        return Err(Invalid {
            span: Some(r.name.span()),
            key: key("transport"),
            message: "RTSP routes run over TCP: set transport = \"tcp\"".into(),
        });
    }
    let route_credentials = credentials(
        r.upstream_username.as_ref(),
        r.upstream_password.as_ref(),
        &key("upstream_username"),
        &key("upstream_password"),
    )?;
    let mut paths: Vec<RtspPath> = Vec::new();
    for (j, p) in r.paths.iter().enumerate() {
        let pkey = |k: &str| format!("signaling_route[{i}].paths[{j}].{k}");
        let prefix = rtsp_path(&p.prefix, &pkey("prefix"))?;
        let up = match &p.upstream {
            Some(u) => {
                let addr = parse_sockaddr(u, &pkey("upstream"))?;
                check_far_side(
                    domains,
                    listen_domain,
                    *addr.ip(),
                    u,
                    &pkey("upstream"),
                    "upstream",
                )?;
                addr
            }
            None => upstream,
        };
        let upstream_path = match &p.upstream_path {
            Some(u) => rtsp_path(u, &pkey("upstream_path"))?,
            None => "/".to_string(),
        };
        let own = credentials(
            p.upstream_username.as_ref(),
            p.upstream_password.as_ref(),
            &pkey("upstream_username"),
            &pkey("upstream_password"),
        )?;
        let norm = |s: &str| s.trim_end_matches('/').to_string();
        if paths.iter().any(|q| norm(&q.prefix) == norm(&prefix)) {
            return Err(invalid(
                &p.prefix,
                pkey("prefix"),
                format!(
                    "the prefix \"{prefix}\" is listed twice; each prefix maps to one upstream"
                ),
            ));
        }
        paths.push(RtspPath {
            prefix,
            upstream: up,
            upstream_path,
            credentials: own.or_else(|| route_credentials.clone()),
        });
    }
    if paths.is_empty() {
        paths.push(RtspPath {
            prefix: "/".into(),
            upstream,
            upstream_path: "/".into(),
            credentials: route_credentials,
        });
    }
    let mut client_users: Vec<UserPass> = Vec::new();
    for (j, u) in r.client_users.iter().enumerate() {
        let ukey = format!("signaling_route[{i}].client_users[{j}].username");
        let user = username(&u.username, &ukey)?;
        if client_users.iter().any(|c| c.username == user) {
            return Err(invalid(&u.username, ukey, "this username is listed twice"));
        }
        client_users.push(UserPass {
            username: user,
            password: Secret::new(u.password.get_ref().0.clone()),
        });
    }
    let client_realm = match &r.client_realm {
        Some(s) => {
            let v = s.get_ref();
            if v.is_empty()
                || v.len() > 64
                || v.chars().any(|c| c.is_control() || c == '"' || c == '\\')
            {
                return Err(invalid(
                    s,
                    key("client_realm"),
                    "a realm is 1-64 printable characters without quotes or backslashes",
                ));
            }
            v.clone()
        }
        None => "vgate".into(),
    };
    let session_timeout = match &r.session_timeout {
        None => 60,
        Some(s) if (1..=3600).contains(s.get_ref()) => *s.get_ref() as u32,
        Some(s) => {
            return Err(invalid(
                s,
                key("session_timeout"),
                "must be between 1 and 3600 seconds",
            ))
        }
    };
    let request_timeout = match &r.request_timeout {
        None => 10,
        Some(s) if (1..=600).contains(s.get_ref()) => *s.get_ref() as u32,
        Some(s) => {
            return Err(invalid(
                s,
                key("request_timeout"),
                "seconds a client may take to send one whole request: a number from 1 to 600",
            ))
        }
    };
    let max_sessions_per_source = match &r.max_sessions_per_source {
        None => crate::config::RTSP_SESSIONS_PER_SOURCE,
        Some(s) if (1..=10_000).contains(s.get_ref()) => *s.get_ref() as usize,
        Some(s) => {
            return Err(invalid(
                s,
                key("max_sessions_per_source"),
                "connections with a live session per source: a number from 1 to 10000",
            ))
        }
    };
    Ok(RtspOptions {
        paths,
        client_users,
        client_realm,
        session_timeout,
        request_timeout,
        max_sessions_per_source,
    })
}

/// A URL path prefix: starts with `/`, printable, no spaces, no dot segments.
fn rtsp_path(s: &Spanned<String>, key: &str) -> Result<String> {
    let v = s.get_ref();
    let ok = v.starts_with('/')
        && v.len() <= 256
        && v.chars()
            .all(|c| c.is_ascii_graphic() && !"?#%\\".contains(c))
        && !v.split('/').any(|seg| seg == "." || seg == "..");
    if !ok {
        return Err(invalid(
            s,
            key,
            "expected a URL path such as \"/cam1\": starts with '/', no spaces, '?', '#', '%' or dot segments",
        ));
    }
    Ok(v.clone())
}

fn username(s: &Spanned<String>, key: &str) -> Result<String> {
    let v = s.get_ref();
    if v.is_empty() || v.len() > 128 || v.chars().any(|c| c.is_control() || c == ':') {
        return Err(invalid(
            s,
            key,
            "a username is 1-128 characters, no ':' and no control characters",
        ));
    }
    Ok(v.clone())
}

/// Both or neither of a username and password. Messages never repeat a password.
fn credentials(
    user: Option<&Spanned<String>>,
    pass: Option<&Spanned<RawSecret>>,
    user_key: &str,
    pass_key: &str,
) -> Result<Option<UserPass>> {
    match (user, pass) {
        (None, None) => Ok(None),
        (Some(u), Some(p)) => {
            let username = username(u, user_key)?;
            if p.get_ref().0.chars().any(|c| c.is_control()) {
                return Err(invalid(
                    p,
                    pass_key,
                    "the password contains control characters",
                ));
            }
            Ok(Some(UserPass {
                username,
                password: Secret::new(p.get_ref().0.clone()),
            }))
        }
        (Some(u), None) => Err(invalid(
            u,
            pass_key,
            "a username needs a password beside it",
        )),
        (None, Some(p)) => Err(invalid(
            p,
            user_key,
            "a password needs a username beside it",
        )),
    }
}

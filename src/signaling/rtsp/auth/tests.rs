use super::*;

fn digest(c: &Challenge<'_>) -> DigestChallenge<'static> {
    match c {
        Challenge::Digest(d) => DigestChallenge {
            realm: Cow::Owned(d.realm.to_string()),
            nonce: Cow::Owned(d.nonce.to_string()),
            opaque: d.opaque.as_ref().map(|o| Cow::Owned(o.to_string())),
            ..*d
        },
        other => panic!("not digest: {other:?}"),
    }
}

/// Pulls `response="..."` out of an Authorization value.
fn response_of(authz: &str) -> &str {
    let start = authz.find("response=\"").unwrap() + 10;
    &authz[start..start + authz[start..].find('"').unwrap()]
}

const RFC7616_NONCE: &str = "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v";
const RFC7616_OPAQUE: &str = "FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS";
const RFC7616_CNONCE: &str = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ";

fn rfc7616(alg: &str) -> String {
    format!(
            "Digest realm=\"http-auth@example.org\", qop=\"auth, auth-int\", algorithm={alg}, nonce=\"{RFC7616_NONCE}\", opaque=\"{RFC7616_OPAQUE}\""
        )
}

#[test]
fn rfc7616_section_3_9_1_vectors() {
    let creds = Credentials::new("Mufasa", "Circle of Life");
    let cn = ClientNonce {
        cnonce: RFC7616_CNONCE,
        nc: 1,
    };
    for (alg, want) in [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        (
            "SHA-256",
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1",
        ),
    ] {
        let header = rfc7616(alg);
        let challenges = parse_www_authenticate(&header).unwrap();
        let d = digest(&challenges[0]);
        assert!(d.qop_auth);
        assert_eq!(d.opaque.as_deref(), Some(RFC7616_OPAQUE));
        let authz = authorization(&challenges[0], &creds, "GET", "/dir/index.html", cn).unwrap();
        assert_eq!(response_of(&authz), want, "{alg}");
        assert!(authz.contains(
            "qop=auth, nc=00000001, cnonce=\"f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ\""
        ));
        assert!(authz.contains(&format!("algorithm={alg}")));
    }
}

#[test]
fn rfc7616_both_challenges_in_one_response_prefers_sha256() {
    let sha = rfc7616("SHA-256");
    let md5 = rfc7616("MD5");
    let joined = format!("{sha}, {md5}");
    let challenges = parse_www_authenticate(&joined).unwrap();
    assert_eq!(challenges.len(), 2);
    let chosen = digest(choose_challenge(&challenges).unwrap());
    assert_eq!(chosen.algorithm, Algorithm::Sha256);
}

#[test]
fn rfc2617_section_3_5_vector() {
    let header = "Digest realm=\"testrealm@host.com\", qop=\"auth,auth-int\", nonce=\"dcd98b7102dd2f0e8b11d0f600bfb0c093\", opaque=\"5ccc069c403ebaf9f0171e9517f40e41\"";
    let challenges = parse_www_authenticate(header).unwrap();
    let creds = Credentials::new("Mufasa", "Circle Of Life");
    let authz = authorization(
        &challenges[0],
        &creds,
        "GET",
        "/dir/index.html",
        ClientNonce {
            cnonce: "0a4f113b",
            nc: 1,
        },
    )
    .unwrap();
    assert_eq!(response_of(&authz), "6629fae49393a05397450978507c4ef1");
    assert!(
        !authz.contains("algorithm"),
        "not echoed when the server did not name it"
    );
    assert!(authz.contains("opaque=\"5ccc069c403ebaf9f0171e9517f40e41\""));
}

#[test]
fn digest_without_qop_rfc2069_style() {
    // Typical IP camera challenge: no qop, no algorithm.
    let challenges = parse_www_authenticate("Digest realm=\"IP Camera\", nonce=\"abc\"").unwrap();
    let authz = authorization(
        &challenges[0],
        &Credentials::new("admin", "pw"),
        "DESCRIBE",
        "rtsp://10.0.0.5:554/live",
        ClientNonce { cnonce: "x", nc: 1 },
    )
    .unwrap();
    let ha1 = Algorithm::Md5.hash_hex(&["admin", "IP Camera", "pw"]);
    let ha2 = Algorithm::Md5.hash_hex(&["DESCRIBE", "rtsp://10.0.0.5:554/live"]);
    assert_eq!(
        response_of(&authz),
        Algorithm::Md5.hash_hex(&[&ha1, "abc", &ha2])
    );
    assert!(!authz.contains("cnonce") && !authz.contains("qop"));
}

#[test]
fn basic_and_mixed_challenges() {
    let v = "Basic realm=\"Live\", Digest realm=\"Live\", nonce=\"n\", algorithm=MD5-sess, Newauth realm=\"x\", Negotiate abc==";
    let c = parse_www_authenticate(v).unwrap();
    assert_eq!(c.len(), 4);
    assert_eq!(
        c[0],
        Challenge::Basic {
            realm: "Live".into()
        }
    );
    assert_eq!(digest(&c[1]).algorithm, Algorithm::Md5Sess);
    assert!(matches!(
        c[2],
        Challenge::Unsupported {
            scheme: "Newauth",
            ..
        }
    ));
    assert!(matches!(
        c[3],
        Challenge::Unsupported {
            scheme: "Negotiate",
            ..
        }
    ));
    let basic = authorization(
        &c[0],
        &Credentials::new("Aladdin", "open sesame"),
        "OPTIONS",
        "*",
        ClientNonce { cnonce: "", nc: 1 },
    )
    .unwrap();
    assert_eq!(basic, "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
    assert_eq!(choose_challenge(&c[..1]), Some(&c[0]));
}

#[test]
fn unsupported_and_malformed_challenges() {
    let c = parse_www_authenticate("Digest realm=\"r\", nonce=\"n\", algorithm=SHA-1").unwrap();
    assert!(matches!(
        &c[0],
        Challenge::Unsupported {
            reason: RtspError::UnsupportedAlgorithm,
            ..
        }
    ));
    let c = parse_www_authenticate("Digest realm=\"r\", nonce=\"n\", qop=\"auth-int\"").unwrap();
    assert!(matches!(
        &c[0],
        Challenge::Unsupported {
            reason: RtspError::UnsupportedQop,
            ..
        }
    ));
    let c = parse_www_authenticate("Digest realm=\"r\"").unwrap();
    assert!(matches!(
        &c[0],
        Challenge::Unsupported {
            reason: RtspError::MissingAuthParam { param: "nonce", .. },
            ..
        }
    ));
    assert_eq!(choose_challenge(&c), None);
    for bad in [
        "",
        "  ,  ",
        "Digest realm=\"r",
        "Digest realm=\"r\", realm=\"s\", nonce=\"n\"",
        "Digest realm=\"a\" ;",
    ] {
        assert!(parse_www_authenticate(bad).is_err(), "{bad:?}");
    }
    let c = parse_www_authenticate(r#"Digest realm="a \"q\" b", nonce="n""#).unwrap();
    assert_eq!(digest(&c[0]).realm, "a \"q\" b");
}

#[test]
fn debug_hides_secrets() {
    let c = Credentials::new("admin", "hunter2");
    assert!(!format!("{c:?}").contains("hunter2"));
    let v = DigestVerifier::new("vgate", [7; 32], vec![c]);
    let dbg = format!("{v:?}");
    assert!(!dbg.contains("hunter2") && !dbg.contains("7, 7"));
}

fn verifier() -> DigestVerifier {
    DigestVerifier::new("vgate", [42; 32], vec![Credentials::new("alice", "s3cret")])
}

/// What a client does: parse our challenge and answer it.
fn answer(challenge: &str, user: &str, pass: &str, method: &str, uri: &str) -> String {
    let c = parse_www_authenticate(challenge).unwrap();
    authorization(
        &c[0],
        &Credentials::new(user, pass),
        method,
        uri,
        ClientNonce {
            cnonce: "c1",
            nc: 1,
        },
    )
    .unwrap()
}

#[test]
fn verifier_accepts_correct_answers_for_each_offered_algorithm() {
    let v = verifier();
    let challenges = v.challenges(1000, [1; 16], false);
    assert_eq!(challenges.len(), 2);
    assert!(challenges[0].contains("algorithm=SHA-256") && challenges[1].contains("algorithm=MD5"));
    for ch in &challenges {
        let authz = answer(ch, "alice", "s3cret", "DESCRIBE", "rtsp://gw/cam1");
        assert_eq!(
            v.verify(&authz, "DESCRIBE", "rtsp://gw/cam1", 1010),
            Ok("alice")
        );
    }
}

#[test]
fn verifier_rejects_what_it_should() {
    let v = verifier();
    let ch = &v.challenges(1000, [1; 16], false)[1];
    let good = answer(ch, "alice", "s3cret", "DESCRIBE", "rtsp://gw/cam1");
    assert_eq!(
        v.verify(&good, "DESCRIBE", "rtsp://gw/cam2", 1010),
        Err(RtspError::AuthRejected)
    );
    assert_eq!(
        v.verify(&good, "SETUP", "rtsp://gw/cam1", 1010),
        Err(RtspError::AuthRejected)
    );
    assert_eq!(
        v.verify(&good, "DESCRIBE", "rtsp://gw/cam1", 1301),
        Err(RtspError::BadNonce { stale: true })
    );
    let wrong = answer(ch, "alice", "guess", "DESCRIBE", "rtsp://gw/cam1");
    assert_eq!(
        v.verify(&wrong, "DESCRIBE", "rtsp://gw/cam1", 1301),
        Err(RtspError::AuthRejected)
    );
    let mallory = answer(ch, "mallory", "s3cret", "DESCRIBE", "rtsp://gw/cam1");
    assert_eq!(
        v.verify(&mallory, "DESCRIBE", "rtsp://gw/cam1", 1010),
        Err(RtspError::AuthRejected)
    );
    // A nonce signed by another secret (another vgate, or forged).
    let other = DigestVerifier::new("vgate", [43; 32], vec![Credentials::new("alice", "s3cret")]);
    let foreign = answer(
        &other.challenges(1000, [1; 16], false)[1],
        "alice",
        "s3cret",
        "DESCRIBE",
        "rtsp://gw/cam1",
    );
    assert_eq!(
        v.verify(&foreign, "DESCRIBE", "rtsp://gw/cam1", 1010),
        Err(RtspError::BadNonce { stale: false })
    );
    // Unoffered algorithm, Basic, garbage.
    let md5_only = verifier().with_algorithms(vec![Algorithm::Md5]);
    let sha = answer(
        &v.challenges(1000, [1; 16], false)[0],
        "alice",
        "s3cret",
        "DESCRIBE",
        "rtsp://gw/cam1",
    );
    assert_eq!(
        md5_only.verify(&sha, "DESCRIBE", "rtsp://gw/cam1", 1010),
        Err(RtspError::UnsupportedAlgorithm)
    );
    assert_eq!(
        v.verify("Basic YWxpY2U6czNjcmV0", "DESCRIBE", "rtsp://gw/cam1", 1010),
        Err(RtspError::UnsupportedScheme)
    );
    assert!(v
        .verify("Digest username=\"alice\"", "DESCRIBE", "x", 0)
        .is_err());
    assert!(v.verify("", "DESCRIBE", "x", 0).is_err());
    assert!(v
        .verify(
            "Digest nonce=\"%%%\", username=\"a\", realm=\"vgate\", uri=\"x\", response=\"0\"",
            "DESCRIBE",
            "x",
            0
        )
        .is_err());
    let stale = v.challenges(2000, [2; 16], true);
    assert!(stale[0].ends_with("stale=true"));
}

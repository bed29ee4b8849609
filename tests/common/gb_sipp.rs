//! GB/T 28181 media over TCP or UDP in sipp scenarios, and the check of the RFC 4571 peers'
//! flows: shared by the single-host (`gb_tcp_netns`) and split (`split_signal_netns`) tests.

use super::rfc4571::Flow;

/// How one side's peer does media.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Udp,
    /// `TCP/RTP/AVP` with this `a=setup:` (what the peer itself does).
    Tcp(&'static str),
}

impl Side {
    pub fn proto(self) -> &'static str {
        match self {
            Side::Udp => "RTP/AVP",
            Side::Tcp(_) => "TCP/RTP/AVP",
        }
    }
    pub fn setup_lines(self) -> String {
        match self {
            Side::Udp => String::new(),
            Side::Tcp(role) => format!("a=setup:{role}\n      a=connection:new\n      "),
        }
    }
}

/// A sipp `<send>` of the 200 without a body that answers the last request received;
/// `to_tag` (e.g. `;tag=[pid]S[call_number]`) added to its To (empty: as received).
pub fn ok_reply(to_tag: &str) -> String {
    format!(
        "  <send>
    <![CDATA[
      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]{to_tag}
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>"
    )
}

/// A sipp `<send>` (with `attrs`, e.g. ` retrans="500"`) of the platform's in-dialog
/// `method` (ACK, BYE) with CSeq `cseq`.
fn in_dialog(method: &str, cseq: u32, attrs: &str) -> String {
    format!(
        r#"  <send{attrs}>
    <![CDATA[
      {method} [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];rport;branch=[branch]
      From: <sip:34020000002000000001@3402000000>;tag=[pid]P[call_number]
      [last_To:]
      Call-ID: [call_id]
      CSeq: {cseq} {method}
      Max-Forwards: 70
      Content-Length: 0

    ]]>
  </send>"#
    )
}

/// The platform's scenario (`hidden`: a regex of what it must never see): INVITE with its SDP, 200/ACK, `hold_ms`, BYE (or, when
/// `expect_bye`, waits for vgate's BYE instead and answers it).
pub fn uac_xml(side: Side, port: u16, hold_ms: u64, expect_bye: bool, hidden: &str) -> String {
    let end = if expect_bye {
        r#"  <recv request="BYE" timeout="20000">
    <action>
      <ereg regexp="TCP media leg closed" search_in="hdr" header="Reason:" check_it="true" assign_to="why"/>
    </action>
  </recv>
"#
        .to_string()
            + &ok_reply("")
    } else {
        format!(
            "  <pause milliseconds=\"{hold_ms}\"/>\n{}\n  <recv response=\"200\" crlf=\"true\"/>",
            in_dialog("BYE", 21, r#" retrans="500""#)
        )
    };
    format!(
        r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="vgate GB TCP play UAC">
  <send retrans="500">
    <![CDATA[
      INVITE sip:34020000001320000001@3402000000 SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];rport;branch=[branch]
      From: <sip:34020000002000000001@3402000000>;tag=[pid]P[call_number]
      To: <sip:34020000001320000001@3402000000>
      Call-ID: [call_id]
      CSeq: 20 INVITE
      Contact: <sip:34020000002000000001@[local_ip]:[local_port]>
      Max-Forwards: 70
      Subject: 34020000001320000001:0[call_number],34020000002000000001:0
      Content-Type: APPLICATION/SDP
      Content-Length: [len]

{sdp}f=v/2/4///a///
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="200" rtd="true" rrs="true">
    <action>
      <ereg regexp="{hidden}" search_in="msg" check_it_inverse="true" assign_to="leak"/>
      <ereg regexp="m=video [0-9]+ {proto} 96" search_in="body" check_it="true" assign_to="proto"/>
    </action>
  </recv>
{ack}
{end}
  <Reference variables="leak,proto{why_ref}"/>
</scenario>
"#,
        proto = side.proto(),
        sdp = play_sdp("34020000002000000001", side, port),
        ack = in_dialog("ACK", 20, ""),
        why_ref = if expect_bye { ",why" } else { "" },
    )
}

/// The device's scenario: answers the INVITE with its SDP, then waits for BYE; the INVITE
/// must show nothing matching `hidden`, keep `y=`/`f=`, and (`offer`) carry that proto.
pub fn uas_xml(side: Side, port: u16, hidden: &str, offer: Option<&str>) -> String {
    let offer_check = match offer {
        Some(p) => format!(
            r#"
      <ereg regexp="m=video [0-9]+ {p} 96" search_in="body" check_it="true" assign_to="offer"/>"#
        ),
        None => String::new(),
    };
    let offer_ref = if offer.is_some() { ",offer" } else { "" };
    format!(
        r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="vgate GB TCP device UAS">
  <recv request="INVITE" crlf="true">
    <action>
      <ereg regexp="{hidden}" search_in="msg" check_it_inverse="true" assign_to="leak"/>{offer_check}
      <ereg regexp="y=0[0-9]+\r?\nf=v/2/4///a///" search_in="body" check_it="true" assign_to="gb"/>
    </action>
  </recv>
  <send retrans="500">
    <![CDATA[
      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]D[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:34020000001320000001@[local_ip]:[local_port]>
      Content-Type: application/sdp
      Content-Length: [len]

{sdp}f=
    ]]>
  </send>
  <recv request="ACK" crlf="true"/>
  <recv request="BYE"/>
{ok}
  <timewait milliseconds="500"/>
  <Reference variables="leak,gb{offer_ref}"/>
</scenario>
"#,
        sdp = play_sdp("34020000001320000001", side, port),
        ok = ok_reply(""),
    )
}

/// The SDP of a GB/T 28181 play by `id` (the platform's offer, the device's answer), in a
/// sipp CDATA block: media `port` over `side`'s proto, its setup lines and `y=` (the `f=` line
/// is the caller's).
fn play_sdp(id: &str, side: Side, port: u16) -> String {
    format!(
        "      v=0
      o={id} 0 0 IN IP4 [local_ip]
      s=Play
      c=IN IP4 [local_ip]
      t=0 0
      m=video {port} {proto} 96
      a=sendrecv
      a=rtpmap:96 PS/90000
      {setup}y=0[call_number]
      ",
        proto = side.proto(),
        setup = side.setup_lines(),
    )
}

/// Every call has one flow, with enough packets, no gap, only RTP, all from the gateway.
pub fn check_flows(what: &str, flows: &[Flow], calls: usize, gateway_ip: &str) {
    assert_eq!(
        flows.len(),
        calls,
        "{what}: one media flow per call: {flows:#?}"
    );
    for f in flows {
        assert!(
            f.received >= 10,
            "{what}: a flow received too little: {f:?}"
        );
        assert_eq!(f.lost(), 0, "{what}: loss in a flow: {f:?}");
        assert_eq!(
            f.bad_frames + f.trailing as u64,
            0,
            "{what}: not RTP: {f:?}"
        );
        let from = f.peer.map(|p| p.ip().to_string()).unwrap_or_default();
        assert_eq!(
            from, gateway_ip,
            "{what}: media must come from the gateway's own address"
        );
    }
}

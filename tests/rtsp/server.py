#!/usr/bin/python3
"""GStreamer RTSP server for vgate's namespace tests (domain A side).

Serves a JPEG video test source (and a PCMU audio tone) at each --path on --port, prints
"READY <port>" on stdout once listening, and runs until SIGTERM/SIGINT. With --digest
USER:PASS every path requires Digest authentication. Rates are modest: --fps frames per
second of --width x --height.

With --tracks 1 only the video track; with --tracks 3 a second audio track (a PCMA square
wave) follows the PCMU one.

With --fixed-transport the server behaves like a widely deployed media server: a connection's
first successful SETUP fixes its lower transport for every later track. A later SETUP that
names the other one is still taken as a SETUP of its track: over a session fixed on TCP it
is answered with an interleaved transport anyway (channels 2n, 2n+1 for stream n), over one
fixed on UDP it is refused 461. A second SETUP of a track closes the connection and prints
"TWICE <url>" on stdout (that server's "can not setup one track twice").

With --shared every client of a path is served from one media pipeline (many sessions of one
camera, cheap: the RTSP limits test pulls 200 streams from one address this way).

With --record the paths take pushed media instead (ANNOUNCE/SETUP mode=record/RECORD, a
JPEG video track): the server depayloads and decodes it and prints "FRAMES <total>" on
stdout each second the count of decoded frames grew; with --tracks 2 they take a PCMU audio
track too and print "AUDIO <total>" (decoded audio buffers) the same way.

Run with Debian's /usr/bin/python3 (python3-gi, gir1.2-gst-rtsp-server-1.0,
gstreamer1.0-plugins-base, gstreamer1.0-plugins-good).
"""
import argparse
import ctypes
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtsp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402


def lower_of(transport):
    """The lower transport of a Transport header's first alternative."""
    return "tcp" if "/TCP" in transport.split(",")[0].upper() else "udp"


def set_request_transport(value):
    """Sets the Transport of the request being handled. Through the C API: the Python
    binding hands out a copy of the context's request."""
    server = ctypes.CDLL("libgstrtspserver-1.0.so.0")
    rtsp = ctypes.CDLL("libgstrtsp-1.0.so.0")
    server.gst_rtsp_context_get_current.restype = ctypes.c_void_p
    rtsp.gst_rtsp_message_remove_header.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    rtsp.gst_rtsp_message_add_header.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    ctx = server.gst_rtsp_context_get_current()
    # GstRTSPContext: server, conn, client, request, ...
    request = ctypes.cast(ctx, ctypes.POINTER(ctypes.c_void_p))[3]
    field = int(GstRtsp.RTSPHeaderField.TRANSPORT)
    rtsp.gst_rtsp_message_remove_header(request, field, -1)
    rtsp.gst_rtsp_message_add_header(request, field, value.encode())


def fix_transport(_server, client):
    """--fixed-transport: the first successful SETUP fixes the connection's lower transport."""
    state = {"lower": None, "tracks": set()}
    field = GstRtsp.RTSPHeaderField.TRANSPORT

    def request_of(ctx):
        _res, _method, uri, _version = ctx.request.parse_request()
        _res, transport = ctx.request.get_header(field, 0)
        return uri, transport or ""

    def pre_setup(client, ctx):
        uri, transport = request_of(ctx)
        if uri in state["tracks"]:
            print(f"TWICE {uri}", flush=True)
            GLib.idle_add(client.close)
            return GstRtsp.RTSPStatusCode.BAD_REQUEST
        if state["lower"] is None:
            return GstRtsp.RTSPStatusCode.OK
        state["tracks"].add(uri)
        if lower_of(transport) == state["lower"]:
            return GstRtsp.RTSPStatusCode.OK
        if state["lower"] == "tcp":
            n = int(uri.rsplit("=", 1)[-1]) if "stream=" in uri else len(state["tracks"])
            mode = ";mode=record" if "record" in transport.lower() else ""
            set_request_transport(f"RTP/AVP/TCP;unicast;interleaved={2 * n}-{2 * n + 1}{mode}")
            return GstRtsp.RTSPStatusCode.OK
        return GstRtsp.RTSPStatusCode.UNSUPPORTED_TRANSPORT

    def setup_done(_client, ctx):
        uri, transport = request_of(ctx)
        state["tracks"].add(uri)
        if state["lower"] is None:
            state["lower"] = lower_of(transport)

    client.connect("pre-setup-request", pre_setup)
    client.connect("setup-request", setup_done)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8554)
    ap.add_argument("--path", action="append", default=[])
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--no-audio", action="store_true")
    ap.add_argument("--digest", default=None, help="USER:PASS")
    ap.add_argument("--tcp-only", action="store_true")
    ap.add_argument("--udp-only", action="store_true")
    ap.add_argument("--record", action="store_true")
    # Default: video + PCMU served (2), video only taken (--record: 1).
    ap.add_argument("--tracks", type=int, default=None, choices=[1, 2, 3])
    ap.add_argument("--fixed-transport", action="store_true")
    ap.add_argument("--shared", action="store_true")
    args = ap.parse_args()
    if args.tracks is None:
        args.tracks = 1 if args.record else 2
    paths = args.path or ["/test"]

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    launch = (
        f"( videotestsrc is-live=true pattern=ball ! video/x-raw,format=I420,width={args.width},"
        f"height={args.height},framerate={args.fps}/1 ! jpegenc quality=50 ! rtpjpegpay name=pay0 pt=26"
    )
    if not args.no_audio and args.tracks >= 2:
        launch += (
            " audiotestsrc is-live=true wave=sine ! audio/x-raw,rate=8000,channels=1 ! mulawenc"
            " ! rtppcmupay name=pay1 pt=0"
        )
    if not args.no_audio and args.tracks >= 3:
        launch += (
            " audiotestsrc is-live=true wave=square ! audio/x-raw,rate=8000,channels=1 ! alawenc"
            " ! rtppcmapay name=pay2 pt=8"
        )
    launch += " )"
    frames = [0, 0]  # decoded, last printed
    audio = [0, 0]  # decoded audio buffers (--record --tracks 2), last printed
    audio2 = [0, 0]  # decoded buffers of the second audio track (--record --tracks 3)
    if args.record:
        launch = "( rtpjpegdepay name=depay0 ! jpegdec ! fakesink name=sink signal-handoffs=true"
        if args.tracks >= 2:
            launch += (
                " rtppcmudepay name=depay1 ! mulawdec"
                " ! fakesink name=sink1 signal-handoffs=true"
            )
        if args.tracks >= 3:
            launch += (
                " rtppcmadepay name=depay2 ! alawdec"
                " ! fakesink name=sink2 signal-handoffs=true"
            )
        launch += " )"

    def count(*_):
        frames[0] += 1

    def count_audio(*_):
        audio[0] += 1

    def count_audio2(*_):
        audio2[0] += 1

    def media_configure(_factory, media):
        sink = media.get_element().get_by_name("sink")
        if sink is not None:
            sink.connect("handoff", count)
        sink = media.get_element().get_by_name("sink1")
        if sink is not None:
            sink.connect("handoff", count_audio)
        sink = media.get_element().get_by_name("sink2")
        if sink is not None:
            sink.connect("handoff", count_audio2)

    def report():
        if frames[0] != frames[1]:
            frames[1] = frames[0]
            print(f"FRAMES {frames[0]}", flush=True)
        if audio[0] != audio[1]:
            audio[1] = audio[0]
            print(f"AUDIO {audio[0]}", flush=True)
        if audio2[0] != audio2[1]:
            audio2[1] = audio2[0]
            print(f"AUDIO2 {audio2[0]}", flush=True)
        return True

    mounts = server.get_mount_points()
    for path in paths:
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(launch)
        factory.set_shared(args.shared)
        if args.record:
            factory.set_transport_mode(GstRtspServer.RTSPTransportMode.RECORD)
            factory.connect("media-configure", media_configure)
        if args.tcp_only:
            factory.set_protocols(GstRtsp.RTSPLowerTrans.TCP)
        if args.udp_only:
            factory.set_protocols(GstRtsp.RTSPLowerTrans.UDP)
        if args.digest:
            perms = GstRtspServer.RTSPPermissions()
            perms.add_permission_for_role("user", "media.factory.access", True)
            perms.add_permission_for_role("user", "media.factory.construct", True)
            factory.set_permissions(perms)
        mounts.add_factory(path, factory)
    if args.digest:
        user, password = args.digest.split(":", 1)
        auth = GstRtspServer.RTSPAuth()
        auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST)
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "user")
        auth.add_digest(user, password, token)
        server.set_auth(auth)
    if args.fixed_transport:
        server.connect("client-connected", fix_transport)
    if server.attach(None) == 0:
        print("cannot listen", file=sys.stderr)
        sys.exit(1)
    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    if args.record:
        GLib.timeout_add_seconds(1, report)
    print(f"READY {server.get_bound_port()}", flush=True)
    loop.run()


if __name__ == "__main__":
    main()

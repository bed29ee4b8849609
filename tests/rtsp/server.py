#!/usr/bin/python3
"""GStreamer RTSP server for vgate's namespace tests (domain A side).

Serves a JPEG video test source (and a PCMU audio tone) at each --path on --port, prints
"READY <port>" on stdout once listening, and runs until SIGTERM/SIGINT. With --digest
USER:PASS every path requires Digest authentication. Rates are modest: --fps frames per
second of --width x --height.

With --record the paths take pushed media instead (ANNOUNCE/SETUP mode=record/RECORD, a
JPEG video track): the server depayloads and decodes it and prints "FRAMES <total>" on
stdout each second the count of decoded frames grew.

Run with Debian's /usr/bin/python3 (python3-gi, gir1.2-gst-rtsp-server-1.0,
gstreamer1.0-plugins-base, gstreamer1.0-plugins-good).
"""
import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtsp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402


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
    args = ap.parse_args()
    paths = args.path or ["/test"]

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    launch = (
        f"( videotestsrc is-live=true pattern=ball ! video/x-raw,format=I420,width={args.width},"
        f"height={args.height},framerate={args.fps}/1 ! jpegenc quality=50 ! rtpjpegpay name=pay0 pt=26"
    )
    if not args.no_audio:
        launch += (
            " audiotestsrc is-live=true wave=sine ! audio/x-raw,rate=8000,channels=1 ! mulawenc"
            " ! rtppcmupay name=pay1 pt=0"
        )
    launch += " )"
    frames = [0, 0]  # decoded, last printed
    if args.record:
        launch = "( rtpjpegdepay name=depay0 ! jpegdec ! fakesink name=sink signal-handoffs=true )"

    def count(*_):
        frames[0] += 1

    def media_configure(_factory, media):
        sink = media.get_element().get_by_name("sink")
        if sink is not None:
            sink.connect("handoff", count)

    def report():
        if frames[0] != frames[1]:
            frames[1] = frames[0]
            print(f"FRAMES {frames[0]}", flush=True)
        return True

    mounts = server.get_mount_points()
    for path in paths:
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(launch)
        factory.set_shared(False)
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

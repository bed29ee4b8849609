#!/usr/bin/env bash
# Regenerate the media validator's golden corpus (tests/golden/media/) from real encoders:
# Debian's ffmpeg (libx264 baseline/main/high, libx265, MJPEG, G.711 mu-law/A-law, AAC,
# MPEG-TS over RTP, MPEG-PS) and GStreamer (x264enc/x265enc with their RTP payloaders,
# jpegenc, mulawenc/alawenc, avenc_aac, mpegtsmux + rtpmp2tpay, mpegpsmux). Each stream is
# sent to a local UDP port on loopback and recorded by scripts/media_golden.py; PS files are
# packetised the GB/T 28181 way by the same script. Small streams (2 s, 320x240) keep the
# corpus well under 2 MB. tests/media_golden.rs reads the files named in manifest.txt.
#
#   scripts/media-golden.sh        (needs ffmpeg, gstreamer1.0-tools and -plugins-{base,good,bad,ugly}, -libav)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=tests/golden/media
PY="python3 scripts/media_golden.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$OUT"
: > "$tmp/manifest"
port=47000
FF=(ffmpeg -hide_banner -loglevel error -nostdin -y -re)
VSRC=(-f lavfi -i testsrc2=size=320x240:rate=25 -t 2)
ASRC=(-f lavfi -i sine=frequency=440:sample_rate=8000 -t 2)
ASRC48=(-f lavfi -i sine=frequency=440:sample_rate=48000 -t 2)

# record NAME CODEC PT CLOCK -- sender command (its URL/port comes from $port)
record() {
    local name=$1 codec=$2 pt=$3 clock=$4
    shift 5
    port=$((port + 2))
    $PY capture "$OUT/$name.rtp" "$port" &
    local cap=$!
    sleep 0.3
    "${@//PORT/$port}" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    wait "$cap"
    [ -s "$OUT/$name.rtp" ] || { echo "media-golden.sh: $name: no packets captured" >&2; exit 1; }
    echo "$name $codec $pt $clock" >> "$tmp/manifest"
}

for prof in baseline main high; do
    record ffmpeg_h264_$prof h264 96 90000 -- "${FF[@]}" "${VSRC[@]}" -c:v libx264 -profile:v $prof \
        -b:v 300k -g 25 -payload_type 96 -f rtp rtp://127.0.0.1:PORT
done
record ffmpeg_h265 h265 96 90000 -- "${FF[@]}" "${VSRC[@]}" -c:v libx265 -x265-params log-level=error \
    -b:v 300k -g 25 -payload_type 96 -f rtp rtp://127.0.0.1:PORT
record ffmpeg_mjpeg jpeg 26 90000 -- "${FF[@]}" "${VSRC[@]}" -t 1 -c:v mjpeg -huffman default -pix_fmt yuvj420p -q:v 20 \
    -f rtp rtp://127.0.0.1:PORT
record ffmpeg_pcmu pcmu 0 8000 -- "${FF[@]}" "${ASRC[@]}" -c:a pcm_mulaw -f rtp rtp://127.0.0.1:PORT
record ffmpeg_pcma pcma 8 8000 -- "${FF[@]}" "${ASRC[@]}" -c:a pcm_alaw -f rtp rtp://127.0.0.1:PORT
record ffmpeg_aac aac 97 48000 -- "${FF[@]}" "${ASRC48[@]}" -c:a aac -b:a 64k -payload_type 97 \
    -f rtp rtp://127.0.0.1:PORT
record ffmpeg_mp2t mp2t 33 90000 -- "${FF[@]}" "${VSRC[@]}" "${ASRC48[@]}" -map 0:v -map 1:a \
    -c:v libx264 -b:v 300k -g 25 -c:a aac -b:a 64k -f rtp_mpegts rtp://127.0.0.1:PORT

GST=(gst-launch-1.0 -q)
GV="videotestsrc num-buffers=50 ! video/x-raw,format=I420,width=320,height=240,framerate=25/1"
GA="audiotestsrc num-buffers=100 samplesperbuffer=160 ! audio/x-raw,rate=8000,channels=1"
# A pipeline is a word list: split on purpose.
# shellcheck disable=SC2086
gst() { record "$1" "$2" "$3" "$4" -- "${GST[@]}" ${5} ! udpsink host=127.0.0.1 port=PORT sync=true; }
gst gst_h264 h264 96 90000 "$GV ! x264enc bitrate=300 key-int-max=25 ! rtph264pay pt=96 config-interval=1"
gst gst_h265 h265 96 90000 "$GV ! x265enc bitrate=300 key-int-max=25 ! rtph265pay pt=96 config-interval=1"
gst gst_jpeg jpeg 26 90000 "$GV ! jpegenc quality=30 ! rtpjpegpay"
gst gst_pcmu pcmu 0 8000 "$GA ! mulawenc ! rtppcmupay"
gst gst_pcma pcma 8 8000 "$GA ! alawenc ! rtppcmapay"
gst gst_aac aac 96 48000 "audiotestsrc num-buffers=100 ! audio/x-raw,rate=48000,channels=1 ! avenc_aac ! rtpmp4gpay pt=96"
gst gst_mp2t mp2t 33 90000 "$GV ! x264enc bitrate=300 key-int-max=25 ! h264parse ! mpegtsmux ! rtpmp2tpay"

# MPEG-PS as GB/T 28181 devices send it: a PS muxer's output cut into RTP at pack boundaries.
"${FF[@]}" "${VSRC[@]}" -c:v libx264 -b:v 300k -g 25 -f vob "$tmp/ff.ps" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
$PY packetize-ps "$tmp/ff.ps" "$OUT/ffmpeg_ps_h264.rtp"
echo "ffmpeg_ps_h264 ps 96 90000" >> "$tmp/manifest"
"${FF[@]}" "${VSRC[@]}" -c:v libx265 -x265-params log-level=error -b:v 300k -g 25 -f vob "$tmp/ff5.ps" \
    2>"$tmp/err" && $PY packetize-ps "$tmp/ff5.ps" "$OUT/ffmpeg_ps_h265.rtp" \
    && echo "ffmpeg_ps_h265 ps 96 90000" >> "$tmp/manifest"
# shellcheck disable=SC2086
"${GST[@]}" $GV ! x264enc bitrate=300 key-int-max=25 ! h264parse ! mpegpsmux ! filesink location="$tmp/gst.ps"
$PY packetize-ps "$tmp/gst.ps" "$OUT/gst_ps_h264.rtp"
echo "gst_ps_h264 ps 96 90000" >> "$tmp/manifest"
# (mpegpsmux 1.22 takes no H.265.)

# RTCP (not in the manifest; tests/media_golden.rs reads these by name): ffmpeg's SR on
# RTP + 1; ffmpeg libx264 with its RTCP muxed on the RTP port (rtcpport = the RTP port,
# RFC 5761); GStreamer rtpbin's SR + SDES on RTP + 1.
rtcp_record() { # OUT-RTP OUT-RTCP-OR-- PORT -- sender
    local rtp=$1 rtcp=$2 p=$3
    shift 4
    $PY capture "$rtp" "$p" & local a=$!
    local b=
    if [ "$rtcp" != - ]; then $PY capture "$rtcp" $((p + 1)) & b=$!; fi
    sleep 0.3
    "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    wait $a ${b:+$b}
}
rtcp_record "$OUT/ffmpeg_h264_rtcp_mux.rtp" - 47600 -- "${FF[@]}" -f lavfi -i testsrc2=size=320x240:rate=25 \
    -t 7 -c:v libx264 -profile:v high -b:v 300k -g 25 -payload_type 96 -f rtp "rtp://127.0.0.1:47600?rtcpport=47600"
rtcp_record "$tmp/pcmu.rtp" "$OUT/ffmpeg_rtcp.rtp" 47602 -- "${FF[@]}" "${ASRC[@]}" -c:a pcm_mulaw \
    -f rtp rtp://127.0.0.1:47602
rtcp_record "$tmp/gst.rtp" "$OUT/gst_rtcp.rtp" 47610 -- "${GST[@]}" -e rtpbin name=rb videotestsrc num-buffers=150 \
    ! video/x-raw,width=320,height=240,framerate=25/1 ! x264enc bitrate=300 ! rtph264pay pt=96 \
    ! rb.send_rtp_sink_0 rb.send_rtp_src_0 ! udpsink host=127.0.0.1 port=47610 sync=true \
    rb.send_rtcp_src_0 ! udpsink host=127.0.0.1 port=47611 sync=false async=false

{
    echo "# name codec payload-type clock-rate: written by scripts/media-golden.sh ($(ffmpeg -version | head -1 | cut -d' ' -f1-3), $(gst-launch-1.0 --version | sed -n 2p))"
    cat "$tmp/manifest"
} > "$OUT/manifest.txt"
du -sh "$OUT"

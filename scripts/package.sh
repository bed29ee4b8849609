#!/usr/bin/env bash
# Build the vgate .deb from a staging tree with dpkg-deb (no debhelper, no cargo-deb needed).
#
# Usage: scripts/package.sh [--binary PATH] [--out DIR]
#
#   --binary PATH  package this vgate binary instead of building one with
#                  `cargo build --release` (the .deb test packages the binary it was built with)
#   --out DIR      where the .deb goes (default target/debian)
#
# The package: /usr/bin/vgate; vgate.service, vgate-nic-setup.service and (hot-standby pairs,
# not enabled) vgate-ha-health.service in /usr/lib/systemd/system; the sysusers.d entry;
# /usr/lib/vgate/nic-setup.sh; /etc/vgate/vgate.toml (the commented appliance example) and
# /etc/vgate/nic.env as conffiles; man pages and bash/zsh/fish completions generated from the
# command line definitions; the Grafana dashboard, Prometheus alert rules and the example
# keepalived config in /usr/share/vgate. Prints the .deb's path.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
out="target/debian"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "package.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for tool in dpkg-deb gzip; do
    command -v "$tool" >/dev/null || { echo "package.sh: $tool not found: apt-get install dpkg gzip" >&2; exit 1; }
done
if [ -z "$binary" ]; then
    cargo build --release --locked >&2
    binary=target/release/vgate
fi
[ -x "$binary" ] || { echo "package.sh: $binary is not an executable" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d "${TMPDIR:-/tmp}/vgate-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/vgate_${version}_${arch}"

install -D -m 755 "$binary" "$root/usr/bin/vgate"
# Debian ships binaries without debug sections (policy 10.1); keep the symbols for backtraces.
if command -v strip >/dev/null; then
    strip --strip-debug "$root/usr/bin/vgate"
else
    echo "package.sh: strip not found (apt-get install binutils): the binary keeps its debug sections" >&2
fi
install -D -m 644 systemd/vgate.service "$root/usr/lib/systemd/system/vgate.service"
install -D -m 644 systemd/vgate-nic-setup.service "$root/usr/lib/systemd/system/vgate-nic-setup.service"
install -D -m 644 systemd/vgate-ha-health.service "$root/usr/lib/systemd/system/vgate-ha-health.service"
install -D -m 644 systemd/keepalived-vgate.conf "$root/usr/share/vgate/keepalived/keepalived-vgate.conf"
install -D -m 755 systemd/vgate-ha-notify-redis "$root/usr/share/vgate/keepalived/vgate-ha-notify-redis"
install -D -m 644 systemd/redis-vgate.conf "$root/usr/share/vgate/redis/redis-vgate.conf"
install -D -m 644 systemd/vgate.sysusers "$root/usr/lib/sysusers.d/vgate.conf"
install -D -m 755 scripts/nic-setup.sh "$root/usr/lib/vgate/nic-setup.sh"
install -D -m 644 systemd/vgate.toml "$root/etc/vgate/vgate.toml"
install -D -m 644 systemd/nic.env "$root/etc/vgate/nic.env"
install -D -m 644 monitoring/grafana/vgate.json "$root/usr/share/vgate/grafana/vgate.json"
install -D -m 644 monitoring/prometheus/vgate-alerts.yml "$root/usr/share/vgate/prometheus/vgate-alerts.yml"

# Man pages and completions come from the clap definitions of this very binary.
mkdir -p "$root/usr/share/man/man1"
"$binary" man "$root/usr/share/man/man1"
gzip -9n "$root"/usr/share/man/man1/*.1
"$binary" completions bash | install -D -m 644 /dev/stdin "$root/usr/share/bash-completion/completions/vgate"
"$binary" completions zsh | install -D -m 644 /dev/stdin "$root/usr/share/zsh/vendor-completions/_vgate"
"$binary" completions fish | install -D -m 644 /dev/stdin "$root/usr/share/fish/vendor_completions.d/vgate.fish"

doc="$root/usr/share/doc/vgate"
install -d "$doc"
cat > "$doc/copyright" <<COPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: vgate

Files: *
License: MIT or Apache-2.0
 On Debian systems the Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0.
COPY
gzip -9n < README.md > "$doc/README.md.gz"

install -d "$root/DEBIAN"
install -m 755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$root/DEBIAN/"
printf '/etc/vgate/vgate.toml\n/etc/vgate/nic.env\n' > "$root/DEBIAN/conffiles"
size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: vgate
Version: $version
Architecture: $arch
Maintainer: vgate developers <vgate@localhost>
Installed-Size: $size
Depends: libc6 (>= 2.34), libgcc-s1, systemd | systemd-sysusers
Recommends: ethtool, iproute2, nftables
Section: net
Priority: optional
Description: inter-network video gateway
 vgate joins two network domains that must never be joined at the IP level
 (a video surveillance network and a user network) and lets video cross under
 control: RTP on one-way channels through port-keyed stream routes, and
 GB/T 28181 SIP and RTSP signaling proxied between the domains.
CONTROL

mkdir -p "$out"
deb="$out/vgate_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
echo "$deb"

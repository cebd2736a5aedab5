#!/bin/bash
# Open vSwitch 3.5.0 userspace tools, built from Debian's source and cached, for the OVN lab's
# chassis (scripts/ovn-lab/ovn-lab.sh). Debian 12 ships 3.1.0, whose userspace conntrack aborts
# under the NetworkPolicy truth table (see docs/network-policy.md); 3.2 reworked userspace
# conntrack NAT, and Debian 13's 3.5.0 is the nearest packaged release.
#
#   scripts/ovs-build.sh          build (first run) or reuse the cache; logs what it cost on
#                                 stderr and prints the install's bin dir as the last line:
#                                 OVS_BIN=$(scripts/ovs-build.sh | tail -1)
#
# Source: Debian 13's `openvswitch-source` package (a .deb from Debian's registry holding the
# full upstream tree, the one Debian's OVN is built against), fetched by URL and checked
# against the SHA-256 pinned below. Tried in turn: the host's Debian mirror, deb.debian.org,
# then snapshot.debian.org, which keeps every file Debian published after the pool has dropped
# it for a newer upload: its machine-readable API names the file's hash for this package
# version (mr/binary/openvswitch-source/3.5.0-1/binfiles) and file/<hash> serves it.
# Built: ovsdb-server, ovsdb-tool, ovs-vswitchd, ovs-vsctl, ovs-appctl, ovs-ofctl, ovs-dpctl and
# the vswitch schema; no kernel module, no DPDK, no AF_XDP, no SSL (the lab talks over unix
# sockets only), no libcap-ng.
#
# Installed into $OVS_BUILD_PREFIX (default ${XDG_CACHE_HOME:-$HOME/.cache}/kuryr-rs/ovs-3.5.0):
#   bin/  share/openvswitch/vswitch.ovsschema  var/ etc/ (the build's default state dirs; the
#   lab overrides them per chassis), .complete (written last: a prefix without it is rebuilt).
# Env: OVS_BUILD_PREFIX, OVS_DEBIAN_MIRROR (default: the host's Debian mirror from apt's
# sources, else http://deb.debian.org/debian), OVS_BUILD_JOBS (2).
set -euo pipefail

VERSION=3.5.0
DEB_VERSION=$VERSION-1
DEB=openvswitch-source_${DEB_VERSION}_all.deb
DEB_PATH=pool/main/o/openvswitch/$DEB
DEB_SHA256=aca60ac8c4ad49a6908c9d8201b97bd75898c54357f880ad50540b0461461bb9
PREFIX=${OVS_BUILD_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/kuryr-rs/ovs-$VERSION}
JOBS=${OVS_BUILD_JOBS:-2}
BINS="ovsdb/ovsdb-server ovsdb/ovsdb-tool vswitchd/ovs-vswitchd utilities/ovs-vsctl
  utilities/ovs-appctl utilities/ovs-ofctl utilities/ovs-dpctl"
# The marker names what was built, so a changed pin rebuilds.
MARK="$VERSION $DEB_SHA256"

T0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "[ovs-build $(date +%T) +$(since "$T0")s] $*" >&2; }

complete() { [ "$(cat "$PREFIX/.complete" 2>/dev/null)" = "$MARK" ]; }

# The host's Debian mirror (deb822 or one-line sources), so a machine behind a registry proxy
# uses the same one apt does.
debian_mirror() {
  local m
  if [ -n "${OVS_DEBIAN_MIRROR:-}" ]; then
    echo "${OVS_DEBIAN_MIRROR%/}"
    return
  fi
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ { print $2 }' |
    grep -v -- '-security' | head -n 1 || true)
  [ -n "$m" ] || m=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' \
    /etc/apt/sources.list 2>/dev/null | grep -v -- '-security' | head -n 1 || true)
  m=${m:-http://deb.debian.org/debian}
  echo "${m%/}"
}

install_build_deps() {
  local p missing=""
  for p in gcc make libc6-dev python3 xz-utils curl; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  log "apt-get install$missing"
  local t; t=$(date +%s.%N)
  # $missing is a word list on purpose.
  # shellcheck disable=SC2086
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2; then
    apt-get update -q >&2
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2
  fi
  log "build dependencies installed in $(since "$t") s"
}

# The snapshot.debian.org URL of $DEB (by its hash, from the API), or fail.
snapshot_url() {
  local api=https://snapshot.debian.org hash
  hash=$(curl -fsSL --retry 3 --retry-delay 2 "$api/mr/binary/openvswitch-source/$DEB_VERSION/binfiles" |
    python3 -c 'import json, sys
print(next(r["hash"] for r in json.load(sys.stdin)["result"] if r["architecture"] == "all"))' 2>/dev/null) ||
    return 1
  [ -n "$hash" ] || return 1
  echo "$api/file/$hash"
}

# download OUT: $DEB with the pinned sha256 from the first source that has it.
download() {
  local out=$1 url mirror urls=()
  mirror=$(debian_mirror)
  urls+=("$mirror/$DEB_PATH")
  case "$mirror" in
    http://deb.debian.org/debian | https://deb.debian.org/debian) ;;
    *) urls+=("http://deb.debian.org/debian/$DEB_PATH") ;;
  esac
  urls+=(snapshot)
  for url in "${urls[@]}"; do
    if [ "$url" = snapshot ]; then
      url=$(snapshot_url) || { log "snapshot.debian.org: found no file for openvswitch-source $DEB_VERSION"; continue; }
    fi
    log "downloading $url"
    rm -f "$out"
    curl -fsSL --retry 5 --retry-delay 2 -o "$out" "$url" || { log "download failed: $url"; continue; }
    [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$DEB_SHA256" ] && return 0
    log "$DEB from $url does not have the pinned sha256 $DEB_SHA256"
  done
  echo "ovs-build: no source had $DEB with the pinned sha256 $DEB_SHA256 (see the log above)" >&2
  return 1
}

build() {
  local work=$PREFIX.build t b
  rm -rf "$work"
  mkdir -p "$work"

  t=$(date +%s.%N)
  download "$work/$DEB" || exit 1
  dpkg-deb --fsys-tarfile "$work/$DEB" | tar -x -C "$work" ./usr/src/openvswitch
  rm -f "$work/$DEB"
  log "source $DEB (sha256 verified) unpacked in $(since "$t") s"

  t=$(date +%s.%N)
  local src=$work/usr/src/openvswitch
  # Debian's python3 (not a pyenv shim): the build runs python scripts to generate sources.
  local py=/usr/bin/python3
  [ -x "$py" ] || py=$(command -v python3)
  (
    cd "$src"
    PYTHON3=$py ./configure --prefix="$PREFIX" --localstatedir="$PREFIX/var" \
      --sysconfdir="$PREFIX/etc" --disable-ssl --disable-libcapng --disable-afxdp \
      CFLAGS="-O2 -g" >"$work/configure.log" 2>&1
  ) || { tail -n 30 "$work/configure.log" >&2; exit 1; }
  log "configure: $(since "$t") s"

  t=$(date +%s.%N)
  # Only the programs the lab runs (a full `make` also builds the test programs, vtep and the
  # docs): first the generated sources (`make all` would build them first, a program target
  # alone does not), then the programs.
  local generated
  # shellcheck disable=SC2016 # $(BUILT_SOURCES) is make's, not the shell's
  generated=$(cd "$src" && printf 'print-built-sources:\n\t@echo $(BUILT_SOURCES)\n' |
    make -s --no-print-directory -f Makefile -f - print-built-sources)
  # $generated and $BINS are word lists on purpose.
  # shellcheck disable=SC2086
  # At nice 10: it runs beside the project's own build, which is on the critical path.
  { nice -n 10 make -C "$src" -j"$JOBS" $generated && nice -n 10 make -C "$src" -j"$JOBS" $BINS; } >"$work/make.log" 2>&1 ||
    { tail -n 30 "$work/make.log" >&2; exit 1; }
  log "make -j$JOBS: $(since "$t") s"

  rm -rf "$PREFIX"
  mkdir -p "$PREFIX/bin" "$PREFIX/share/openvswitch" "$PREFIX/var/run/openvswitch" \
    "$PREFIX/var/log/openvswitch" "$PREFIX/etc/openvswitch"
  for b in $BINS; do
    # Static libopenvswitch (configure's default): the programs are real executables.
    install -m 0755 "$src/$b" "$PREFIX/bin/"
  done
  install -m 0644 "$src/vswitchd/vswitch.ovsschema" "$PREFIX/share/openvswitch/"
  "$PREFIX/bin/ovs-vswitchd" --version | head -n 1 | grep -q " $VERSION\$" ||
    { echo "ovs-build: the built ovs-vswitchd is not $VERSION" >&2; exit 1; }
  echo "$MARK" >"$PREFIX/.complete"
  rm -rf "$work"
}

main() {
  mkdir -p "$(dirname "$PREFIX")"
  # One build at a time: a second caller waits and then finds the cache complete.
  exec 9>"$PREFIX.lock"
  flock 9
  if complete; then
    log "cached: Open vSwitch $VERSION in $PREFIX ($(since "$T0") s)"
  else
    install_build_deps
    build
    log "built Open vSwitch $VERSION into $PREFIX in $(since "$T0") s"
  fi
  echo "$PREFIX/bin"
}

main

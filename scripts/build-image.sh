#!/usr/bin/env bash
# Builds the kuryr-rs container image (one image for the controller and the CNI DaemonSet) without
# pulling any base image: the root filesystem is a minimal Debian 12 made by mmdebstrap from Debian's
# packages (the essential set and ca-certificates; the OVS binding talks to the node's ovsdb-server over
# its socket, no Open vSwitch package needed), plus `kuryr` and `kuryr-cni` in /usr/local/bin; umoci
# assembles it into an OCI image layout.
#
#   scripts/build-image.sh [--profile dist|release|dev] [--out DIR] [--prebuilt] [--check]
#
# The default profile, dist (Cargo.toml: whole-program LTO, one codegen unit), is what ships: its
# controller is faster and about 8 MiB smaller resident; it takes ~40 minutes to build on 2 cores.
#
# Output: DIR/oci (OCI layout, tag kuryr-rs:<version>; `skopeo copy oci:DIR/oci:kuryr-rs:<version> ...`
# or `podman load` pushes it), DIR/bundle/rootfs (the unpacked root filesystem). The Debian part is
# cached in DIR/rootfs.tar and rebuilt only when its package list changes. --check runs the binaries
# from inside the root filesystem (chroot): `kuryr --version`, kuryr-cni's CNI VERSION command (and
# that kuryr-cni is statically linked: it runs on the node, whatever its libc),
# `kuryr install-cni` into temporary directories; it fails on a library the
# binaries need that the image lacks, and prints the image's size. --prebuilt takes `kuryr` already
# in the profile's target directory (scripts/test-all.sh: its test build made it) instead of
# building it; kuryr-cni is always built here (statically linked, in seconds).
# Needs root (mmdebstrap, chroot) and the Debian packages mmdebstrap and umoci (installed if missing).
set -euo pipefail

cd "$(dirname "$0")/.."
PROFILE=dist
OUT=.image
CHECK=0
PREBUILT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --check) CHECK=1; shift ;;
    --prebuilt) PREBUILT=1; shift ;;
    *) echo "usage: $0 [--profile dist|release|dev] [--out DIR] [--prebuilt] [--check]" >&2; exit 2 ;;
  esac
done
case "$PROFILE" in
  dist) TARGET_SUBDIR=dist ;;
  release) TARGET_SUBDIR=release ;;
  dev) TARGET_SUBDIR=debug ;;
  *) echo "--profile must be dist, release or dev" >&2; exit 2 ;;
esac

SUITE=bookworm
# The mirror this machine's apt uses for $SUITE (a registry proxy in CI), else Debian's; IMAGE_MIRROR overrides.
host_mirror() {
  {
    awk '/^URIs:/ {u=$2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == "'"$SUITE"'") print u}' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null
    awk '$1 == "deb" && $3 == "'"$SUITE"'" {print $2}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null
  } | grep -v -- '-security' | head -n1 || true
}
MIRROR=${IMAGE_MIRROR:-$(host_mirror)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PACKAGES=ca-certificates
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
TAG="kuryr-rs:${VERSION}"

for tool in mmdebstrap umoci; do
  if ! command -v "$tool" >/dev/null; then
    echo "== installing $tool from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$tool" >/dev/null
  fi
done

BIN_DIR="${CARGO_TARGET_DIR:-target}/$TARGET_SUBDIR"
if [ "$PREBUILT" = 1 ]; then
  [ -x "$BIN_DIR/kuryr" ] || { echo "--prebuilt: $BIN_DIR/kuryr is not built" >&2; exit 1; }
  echo "== prebuilt kuryr from $BIN_DIR"
else
  echo "== cargo build --profile $PROFILE -p kuryr"
  cargo build -q --profile "$PROFILE" -p kuryr
fi

# kuryr-cni runs on the node, not in the image (install-cni copies it to /opt/cni/bin), so it is
# linked statically: a node whose glibc is older than the image's (RHEL 8, Ubuntu 20.04) runs it too.
# Its own target directory keeps these flags from rebuilding the rest. Quick: serde is all it uses.
CNI_TARGET=$(rustc -vV | sed -n 's/^host: //p')
echo "== cargo build --profile $PROFILE -p kuryr-cni --target $CNI_TARGET (statically linked)"
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build -q --profile "$PROFILE" -p kuryr-cni --target "$CNI_TARGET"
CNI_BIN="${CARGO_TARGET_DIR:-target}/$CNI_TARGET/$TARGET_SUBDIR/kuryr-cni"

mkdir -p "$OUT"
KEY="$SUITE $MIRROR $PACKAGES essential"
if [ ! -f "$OUT/rootfs.tar" ] || [ "$(cat "$OUT/rootfs.key" 2>/dev/null)" != "$KEY" ]; then
  echo "== mmdebstrap $SUITE from $MIRROR (essential + $PACKAGES)"
  rm -f "$OUT/rootfs.tar"
  # mmdebstrap's apt does not read the host's apt.conf.d: pass on what a registry proxy may need (its
  # Release files can carry a Valid-Until or Date the host's apt is told to ignore) and retry fetches.
  # A failed attempt prints apt's own output (quiet otherwise) and is tried again: mirrors hiccup.
  log="$OUT/mmdebstrap.log"
  for attempt in 1 2 3; do
    if mmdebstrap --verbose --format=tar --variant=essential --include="$PACKAGES" \
      --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Check-Date "false"' \
      --aptopt='Acquire::Retries "5"' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      "$SUITE" "$OUT/rootfs.tar.tmp" "$MIRROR" >"$log" 2>&1; then
      break
    fi
    # dpkg names the cause (a full disk, say) once per package, long before the end of the log.
    echo "mmdebstrap attempt $attempt failed; dpkg's errors, the end of its output, the free space:" >&2
    grep -i 'dpkg: error\|no space left\|cannot copy extracted data\|unable to' "$log" | head -n 20 >&2 || true
    grep -v '^I: \|^Get:\|^Hit:\|^Ign:' "$log" | tail -n 25 >&2
    df -h "$OUT" "${TMPDIR:-/tmp}" >&2 || true
    if [ "$attempt" = 3 ]; then exit 1; fi
    sleep $((attempt * 10))
  done
  mv "$OUT/rootfs.tar.tmp" "$OUT/rootfs.tar"
  echo "$KEY" >"$OUT/rootfs.key"
fi

echo "== assembling $TAG with umoci"
rm -rf "$OUT/oci" "$OUT/bundle"
umoci init --layout "$OUT/oci"
umoci new --image "$OUT/oci:$TAG"
umoci unpack --image "$OUT/oci:$TAG" "$OUT/bundle" >/dev/null
tar -xf "$OUT/rootfs.tar" -C "$OUT/bundle/rootfs"
install -m 0755 "$BIN_DIR/kuryr" "$CNI_BIN" "$OUT/bundle/rootfs/usr/local/bin/"
umoci repack --image "$OUT/oci:$TAG" "$OUT/bundle"
umoci config --image "$OUT/oci:$TAG" \
  --config.entrypoint /usr/local/bin/kuryr \
  --config.label "org.opencontainers.image.title=kuryr-rs" \
  --config.label "org.opencontainers.image.version=$VERSION"
# umoci config writes a new manifest; the bundle's rootfs is unchanged by it.
echo "image: oci:$OUT/oci:$TAG"

if [ "$CHECK" = 1 ]; then
  ROOT="$OUT/bundle/rootfs"
  echo "== running the binaries inside the image (chroot $ROOT)"
  for bin in kuryr kuryr-cni; do
    if chroot "$ROOT" /usr/bin/ldd "/usr/local/bin/$bin" | grep 'not found'; then
      echo "FAIL: /usr/local/bin/$bin needs a library the image lacks" >&2
      exit 1
    fi
  done
  if ! chroot "$ROOT" /usr/bin/ldd /usr/local/bin/kuryr-cni 2>&1 | grep -qE 'statically linked|not a dynamic executable'; then
    echo "FAIL: /usr/local/bin/kuryr-cni is dynamically linked: it runs on nodes whose libc may be older" >&2
    exit 1
  fi
  chroot "$ROOT" /usr/local/bin/kuryr --version
  chroot "$ROOT" /usr/bin/env CNI_COMMAND=VERSION /usr/local/bin/kuryr-cni </dev/null
  echo
  chroot "$ROOT" /bin/sh -c 'd=$(mktemp -d) && mkdir "$d/bin" "$d/net.d" && /usr/local/bin/kuryr install-cni --cni-bin /usr/local/bin/kuryr-cni --bin-dir "$d/bin" --conf-dir "$d/net.d" \
    && test -x "$d/bin/kuryr-cni" && test -s "$d/net.d/10-kuryr.conflist" && rm -rf "$d"'
  echo "rootfs size: $(du -sh "$ROOT" | cut -f1)"
  echo "image size (compressed layers): $(du -sh "$OUT/oci/blobs" | cut -f1)"
fi

#!/bin/bash
# A private Open vSwitch with the userspace (netdev) datapath, for tests and the sandbox on
# nodes without the openvswitch kernel module. Nothing is shared with a system OVS: the
# database, sockets, pid and log files all live in one directory.
#   scripts/ovs-userspace.sh start   installs openvswitch-switch and ethtool (the OVS binding
#                                    tests read the pods' offloads with it) when missing, starts
#                                    ovsdb-server + ovs-vswitchd (already running ones are
#                                    reused), ensures br-int with datapath_type=netdev and
#                                    prints the database socket path on stdout
#   scripts/ovs-userspace.sh stop    stops both daemons (succeeds when nothing runs)
#   scripts/ovs-userspace.sh status  prints the socket path and exits 0 when both run, else 3
# Env: OVS_USERSPACE_DIR (default $repo/.ovs), OVS_USERSPACE_BRIDGE (default br-int).
# Use the socket as `ovs-vsctl --db=unix:<path>` (or KURYR_TEST_OVS_DB=unix:<path>).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# apt_get_no_services
. "$REPO/scripts/lab-lib.sh"
D=${OVS_USERSPACE_DIR:-$REPO/.ovs}
BRIDGE=${OVS_USERSPACE_BRIDGE:-br-int}
SOCK="$D/db.sock"
SCHEMA=/usr/share/openvswitch/vswitch.ovsschema
# The daemons and ovs-appctl find their control sockets through these.
export OVS_RUNDIR=$D OVS_LOGDIR=$D OVS_DBDIR=$D

log() { echo "ovs-userspace: $*" >&2; }

# pid from a pidfile when that process is alive and is the expected program.
running_pid() {
  local pidfile=$1 prog=$2 pid
  [ -r "$pidfile" ] || return 1
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm")" = "$prog" ] || return 1
  echo "$pid"
}

vsctl() { ovs-vsctl --db="unix:$SOCK" --timeout=10 "$@"; }

install_packages() {
  local missing=""
  if ! { command -v ovsdb-server >/dev/null && command -v ovs-vswitchd >/dev/null \
    && command -v ovs-vsctl >/dev/null && [ -r "$SCHEMA" ]; }; then
    missing="$missing openvswitch-switch"
  fi
  command -v ethtool >/dev/null || missing="$missing ethtool"
  [ -n "$missing" ] || return 0
  log "installing$missing"
  # Under a policy-rc.d that says no: openvswitch-switch would otherwise start the system's
  # Open vSwitch (its ovsdb-server and ovs-vswitchd), which this private one must not share a
  # host with unasked.
  # $missing is a word list on purpose.
  # shellcheck disable=SC2086
  if ! apt_get_no_services install -y --no-install-recommends $missing >&2; then
    apt-get update >&2
    apt_get_no_services install -y --no-install-recommends $missing >&2
  fi
}

start() {
  install_packages
  mkdir -p "$D"
  if ! running_pid "$D/ovsdb-server.pid" ovsdb-server >/dev/null; then
    if [ ! -f "$D/conf.db" ]; then
      ovsdb-tool create "$D/conf.db" "$SCHEMA"
    elif [ "$(ovsdb-tool needs-conversion "$D/conf.db" "$SCHEMA")" = yes ]; then
      # A newer package brings a newer schema.
      ovsdb-tool convert "$D/conf.db" "$SCHEMA"
    fi
    rm -f "$SOCK"
    log "starting ovsdb-server"
    ovsdb-server "$D/conf.db" --remote="punix:$SOCK" --pidfile="$D/ovsdb-server.pid" \
      --detach --log-file="$D/ovsdb-server.log" -vconsole:warn
  fi
  vsctl --no-wait init
  if ! running_pid "$D/ovs-vswitchd.pid" ovs-vswitchd >/dev/null; then
    log "starting ovs-vswitchd (userspace datapath)"
    ovs-vswitchd "unix:$SOCK" --pidfile="$D/ovs-vswitchd.pid" --detach \
      --log-file="$D/ovs-vswitchd.log" -vconsole:warn
  fi
  # Without the kernel module only the netdev datapath works; an existing bridge is switched
  # to it too (a system-datapath bridge could never forward here).
  vsctl --may-exist add-br "$BRIDGE" -- set Bridge "$BRIDGE" datapath_type=netdev
  echo "$SOCK"
}

stop_one() {
  local prog=$1 pid i
  pid=$(running_pid "$D/$prog.pid" "$prog") || return 0
  log "stopping $prog ($pid)"
  ovs-appctl -t "$D/$prog.$pid.ctl" exit >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
  for i in $(seq 50); do
    [ -d "/proc/$pid" ] || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

stop() {
  # vswitchd first: it needs the database to shut down cleanly.
  stop_one ovs-vswitchd
  stop_one ovsdb-server
  rm -f "$SOCK"
}

status() {
  local rc=0 prog pid
  for prog in ovsdb-server ovs-vswitchd; do
    if pid=$(running_pid "$D/$prog.pid" "$prog"); then
      log "$prog running ($pid)"
    else
      log "$prog not running"
      rc=3
    fi
  done
  echo "$SOCK"
  return "$rc"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac

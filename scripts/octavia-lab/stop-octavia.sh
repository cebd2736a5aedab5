#!/bin/bash
# Stop what start-octavia.sh started (by pid files under $OCTAVIA_LAB/run).
#   PURGE=1 stop-octavia.sh   also deletes the database and certificates (keeps the venv)
set -u
# With OCTAVIA_OVN_LAB set (as for start-octavia.sh) the default is the ovn instance's state dir.
if [ -n "${OCTAVIA_OVN_LAB:-}" ]; then LAB=${OCTAVIA_LAB:-$PWD/.octavia-ovn-lab}; else LAB=${OCTAVIA_LAB:-$PWD/.octavia-lab}; fi
log() { echo "[stop-octavia $(date +%T)] $*"; }
stop_pid() {  # stop_pid NAME PIDFILE
  local f=$LAB/run/$2 p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"
    for i in $(seq 1 60); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$p" 2>/dev/null; then log "$1 ($p) still alive, SIGKILL"; kill -KILL "$p"; fi
    log "stopped $1 ($p)"
  fi
  rm -f "$f"
}
stop_pid octavia octavia.pid
stop_pid octavia-driver-agent driver-agent.pid
stop_pid mariadb mysqld.pid
if [ "${PURGE:-0}" = 1 ]; then
  rm -rf "$LAB/db" "$LAB/state" "$LAB/run" "$LAB/certs"
  log "purged data under $LAB (venv kept)"
fi

#!/bin/bash
# Stop what start-octavia.sh started (by pid files under $OCTAVIA_LAB/run).
#   PURGE=1 stop-octavia.sh   also deletes the database and certificates (keeps the venv)
set -u
# With OCTAVIA_OVN_LAB set (as for start-octavia.sh) the default is the ovn instance's state dir.
if [ -n "${OCTAVIA_OVN_LAB:-}" ]; then LAB=${OCTAVIA_LAB:-$PWD/.octavia-ovn-lab}; else LAB=${OCTAVIA_LAB:-$PWD/.octavia-lab}; fi
log() { echo "[stop-octavia $(date +%T)] $*"; }
# lab_stop NAME SIGNAL PIDFILE NEEDLE...: signals the pid file's process only when its command
# line still names what start-octavia.sh started (after a reboot the pid may be another
# process'); see ../lab-lib.sh.
. "$(cd "$(dirname "$0")" && pwd)/../lab-lib.sh"
lab_stop octavia TERM "$LAB/run/octavia.pid" octavia_lab_server.py "$LAB/etc/octavia.conf" --bind
lab_stop octavia-driver-agent TERM "$LAB/run/driver-agent.pid" octavia_lab_server.py "$LAB/etc/octavia.conf" --driver-agent
lab_stop mariadb TERM "$LAB/run/mysqld.pid" mariadbd "$LAB/db/mysql"
if [ "${PURGE:-0}" = 1 ]; then
  rm -rf "$LAB/db" "$LAB/state" "$LAB/run" "$LAB/certs"
  log "purged data under $LAB (venv kept)"
fi

# Helpers shared by the lab scripts (scripts/neutron-lab/, scripts/octavia-lab/,
# scripts/ovs-userspace.sh); sourced, not run. Safe under `set -euo pipefail`.

# Pid files are trusted only for the process they were written for: after a reboot, or a
# container restart that kept the state directory, the pid in one may belong to an unrelated
# process, and `kill -0` alone would make a start skip the daemon and a stop signal a stranger
# (as root). A process is the lab's when its command line contains every NEEDLE (the program
# and the lab directory, say); with --environ, its environment instead (RabbitMQ's beam.smp,
# whose arguments do not name the lab's files). A zombie has neither, so it counts as gone.

# lab_pid_is PID [--environ] NEEDLE...: is PID alive and the lab's?
lab_pid_is() {
  local pid=$1 what=cmdline text needle
  shift
  if [ "${1:-}" = --environ ]; then what=environ; shift; fi
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  # No pipeline: under pipefail a `| grep -q` that stops reading early can fail a match.
  text=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/$what") || return 1
  for needle in "$@"; do
    case "$text" in *"$needle"*) ;; *) return 1 ;; esac
  done
}

# lab_pid PIDFILE [--environ] NEEDLE...: prints the pid in PIDFILE when lab_pid_is holds.
lab_pid() {
  local f=$1 pid
  shift
  [ -r "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  pid=${pid//[[:space:]]/}
  lab_pid_is "$pid" "$@" || return 1
  echo "$pid"
}

# lab_stop NAME SIGNAL PIDFILE [--environ] NEEDLE...: when PIDFILE names the lab's process,
# sends it SIGNAL, waits up to 30 s for it to exit, then SIGKILLs it; removes PIDFILE either
# way. Reports through the caller's log().
lab_stop() {
  local name=$1 sig=$2 f=$3 pid i
  shift 3
  if pid=$(lab_pid "$f" "$@"); then
    kill -"$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 60); do
      lab_pid_is "$pid" "$@" || break
      sleep 0.5
    done
    if lab_pid_is "$pid" "$@"; then
      log "$name ($pid) still alive after 30 s, SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name ($pid)"
  fi
  rm -f "$f"
}

# apt_get_no_services ARG...: `apt-get ARG...` (noninteractive) while /usr/sbin/policy-rc.d
# denies every service start (exit 101), so the packages a lab installs do not start
# system-wide daemons (mariadb, rabbitmq, Open vSwitch: the labs run private instances).
# Only a policy-rc.d written here is removed again, also when apt-get fails or the script is
# interrupted; one the host already has is left alone. (policy-rc.d stops the start, not
# systemd's enabling of the unit.) Returns apt-get's status.
apt_get_no_services() {
  local policy=/usr/sbin/policy-rc.d
  (
    own=0
    trap '[ "$own" = 0 ] || rm -f "$policy"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP
    # noclobber: created here (and so ours to remove) only when there was none.
    if (set -C && printf '#!/bin/sh\n# kuryr-rs scripts/lab-lib.sh: no service starts during its apt-get\nexit 101\n' >"$policy") 2>/dev/null; then
      own=1
      chmod +x "$policy"
    fi
    DEBIAN_FRONTEND=noninteractive apt-get "$@"
  )
}

#!/bin/bash
# Install (if needed) and start a real OpenStack Octavia 19.0.0 for
# integration tests, all on 127.0.0.1, all state under $OCTAVIA_LAB:
#   MariaDB (private instance, :3318, database `octavia`)
#   octavia API + v2 (taskflow) worker in one process (:9876,
#   auth_strategy=noauth), see octavia_lab_server.py: oslo.messaging `fake:/`
#   needs both in one process, so no message broker is needed
# Provider `amphora` (default) on the noop amphora/compute/network/volume/image
# drivers: load balancers, listeners, pools, members and health monitors go
# through the real API, database and taskflow flows and reach ACTIVE; nothing
# is booted and the VIP address is invented by the noop network driver.
# Also enabled: `octavia` (alias of amphora) and `noop_driver`.
# With OCTAVIA_OVN_LAB=<OVN lab state dir> (scripts/ovn-lab/ovn-lab.sh) the
# `ovn` provider (ovn-octavia-provider) is enabled too and drives that lab:
# load balancers become OVN NB load balancers that really forward traffic.
# It reaches the lab's OVN NB/SB over their unix sockets and the lab's
# neutron-server (OCTAVIA_OVN_NEUTRON_URL, default :9698, noauth) through
# keystoneauth's `none` plugin with an endpoint override; its status updates
# go through octavia-driver-agent (started here, sockets under $LAB/run),
# which also runs the provider's OVN event agent.  That instance defaults to
# its own state dir (.octavia-ovn-lab) and ports (9877 API, 3319 MariaDB) so
# the amphora-only one keeps running next to it; OCTAVIA_VENV lets both share
# one venv.
# Works on a fresh Debian 12 (python3 = 3.11) as root; needs only the Debian
# and PyPI package registries.  Idempotent: a running lab whose config is
# unchanged is reused; a changed config restarts the server.  On a failure it
# names the component, prints the end of its log, stops what this run started
# and exits non-zero.  Stop with stop-octavia.sh (same OCTAVIA_LAB).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# lab_pid/lab_stop (pid files checked against the process)
. "$HERE/../lab-lib.sh"
OVN_LAB=${OCTAVIA_OVN_LAB:-}
if [ -n "$OVN_LAB" ]; then
  LAB=${OCTAVIA_LAB:-$PWD/.octavia-ovn-lab}
  API_PORT=${OCTAVIA_API_PORT:-9877}
  DB_PORT=${OCTAVIA_DB_PORT:-3319}
else
  LAB=${OCTAVIA_LAB:-$PWD/.octavia-lab}
  API_PORT=${OCTAVIA_API_PORT:-9876}
  DB_PORT=${OCTAVIA_DB_PORT:-3318}
fi
VENV=${OCTAVIA_VENV:-$LAB/venv}
OVN_NEUTRON_URL=${OCTAVIA_OVN_NEUTRON_URL:-http://127.0.0.1:9698}
OCTAVIA_VERSION=${OCTAVIA_VERSION:-19.0.0}
CONSTRAINTS=${OCTAVIA_CONSTRAINTS:-$HERE/../neutron-lab/neutron-constraints.txt}
PYTHON=${PYTHON:-/usr/bin/python3}
RESET_DB=${RESET_DB:-0}                   # 1 = drop+recreate the octavia DB
DEBUG=${OCTAVIA_DEBUG:-False}

log() { echo "[start-octavia $(date +%T)] $*"; }
T0=$(date +%s)
mkdir -p "$LAB"/{etc,run,logs,db,certs,state/lock}

STARTED=()   # pid files of processes this run started, stopped again on failure
fail() {  # fail COMPONENT LOGFILE MESSAGE
  log "FAILED: $1: $3"
  if [ -n "${2:-}" ] && [ -f "$2" ]; then
    echo "---- last lines of $2 ----"; tail -n 30 "$2"; echo "----"
  fi
  for f in "${STARTED[@]}"; do
    [ -f "$f" ] || continue
    p=$(cat "$f"); kill -TERM "$p" 2>/dev/null || true
    for i in $(seq 1 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$p" 2>/dev/null || true; rm -f "$f"
  done
  [ "${#STARTED[@]}" -gt 0 ] && log "stopped what this run started"
  exit 1
}
# A pid file counts only while its process is the one started here (its program
# and this lab's config on its command line, lab-lib.sh): after a reboot the pid
# may be another process'. PIDFILE NEEDLE... per process (the same in
# stop-octavia.sh):
MYSQLD=("$LAB/run/mysqld.pid" mariadbd "$LAB/db/mysql")
OCTAVIA=("$LAB/run/octavia.pid" octavia_lab_server.py "$LAB/etc/octavia.conf" --bind)
DRIVER_AGENT=("$LAB/run/driver-agent.pid" octavia_lab_server.py "$LAB/etc/octavia.conf" --driver-agent)
alive() { lab_pid "$@" >/dev/null; }  # alive PIDFILE NEEDLE...
# still_running PIDFILE: a process this run has just started (so no stale pid) has not
# exited; unlike alive also true before its exec, while its command line is still this script's.
still_running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---------------------------------------------------------------- packages
PKGS="mariadb-server python3-venv openssl curl"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  log "apt-get install$missing"
  apt-get update -q >"$LAB/logs/apt.log" 2>&1 || fail apt "$LAB/logs/apt.log" "apt-get update failed"
  # the packages must not start system-wide services (apt_get_no_services, lab-lib.sh)
  # shellcheck disable=SC2086
  apt_get_no_services install -y -q --no-install-recommends $missing >>"$LAB/logs/apt.log" 2>&1 \
    || fail apt "$LAB/logs/apt.log" "apt-get install failed"
fi
log "packages ready ($(( $(date +%s)-T0 ))s)"

# ---------------------------------------------------------------- venv
if [ ! -x "$VENV/bin/octavia-db-manage" ] || ! "$VENV/bin/python" -c 'import octavia, ovn_octavia_provider, pymysql' 2>/dev/null; then
  log "creating venv + pip install octavia==$OCTAVIA_VERSION ovn-octavia-provider"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip >"$LAB/logs/pip.log" 2>&1 || fail pip "$LAB/logs/pip.log" "pip upgrade failed"
  C=""; [ -f "$CONSTRAINTS" ] && C="-c $CONSTRAINTS"
  "$VENV/bin/pip" install $C "octavia==$OCTAVIA_VERSION" ovn-octavia-provider PyMySQL >>"$LAB/logs/pip.log" 2>&1 \
    || fail pip "$LAB/logs/pip.log" "pip install octavia failed"
fi
log "venv ready ($(( $(date +%s)-T0 ))s)"

# ---------------------------------------------------------------- CA ([certificates])
# Octavia's local cert generator signs amphora certificates with this CA and
# insists on an encrypted key; the noop amphora driver never uses them, but
# the worker loads them.
CERTS=$LAB/certs
if [ ! -s "$CERTS/ca.pem" ] || [ ! -s "$CERTS/ca.key" ]; then
  echo octavia-lab-passphrase >"$CERTS/passphrase"
  openssl genrsa -aes256 -passout "file:$CERTS/passphrase" -out "$CERTS/ca.key" 2048 >"$LAB/logs/openssl.log" 2>&1 \
    || fail openssl "$LAB/logs/openssl.log" "cannot create the CA key"
  openssl req -x509 -new -key "$CERTS/ca.key" -passin "file:$CERTS/passphrase" -sha256 -days 3650 \
    -subj "/CN=octavia-lab CA" -out "$CERTS/ca.pem" >>"$LAB/logs/openssl.log" 2>&1 \
    || fail openssl "$LAB/logs/openssl.log" "cannot create the CA certificate"
fi

# ---------------------------------------------------------------- MariaDB
MYSQL="mariadb --no-defaults -S $LAB/run/mysqld.sock -uroot"
if [ ! -d "$LAB/db/mysql/mysql" ]; then
  mariadb-install-db --no-defaults --user=root --datadir="$LAB/db/mysql" \
    --auth-root-authentication-method=normal --skip-test-db >"$LAB/logs/mariadb-install.log" 2>&1 \
    || fail mariadb "$LAB/logs/mariadb-install.log" "mariadb-install-db failed"
fi
if ! $MYSQL -e 'select 1' >/dev/null 2>&1; then
  setsid mariadbd --no-defaults --user=root --datadir="$LAB/db/mysql" \
    --socket="$LAB/run/mysqld.sock" --pid-file="$LAB/run/mysqld.pid" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --log-error="$LAB/logs/mariadb.err" \
    --max-connections=200 --innodb-buffer-pool-size=64M \
    --innodb-flush-log-at-trx-commit=2 --skip-log-bin \
    --character-set-server=utf8mb4 </dev/null >/dev/null 2>&1 &
  echo $! >"$LAB/run/mysqld.pid"
  STARTED+=("$LAB/run/mysqld.pid")
  for i in $(seq 1 240); do
    $MYSQL -e 'select 1' >/dev/null 2>&1 && break
    still_running "${MYSQLD[0]}" || fail mariadb "$LAB/logs/mariadb.err" "mariadbd exited"
    sleep 0.25
  done
  $MYSQL -e 'select 1' >/dev/null 2>&1 || fail mariadb "$LAB/logs/mariadb.err" "MariaDB did not come up on 127.0.0.1:$DB_PORT"
fi
[ "$RESET_DB" = 1 ] && $MYSQL -e "DROP DATABASE IF EXISTS octavia"
$MYSQL -e "CREATE DATABASE IF NOT EXISTS octavia CHARACTER SET utf8mb4;
  CREATE USER IF NOT EXISTS 'octavia'@'127.0.0.1' IDENTIFIED BY 'octavia';
  GRANT ALL ON octavia.* TO 'octavia'@'127.0.0.1';" || fail mariadb "$LAB/logs/mariadb.err" "cannot create the octavia database"
log "mariadb up on 127.0.0.1:$DB_PORT ($(( $(date +%s)-T0 ))s)"

# ---------------------------------------------------------------- config
PROVIDERS="amphora:The Octavia Amphora driver (noop backends).,octavia:Deprecated alias of the Octavia Amphora driver.,noop_driver:NoOp provider driver."
PASSPHRASE=$(cat "$CERTS/passphrase") || fail certificates "" "cannot read $CERTS/passphrase (remove $CERTS to recreate the CA)"
OVN_CONF=""
NETWORK_DRIVER=network_noop_driver
if [ -n "$OVN_LAB" ]; then
  for s in nb sb; do
    [ -S "$OVN_LAB/run/$s.sock" ] || fail ovn-lab "" "no OVN ${s^^} socket at $OVN_LAB/run/$s.sock (start scripts/ovn-lab/ovn-lab.sh first)"
  done
  curl -sf -m 10 -o /dev/null "$OVN_NEUTRON_URL/v2.0/networks?limit=1" \
    || fail ovn-lab "" "the OVN lab's neutron-server does not answer at $OVN_NEUTRON_URL (OCTAVIA_OVN_NEUTRON_URL)"
  PROVIDERS="$PROVIDERS,ovn:Octavia OVN driver (the OVN lab)."
  # The API looks up the VIP subnet's network through the network driver
  # before the provider creates the VIP port: the noop driver invents none.
  NETWORK_DRIVER=allowed_address_pairs_driver
  # [neutron]: keystoneauth's `none` plugin (through an auth_section, see
  # octavia_lab_server.py) plus an endpoint override is what the provider's
  # openstacksdk Connection accepts for a noauth neutron-server.
  # [networking]: a noauth API has no user token to look the VIP subnet up
  # with, so Octavia uses its own client.
  # [driver_agent]: the provider reports status to these sockets and the
  # agent writes it to the database; its `ovn` agent follows OVN events.
  OVN_CONF="
[ovn]
ovn_nb_connection = unix:$OVN_LAB/run/nb.sock
ovn_sb_connection = unix:$OVN_LAB/run/sb.sock

[neutron]
auth_section = neutron_noauth
endpoint_override = $OVN_NEUTRON_URL

[neutron_noauth]
auth_type = none
endpoint = $OVN_NEUTRON_URL

[networking]
allow_invisible_resource_usage = True

[driver_agent]
status_socket_path = $LAB/run/status.sock
stats_socket_path = $LAB/run/stats.sock
get_socket_path = $LAB/run/get.sock
enabled_provider_agents = ovn
"
fi
cat >"$LAB/etc/octavia.conf" <<CONF
[DEFAULT]
debug = $DEBUG
host = octavia-lab
transport_url = fake:/
log_file = $LAB/logs/octavia.log
use_stderr = False

[api_settings]
bind_host = 127.0.0.1
bind_port = $API_PORT
auth_strategy = noauth
api_v2_enabled = True
enabled_provider_drivers = $PROVIDERS
default_provider_driver = amphora
allow_tls_terminated_listeners = True

[database]
connection = mysql+pymysql://octavia:octavia@127.0.0.1:$DB_PORT/octavia?charset=utf8mb4
max_retries = 10

[controller_worker]
amphora_driver = amphora_noop_driver
compute_driver = compute_noop_driver
network_driver = $NETWORK_DRIVER
volume_driver = volume_noop_driver
image_driver = image_noop_driver
distributor_driver = distributor_noop_driver
client_ca = $CERTS/ca.pem
loadbalancer_topology = SINGLE
workers = 1

[task_flow]
jobboard_enabled = False

[certificates]
cert_generator = local_cert_generator
cert_manager = local_cert_manager
ca_certificate = $CERTS/ca.pem
ca_private_key = $CERTS/ca.key
ca_private_key_passphrase = $PASSPHRASE
storage_path = $LAB/state/certs

[haproxy_amphora]
client_cert = $CERTS/ca.pem
server_ca = $CERTS/ca.pem

[oslo_concurrency]
lock_path = $LAB/state/lock

[oslo_policy]
enforce_scope = False
enforce_new_defaults = False
$OVN_CONF
CONF
OCONF="--config-file $LAB/etc/octavia.conf"
"$VENV/bin/octavia-db-manage" $OCONF upgrade head >"$LAB/logs/db-manage.log" 2>&1 \
  || fail octavia-db-manage "$LAB/logs/db-manage.log" "database migration failed"
log "db migrated ($(( $(date +%s)-T0 ))s)"

# ---------------------------------------------------------------- octavia
SUM=$(cat "$LAB/etc/octavia.conf" "$HERE/octavia_lab_server.py" | sha256sum | cut -d' ' -f1)
PIDF=${OCTAVIA[0]}
api_up() { curl -sf -m 10 -o /dev/null "http://127.0.0.1:$API_PORT/v2/lbaas/providers"; }
AGENT_PIDF=${DRIVER_AGENT[0]}
if [ "$(cat "$LAB/run/octavia.conf-sum" 2>/dev/null)" != "$SUM" ]; then
  alive "${OCTAVIA[@]}" && { log "config changed: restarting octavia"; lab_stop octavia TERM "${OCTAVIA[@]}"; }
  alive "${DRIVER_AGENT[@]}" && lab_stop octavia-driver-agent TERM "${DRIVER_AGENT[@]}"
fi
if [ -z "$OVN_LAB" ] && alive "${DRIVER_AGENT[@]}"; then lab_stop octavia-driver-agent TERM "${DRIVER_AGENT[@]}"; fi

# The ovn provider reports every status change through the driver agent's
# sockets; without the agent its load balancers never leave PENDING_*.
if [ -n "$OVN_LAB" ] && ! alive "${DRIVER_AGENT[@]}"; then
  rm -f "$LAB"/run/{status,stats,get}.sock
  setsid "$VENV/bin/python" "$HERE/octavia_lab_server.py" $OCONF --driver-agent -- --log-file "$LAB/logs/driver-agent.log" \
    </dev/null >>"$LAB/logs/driver-agent.out" 2>&1 &
  echo $! >"$AGENT_PIDF"
  STARTED+=("$AGENT_PIDF")
  for i in $(seq 1 240); do
    [ -S "$LAB/run/status.sock" ] && [ -S "$LAB/run/get.sock" ] && break
    still_running "$AGENT_PIDF" || fail octavia-driver-agent "$LAB/logs/driver-agent.log" "the driver agent exited (see also $LAB/logs/driver-agent.out)"
    sleep 0.25
  done
  [ -S "$LAB/run/status.sock" ] || fail octavia-driver-agent "$LAB/logs/driver-agent.log" "no status socket within 60 s"
  log "octavia-driver-agent up (ovn agent on $OVN_LAB) ($(( $(date +%s)-T0 ))s)"
fi
if ! alive "${OCTAVIA[@]}"; then
  if curl -s -m 2 -o /dev/null "http://127.0.0.1:$API_PORT/"; then
    fail octavia "" "port $API_PORT is taken by another process (set OCTAVIA_API_PORT)"
  fi
  setsid "$VENV/bin/python" "$HERE/octavia_lab_server.py" $OCONF --bind "127.0.0.1:$API_PORT" \
    </dev/null >>"$LAB/logs/octavia-server.out" 2>&1 &
  echo $! >"$PIDF"
  STARTED+=("$PIDF")
fi
echo "$SUM" >"$LAB/run/octavia.conf-sum"
for i in $(seq 1 240); do
  api_up && break
  still_running "$PIDF" || fail octavia "$LAB/logs/octavia-server.out" "the octavia process exited (see also $LAB/logs/octavia.log)"
  sleep 0.25
done
api_up || fail octavia "$LAB/logs/octavia.log" "API did not answer on 127.0.0.1:$API_PORT within 60 s"
log "octavia API + worker up on http://127.0.0.1:$API_PORT ($(( $(date +%s)-T0 ))s)"
log "ready in $(( $(date +%s)-T0 ))s  (state in $LAB; stop with $HERE/stop-octavia.sh)"

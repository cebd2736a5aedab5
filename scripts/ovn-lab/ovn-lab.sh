#!/bin/bash
# A real OpenStack dataplane for the end-to-end tests: ML2/OVN on userspace Open vSwitch.
#
#   scripts/ovn-lab/ovn-lab.sh start    install (first run) and start everything below; a
#                                       component that already runs is reused (idempotent)
#   scripts/ovn-lab/ovn-lab.sh stop     stop every component and remove the node namespaces
#   scripts/ovn-lab/ovn-lab.sh status   one line per component; exit 0 when all run, else 3
#   scripts/ovn-lab/ovn-lab.sh env      the variables the tests read (KEY=VALUE lines)
#   scripts/ovn-lab/ovn-lab.sh smoke    two ports on the two chassis, plugged by hand, ping
#                                       over geneve (smoke.py); prints the time to first ping
#   scripts/ovn-lab/ovn-lab.sh supervise  (started by `start`, in the background) restarts a
#                                       chassis' ovs-vswitchd that crashed; see supervise()
#
# What runs (all state under $OVN_LAB, default <repo>/.ovn-lab; nothing system-wide):
#   OVN central     ovsdb-server NB + SB (unix sockets only), ovn-northd           root netns
#   MariaDB         private instance on 127.0.0.1:$OVN_DB_PORT (3308), db "neutron"  root netns
#   neutron-server  29.0.0 under uWSGI on 127.0.0.1:$OVN_API_PORT (9698), ML2 mechanism
#                   driver ovn, geneve tenant networks, auth_strategy=noauth, no RabbitMQ
#                   (transport_url=fake:/: ML2/OVN has no agents), plus the OVN maintenance
#                   worker                                                          root netns
#   two chassis     per node (k8s-node-1, k8s-node-2): netns ovn-<node>, its own ovsdb-server,
#                   ovs-vswitchd (datapath_type=netdev, no kernel module), br-int for pods,
#                   br-phy carrying the geneve underlay (172.30.0.<n>/24 on a veth between
#                   the two namespaces), ovn-controller (chassis name = hostname = node name,
#                   which is the ports' binding:host_id)
# The chassis' Open vSwitch (ovsdb-server, ovs-vswitchd, their conf.db schema and the ovs-vsctl
# the script uses on them) is 3.5.0 built from Debian 13's source by scripts/ovs-build.sh (cached
# after the first build): Debian 12's 3.1.0 userspace conntrack aborts under the NetworkPolicy
# truth table. OVN (central and ovn-controller) stays Debian 12's 23.03, as do the central
# ovsdb-servers. OVN_LAB_OVS=debian runs the chassis on Debian's 3.1.0 instead, for comparison.
# Packages come from Debian (apt) and PyPI (pip, pinned by
# scripts/neutron-lab/neutron-constraints.txt); the venv of the ML2/OVS lab
# ($NEUTRON_LAB/venv, same neutron version) is reused when it exists, which saves CI the pip
# install. When a component fails to start, the script names it, prints the end of its log,
# stops the whole lab and exits non-zero. See docs/architecture.md ("OVN lab").
#
# Env: OVN_LAB, OVN_API_PORT (9698), OVN_DB_PORT (3308), OVN_NODES ("k8s-node-1 k8s-node-2"),
# OVN_UNDERLAY (172.30.0), NEUTRON_LAB (<repo>/.neutron-lab, for its venv), OVN_VENV (force a
# venv), NEUTRON_DEBUG (False), OVN_LAB_OVS (build: scripts/ovs-build.sh's 3.5.0; debian: the
# packaged 3.1.0).
set -Eeuo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=../lab-lib.sh
. "$HERE/../lab-lib.sh"
LAB=${OVN_LAB:-$REPO/.ovn-lab}
API_PORT=${OVN_API_PORT:-9698}
DB_PORT=${OVN_DB_PORT:-3308}
NODES=${OVN_NODES:-"k8s-node-1 k8s-node-2"}
UNDERLAY=${OVN_UNDERLAY:-172.30.0}
NEUTRON_VERSION=${NEUTRON_VERSION:-29.0.0}
CONSTRAINTS=${NEUTRON_CONSTRAINTS:-$REPO/scripts/neutron-lab/neutron-constraints.txt}
# uWSGI's python3 plugin embeds Debian's interpreter: the venv must be built from it.
PYTHON=/usr/bin/python3
PKGS="ovn-central ovn-host openvswitch-switch mariadb-server uwsgi-core uwsgi-plugin-python3
  python3-venv curl iputils-ping ethtool netcat-openbsd conntrack"
RUN=$LAB/run
LOGS=$LAB/logs
API_URL="http://127.0.0.1:$API_PORT"

T0=$(date +%s.%N)
since() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }'; }
log() { echo "[ovn-lab $(date +%T) +$(since)] $*" >&2; }

netns_of() { echo "ovn-$1"; }
node_dir() { echo "$LAB/nodes/$1"; }

# ---------------------------------------------------------------- the chassis' Open vSwitch
# OVS_BIN: the directory of the chassis' OVS programs ("" = Debian's, found in PATH), chosen by
# `start` (choose_ovs) and kept in $RUN/ovs-bin, so the supervisor and a later `start` on a
# running lab use the same programs as the running daemons.
OVS_BIN=""
ovs() { "${OVS_BIN:+$OVS_BIN/}$1" "${@:2}"; }
ovs_schema() {
  if [ -n "$OVS_BIN" ]; then echo "$OVS_BIN/../share/openvswitch/vswitch.ovsschema"; else
    echo /usr/share/openvswitch/vswitch.ovsschema; fi
}
load_ovs() { OVS_BIN=$(cat "$RUN/ovs-bin" 2>/dev/null || true); }
vsctl() { ovs ovs-vsctl --db="unix:$(node_dir "$1")/db.sock" --timeout=10 "${@:2}"; }
ovs_version() { ovs ovs-vswitchd --version 2>/dev/null | awk 'NR == 1 { print $NF }'; }

# Picks the chassis' Open vSwitch for `start` (OVN_LAB_OVS) and sets OVS_COST (what getting it
# cost). Chassis that ran the other one (no $RUN/ovs-bin: a lab started before the choice
# existed, so Debian's) are stopped and get a fresh conf.db, so no daemon or database of one
# version is reused by the other; ovn-controller rebuilds the bridges' OVN state on its own.
OVS_COST=""
choose_ovs() {
  local want old t node d
  case "${OVN_LAB_OVS:-build}" in
    build)
      step "scripts/ovs-build.sh (the chassis' Open vSwitch)"
      t=$(date +%s.%N)
      want=$("$REPO/scripts/ovs-build.sh" | tail -n 1)
      OVS_COST=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }')
      ;;
    *) want="" OVS_COST="packaged" ;;
  esac
  old=$(cat "$RUN/ovs-bin" 2>/dev/null || true)
  if [ "$old" != "$want" ]; then
    # The supervisor would restart the vswitchds stopped here, with the old programs;
    # `start` starts a new one at its end.
    stop_pid "$RUN/supervise.pid" ovn-lab.sh
    for node in $NODES; do
      d=$(node_dir "$node")
      [ -d "$d" ] || continue
      log "$node: switching Open vSwitch (${old:-Debian 12} -> ${want:-Debian 12}): stopping its daemons, new conf.db"
      stop_pid "$d/ovn-controller.pid" ovn-controller
      stop_pid "$d/ovs-vswitchd.pid" ovs-vswitchd
      stop_pid "$d/ovsdb-server.pid" ovsdb-server
      rm -f "$d/conf.db"
    done
  fi
  OVS_BIN=$want
  echo "$OVS_BIN" >"$RUN/ovs-bin"
  log "chassis Open vSwitch: $(ovs_version) (${OVS_BIN:-Debian 12, in PATH}; $OVS_COST)"
}

# running_pid PIDFILE PROG: the pid in PIDFILE when that process is alive and the lab's: its
# command line names PROG and this lab's directory (lab-lib.sh's lab_pid; the supervisor, a
# shell running this script, names the script and `supervise` instead).
running_pid() {
  case "$2" in
    ovn-lab.sh) lab_pid "$1" "$HERE/ovn-lab.sh" supervise "$LAB" ;;
    *) lab_pid "$1" "$2" "$LAB/" ;;
  esac
}

# stop_pid PIDFILE PROG [SIGNAL]: SIGNAL (TERM), up to 10 s, then KILL.
stop_pid() {
  local pid
  pid=$(running_pid "$1" "$2") || { rm -f "$1"; return 0; }
  kill -"${3:-TERM}" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    [ -d "/proc/$pid" ] || break
    sleep 0.1
  done
  if [ -d "/proc/$pid" ]; then
    log "$2 ($pid) ignored SIGTERM: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

# ---------------------------------------------------------------- failure reporting
# Every start step names its component and log first; a failing step reports both and takes the
# whole lab down, so no half-started daemons stay behind.
STEP="" STEP_LOG=""
step() { STEP=$1 STEP_LOG=${2:-}; }
on_error() {
  local rc=$?
  trap - ERR
  echo "ovn-lab: FAILED to start: $STEP (exit $rc)" >&2
  if [ -n "$STEP_LOG" ] && [ -f "$STEP_LOG" ]; then
    echo "ovn-lab: last lines of $STEP_LOG:" >&2
    tail -n 25 "$STEP_LOG" | sed 's/^/    /' >&2
  fi
  echo "ovn-lab: stopping the lab so nothing half-started stays behind" >&2
  stop_all >&2 || true
  exit 1
}

# wait_for WHAT TRIES CMD...: poll CMD every 0.2 s.
wait_for() {
  local what=$1 tries=$2 _
  shift 2
  for _ in $(seq "$tries"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "ovn-lab: timed out waiting for $what" >&2
  return 1
}

# ---------------------------------------------------------------- install
install_packages() {
  local p missing=""
  for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  step "apt-get install$missing" "$LOGS/apt.log"
  log "apt-get install$missing"
  # The packages must not start system-wide services (ovsdb, northd, mariadb): the lab runs
  # private instances (apt_get_no_services, lab-lib.sh).
  # $missing is a word list on purpose.
  # shellcheck disable=SC2086
  {
    apt-get update -q &&
      apt_get_no_services install -y -q --no-install-recommends $missing
  } >"$LOGS/apt.log" 2>&1
  log "packages installed"
}

VENV=""
ensure_venv() {
  local nl=${NEUTRON_LAB:-$REPO/.neutron-lab}
  if [ -n "${OVN_VENV:-}" ]; then
    VENV=$OVN_VENV
  elif [ -x "$LAB/venv/bin/neutron-db-manage" ]; then
    VENV=$LAB/venv
  elif [ -x "$nl/venv/bin/neutron-db-manage" ] &&
    [ "$("$nl/venv/bin/python" -c 'from importlib.metadata import version; print(version("neutron"))' 2>/dev/null)" = "$NEUTRON_VERSION" ]; then
    # Same neutron as the ML2/OVS lab: no second 350 MB install.
    VENV=$nl/venv
  else
    VENV=$LAB/venv
    step "pip install neutron==$NEUTRON_VERSION" "$LOGS/pip.log"
    log "creating $VENV: pip install neutron==$NEUTRON_VERSION (first run, ~2 min)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >"$LOGS/pip.log" 2>&1
    "$VENV/bin/pip" install -q -U pip >>"$LOGS/pip.log" 2>&1
    "$VENV/bin/pip" install -c "$CONSTRAINTS" "neutron==$NEUTRON_VERSION" PyMySQL >>"$LOGS/pip.log" 2>&1
    log "venv ready"
  fi
}

# ---------------------------------------------------------------- OVN central
start_central() {
  local db
  mkdir -p "$LAB/central"
  for db in nb sb; do
    step "ovsdb-server (OVN ${db^^})" "$LOGS/ovsdb-$db.log"
    if [ ! -f "$LAB/central/ovn$db.db" ]; then
      ovsdb-tool create "$LAB/central/ovn$db.db" "/usr/share/ovn/ovn-$db.ovsschema"
    elif [ "$(ovsdb-tool needs-conversion "$LAB/central/ovn$db.db" "/usr/share/ovn/ovn-$db.ovsschema")" = yes ]; then
      ovsdb-tool convert "$LAB/central/ovn$db.db" "/usr/share/ovn/ovn-$db.ovsschema"
    fi
    if ! running_pid "$RUN/ovsdb-$db.pid" ovsdb-server >/dev/null; then
      rm -f "$RUN/$db.sock"
      ovsdb-server "$LAB/central/ovn$db.db" --remote="punix:$RUN/$db.sock" \
        --pidfile="$RUN/ovsdb-$db.pid" --unixctl="$RUN/ovsdb-$db.ctl" \
        --log-file="$LOGS/ovsdb-$db.log" --detach -vconsole:off 2>>"$LOGS/ovsdb-$db.log"
    fi
  done
  ovn-nbctl --db="unix:$RUN/nb.sock" --no-wait init
  ovn-sbctl --db="unix:$RUN/sb.sock" init
  step ovn-northd "$LOGS/ovn-northd.log"
  if ! running_pid "$RUN/ovn-northd.pid" ovn-northd >/dev/null; then
    ovn-northd --ovnnb-db="unix:$RUN/nb.sock" --ovnsb-db="unix:$RUN/sb.sock" \
      --pidfile="$RUN/ovn-northd.pid" --unixctl="$RUN/ovn-northd.ctl" \
      --log-file="$LOGS/ovn-northd.log" --detach -vconsole:off 2>>"$LOGS/ovn-northd.log"
  fi
  log "OVN central up (NB unix:$RUN/nb.sock, SB unix:$RUN/sb.sock)"
}

# ---------------------------------------------------------------- chassis
start_node() {
  local node=$1 n=$2 ns d ip
  ns=$(netns_of "$node")
  d=$(node_dir "$node")
  ip="$UNDERLAY.$n"
  mkdir -p "$d"
  echo "$ns" >"$d/netns"

  step "ovsdb-server of $node" "$d/ovsdb-server.log"
  if ! running_pid "$d/ovsdb-server.pid" ovsdb-server >/dev/null; then
    # (A running server holds the database's lock: only a stopped one is checked.)
    if [ ! -f "$d/conf.db" ]; then
      ovs ovsdb-tool create "$d/conf.db" "$(ovs_schema)"
    elif [ "$(ovs ovsdb-tool needs-conversion "$d/conf.db" "$(ovs_schema)")" = yes ]; then
      ovs ovsdb-tool convert "$d/conf.db" "$(ovs_schema)"
    fi
    rm -f "$d/db.sock"
    ovs ovsdb-server "$d/conf.db" --remote="punix:$d/db.sock" --pidfile="$d/ovsdb-server.pid" \
      --unixctl="$d/ovsdb-server.ctl" --log-file="$d/ovsdb-server.log" --detach -vconsole:off 2>>"$d/ovsdb-server.log"
  fi
  vsctl "$node" --no-wait init

  # vswitchd runs inside the node namespace: the veths the CNI daemon creates there, the
  # internal ports' tap devices and the underlay route all live in that namespace.
  step "ovs-vswitchd of $node (netns $ns)" "$d/ovs-vswitchd.log"
  if ! running_pid "$d/ovs-vswitchd.pid" ovs-vswitchd >/dev/null; then
    # Bridge management sockets (br-int.mgmt, which ovn-controller connects to) go to $OVS_RUNDIR.
    OVS_RUNDIR=$d ip netns exec "$ns" "${OVS_BIN:+$OVS_BIN/}ovs-vswitchd" "unix:$d/db.sock" --pidfile="$d/ovs-vswitchd.pid" \
      --unixctl="$d/ovs-vswitchd.ctl" --log-file="$d/ovs-vswitchd.log" --detach -vconsole:off 2>>"$d/ovs-vswitchd.log"
  fi
  vsctl "$node" --may-exist add-br br-int -- set Bridge br-int datapath_type=netdev \
    fail-mode=secure other_config:disable-in-band=true
  # Userspace tunnels leave through an OVS bridge that owns the tunnel endpoint address.
  vsctl "$node" --may-exist add-br br-phy -- set Bridge br-phy datapath_type=netdev \
    -- --may-exist add-port br-phy ul0
  ip -n "$ns" addr replace "$ip/24" dev br-phy
  ip -n "$ns" link set br-phy up

  step "ovn-controller of $node (netns $ns)" "$d/ovn-controller.log"
  vsctl "$node" set Open_vSwitch . external_ids:system-id="$node" external_ids:hostname="$node" \
    external_ids:ovn-remote="unix:$RUN/sb.sock" external_ids:ovn-encap-type=geneve \
    external_ids:ovn-encap-ip="$ip" external_ids:ovn-bridge=br-int \
    external_ids:ovn-bridge-datapath-type=netdev
  if ! running_pid "$d/ovn-controller.pid" ovn-controller >/dev/null; then
    # No --unixctl option: its control socket goes to $OVN_RUNDIR.
    OVS_RUNDIR=$d OVN_RUNDIR=$d ip netns exec "$ns" ovn-controller "unix:$d/db.sock" --pidfile="$d/ovn-controller.pid" \
      --log-file="$d/ovn-controller.log" --detach -vconsole:off 2>>"$d/ovn-controller.log"
  fi
}

# The node namespaces and the underlay between them: one veth, the `ul0` port of each br-phy
# (created before vswitchd is asked to add it).
ensure_namespaces() {
  local a b node ns
  for node in $NODES; do
    ns=$(netns_of "$node")
    step "network namespace $ns"
    ip netns add "$ns" 2>/dev/null || ip netns list | grep -qw "$ns"
    ip -n "$ns" link set lo up
  done
  # shellcheck disable=SC2086
  set -- $NODES
  a=$(netns_of "$1")
  b=$(netns_of "$2")
  step "geneve underlay veth ($a <-> $b)"
  if ! ip -n "$a" link show ul0 >/dev/null 2>&1 || ! ip -n "$b" link show ul0 >/dev/null 2>&1; then
    ip -n "$a" link del ul0 2>/dev/null || true
    ip -n "$b" link del ul0 2>/dev/null || true
    ip link add ul0 netns "$a" type veth peer name ul0 netns "$b"
  fi
  ip -n "$a" link set ul0 up
  ip -n "$b" link set ul0 up
}

chassis_registered() {
  local node
  for node in $NODES; do
    ovn-sbctl --db="unix:$RUN/sb.sock" --bare --columns=hostname find Chassis name="$node" | grep -qx "$node" || return 1
  done
}

# Geneve between the chassis: each one's tunnel port to the other is up (BFD-less, so check
# that vswitchd created it without error).
tunnels_ready() {
  local node
  for node in $NODES; do
    [ -n "$(vsctl "$node" --bare --columns=name find Interface type=geneve)" ] || return 1
  done
}

# ---------------------------------------------------------------- MariaDB
MYSQL() { mariadb --no-defaults -S "$RUN/mysqld.sock" -uroot "$@"; }
start_mariadb() {
  step "MariaDB (127.0.0.1:$DB_PORT)" "$LOGS/mariadb.err"
  if [ ! -d "$LAB/db/mysql" ]; then
    mariadb-install-db --no-defaults --user=root --datadir="$LAB/db" \
      --auth-root-authentication-method=normal --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 ||
      { STEP_LOG="$LOGS/mariadb-install.log"; false; }
  fi
  if ! MYSQL -e 'select 1' >/dev/null 2>&1; then
    setsid mariadbd --no-defaults --user=root --datadir="$LAB/db" \
      --socket="$RUN/mysqld.sock" --pid-file="$RUN/mysqld.pid" \
      --bind-address=127.0.0.1 --port="$DB_PORT" --log-error="$LOGS/mariadb.err" \
      --max-connections=300 --innodb-buffer-pool-size=128M \
      --innodb-flush-log-at-trx-commit=2 --skip-log-bin \
      --character-set-server=utf8mb4 </dev/null >/dev/null 2>&1 &
    wait_for "MariaDB" 150 MYSQL -e 'select 1'
  fi
  MYSQL -e "CREATE DATABASE IF NOT EXISTS neutron CHARACTER SET utf8mb4;
    CREATE USER IF NOT EXISTS 'neutron'@'127.0.0.1' IDENTIFIED BY 'neutron';
    GRANT ALL ON neutron.* TO 'neutron'@'127.0.0.1';"
}

# ---------------------------------------------------------------- neutron
write_neutron_config() {
  local e=$LAB/etc
  mkdir -p "$e" "$LAB/state/lock"
  cp "$VENV/etc/neutron/api-paste.ini" "$e/api-paste.ini"
  cat >"$e/neutron.conf" <<EOF
[DEFAULT]
debug = ${NEUTRON_DEBUG:-False}
state_path = $LAB/state
auth_strategy = noauth
core_plugin = ml2
; ovn-router: routers as OVN logical routers (the namespace-subnet driver's router);
; trunk + segments for nested and routed networks; address groups are an ML2 extension.
service_plugins = ovn-router,trunk,segments,network_ip_availability
; ML2/OVN has no agents and so no RPC: the in-process fake transport instead of RabbitMQ
transport_url = fake:/
api_paste_config = $e/api-paste.ini
notify_nova_on_port_status_changes = False
notify_nova_on_port_data_changes = False
dhcp_agent_notification = False
allow_bulk = True
global_physnet_mtu = 1500

[database]
connection = mysql+pymysql://neutron:neutron@127.0.0.1:$DB_PORT/neutron?charset=utf8mb4

[oslo_concurrency]
lock_path = $LAB/state/lock

[oslo_policy]
enforce_scope = False
enforce_new_defaults = False
EOF
  cat >"$e/ml2_conf.ini" <<EOF
[ml2]
type_drivers = local,flat,vlan,geneve
tenant_network_types = geneve
mechanism_drivers = ovn
; tag_ports_during_bulk_creation: without it the tags of a bulk port create are dropped
extension_drivers = port_security,tag_ports_during_bulk_creation
overlay_ip_version = 4

[ml2_type_geneve]
vni_ranges = 1:65536
max_header_size = 38

[ml2_type_flat]
flat_networks = *

[securitygroup]
enable_security_group = True

[ovn]
ovn_nb_connection = unix:$RUN/nb.sock
ovn_sb_connection = unix:$RUN/sb.sock
ovn_metadata_enabled = False
enable_distributed_floating_ip = False
EOF
  cat >"$e/uwsgi.ini" <<EOF
[uwsgi]
plugins = python3
http-socket = 127.0.0.1:$API_PORT
module = neutron.wsgi.api:application
virtualenv = $VENV
env = OS_NEUTRON_CONFIG_DIR=$e
env = OS_NEUTRON_CONFIG_FILES=neutron.conf;ml2_conf.ini
master = true
processes = ${OVN_API_WORKERS:-2}
threads = 1
enable-threads = true
lazy-apps = true
thunder-lock = true
buffer-size = 65535
; uWSGI's http-socket does no keep-alive: say so, or pooled client connections get resets
add-header = Connection: close
die-on-term = true
exit-on-reload = false
hook-master-start = unix_signal:15 gracefully_kill_them_all
worker-reload-mercy = 30
pidfile = $RUN/neutron-api.pid
logto = $LOGS/neutron-api.log
EOF
}

api_up() { curl -sf -m 20 -o /dev/null "$API_URL/v2.0/networks?limit=1"; }

start_neutron() {
  local e=$LAB/etc sum nconf
  write_neutron_config
  nconf=(--config-file "$e/neutron.conf" --config-file "$e/ml2_conf.ini")
  sum=$(cat "$e/neutron.conf" "$e/ml2_conf.ini" "$e/uwsgi.ini" | sha256sum | cut -d' ' -f1)
  # A running server started with this config (and so on a migrated schema) is reused as it is;
  # one started with another config is restarted once.
  if [ "$(cat "$RUN/neutron.conf-sum" 2>/dev/null)" != "$sum" ] ||
    ! running_pid "$RUN/neutron-api.pid" uwsgi >/dev/null; then
    stop_pid "$RUN/neutron-api.pid" uwsgi INT
    stop_pid "$RUN/maintenance.pid" neutron-ovn-maintenance-worker
    step "neutron-db-manage upgrade heads" "$LOGS/db-manage.log"
    "$VENV/bin/neutron-db-manage" "${nconf[@]}" upgrade heads >"$LOGS/db-manage.log" 2>&1
  fi
  step "neutron-server (uWSGI, $API_URL)" "$LOGS/neutron-api.log"
  if ! running_pid "$RUN/neutron-api.pid" uwsgi >/dev/null; then
    if api_up; then
      echo "ovn-lab: something else already answers on $API_URL" >&2
      STEP_LOG=""
      false
    fi
    : >"$LOGS/neutron-api.log"
    setsid /usr/bin/uwsgi --ini "$e/uwsgi.ini" </dev/null >/dev/null 2>&1 &
  fi
  # The maintenance worker repairs NB/Neutron drift and registers the hash ring nodes.
  step "neutron-ovn-maintenance-worker" "$LOGS/maintenance.log"
  if ! running_pid "$RUN/maintenance.pid" neutron-ovn-maintenance-worker >/dev/null; then
    setsid "$VENV/bin/neutron-ovn-maintenance-worker" "${nconf[@]}" </dev/null >>"$LOGS/maintenance.log" 2>&1 &
    echo $! >"$RUN/maintenance.pid"
  fi
  echo "$sum" >"$RUN/neutron.conf-sum"
  step "neutron-server (uWSGI, $API_URL)" "$LOGS/neutron-api.log"
  wait_for "the neutron API on $API_URL" 600 api_up
  running_pid "$RUN/maintenance.pid" neutron-ovn-maintenance-worker >/dev/null ||
    { STEP="neutron-ovn-maintenance-worker" STEP_LOG="$LOGS/maintenance.log"; false; }
  log "neutron-server (ML2/OVN) up on $API_URL"
}

# ---------------------------------------------------------------- stop / status
stop_all() {
  local node d
  # The supervisor first, or it would restart the vswitchds being stopped.
  stop_pid "$RUN/supervise.pid" ovn-lab.sh
  # Neutron first (it holds OVSDB connections), then everything else at once: each daemon
  # takes a moment to exit and none depends on another one's shutdown.
  # Only these jobs are waited for: a bare `wait` would also wait for the daemons this shell
  # started in the background (mariadbd, uwsgi) when a failed start lands here.
  local jobs=()
  stop_pid "$RUN/maintenance.pid" neutron-ovn-maintenance-worker &
  jobs+=($!)
  # SIGTERM is a graceful uWSGI shutdown that waits for workers blocked in their OVSDB
  # connections; SIGINT ends them at once (the lab keeps no request state worth finishing).
  stop_pid "$RUN/neutron-api.pid" uwsgi INT &
  jobs+=($!)
  wait "${jobs[@]}"
  jobs=()
  for node in $NODES; do
    d=$(node_dir "$node")
    stop_pid "$d/ovn-controller.pid" ovn-controller &
    jobs+=($!)
    stop_pid "$d/ovs-vswitchd.pid" ovs-vswitchd &
    jobs+=($!)
    stop_pid "$d/ovsdb-server.pid" ovsdb-server &
    jobs+=($!)
  done
  stop_pid "$RUN/ovn-northd.pid" ovn-northd &
  jobs+=($!)
  stop_pid "$RUN/ovsdb-sb.pid" ovsdb-server &
  jobs+=($!)
  stop_pid "$RUN/ovsdb-nb.pid" ovsdb-server &
  jobs+=($!)
  stop_pid "$RUN/mysqld.pid" mariadbd &
  jobs+=($!)
  wait "${jobs[@]}"
  for node in $NODES; do
    # Removing the namespace also removes the underlay veth and any pod veth left in it.
    ip netns del "$(netns_of "$node")" 2>/dev/null || true
  done
  rm -f "$RUN/neutron.conf-sum"
  log "stopped"
}

status() {
  local rc=0 node d
  load_ovs
  check() {
    if running_pid "$1" "$2" >/dev/null; then echo "running  $3"; else echo "stopped  $3"; rc=3; fi
  }
  check "$RUN/ovsdb-nb.pid" ovsdb-server "ovsdb-server (OVN NB)"
  check "$RUN/ovsdb-sb.pid" ovsdb-server "ovsdb-server (OVN SB)"
  check "$RUN/ovn-northd.pid" ovn-northd "ovn-northd"
  check "$RUN/mysqld.pid" mariadbd "MariaDB 127.0.0.1:$DB_PORT"
  check "$RUN/neutron-api.pid" uwsgi "neutron-server $API_URL"
  check "$RUN/maintenance.pid" neutron-ovn-maintenance-worker "neutron-ovn-maintenance-worker"
  check "$RUN/supervise.pid" ovn-lab.sh "supervisor of the chassis' ovs-vswitchd"
  for node in $NODES; do
    d=$(node_dir "$node")
    check "$d/ovsdb-server.pid" ovsdb-server "$node: ovsdb-server"
    check "$d/ovs-vswitchd.pid" ovs-vswitchd "$node: ovs-vswitchd $(ovs_version) (netns $(netns_of "$node"))"
    check "$d/ovn-controller.pid" ovn-controller "$node: ovn-controller"
  done
  return "$rc"
}

print_env() {
  echo "KURYR_TEST_OVN_NEUTRON_URL=$API_URL"
  echo "KURYR_TEST_OVN_LAB=$LAB"
}

# Resident memory of every lab process, in MiB (what the lab costs a CI machine besides time).
lab_rss_mib() {
  local f pids="" pid kids
  for f in "$RUN"/*.pid "$LAB"/nodes/*/*.pid; do
    [ -r "$f" ] && pids="$pids $(cat "$f")"
  done
  for pid in $pids; do
    kids=$(pgrep -P "$pid" 2>/dev/null || true)
    pids="$pids $kids"
  done
  # shellcheck disable=SC2086
  ps -o rss= -p "$(echo $pids | tr ' ' ',')" 2>/dev/null | awk '{s+=$1} END {printf "%d", s/1024}'
}

start() {
  local n=0 node
  case "${OVN_LAB_OVS:-build}" in
    build | debian) ;;
    *)
      echo "ovn-lab: OVN_LAB_OVS must be 'build' or 'debian', not '$OVN_LAB_OVS'" >&2
      exit 2
      ;;
  esac
  mkdir -p "$RUN" "$LOGS" "$LAB/nodes"
  trap on_error ERR
  install_packages
  local t_pkg; t_pkg=$(since)
  choose_ovs
  local t_ovs; t_ovs=$(since)
  ensure_venv
  local t_venv; t_venv=$(since)
  start_central
  ensure_namespaces
  for node in $NODES; do
    n=$((n + 1))
    start_node "$node" "$n"
  done
  step "ovn-controller chassis registration" "$(node_dir "${NODES%% *}")/ovn-controller.log"
  wait_for "both chassis in the OVN southbound database" 150 chassis_registered
  wait_for "the geneve tunnel ports" 150 tunnels_ready
  log "chassis up: $NODES (geneve over $UNDERLAY.0/24)"
  start_mariadb
  start_neutron
  start_supervisor
  trap - ERR
  log "ready in $(since) (packages done at $t_pkg, Open vSwitch $(ovs_version) at $t_ovs ($OVS_COST), venv at $t_venv; venv $VENV); lab processes use $(lab_rss_mib) MiB RSS; state in $LAB"
  print_env
}

# Open vSwitch 3.1 (Debian 12, OVN_LAB_OVS=debian) userspace conntrack can abort on an assertion
# (lib/conntrack.c:1063 conn_update_state: conn_type == CT_CONN_TYPE_DEFAULT) when a connection's
# state changes under churning ACLs, as the NetworkPolicy truth table makes them; 3.5 has not
# aborted so far, but a vswitchd can always die. A real chassis would have systemd restart the
# daemon; here this loop does: it restarts a dead vswitchd
# through start_node (idempotent: the br-phy underlay address and the bridges come back, the
# pods' veths stay in the database) and logs each restart in $LOGS/supervise.log, so a test
# that failed around one can say so. Runs until `stop`.
supervise() {
  local n node d
  echo $$ >"$RUN/supervise.pid"
  load_ovs
  while true; do
    sleep 1
    n=0
    for node in $NODES; do
      n=$((n + 1))
      d=$(node_dir "$node")
      running_pid "$d/ovsdb-server.pid" ovsdb-server >/dev/null || continue
      if ! running_pid "$d/ovs-vswitchd.pid" ovs-vswitchd >/dev/null; then
        log "ovs-vswitchd of $node is gone ($(grep -h 'EMER\|assertion' "$d/ovs-vswitchd.log" | tail -n 1)); restarting it" \
          2>>"$LOGS/supervise.log"
        (start_node "$node" "$n") >>"$LOGS/supervise.log" 2>&1 || true
        # ovn-controller reconnects on its own, but its incremental processing may keep state
        # from before the crash: a full recompute reinstalls every flow.
        sleep 1
        OVN_RUNDIR=$d ovn-appctl -t "$d/ovn-controller.$(cat "$d/ovn-controller.pid").ctl" recompute \
          >>"$LOGS/supervise.log" 2>&1 || true
      fi
    done
  done
}

start_supervisor() {
  running_pid "$RUN/supervise.pid" ovn-lab.sh >/dev/null && return 0
  # The lab directory as an argument: what tells this lab's supervisor from another one's.
  setsid nohup "$HERE/ovn-lab.sh" supervise "$LAB" </dev/null >>"$LOGS/supervise.log" 2>&1 &
}

smoke() {
  local venv=${OVN_VENV:-}
  [ -n "$venv" ] || venv=$(sed -n 's/^virtualenv = //p' "$LAB/etc/uwsgi.ini")
  OVN_API_URL=$API_URL OVN_LAB=$LAB OVN_NODES=$NODES "$venv/bin/python" "$HERE/smoke.py"
}

case "${1:-}" in
  start) start ;;
  smoke) smoke ;;
  supervise) supervise ;;
  stop) stop_all ;;
  status) status ;;
  env) print_env ;;
  *)
    echo "usage: $0 start|stop|status|env|smoke|supervise" >&2
    exit 2
    ;;
esac

#!/bin/bash
# The README's test command: every check CI runs, including the tests against a real
# neutron-server. Runs as root (apt-get, network namespaces).
#   0. installs the build's prerequisites when missing (gcc, make, libc6-dev; curl and
#      ca-certificates), then rustup when there is no cargo
#   1. installs (first run) and starts neutron-server 29.0.0 via scripts/neutron-lab/ (state in
#      .neutron-lab/; an already running lab server is reused) and exports KURYR_TEST_NEUTRON_URL;
#      then a second one (INSTANCE=2: .neutron-lab-2/, :9699) for the placement tests,
#      KURYR_TEST_NEUTRON_URL_2
#   2. creates the upstream kuryr-kubernetes venv (scripts/upstream-kuryr-venv.sh) for the
#      compatibility tests, and starts a private userspace Open vSwitch
#      (scripts/ovs-userspace.sh, state in .ovs/; a running one is reused) for the OVS binding
#      tests, exporting KURYR_TEST_OVS_DB
#   2b. installs (first run: Debian's OVN packages; the neutron venv of step 1 is reused) and
#      starts the ML2/OVN lab (scripts/ovn-lab/ovn-lab.sh: neutron-server on :9698 with its own
#      database, two userspace-OVS chassis over geneve; state in .ovn-lab/; a running lab is
#      reused) for the real-dataplane tests, exporting KURYR_TEST_OVN_NEUTRON_URL and
#      KURYR_TEST_OVN_LAB (KURYR_TEST_REQUIRE_OVN=1: those tests fail instead of skipping; and
#      KURYR_TEST_REQUIRE_ALL=1: so does every other test that would skip for want of a lab, a
#      privilege or a tool, all but those needing hardware no CI machine has)
#   3. cargo fmt --check; clippy -D warnings runs in the background from here on at nice 19 (its
#      own target dir, target/clippy), judged at the end; the test build (cargo test --workspace
#      --no-run), whose kuryr binary then checks the CRD manifests for staleness and runs the chaos
#      soak, and whose kuryr and kuryr-cni go into the image check
#   4. cargo test --workspace (the Neutron contract suite runs against the emulator and the
#      real server; its per-target summary lines are repeated at the end, and the run fails
#      unless both passed the same number of cases with 0 failed: scripts/check-contract-summary.sh)
#   4b. the chaos soak's CI profile on the emulators and its server profile on neutron-server
#      (kuryr chaos, docs/chaos.md), each with its time
#   5. stops neutron-server, Open vSwitch, the OVN lab and Octavia again, but only those this script started
# To fit CI's budget on two cores, steps 1-2b (the labs) run in the background while step 3 and the
# test build run (their output is printed when they are ready, each with its time), and step 4
# runs in three streams at once: the end-to-end crate (the OVN lab's dataplane tests) then the chaos
# CI profile; the controller's pool and topology tests then the chaos server profile; everything
# else. Each stream's time is printed, and the slowest test binaries.
# Also starts a real Octavia 19.0.0 (scripts/octavia-lab/, state in .octavia-lab/; first run
# installs it, about 1.5 minutes; then about 15 s; a running one is reused) and exports
# KURYR_TEST_OCTAVIA_URL for the Octavia contract suite (crates/octavia-contract), whose
# `contract-octavia[...]` lines are repeated in the summary; stopped again if this script started it.
# After the OVN lab, a second Octavia with the ovn provider on it (.octavia-ovn-lab/, :9877/:3319,
# OCTAVIA_OVN_API_PORT/OCTAVIA_OVN_DB_PORT) for the Services dataplane test, KURYR_TEST_OCTAVIA_OVN_URL.
# Env: KEEP_NEUTRON=1 leaves a server this script started running (KEEP_OVS=1 the same for Open
# vSwitch, KEEP_OVN=1 for the OVN lab, KEEP_OCTAVIA=1 for Octavia); NEUTRON_LAB overrides the state directory; extra arguments go to `cargo test`
# (e.g. `-- --test-threads=1`).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export NEUTRON_LAB=${NEUTRON_LAB:-$REPO/.neutron-lab}
API_PORT=${API_PORT:-9696}
NEUTRON_URL="http://127.0.0.1:$API_PORT"
LOG_DIR="$REPO/target/test-all"
mkdir -p "$LOG_DIR"
T_START=$(date +%s)

step() { echo; echo "==> $*"; }
since() { echo "$(( $(date +%s) - $1 ))s"; }
# The build and test binaries take about 20 GB of target/; a full disk shows up only as a compiler
# crash (exit 101), so the free space is printed before and after the build.
disk_free() { df -h --output=avail "$REPO" | tail -n 1 | tr -d ' '; }

# The Rust build compiles C (ring, psm, tikv-jemalloc-sys, whose jemalloc build also runs make)
# and links through cc, and rustup is fetched with curl: installed here when missing, before the
# labs and the build start. The build needs them from its first minute, and from then on the
# labs' apt-get runs in the background (scripts/ovs-build.sh installs gcc, but minutes in).
missing=""
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v make >/dev/null 2>&1 || missing="$missing make"
dpkg -s libc6-dev >/dev/null 2>&1 || missing="$missing libc6-dev"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
[ -e /etc/ssl/certs/ca-certificates.crt ] || missing="$missing ca-certificates"
if [ -n "$missing" ]; then
  step "installing the build prerequisites:$missing (apt-get; log: $LOG_DIR/apt.log)"
  t0=$(date +%s)
  # $missing is a word list on purpose.
  # shellcheck disable=SC2086
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing; } \
    >"$LOG_DIR/apt.log" 2>&1; then
    tail -n 20 "$LOG_DIR/apt.log"
    echo "installing$missing FAILED (this command runs as root: apt-get, network namespaces)"
    exit 1
  fi
  echo "build prerequisites: $(since "$t0")"
fi

# A fresh machine has no Rust toolchain: install rustup (the pinned toolchain in
# rust-toolchain.toml is then fetched by cargo itself).
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || {
    step "installing rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
  }
  export PATH="$HOME/.cargo/bin:$PATH"
fi

export OCTAVIA_LAB=${OCTAVIA_LAB:-$REPO/.octavia-lab}
OCTAVIA_URL="http://127.0.0.1:${OCTAVIA_API_PORT:-9876}"
NEUTRON_URL_2="http://127.0.0.1:${API_PORT_2:-9699}"
OCTAVIA_OVN_URL="http://127.0.0.1:${OCTAVIA_OVN_API_PORT:-9877}"
# What the labs job found or started, and the variables the tests read: `KEY=value` lines, read
# back by this shell (the job runs in a subshell) and by the stop on exit.
LAB_ENV="$LOG_DIR/labs.env"
LAB_LOG="$LOG_DIR/labs.log"
: >"$LAB_ENV"

neutron_up() { curl -sf -o /dev/null "$NEUTRON_URL/v2.0/networks?limit=1"; }
octavia_up() { curl -sf -o /dev/null "$OCTAVIA_URL/v2/lbaas/providers"; }
lab_var() {
  # An empty value would only fail the tests that read it, much later and less clearly.
  [ -n "$2" ] || { echo "labs: no value for $1" >&2; exit 1; }
  echo "$1=$2" >>"$LAB_ENV"
}
# lab_failed WHAT RC: the labs stream stops here, naming the step (its output is above it).
lab_failed() { echo "labs: $1 FAILED (exit $2)" >&2; exit "$2"; }

# Steps 1-2b, in the background: every lab installed (first run) and started, each with its time.
start_labs() {
  set -euo pipefail
  local t0
  t0=$(date +%s)
  if neutron_up; then
    # Possibly another checkout's lab: use it as it is (starting this checkout's own lab
    # would fight it for the ports).
    step "neutron-server already answers at $NEUTRON_URL: reusing it"
  else
    step "starting neutron-server (first run installs it; takes a few minutes)"
    lab_var STARTED_NEUTRON 1
    "$REPO/scripts/neutron-lab/start-neutron.sh" || lab_failed scripts/neutron-lab/start-neutron.sh $?
  fi
  neutron_up || { echo "neutron-server is not answering at $NEUTRON_URL" >&2; exit 1; }
  echo "neutron-server ready in $(since "$t0")"
  lab_var KURYR_TEST_NEUTRON_URL "$NEUTRON_URL"

  # A second neutron-server (.neutron-lab-2/, :9699, its own database, queue and fake agents, the
  # first one's venv): the placement tests bind projects over two real OpenStack deployments.
  t0=$(date +%s)
  if curl -sf -o /dev/null "$NEUTRON_URL_2/v2.0/networks?limit=1"; then
    step "second neutron-server already answers at $NEUTRON_URL_2: reusing it"
  else
    step "starting a second neutron-server (INSTANCE=2 scripts/neutron-lab/start-neutron.sh)"
    lab_var STARTED_NEUTRON_2 1
    INSTANCE=2 "$REPO/scripts/neutron-lab/start-neutron.sh" || lab_failed "INSTANCE=2 scripts/neutron-lab/start-neutron.sh" $?
  fi
  echo "second neutron-server ready in $(since "$t0")"
  lab_var KURYR_TEST_NEUTRON_URL_2 "$NEUTRON_URL_2"

  t0=$(date +%s)
  if octavia_up; then
    # Possibly another checkout's lab: use it as it is.
    step "Octavia already answers at $OCTAVIA_URL: reusing it"
  else
    step "starting Octavia (scripts/octavia-lab/; first run installs it)"
    lab_var STARTED_OCTAVIA 1
    "$REPO/scripts/octavia-lab/start-octavia.sh" || lab_failed scripts/octavia-lab/start-octavia.sh $?
  fi
  octavia_up || { echo "Octavia is not answering at $OCTAVIA_URL" >&2; exit 1; }
  echo "Octavia lab ready in $(since "$t0")"
  lab_var KURYR_TEST_OCTAVIA_URL "$OCTAVIA_URL"

  # A script whose output becomes a variable runs on its own line, not inside lab_var's
  # arguments (where set -e would not see it fail): a failing one stops this stream here, with
  # its own output above, instead of exporting an empty value the tests trip over much later.
  local py sock
  t0=$(date +%s)
  step "upstream kuryr-kubernetes 10.0.0 venv (its Python client is run against the Kubernetes emulator)"
  py=$("$REPO/scripts/upstream-kuryr-venv.sh") || lab_failed scripts/upstream-kuryr-venv.sh $?
  lab_var KURYR_TEST_UPSTREAM_PYTHON "$py"
  echo "upstream kuryr venv ready in $(since "$t0")"

  t0=$(date +%s)
  if "$REPO/scripts/ovs-userspace.sh" status >/dev/null 2>&1; then
    step "userspace Open vSwitch already running: reusing it"
  else
    step "starting a userspace Open vSwitch (scripts/ovs-userspace.sh; no kernel module needed)"
    lab_var STARTED_OVS 1
  fi
  # Idempotent: also (re)creates br-int with the netdev datapath.
  sock=$("$REPO/scripts/ovs-userspace.sh" start) || lab_failed "scripts/ovs-userspace.sh start" $?
  lab_var KURYR_TEST_OVS_DB "unix:$sock"
  echo "Open vSwitch ready in $(since "$t0")"

  if "$REPO/scripts/ovn-lab/ovn-lab.sh" status >/dev/null 2>&1; then
    step "ML2/OVN lab already running: reusing it"
  else
    step "starting the ML2/OVN lab (scripts/ovn-lab/ovn-lab.sh; first run installs OVN)"
    lab_var STARTED_OVN 1
  fi
  # Idempotent; prints its start-up time and memory, then the variables the OVN tests read.
  t0=$(date +%s)
  local ovn_env key value ovn_url="" ovn_lab=""
  ovn_env=$("$REPO/scripts/ovn-lab/ovn-lab.sh" start) || lab_failed "scripts/ovn-lab/ovn-lab.sh start" $?
  echo "ML2/OVN lab ready after $(since "$t0")"
  while IFS='=' read -r key value; do
    case "$key" in
      KURYR_TEST_OVN_NEUTRON_URL) ovn_url=$value; lab_var "$key" "$value" ;;
      KURYR_TEST_OVN_LAB) ovn_lab=$value; lab_var "$key" "$value" ;;
    esac
  done <<<"$ovn_env"
  [ -n "$ovn_url" ] && [ -n "$ovn_lab" ] ||
    lab_failed "scripts/ovn-lab/ovn-lab.sh start (no KURYR_TEST_OVN_NEUTRON_URL/KURYR_TEST_OVN_LAB in its output)" 1

  # A second Octavia whose `ovn` provider drives the OVN lab (Services proven by traffic,
  # crates/kuryr-e2e/tests/ovn_services.rs): own state dir and ports, the first one's venv.
  t0=$(date +%s)
  if curl -sf -o /dev/null "$OCTAVIA_OVN_URL/v2/lbaas/providers"; then
    step "Octavia with the ovn provider already answers at $OCTAVIA_OVN_URL: reusing it"
  else
    step "starting Octavia with the ovn provider on the OVN lab (scripts/octavia-lab/start-octavia.sh)"
    lab_var STARTED_OCTAVIA_OVN 1
    # Reuse the first Octavia's venv: bash expands these assignments left to right, so OCTAVIA_VENV goes first.
    OCTAVIA_VENV="$OCTAVIA_LAB/venv" OCTAVIA_OVN_LAB="$ovn_lab" OCTAVIA_LAB="$REPO/.octavia-ovn-lab" \
      OCTAVIA_API_PORT="${OCTAVIA_OVN_API_PORT:-9877}" OCTAVIA_DB_PORT="${OCTAVIA_OVN_DB_PORT:-3319}" \
      OCTAVIA_OVN_NEUTRON_URL="$ovn_url" "$REPO/scripts/octavia-lab/start-octavia.sh" ||
      lab_failed "scripts/octavia-lab/start-octavia.sh (ovn provider)" $?
  fi
  echo "Octavia (ovn provider) ready in $(since "$t0")"
  lab_var KURYR_TEST_OCTAVIA_OVN_URL "$OCTAVIA_OVN_URL"
  lab_var LABS_READY 1
}

read_lab_env() {
  local key value
  while IFS='=' read -r key value; do
    [ -n "$key" ] && export "$key=$value"
  done <"$LAB_ENV"
}

LABS_PID=""
CLIPPY_PID=""
stop_labs() {
  if [ -n "$CLIPPY_PID" ]; then
    kill -- "-$CLIPPY_PID" 2>/dev/null || true
  fi
  if [ -n "$LABS_PID" ] && kill -0 "$LABS_PID" 2>/dev/null; then
    # Let a lab that is starting finish, so it can be stopped cleanly.
    wait "$LABS_PID" 2>/dev/null || true
  fi
  read_lab_env
  if [ "${STARTED_OCTAVIA_OVN:-0}" = 1 ] && [ "${KEEP_OCTAVIA:-0}" != 1 ]; then
    step "stopping the ovn-provider Octavia this script started"
    OCTAVIA_LAB="$REPO/.octavia-ovn-lab" "$REPO/scripts/octavia-lab/stop-octavia.sh" || true
  fi
  if [ "${STARTED_OVN:-0}" = 1 ] && [ "${KEEP_OVN:-0}" != 1 ]; then
    step "stopping the OVN lab this script started"
    "$REPO/scripts/ovn-lab/ovn-lab.sh" stop || true
  fi
  if [ "${STARTED_OCTAVIA:-0}" = 1 ] && [ "${KEEP_OCTAVIA:-0}" != 1 ]; then
    step "stopping the Octavia this script started"
    "$REPO/scripts/octavia-lab/stop-octavia.sh" || true
  fi
  if [ "${STARTED_NEUTRON_2:-0}" = 1 ] && [ "${KEEP_NEUTRON:-0}" != 1 ]; then
    step "stopping the second neutron-server this script started"
    INSTANCE=2 "$REPO/scripts/neutron-lab/stop-neutron.sh" || true
  fi
  if [ "${STARTED_NEUTRON:-0}" = 1 ] && [ "${KEEP_NEUTRON:-0}" != 1 ]; then
    step "stopping the neutron-server this script started"
    "$REPO/scripts/neutron-lab/stop-neutron.sh" || true
  fi
  if [ "${STARTED_OVS:-0}" = 1 ] && [ "${KEEP_OVS:-0}" != 1 ]; then
    step "stopping the Open vSwitch this script started"
    "$REPO/scripts/ovs-userspace.sh" stop || true
  fi
}
trap stop_labs EXIT

echo "disk: $(disk_free) free at $REPO"
step "starting the labs in the background (log: $LAB_LOG; printed when ready)"
# Background jobs leave their exit status in a file: with pid_max at 32768 and a long run, bash can
# hand a background job's pid to a later child of its own and forget the job's status (`wait` then
# answers 127 for a job that ended well).
rm -f "$LOG_DIR/labs.rc" "$LOG_DIR/clippy.rc"
job_rc() { # <pid> <rc file>: waits for the job, prints its exit status (1 when it left none)
  wait "$1" 2>/dev/null || true
  cat "$2" 2>/dev/null || echo 1
}
( trap 'echo $? >"$LOG_DIR/labs.rc"' EXIT; start_labs ) >"$LAB_LOG" 2>&1 &
LABS_PID=$!

t0=$(date +%s)
step "cargo fmt --all -- --check"
cargo fmt --all -- --check

# Clippy checks every crate again (check-mode units share nothing with the test build), about ten
# CPU-minutes here. It runs from now until it is done, at the lowest priority and in its own target
# directory (no wait on the build's lock): it takes only the CPU the build, the labs and the tests
# leave idle, and its verdict is printed with the summary.
step "cargo clippy --workspace --all-targets -- -D warnings (in the background at nice 19; log: $LOG_DIR/clippy.log)"
# Its own session, so an early exit stops all of it (stop_labs). A new session is a new scheduler
# autogroup, which competes with the build's as an equal whatever its processes' nice values: the
# autogroup itself is set to nice 19.
CARGO_TARGET_DIR="$REPO/target/clippy" setsid bash -c 't0=$(date +%s); rc=0
  echo 19 >/proc/self/autogroup 2>/dev/null || true
  nice -n 19 cargo clippy --workspace --all-targets -- -D warnings || rc=$?
  echo "clippy: $(( $(date +%s) - t0 ))s (exit $rc)"; echo "$rc" >"$1"; exit "$rc"' clippy "$LOG_DIR/clippy.rc" >"$LOG_DIR/clippy.log" 2>&1 &
CLIPPY_PID=$!

step "building the tests (cargo test --workspace --no-run; log: $LOG_DIR/test-build.log)"
t0=$(date +%s)
if ! cargo test --workspace --no-run "$@" >"$LOG_DIR/test-build.log" 2>&1; then
  # The compiler's own words, not only cargo's last line ("could not compile ... 1 previous error").
  grep -v -E '^\s+(Compiling|Executable|Running|Fresh) ' "$LOG_DIR/test-build.log" | tail -n 60
  echo "test build FAILED after $(since "$t0"); disk: $(disk_free) free"
  exit 1
fi
tail -n 1 "$LOG_DIR/test-build.log"
echo "test build: $(since "$t0"); disk: $(disk_free) free"
# The binaries the test build made (the kuryr and kuryr-cni integration tests need them) serve the
# checks below: a `cargo run -p kuryr` would build every dependency again, with the features of
# that one package instead of the workspace's.
KURYR_BIN="${CARGO_TARGET_DIR:-$REPO/target}/debug/kuryr"

step "CRD and install manifests are up to date (deploy/crds, deploy/manifests)"
t0=$(date +%s)
"$KURYR_BIN" crds --check deploy/crds
"$KURYR_BIN" manifests --config-file deploy/kuryr.conf --check deploy/manifests
echo "manifests: $(since "$t0")"

step "waiting for the labs"
t0=$(date +%s)
labs_rc=$(job_rc "$LABS_PID" "$LOG_DIR/labs.rc")
LABS_PID=""
cat "$LAB_LOG"
if [ "$labs_rc" -ne 0 ]; then
  echo "starting the labs FAILED (exit $labs_rc); log above ($LAB_LOG)"
  exit "$labs_rc"
fi
echo "labs: waited $(since "$t0") for them after the build"
read_lab_env

# After the labs: the image build may apt-get its tools, which must not race the labs' apt-get for dpkg's lock.
step "the image builds and its binaries run (scripts/build-image.sh --profile dev --prebuilt --check)"
t0=$(date +%s)
scripts/build-image.sh --profile dev --prebuilt --check
echo "image: $(since "$t0")"
# Real-server tests (contract suites, kuryr-testbed targets, OVN dataplane) fail instead of skipping;
# KURYR_TEST_REQUIRE_ALL=1 does the same for every other skip (network namespaces, the userspace OVS,
# ethtool, the upstream venv: kuryr_testbed::skip), all but what no machine here has (VLAN devices,
# SR-IOV NICs: skip_hardware). Every test stream below inherits these.
export KURYR_TEST_REQUIRE_NEUTRON=1 KURYR_TEST_REQUIRE_OCTAVIA=1 KURYR_TEST_REQUIRE_KUBECTL=1 KURYR_TEST_REQUIRE_OVN=1
export KURYR_TEST_REQUIRE_ALL=1

# The chaos soak's short profiles (docs/chaos.md): the emulators, or the real neutron-server.
chaos() {
  local name=$1 t0 rc=0
  shift
  step "kuryr chaos --profile $name $*"
  t0=$(date +%s)
  "$KURYR_BIN" chaos --profile "$name" "$@" --state-dir "$LOG_DIR/chaos-$name" 2>&1 || rc=$?
  echo "chaos[$name]: $(since "$t0") (exit $rc)"
  return "$rc"
}

# Three streams at once (steps 4 and 4b), each a third of the tests' wall time, which is mostly
# waiting (for the labs, timers, the emulators): the end-to-end crate (the OVN lab's dataplane
# tests) then the chaos CI profile; the controller's pool tests and its topology tests then the
# chaos server profile; every other test target, lib and bin of the workspace, then the doctests.
step "cargo test, three streams (KURYR_TEST_NEUTRON_URL=$KURYR_TEST_NEUTRON_URL KURYR_TEST_OVS_DB=$KURYR_TEST_OVS_DB KURYR_TEST_OVN_NEUTRON_URL=$KURYR_TEST_OVN_NEUTRON_URL)"
# Every stream runs `cargo test --workspace` with `--test NAME` for its integration test targets:
# with the workspace selected, features resolve as in the test build above and nothing is
# compiled again (`-p` or `--exclude` would resolve them for fewer packages and rebuild about 30
# crates per stream). Each target lands in exactly one stream (names shared by several packages,
# like `properties`, go together to the third).
test_targets() {
  cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
want = sys.argv[1]
names = set()
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" not in t["kind"]:
            continue
        n = t["name"]
        if p["name"] == "kuryr-e2e":
            s = "e2e"
        elif p["name"] == "kuryr-controller" and (n.startswith("pool_") or n == "topologies"):
            s = "pools"
        else:
            s = "rest"
        if s == want:
            names.add(n)
for n in sorted(names):
    print("--test")
    print(n)
' "$1"
}
# Not `mapfile < <(test_targets ...)`: a failure there would go unnoticed, and a stream without
# --test targets would run every test of the workspace.
load_targets() {  # load_targets ARRAY STREAM
  local -n into=$1
  local out
  out=$(test_targets "$2") || { echo "listing the test targets of stream $2 FAILED" >&2; exit 1; }
  [ -n "$out" ] || { echo "stream $2 has no test targets" >&2; exit 1; }
  mapfile -t into <<<"$out"
}
load_targets E2E_TESTS e2e
load_targets POOL_TESTS pools
load_targets REST_TESTS rest
stream() {
  local name=$1 t0 rc=0 chaos_rc=0
  shift
  t0=$(date +%s)
  {
    case "$name" in
      e2e) cargo test --workspace "${E2E_TESTS[@]}" --no-fail-fast "$@" || rc=$? ;;
      pools) cargo test --workspace "${POOL_TESTS[@]}" --no-fail-fast "$@" || rc=$? ;;
      rest)
        cargo test --workspace --lib --bins "${REST_TESTS[@]}" --no-fail-fast "$@" || rc=$?
        cargo test --workspace --doc "$@" || rc=$?
        ;;
    esac
  } >"$LOG_DIR/test-$name.log" 2>&1
  echo "cargo test [$name]: $(since "$t0") (exit $rc)" >>"$LOG_DIR/test-$name.log"
  case "$name" in
    e2e) chaos ci >"$LOG_DIR/chaos-$name.log" 2>&1 || chaos_rc=$? ;;
    pools) chaos server --neutron-url "$KURYR_TEST_NEUTRON_URL" >"$LOG_DIR/chaos-$name.log" 2>&1 || chaos_rc=$? ;;
    rest) : >"$LOG_DIR/chaos-$name.log" ;;
  esac
  echo "rc=$rc chaos_rc=$chaos_rc" >"$LOG_DIR/stream-$name.rc"
}
t0=$(date +%s)
rm -f "$LOG_DIR"/stream-*.rc
pids=()
for name in e2e pools rest; do
  stream "$name" "$@" &
  pids+=($!)
done
wait "${pids[@]}" || true
echo "all streams: $(since "$t0")"
rc=0
chaos_ok=1
: >"$LOG_DIR/cargo-test.log"
: >"$LOG_DIR/chaos.log"
for name in rest pools e2e; do
  step "stream $name: cargo test"
  cat "$LOG_DIR/test-$name.log"
  cat "$LOG_DIR/test-$name.log" >>"$LOG_DIR/cargo-test.log"
  if [ -s "$LOG_DIR/chaos-$name.log" ]; then
    step "stream $name: chaos"
    cat "$LOG_DIR/chaos-$name.log"
    cat "$LOG_DIR/chaos-$name.log" >>"$LOG_DIR/chaos.log"
  fi
  s_rc=1
  s_chaos=1
  if [ -r "$LOG_DIR/stream-$name.rc" ]; then
    s_rc=$(sed -n 's/^rc=\([0-9]*\).*/\1/p' "$LOG_DIR/stream-$name.rc")
    s_chaos=$(sed -n 's/.*chaos_rc=\([0-9]*\)/\1/p' "$LOG_DIR/stream-$name.rc")
  fi
  [ "$s_rc" = 0 ] || rc=$s_rc
  [ "$s_chaos" = 0 ] || chaos_ok=0
done

step "slowest test binaries (stream: binary seconds)"
for name in rest pools e2e; do
  awk -v s="$name" '/^ *Running /{bin=$2} /^test result: /{t=$NF; sub(/s$/,"",t); print s": "bin" "t}' "$LOG_DIR/test-$name.log"
done | sort -k3 -n -r | head -n 15

step "waiting for clippy"
clippy_rc=$(job_rc "$CLIPPY_PID" "$LOG_DIR/clippy.rc")
CLIPPY_PID=""
if [ "$clippy_rc" -ne 0 ]; then
  cat "$LOG_DIR/clippy.log"
else
  tail -n 1 "$LOG_DIR/clippy.log"
fi

step "summary"
grep -E '^(cargo test \[|chaos\[)' "$LOG_DIR/cargo-test.log" "$LOG_DIR/chaos.log" | sed 's/^[^:]*://' || true
tail -n 1 "$LOG_DIR/clippy.log"
grep -E '^contract\[[^]]+\]: ' "$LOG_DIR/cargo-test.log" || echo "(no contract suite summary found in the test output)"
grep -E '^contract-octavia\[[^]]+\]: ' "$LOG_DIR/cargo-test.log" || echo "(no Octavia contract suite summary found in the test output)"
grep -E '^test result: ' "$LOG_DIR/cargo-test.log" | awk '{p+=$4; f+=$6; i+=$8} END {printf "libtest totals: %d passed, %d failed, %d ignored\n", p, f, i}'
# Both targets of each contract suite must have run the same N cases with 0 failed.
contract_ok=1
"$REPO/scripts/check-contract-summary.sh" "$LOG_DIR/cargo-test.log" || contract_ok=0
"$REPO/scripts/check-contract-summary.sh" "$LOG_DIR/cargo-test.log" contract-octavia emulator octavia || contract_ok=0
echo "total: $(since "$T_START")"
if [ "$rc" -ne 0 ]; then
  step "failed tests"
  "$REPO/scripts/failed-tests.sh" "$LOG_DIR/cargo-test.log" || true
  echo "cargo test FAILED (exit $rc); full log: $LOG_DIR/cargo-test.log"
  exit "$rc"
fi
if [ "$clippy_rc" -ne 0 ]; then
  echo "clippy FAILED (exit $clippy_rc); its output is above ($LOG_DIR/clippy.log)"
  exit "$clippy_rc"
fi
if [ "$chaos_ok" != 1 ]; then
  # Repeated here, last, so that the end of the output alone says which profile failed and why.
  step "chaos soak findings"
  for f in "$LOG_DIR/chaos-e2e.log" "$LOG_DIR/chaos-pools.log"; do
    [ -s "$f" ] || continue
    grep -m 1 -E '^chaos soak: ' "$f" || basename "$f"
    grep -E '^\| (leaks|stuck pods|mismatches|shared ports|node state|ERROR lines)' "$f" || true
    sed -n '/^violations:/,/^result:/p' "$f" | head -n 40
    grep -E '^(result: |kuryr: error)' "$f" | tail -n 2 || true
  done
  echo "chaos soak FAILED; full log: $LOG_DIR/chaos.log"
  exit 1
fi
if [ "$contract_ok" != 1 ]; then
  echo "contract suite check FAILED; full log: $LOG_DIR/cargo-test.log"
  exit 1
fi
echo "all checks passed"

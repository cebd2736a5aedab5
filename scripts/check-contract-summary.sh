#!/bin/bash
# Checks a `cargo test` log for a contract suite's result: both summary lines present
# (`PREFIX[A]: N passed, M failed` and `PREFIX[B]: N passed, M failed`), no failed case on either
# target, and the same N > 0 for both (any difference means a case was skipped or missing on one
# target). Prints what is wrong and exits 1; exits 0 when it holds.
# Usage: scripts/check-contract-summary.sh CARGO_TEST_LOG [PREFIX TARGET_A TARGET_B]
#   defaults: the Neutron suite, `contract emulator neutron-server`; the Octavia suite is
#   `contract-octavia emulator octavia` (both used by scripts/test-all.sh)
set -euo pipefail

log=${1:?usage: $0 CARGO_TEST_LOG [PREFIX TARGET_A TARGET_B]}
prefix=${2:-contract}
a=${3:-emulator}
b=${4:-neutron-server}
if [ ! -r "$log" ]; then
  echo "$prefix summary check: cannot read $log" >&2
  exit 2
fi

ok=1
counts=()
declare -A passed_of
for target in "$a" "$b"; do
  # The last run counts (a log may hold a re-run).
  line=$(grep -E "^$prefix\[$target\]: [0-9]+ passed, [0-9]+ failed" "$log" | tail -n 1 || true)
  if [ -z "$line" ]; then
    echo "$prefix summary check: FAILED: no '$prefix[$target]: N passed, M failed' line in $log (the target did not run or was skipped)"
    ok=0
    continue
  fi
  read -r passed failed < <(sed -E 's/^[^[]+\[[^]]+\]: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/' <<<"$line")
  if [ "$failed" -ne 0 ]; then
    echo "$prefix summary check: FAILED: $prefix[$target] has $failed failed case(s)"
    ok=0
  fi
  counts+=("$target=$passed")
  passed_of[$target]=$passed
done

if [ "${#counts[@]}" -eq 2 ]; then
  if [ "${passed_of[$a]}" -ne "${passed_of[$b]}" ]; then
    echo "$prefix summary check: FAILED: the targets passed different numbers of cases (${counts[*]}); both must run the same suite"
    ok=0
  elif [ "${passed_of[$a]}" -eq 0 ]; then
    echo "$prefix summary check: FAILED: no $prefix case passed (${counts[*]})"
    ok=0
  fi
fi

if [ "$ok" = 1 ]; then
  echo "$prefix summary check: OK, both targets passed the same ${passed_of[$a]} cases with 0 failed"
  exit 0
fi
exit 1

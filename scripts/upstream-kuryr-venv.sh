#!/bin/bash
# Creates (idempotently) a venv with upstream kuryr-kubernetes 10.0.0, the peer used by the
# compatibility tests and benchmarks, and prints its python path.
#   UPSTREAM_VENV (default $repo/.upstream-kuryr/venv)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${UPSTREAM_VENV:-$ROOT/.upstream-kuryr/venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import kuryr_kubernetes' 2>/dev/null; then
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q -U pip >&2
  # pyroute2 >= 0.7 dropped ipdb, which kuryr-kubernetes 10.0.0 imports.
  "$VENV/bin/pip" install -q 'kuryr-kubernetes==10.0.0' 'pyroute2<0.7' >&2
fi
echo "$VENV/bin/python"

#!/bin/bash
# Prints, for every failed libtest test in a `cargo test` log, its name and why it failed (the
# panic's location and message, or the `Error:` a test returned), a few lines each, so a CI
# summary that shows only its tail still says what broke.
#   scripts/failed-tests.sh target/test-all/cargo-test.log
set -euo pipefail
awk '
  /^---- .* stdout ----$/ { name = $2; printed = 0; want = 0; inblock = 1; print "FAILED " name; next }
  /^failures:$/ || /^test result: / { inblock = 0; next }
  !inblock { next }
  /panicked at / || /^Error: / { want = 4 }
  want > 0 && printed < 10 {
    sub(/\r$/, ""); gsub(/\033\[[0-9;]*m/, "")
    print "    " $0; want--; printed++
  }
' "$1"

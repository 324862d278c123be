#!/usr/bin/env bash
# The long fuzzing campaign, resumable across sessions: runs scripts/fuzz.sh
# on ONE target at a time (the machine is shared), at nice 19, each for
# SECONDS_EACH seconds, growing the kept corpus in $CAMPAIGN/fuzz-corpus/,
# and appends one ledger line per run to tests/fuzz/campaign-ledger.tsv
# (date, target, executions, seconds, crashes, commit) so that runs across
# sessions add up (scripts/fuzz-ledger.sh sums it). Stops before starting a
# run that would end after STOP_AT (a `date -d` time, e.g. 19:45).
#   fuzz-campaign.sh [TARGET...]   default: every target, the least-run first
# Environment: CAMPAIGN (build-campaign), FUZZ_BUILD (build-fuzz),
# SECONDS_EACH (300), STOP_AT (none).
set -u
cd "$(dirname "$0")/.."
campaign=${CAMPAIGN:-build-campaign}
build=${FUZZ_BUILD:-build-fuzz}
each=${SECONDS_EACH:-300}
ledger=tests/fuzz/campaign-ledger.tsv
stop=${STOP_AT:+$(date -d "$STOP_AT" +%s)}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  # least executions so far first, so the totals even out
  mapfile -t targets < <(scripts/fuzz-ledger.sh --order "$build")
fi
mkdir -p "$campaign/fuzz-corpus"
for t in "${targets[@]}"; do
  if [ -n "$stop" ] && [ $(($(date +%s) + each)) -gt "$stop" ]; then
    echo "campaign: stopping before $t (STOP_AT $STOP_AT)"
    break
  fi
  commit=$(git rev-parse --short HEAD)
  line=$(FUZZ_BUILD=$build FUZZ_SECONDS=$each FUZZ_CORPUS=$campaign/fuzz-corpus \
    nice -n 19 scripts/fuzz.sh "$t" | grep -E '^(FAIL )?fuzz_')
  echo "$line"
  execs=$(echo "$line" | sed -nE 's/.* ([0-9?]+) executions in ([0-9.]+) s.*/\1/p')
  secs=$(echo "$line" | sed -nE 's/.* executions in ([0-9.]+) s.*/\1/p')
  crashes=0
  case "$line" in FAIL*) crashes=$(echo "$line" | sed -nE 's/.*; ([0-9]+) saved crash inputs.*/\1/p') ;; esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "${t#fuzz_}" "${execs:-0}" "${secs:-0}" "${crashes:-1}" \
    "$commit" >>"$ledger"
done
scripts/fuzz-ledger.sh

#!/usr/bin/env bash
# Sums tests/fuzz/campaign-ledger.tsv (one line per campaign run: date,
# target, executions, seconds, crashes, commit) per target:
#   fuzz-ledger.sh            a table: target, runs, executions, seconds, crashes
#   fuzz-ledger.sh --order B  every fuzz target built in B/tests/fuzz, the
#                             fewest executions first (the campaign's order)
set -u
cd "$(dirname "$0")/.."
ledger=tests/fuzz/campaign-ledger.tsv
if [ "${1:-}" = --order ]; then
  for t in "${2:-build-fuzz}"/tests/fuzz/fuzz_*; do
    case "$t" in *.o | *.d) continue ;; esac
    n=$(basename "$t")
    n=${n#fuzz_}
    printf '%s %s\n' "$(awk -F'\t' -v n="$n" '$2 == n && $1 !~ /^#/ {s += $3} END {print s + 0}' "$ledger")" "fuzz_$n"
  done | sort -n | cut -d' ' -f2
  exit 0
fi
awk -F'\t' '$1 !~ /^#/ && NF >= 6 {
    runs[$2]++; ex[$2] += $3; sec[$2] += $4; cr[$2] += $5
  }
  END {
    printf "%-24s %5s %12s %9s %8s\n", "target", "runs", "executions", "seconds", "crashes"
    for (t in runs) { printf "%-24s %5d %12d %9.0f %8d\n", t, runs[t], ex[t], sec[t], cr[t]; tot += ex[t]; tc += cr[t] }
    printf "%-24s %5s %12d %9s %8d\n", "total", "", tot, "", tc
  }' "$ledger" | sort -k1,1 | awk '/^target/ {h = $0; next} /^total/ {t = $0; next} {r[++n] = $0} END {print h; for (i = 1; i <= n; i++) print r[i]; print t}'

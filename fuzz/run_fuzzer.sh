#!/usr/bin/env bash
# Fuzzes for a bounded time from a copy of the committed corpus and prints how
# many inputs ran. A finding (crash, sanitizer report, broken invariant) is
# saved under WORK_DIR/ and makes this script fail. SEED (default 0: a new
# random seed each run) fixes libFuzzer's mutations; CI passes one so that a
# finding reproduces and a run is not a lottery.
#   run_fuzzer.sh FUZZER SECONDS CORPUS_DIR WORK_DIR [SEED]
set -euo pipefail
fuzzer=$1 seconds=$2 corpus=$3 work=$4 seed=${5:-0}

rm -rf "$work"
mkdir -p "$work/corpus" "$work/findings"
cp "$corpus"/* "$work/corpus/"
seeds=$(ls "$work/corpus" | wc -l)

status=0
"$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -timeout=60 -rss_limit_mb=4096 -seed="$seed" \
  -max_len=1024 -artifact_prefix="$work/findings/" "$work/corpus" >"$work/fuzz.log" 2>&1 || status=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
if [ "$status" -ne 0 ] || [ -z "$runs" ]; then
  tail -n 60 "$work/fuzz.log"
  echo "fuzz_attention: FINDING after ${runs:-?} inputs (exit $status); inputs in $work/findings/"
  exit 1
fi
echo "fuzz_attention: ran clean for $seconds s (seed $seed): $runs inputs, corpus $seeds -> $(ls "$work/corpus" | wc -l) files"

#!/usr/bin/env bash
# Samples/s of the Bahdanau example (examples/bahdanau_fra_eng) in one
# process and in two (--spawn 2, each on half of every batch), run alternately
# so that both see the same machine. Each run prints the median epoch's
# examples/s; this prints every run and the median of the runs per row.
#
#   benchmarks/data_parallel.sh BUILD_DIR [REPS] [EPOCHS]
#
# Rows: the book's model (32 hidden units) and a wider one (256), batches of
# 64, each as 1 process x 1 thread, 1 process x 2 threads, 2 processes x 1
# thread splitting every batch of 64 (32 rows each: the same training as one
# process, as the equivalence test checks), and 2 processes x 1 thread on
# batches of 128 (64 rows each: every process keeps the single process's
# batch, as data-parallel runs usually scale). OpenBLAS is kept at 1 thread
# (the example's default; see its comments).
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [REPS] [EPOCHS]}
reps=${2:-3}
epochs=${3:-30}
exe="$build/examples/bahdanau_fra_eng"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OPENBLAS_NUM_THREADS=1
# OpenMP's threads wait passively between regions, as make bahdanau runs it.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

rate() {  # the example's "N examples/sec (median of ...)" figure
  "$exe" --out "$out" --epochs "$1" "${@:2}" 2>&1 | sed -n 's/^\([0-9.]*\) examples\/sec.*/\1/p'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

printf '| model | 1 process, 1 thread | 1 process, 2 threads | 2 processes, batch 64 split | ratio | 2 processes, batch 128 split (64 each) | ratio |\n'
printf '| --- | --- | --- | --- | --- | --- | --- |\n'
ratio() { awk -v c="$1" -v a="$2" 'BEGIN { printf "%.2fx", c / a }'; }
for model in "32" "256"; do
  e=$epochs
  [ "$model" = 256 ] && e=$(( (epochs + 2) / 3 ))
  a="" b="" c="" d=""
  for ((r = 0; r < reps; ++r)); do
    a+=" $(rate "$e" --num-hiddens "$model" --threads 1)"
    b+=" $(rate "$e" --num-hiddens "$model" --threads 2)"
    c+=" $(rate "$e" --num-hiddens "$model" --spawn 2 --threads 1)"
    d+=" $(rate "$e" --num-hiddens "$model" --spawn 2 --threads 1 --batch-size 128)"
  done
  ma=$(echo "$a" | median) mb=$(echo "$b" | median) mc=$(echo "$c" | median) md=$(echo "$d" | median)
  printf '| %s hidden, %s epochs |%s (median %s) |%s (median %s) |%s (median %s) | %s |%s (median %s) | %s |\n' \
    "$model" "$e" "$a" "$ma" "$b" "$mb" "$c" "$mc" "$(ratio "$mc" "$ma")" "$d" "$md" "$(ratio "$md" "$ma")"
done

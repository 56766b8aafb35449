#!/usr/bin/env bash
# Runs the fuzz targets one at a time (one process each: 2-core machine), after replaying the
# committed regression cases, and prints executions per target.
#
#   fuzz/run.sh SECONDS [TARGET...]       fuzz each target for SECONDS
#   fuzz/run.sh --smoke SECONDS [TARGET...]  the same, meant for `make fuzz-smoke`
#   fuzz/run.sh --regressions [TARGET...]    replay fuzz/regressions/ (and the seeds) only
# FUZZ_NO_BUILD=1 reuses the binaries in fuzz/target/ instead of building them first.
#
# Seeds: fuzz/corpus/<target>/ (committed, from `fuzz/gen-corpus.py`). What a run finds grows in
# fuzz/work/<target>/ (ignored); a crash lands in fuzz/artifacts/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")"

ALL=(sanitize policy host frame read_pager edit_replace request_head)
mode=fuzz
seconds=60
case "${1:-}" in
  --regressions) mode=replay; shift ;;
  --smoke) mode=fuzz; seconds=${2:?seconds}; shift 2 ;;
  '') ;;
  *) seconds=$1; shift ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL[@]}")

# Per-target input size limits (bytes): archives, streams and files need room.
max_len() {
  case $1 in
    sanitize|frame|read_pager) echo 65536 ;;
    request_head) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

# libFuzzer on the stable toolchain; no sanitizer: the crates forbid unsafe code, and the targets
# assert their memory bounds themselves (a counting allocator) besides libFuzzer's RSS limit.
export RUSTC_BOOTSTRAP=1
mkdir -p work
build_flags=(--sanitizer none)
if [ -n "${FUZZ_NO_BUILD:-}" ]; then
  : # reuse the binaries already built (fuzz/target/)
elif [ ${#targets[@]} -eq ${#ALL[@]} ]; then
  cargo fuzz build "${build_flags[@]}" >work/build.log 2>&1 || { cat work/build.log; exit 1; }
else
  for t in "${targets[@]}"; do
    cargo fuzz build "${build_flags[@]}" "$t" >work/build.log 2>&1 || { cat work/build.log; exit 1; }
  done
fi
bin_dir=target/x86_64-unknown-linux-gnu/release

total=0
printf '%-14s %12s %10s\n' target executions exec/s
for t in "${targets[@]}"; do
  bin=$bin_dir/$t
  # Replay: every committed crasher and seed must pass.
  inputs=()
  for d in regressions/$t corpus/$t; do
    [ -d "$d" ] && inputs+=("$d"/*)
  done
  if [ ${#inputs[@]} -gt 0 ]; then
    "$bin" -runs=1 "${inputs[@]}" >"work/replay-$t.log" 2>&1 \
      || { tail -40 "work/replay-$t.log"; echo "fuzz: $t: a regression case fails" >&2; exit 1; }
  fi
  [ "$mode" = fuzz ] || { printf '%-14s %12s\n' "$t" "replayed ${#inputs[@]}"; continue; }
  mkdir -p "work/$t" "artifacts/$t"
  log=work/$t.log
  if ! "$bin" "work/$t" "corpus/$t" -max_total_time="$seconds" -max_len="$(max_len "$t")" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
      >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t found a crash: fuzz/artifacts/$t/ (log: fuzz/$log)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  total=$((total + ${runs:-0}))
  printf '%-14s %12s %10s\n' "$t" "${runs:-?}" "${rate:-?}"
done
[ "$mode" = fuzz ] && printf '%-14s %12s\n' total "$total"
exit 0

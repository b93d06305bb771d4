#!/usr/bin/env bash
# The simulator's outputs, to hold a refactor bit-identical: every policy on the reference traces, the modes on a few
# policies, compositions, a KV-bound cluster, a profiled cost model, and the CLI's printed tables.
#   git worktree add /tmp/before <commit>; REPO=/tmp/before paper/experiments/frames_snapshot.sh /tmp/frames-before
#   REPO=$PWD paper/experiments/frames_snapshot.sh /tmp/frames-after
#   python paper/experiments/frames_compare.py /tmp/frames-before /tmp/frames-after [--added-columns-ok] [--skip-tables]
# (issue 34: b939830 against the refactored main, 385 files, every frame equal; ~3 minutes a snapshot on 2 cores)
set -u
REPO=${REPO:-/work/main}
OUT=$1
mkdir -p $OUT
cd $REPO
PROFILE=real_backend/data/profile_cpu.json; [ -f $PROFILE ] || PROFILE=real_backend/profile_cpu.json
POLS=$(ls policies/*.py | xargs -n1 basename | sed 's/\.py$//' | grep -v '^_')
run() { # name, args...
  local name=$1; shift
  lssim replay "$@" --out $OUT/$name --workers 1 > $OUT/$name.txt 2> $OUT/$name.err; echo "$name rc=$?" >> $OUT/rc.txt
}
for t in math7b longtail32k; do
  for p in $POLS; do run ${t}_$p traces/$t.parquet --policy $p --no-reference; done
  run ${t}_refs traces/$t.parquet --policy hadb
done
for p in baseline hadb april breaker; do
  for m in disaggregated async hybrid; do run math7b_${p}_$m traces/math7b.parquet --policy $p --mode $m --no-reference; done
  run math7b_${p}_async3areal traces/math7b.parquet --policy $p --mode async --staleness 3 --async-variant areal --no-reference
done
run math7b_compose traces/math7b.parquet --policy 'hadb+april+breaker' --policy 'seer+segment' --no-reference
run math7b_kv traces/math7b.parquet --policy hadb --policy april --instances 2 --kv-tokens 20000 --no-reference
for p in baseline hadb april seer breaker segment; do
  run real_$p traces/real_cpu_baseline.parquet --policy $p --profile $PROFILE --instances 1 --no-reference
done

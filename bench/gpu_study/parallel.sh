#!/bin/bash
# GPU call after setup.sh (carry .gpu-b): several `bsi sweep` runs at once on the one GPU, each into a folder of its
# own, and each returned as one archive ($OUT/NAME.tgz: its study folder and sweep.log), with the GPU's use sampled
# every 5 s ($OUT/smi.csv). A sweep here keeps the GPU a few percent busy (docs/benchmarks.md), so paths of one
# sweep's grid (the same flags but --protocols and --methods: one fingerprint) run side by side and merge here.
#
#   SWEEP_S=480 bash bench/gpu_study/parallel.sh NAME "FLAGS" [NAME "FLAGS" ...]
#
# SWEEP_S bounds every sweep (each keeps its finished cells; a path stopped midway is lost, its round lines stay
# in sweep.log). Each sweep has its own cache (the fine-tunes are redone, seconds each) and 4 CPU threads.
set -u
source "$(dirname "$0")/model.sh"
[ $# -ge 2 ] && [ $(( $# % 2 )) -eq 0 ] || { echo "give NAME \"FLAGS\" pairs"; exit 2; }
command -v nvidia-smi >/dev/null && { nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > $OUT/smi.csv 2>&1 & }
start=$(date +%s); pids=(); names=()
while [ $# -ge 2 ]; do
  name=$1; flags=$2; shift 2
  mkdir -p $OUT/$name; names+=("$name")
  ( export BSI_CACHE=/tmp/bsi-cache-$name OMP_NUM_THREADS=4
    # shellcheck disable=SC2086  # the flags are words
    timeout -s INT ${SWEEP_S:-480} python -m bsi sweep $flags --out $OUT/$name/study > $OUT/$name/sweep.log 2>&1
    echo "$name: sweep exit $? after $(( $(date +%s) - start )) s" ) &
  pids+=($!)
done
wait "${pids[@]}"
pkill -f "nvidia-smi --query-gpu" 2>/dev/null
for name in "${names[@]}"; do
  echo "== $name"; grep -v "Converting\|step [0-9]*/" $OUT/$name/sweep.log | tail -c 2500
  rm -f $OUT/$name/study/figure.html; (cd $OUT && tar czf $name.tgz $name && rm -rf $name)
done

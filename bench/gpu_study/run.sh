#!/bin/bash
# GPU call 2 (carry .gpu-b) or later (carry nothing, RESUME=/tmp/study-gpu): run `bsi sweep "$@"` into a copy of
# the sweep folder under $OUT (an empty one when prepare.sh was given none), and return that folder as one archive
# ($OUT/study.tgz: the device returns only a few files). SWEEP_S bounds the sweep (it keeps its finished cells when
# stopped; a method's path stopped midway is lost); RESUME=/tmp/study-gpu continues a stopped run on a warm machine.
set -u
source "$(dirname "$0")/model.sh"
mkdir -p $OUT/study
src=${RESUME:-$M/study}
[ -d "$src" ] && cp -r "$src"/. $OUT/study/
start=$(date +%s)
timeout -s INT ${SWEEP_S:-480} python -m bsi sweep "$@" --out $OUT/study > $OUT/sweep.log 2>&1
echo "sweep exit $? after $(( $(date +%s) - start )) s"
rm -f $OUT/study/figure.html; rm -rf /tmp/study-gpu && cp -r $OUT/study /tmp/study-gpu
grep -v "step [0-9]*/\|round [0-9]*/" $OUT/sweep.log | tail -c 6000
cd $OUT && tar czf study.tgz study sweep.log && rm -rf study sweep.log

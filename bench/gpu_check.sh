#!/usr/bin/env bash
# One prepared device check: build for sm_90, GPU tests, GPU benchmarks,
# bench/gpu_results/<device>.json, docs/gpu.md's GPU tables. Arguments and steps:
# bench/gpu_check.py (python3 bench/gpu_check.sh --help).
set -u
cd "$(dirname "$0")/.." || exit 2
exec "${PYTHON:-python3}" bench/gpu_check.py "$@"

#!/bin/bash
# Answer-path tuning on a TRAIN-split copy of the end-to-end set: MODEL TOPK NAME [more `midlens eval e2e` options]
#   python -m midlens.eval.build_default_corpus --split train --questions 60 --seed 1 --out runs/tune-e2e   # once
#   docs/results/answer-path/tuning-e2e/tune_e2e.sh qwen2.5-0.5b 5 dense5
#   docs/results/answer-path/tuning-e2e/tune_e2e.sh qwen2.5-0.5b 10 hybrid10 --retrieval hybrid
# One thread per job, one job per core; 48 new tokens is `midlens ask`'s default answer length.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
M=$1; K=$2; NAME=$3; shift 3
.venv/bin/midlens eval e2e --model "$M" --methods baseline --max-new-tokens 48 --top-k "$K" \
  --questions runs/tune-e2e/hotpotqa_questions.jsonl --corpus runs/tune-e2e/hotpotqa_corpus.jsonl \
  --index-dir "runs/tune-e2e/index-$NAME" "$@" --out "runs/tune-e2e-$M-$NAME"

#!/usr/bin/env bash
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1
source .venv/bin/activate
python -m midlens.cli eval sweep --dataset hotpotqa --n 200 --k 10 --max-words 60 --max-new-tokens 16 --device cpu \
  --no-progress --methods moice --out runs/h200-moice --shard $1/2
echo DONE $1

#!/bin/bash
# Pos2Distill on SmolLM2-135M against the baseline and the fine-tuning control, short-answer instruction, gold at
# 1/5/10; one corpus per process (hotpotqa | squad), one thread each. Run from the repository root.
D=$1
OMP_NUM_THREADS=1 midlens eval sweep --dataset "$D" --model smollm2-135m --n 60 --k 10 --positions 1,5,10 \
    --methods "baseline,pos2distill,mudaf(alpha=0)" --prompt-style short --max-words 60 --max-new-tokens 16 \
    --stop-at-line-end --batch-size 4 --out "runs/p2d-$D-smollm2"

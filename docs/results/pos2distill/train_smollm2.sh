#!/bin/bash
# Pos2Distill for SmolLM2-135M, sized for a 2-core CPU (the paper: K = 4 placements, 300 examples, full fine-tuning
# on GPUs). Run from the repository root; the artefact was then copied to generators/trained/pos2distill/smollm2-135m.
OMP_NUM_THREADS=2 midlens train pos2distill --model smollm2-135m --device cpu --examples 120 --batch 4 --lr 3e-4 \
    --placements 2 --max-words 30 --out runs/p2d-smollm2

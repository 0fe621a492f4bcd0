# What ran on one NVIDIA GPU, from the repository root, with the packaged model's wheel, the HotpotQA data wheel
# and gguf importable, HF_HUB_OFFLINE=1 and PYTHONUNBUFFERED=1. Outputs went to /tmp/res and were copied back:
# the head scores to generators/trained/retrieval-heads/, the two deltas to generators/trained/mudaf/.
M=smollm2-135m
nvidia-smi -L

# 1. Retrieval-head scores on 200 train-split prompts.
mkdir -p /tmp/res/heads /tmp/res/art
midlens heads score --model $M --n 200 --out /tmp/res/heads --device cuda --dtype float32

# 2. MuDAF (alpha 0.7) and its plain fine-tuning control (alpha 0), side by side, same data order; each stops
#    by time (4.2 minutes) and leaves a checkpoint a second command resumes from.
for A in 0.7 0; do
  D=/tmp/res/art/$M; [ "$A" = "0" ] && D=/tmp/res/art/$M-alpha0
  midlens train mudaf --model $M --alpha $A --heads-file /tmp/res/heads/$M.json \
    --examples 2400 --batch 8 --lr 4e-4 --out $D --device cuda --dtype float32 --max-minutes 4.2 --no-progress \
    > /tmp/res/train_alpha$A.log 2>&1 &
done
wait
rm -rf /tmp/res/art/*.checkpoint   # finished artefacts only

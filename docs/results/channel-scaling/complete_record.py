"""Rebuild the candidate list of a channel-scaling search record written before the fix of training/channel_scaling.py
that keeps the search's options under "options" (the option `candidates`, a count, overwrote the list of candidate
channels). Step 1 is rerun with the run's own seed and options (deterministic: the same strings give the same means
and the same candidates); each candidate's answer NLL at scale 0 is read from the search's log; the record is
rewritten in the fixed layout. meta.json is not hashed: the verified choice (the tensors) is untouched.

    python docs/results/channel-scaling/complete_record.py smollm2-135m /work/runs/chs-search-smollm2.log
"""

from __future__ import annotations

import json
import re
import sys

from midlens.generators.models.loading import load_model
from midlens.generators.models.shipped import shipped_path
from midlens.training.channel_scaling import find_candidates

OPTIONS = ("strings", "length", "candidates", "scales", "layer_ranges", "kv_pairs", "kv_seed", "prompt_style")


def main(model: str, log: str) -> None:
    folder = shipped_path("channel-scaling", model)
    meta = json.loads((folder / "meta.json").read_text())
    record = meta["training"]
    if "candidate_channels" in record:
        print("record already complete")
        return
    lines = open(log, encoding="utf-8").read().replace("\r", "\n")
    nll: dict[int, float] = {}
    for c, v in re.findall(r"channel (\d+) scale 0 layers \d+-\d+: answer NLL ([\d.]+)", lines):
        nll.setdefault(int(c), float(v))  # the channel step comes first in the log, at the default layers
    options = {k: record.pop(k) for k in OPTIONS}
    options.update(examples=record.pop("examples"), batch=record.pop("batch"), seed=record.pop("seed"))
    loaded = load_model(model)
    found, _ = find_candidates(loaded, options["strings"], options["length"], options["candidates"], options["seed"])
    if sorted(nll) != sorted(r["channel"] for r in found):
        raise SystemExit(f"the rerun's candidates {[r['channel'] for r in found]} are not the log's {sorted(nll)}")
    record["candidate_channels"] = [{**r, "nll_at_scale_0": nll[r["channel"]]} for r in found]
    record["options"] = options
    record["record_note"] = "candidate_channels rebuilt by docs/results/channel-scaling/complete_record.py"
    (folder / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    print(json.dumps(record["candidate_channels"], indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

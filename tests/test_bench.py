"""The benchmark commands run end to end on a tiny prompt (a smoke test: timings are not asserted here,
they are measured by `midlens bench` on a quiet machine)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # subprocess runs and benches: `make test`, not `make test-fast`


# The method bench measures no memory (a fresh process per variant, ~15 s each here): the evidence bench covers the
# memory path, and the method bench's own part is its answer path.
@pytest.mark.parametrize(
    ("kind", "variants", "memory_repeats"),
    [("evidence", {"plain", "module", "evidence", "score", "eager"}, 1), ("attn-calibration", None, 0)],
)
def test_bench_report_has_every_variant_and_ratio(loaded, kind, variants, memory_repeats, capsys):
    from midlens.eval.bench import method_variants, print_report, run

    report = run(kind, "smollm2-135m", [400], repeats=1, decode_tokens=2, memory_repeats=memory_repeats)
    (row,) = report["sizes"]
    expected = variants or set(method_variants(kind))
    assert 0 < row["prompt_tokens"] <= 400
    memory_keys = ("peak_rss_mb", "memory_ratio_total") if memory_repeats else ()
    for key in ("prefill_s", "time_ratio", *memory_keys):
        assert set(row[key]) == expected and all(v > 0 for v in row[key].values())
    base = next(iter(row["time_ratio"]))
    assert row["time_ratio"][base] == 1.0
    if memory_repeats:
        assert row["memory_ratio_total"][base] == 1.0
    else:
        assert "peak_rss_mb" not in row
        print_report(report)
        assert "memory not measured: --memory-repeats 0" in capsys.readouterr().out
    assert all(v > 0 for k, v in row["decode_tok_per_s"].items() if k.startswith("ratio"))
    assert report["malloc_mmap_threshold"] == 65536
    if kind == "evidence":  # the probe's cost against the same module's prefill, in the same run
        assert row["over_module"]["module"] == 1.0 and row["over_module"]["evidence"] > 0
    if kind != "evidence":  # a method bench also times the whole answer path, every variant decoding as many tokens
        answer = row["answer"]
        assert set(answer["seconds"]) == expected and answer["time_ratio"][base] == 1.0
        assert all(parts["generated_tokens"] == 2 and parts["answer_s"] > 0 for parts in answer["seconds"].values())
        assert all("calibrate_s" in answer["seconds"][v] for v in expected - {base})  # its calibration pass is timed


def test_memory_processes_run_with_the_fixed_mmap_threshold(loaded, monkeypatch):
    """The allocator setting must reach the measuring process (glibc reads it at start-up), and 0 must
    remove an inherited one."""
    from midlens.eval.bench_memory import memory_of

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    fixed = memory_of("baseline", "smollm2-135m", 200, repeats=1)
    default = memory_of("baseline", "smollm2-135m", 200, repeats=1, mmap_threshold=0)
    assert fixed["mmap_threshold"] == "65536" and default["mmap_threshold"] is None
    assert fixed["peak_mb"] > fixed["base_mb"] > 0


def test_bench_batch_removes_its_random_weights_folder(monkeypatch, tmp_path):
    """`midlens bench batch --random-shape` writes a model folder (0.5 GB for SmolLM2's shape) into the temp
    directory; it is gone after the run, and after a run that fails."""
    import midlens.eval.bench_batch as bench_batch
    import midlens.generators.models.model_cache as model_cache
    import midlens.generators.models.random_models as random_models

    def fake_save(shape, folder, tokenizer_dir):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        return folder

    seen = []

    def fake_measure(source, *args):
        seen.append(source)
        assert (bench_batch.Path(source) / "model.safetensors").is_file()  # there while measured
        if len(seen) == 2:
            raise RuntimeError("interrupted")
        return {"model": source}

    monkeypatch.setattr(model_cache, "resolve_model_dir", lambda name: tmp_path)
    monkeypatch.setattr(random_models, "save_random_model", fake_save)
    monkeypatch.setattr(bench_batch, "_measure", fake_measure)
    bench_batch.run("smollm2-135m", [1], 1, 1, 1, "cpu", "float32", random_shape="smollm2-135m")
    with pytest.raises(RuntimeError, match="interrupted"):
        bench_batch.run("smollm2-135m", [1], 1, 1, 1, "cpu", "float32", random_shape="smollm2-135m")
    assert len(seen) == 2 and not any(bench_batch.Path(s).parent.exists() for s in seen)

"""Benchmark of `midlens serve` (a command, not a test): throughput and latency under 1, 4 and 16 concurrent clients
against in-process `generate_batch` on the same prompts, the batch sizes the server formed, and peak memory.

    midlens bench serve --out docs/results/serve      (or python -m midlens.serve.bench)

Every request stacks three passages of the embedded HotpotQA corpus under a question about one of them; the server
runs one replica on one torch thread, as the in-process side does, on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def workload(n: int) -> list[dict[str, Any]]:
    """n requests: a question about one document, stacked with it and two neighbours of the embedded corpus."""
    from midlens.retrievers.corpus import default_corpus_path, read_documents

    docs = read_documents(default_corpus_path())
    requests = []
    for i in range(n):
        group = [docs[(3 * i + j) % len(docs)] for j in range(3)]
        target = group[i % 3]
        requests.append(
            {
                "question": f"What does the passage say about {target['title']}?",
                "passages": [{"id": d["id"], "title": d["title"], "text": d["text"][:400]} for d in group],
            }
        )
    return requests


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_server(url: str, requests: list[dict], concurrency: int, max_new: int) -> dict[str, Any]:
    from midlens.rag.remote import MidlensClient

    clients = [MidlensClient(url, timeout=600, retries=0) for _ in range(concurrency)]
    before = Counter(clients[0].stats().batches)
    latencies: list[float] = []
    texts: list[str] = [""] * len(requests)
    lock = threading.Lock()
    next_index = iter(range(len(requests)))

    def worker(client: MidlensClient) -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            t0 = time.perf_counter()
            out = client.answer(requests[i]["question"], requests[i]["passages"], max_new_tokens=max_new)
            with lock:
                latencies.append(time.perf_counter() - t0)
                texts[i] = out.text

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, clients))
    wall = time.perf_counter() - t0
    stats = clients[0].stats()
    after = Counter(stats.batches)
    for client in clients:
        client.close()
    formed = {size: n for size, n in sorted((after - before).items())}
    return {
        "side": "server",
        "concurrency": concurrency,
        "requests": len(requests),
        "wall_s": wall,
        "throughput_rps": len(requests) / wall,
        "p50_s": statistics.median(latencies),
        "p99_s": _percentile(latencies, 0.99),
        "batches": formed,
        "texts": texts,
        "pid": stats.pid,
    }


def bench_in_process(generator, requests: list[dict], batch_size: int, max_new: int) -> dict[str, Any]:
    from midlens.core.passage import Passage

    prompts = [
        generator.prompt(r["question"], [Passage(p["text"], p["title"], p["id"]) for p in r["passages"]], max_new)
        for r in requests
    ]
    latencies, texts = [], []
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch_size):
        t1 = time.perf_counter()
        answers = generator.generate_batch(prompts[start : start + batch_size], max_new_tokens=max_new)
        # Every prompt of a batch waits for the whole batch: its latency is the batch's.
        latencies += [time.perf_counter() - t1] * len(answers)
        texts += [a.text for a in answers]
    wall = time.perf_counter() - t0
    return {
        "side": "in-process",
        "concurrency": batch_size,
        "requests": len(requests),
        "wall_s": wall,
        "throughput_rps": len(requests) / wall,
        "p50_s": statistics.median(latencies),
        "p99_s": _percentile(latencies, 0.99),
        "batches": dict(Counter(min(batch_size, len(prompts) - s) for s in range(0, len(prompts), batch_size))),
        "texts": texts,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| side | clients / batch | requests | throughput (req/s) | p50 (s) | p99 (s) | batches formed {size: count} "
        "| load (1 min) at start |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['side']} | {row['concurrency']} | {row['requests']} | {row['throughput_rps']:.2f} | "
            f"{row['p50_s']:.2f} | {row['p99_s']:.2f} | {row['batches']} | {row['load_1min']:.2f} |"
        )
    mem = report["peak_rss_mb"]
    lines.append("")
    ratios = {c: ratio(report, c) for c in sorted({row["concurrency"] for row in report["rows"]})}
    lines.append(
        "Server throughput over in-process throughput at the same clients / batch size: "
        + ", ".join(f"{c}: {r:.2f}x" for c, r in ratios.items() if r is not None)
        + "."
    )
    lines.append(
        f"Peak resident memory: server replica {mem['replica']:.0f} MiB, in-process benchmark process "
        f"{mem['in_process']:.0f} MiB. Server answers equal in-process ones: {report['texts_equal']}."
    )
    return "\n".join(lines)


def run(
    model: str,
    n_requests: int,
    levels: list[int],
    max_new: int,
    max_batch_size: int,
    batch_wait_timeout_s: float,
    command: str,
) -> dict[str, Any]:
    """Serve `model` on a local cluster and, at every client count in `levels`, time `n_requests` sent to it, then
    the same prompts through in-process `generate_batch` in batches of that size; returns the report `markdown`
    reads. One function on purpose: the server's lifetime brackets both sides of every level, back to back."""
    import torch

    torch.set_num_threads(1)  # the replica runs one torch thread too
    from midlens.generators.answering.generator import Generator
    from midlens.rag.remote import MidlensClient
    from midlens.serve.app import ServeOptions, start, stop

    requests = workload(n_requests)
    options = ServeOptions(
        model=model,
        port=_free_port(),
        threads=1,
        max_new_tokens=max_new,
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
        request_timeout_s=600,
    )
    rows = []
    load_before = os.getloadavg()
    url = start(options)
    try:
        with MidlensClient(url) as warm:  # the first request pays for lazy set-up; it is not timed
            warm.answer(requests[0]["question"], requests[0]["passages"], max_new_tokens=max_new)
        generator = Generator(model, device="cpu")
        bench_in_process(generator, requests[:1], 1, max_new)  # warm-up, untimed
        # Each level's two sides back to back (the server idle while this process generates): on a shared
        # machine the load drifts over minutes, and a ratio is only fair between rows taken under the same load.
        for c in levels:
            for side in ("server", "in-process"):
                load = os.getloadavg()[0]
                if side == "server":
                    row = bench_server(url, requests, c, max_new)
                else:
                    row = bench_in_process(generator, requests, c, max_new)
                rows.append({**row, "load_1min": load})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "texts"}), flush=True)
        replica_peak = _peak_rss_mb(rows[0]["pid"])
    finally:
        stop()
    rows.sort(key=lambda row: row["side"] != "server")  # the table: the server's rows, then in-process ones
    texts = {tuple(row["texts"]) for row in rows}
    return {
        "command": command,
        "model": model,
        "requests": n_requests,
        "max_new_tokens": max_new,
        "max_batch_size": max_batch_size,
        "batch_wait_timeout_s": batch_wait_timeout_s,
        "cpu_count": os.cpu_count(),
        # 1-minute load averages: the machine is shared, so the table is read against them.
        "load_average": {"before": load_before[0], "after": os.getloadavg()[0]},
        "rows": [{k: v for k, v in row.items() if k not in ("texts", "pid")} for row in rows],
        "peak_rss_mb": {"replica": replica_peak, "in_process": _peak_rss_mb()},
        "texts_equal": len(texts) == 1,
    }


def ratio(report: dict[str, Any], level: int) -> float | None:
    """Server throughput over in-process throughput at one client count / batch size (None: not measured)."""
    by_side = {row["side"]: row for row in report["rows"] if row["concurrency"] == level}
    if len(by_side) != 2:
        return None
    return by_side["server"]["throughput_rps"] / by_side["in-process"]["throughput_rps"]


def write(report: dict[str, Any], out: Path) -> None:
    """bench.json (the report) and README.md (the table, the command, the machine's load) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    load = report["load_average"]
    (out / "README.md").write_text(
        "# midlens serve: throughput and latency\n\n"
        f"`{report['command']}` on a {report['cpu_count']}-core CPU machine (shared; 1-minute load average "
        f"{load['before']:.2f} before, {load['after']:.2f} after), {report['model']}, {report['requests']} requests "
        f"per row, {report['max_new_tokens']} new tokens, three passages per prompt. Server: one Ray Serve replica "
        f"on one torch thread, `--max-batch-size {report['max_batch_size']} --batch-wait-timeout "
        f"{report['batch_wait_timeout_s']}`, clients over loopback HTTP. In-process: `Generator.generate_batch` in "
        "batches of the same size as the client count, one torch thread; a prompt's latency there is its batch's."
        "\n\n" + markdown(report) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m midlens.serve.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=16, help="requests at every concurrency")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts (= in-process batches)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-wait-timeout", type=float, default=0.02)
    parser.add_argument("--out", type=Path, help="folder for README.md (the table) and bench.json")
    args = parser.parse_args(argv)
    report = run(
        args.model,
        args.requests,
        [int(x) for x in args.concurrency.split(",")],
        args.max_new_tokens,
        args.max_batch_size,
        args.batch_wait_timeout,
        "python -m midlens.serve.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    print(markdown(report))
    if args.out:
        write(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

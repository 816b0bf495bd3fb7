"""Crawl benchmark: a synthetic hub of N repos (default 10 000) served on 127.0.0.1 with injected
latency and a fixed-window request-rate limit, crawled by the real crawler.

Prints, side by side: allowed vs achieved request rate, 429s received, peak RSS of this process
(crawler and hub server together), the no-change recrawl, and the fingerprint pass (pure rules,
and the store round trip of `--refingerprint`).

    .venv/bin/python benchmarks/crawl.py [--repos 10000] [--latency-ms 20] [--rate 200] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.pop("HF_HUB_OFFLINE", None)

from atlas.hub import crawl as crawler  # noqa: E402
from atlas.fingerprints import fingerprint  # noqa: E402
from atlas.hub.server import HubServer, MirrorRepo  # noqa: E402

ORGS = 10


def synthetic_repos(n: int) -> dict[str, MirrorRepo]:
    """Configs shaped like real ones; every 4th declares MTP, every 10th has a weight index."""
    repos: dict[str, MirrorRepo] = {}
    for i in range(n):
        repo_id = f"bench-org-{i % ORGS}/model-{i:05d}"
        layers = 24 + i % 40
        config: dict[str, object] = {
            "architectures": ["BenchForCausalLM"], "model_type": "bench", "hidden_size": 1024 + 64 * (i % 8),
            "num_hidden_layers": layers, "vocab_size": 32000 + i, "torch_dtype": "bfloat16",
        }
        if i % 4 == 0:
            config["num_nextn_predict_layers"] = i % 3
        files: dict[str, bytes | Path] = {"config.json": json.dumps(config, indent=2).encode()}
        if i % 10 == 0:
            names = [f"model.layers.{k}.mlp.down_proj.weight" for k in range(layers)]
            if i % 20 == 0:
                names.append(f"model.layers.{layers}.eh_proj.weight")
            files["model.safetensors.index.json"] = json.dumps(
                {"metadata": {}, "weight_map": {name: "model-00001-of-00001.safetensors" for name in names}}
            ).encode()
        repos[repo_id] = MirrorRepo(repo_id, files)
    return repos


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=200, help="allowed requests per second (fixed 2 s window)")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    t0 = time.perf_counter()
    repos = synthetic_repos(args.repos)
    build_s = time.perf_counter() - t0
    window_s = 2.0
    with tempfile.TemporaryDirectory(prefix="atlas-bench-") as tmp:
        work = Path(tmp)
        watch = work / "watchlist.toml"
        watch.write_text(
            "orgs = [" + ", ".join(f'{{ author = "bench-org-{k}" }}' for k in range(ORGS)) + "]\n"
            "[defaults]\npipeline_tags = ['text-generation']\nmin_downloads = 0\nmax_models = 100000\n"
        )
        db = work / "atlas.duckdb"
        with HubServer(repos, page_size=1000, latency_s=args.latency_ms / 1000,
                       rate_limit=(int(args.rate * window_s), window_s)) as hub:
            run = lambda: crawler.crawl(  # noqa: E731
                db, watch, endpoint=hub.url, endpoint_label="bench", token=False, cache_dir=work / "cache",
                concurrency=args.concurrency, progress=False,
            )
            t0 = time.perf_counter()
            first = run()
            first_s = time.perf_counter() - t0
            served_first, limited_first = len(hub.requests), hub.rate_limited
            hub.clear_log()
            t0 = time.perf_counter()
            second = run()
            second_s = time.perf_counter() - t0
            file_requests_second = len(hub.file_requests())

        configs = [json.loads(r.read("config.json")) for r in repos.values()]
        t0 = time.perf_counter()
        for config in configs:
            fingerprint(config)
        pure_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_refp = crawler.refingerprint(db)
        refp_s = time.perf_counter() - t0
        db_mb = db.stat().st_size / 2**20

    achieved = served_first / first_s
    achieved_ok = (served_first - limited_first) / first_s
    print(f"synthetic hub: {args.repos} repos in {ORGS} orgs, built in {build_s:.1f} s; "
          f"latency {args.latency_ms:.0f} ms/request, concurrency {args.concurrency}")
    print(f"{'':34} {'allowed':>12} {'achieved':>12}")
    print(f"{'request rate, all answers (req/s)':34} {args.rate:>12.1f} {achieved:>12.1f}   ({achieved / args.rate:.2f} of allowed)")
    print(f"{'request rate, served (non-429)':34} {args.rate:>12.1f} {achieved_ok:>12.1f}   ({achieved_ok / args.rate:.2f} of allowed)")
    print(f"first crawl: {first.listed} listed, {first.fetched} fetched, {first.failed} failed, "
          f"{served_first} requests served in {first_s:.1f} s; 429s sent by hub {limited_first}, "
          f"seen by crawler {first.rate_limited}; {first.waited_s:.1f} thread-seconds held by the shared pause")
    print(f"no-change recrawl: {second.unchanged} unchanged, {file_requests_second} file requests, {second_s:.1f} s")
    print(f"fingerprint pass: pure rules {pure_s:.2f} s for {len(configs)} configs "
          f"({len(configs) / pure_s:,.0f}/s); --refingerprint (store read+write) {refp_s:.2f} s for {n_refp}")
    print(f"peak RSS (crawler + hub server, one process): {peak_rss_mb():.0f} MiB; store file {db_mb:.1f} MiB")
    return 0 if first.failed == 0 and file_requests_second == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

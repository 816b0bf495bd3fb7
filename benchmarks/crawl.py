"""Crawl benchmark: a synthetic hub of N repos served by the local hub on 127.0.0.1 (the real Hub's
answers: 307 resolve-cache hops for small files, three rate-limit buckets with a tier's quotas and
RateLimit headers, injected latency), crawled by the real crawler.

The Hub's windows are 5 minutes; to run in a couple of minutes the benchmark keeps a tier's quotas
and scales the window down (default 30 s, i.e. 10x the Hub's request rate). The pacing does not
depend on the window length: it reads both quota and window from the RateLimit headers.

Prints, side by side: each bucket's allowance vs the achieved rate (as ratios), how full each
complete window was, 429s, lost repos, the no-change recrawl's file requests, the fingerprint pass,
and peak RSS. First, the local hub's listing on its own at 2 000 and 8 000 repos, all in one org and
spread over ten (every org listed as the crawler lists it, 100 models a page, no rate limit): the
time at 8 000 over the time at 2 000 is ~4 when the listing is linear in the mirror's size, ~16
when it is quadratic.

    .venv/bin/python benchmarks/crawl.py [--repos 5000] [--tier anonymous] [--window-s 30]
                                         [--latency-ms 20] [--concurrency 16] [--listing-only]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.pop("HF_HUB_OFFLINE", None)

from atlas.fingerprints.rules import fingerprint
from atlas.hub import crawl as crawler
from atlas.hub.pacing import TIERS, WINDOW_S
from atlas.hub.local.server import HubServer, MirrorRepo

ORGS = 10


def synthetic_repos(n: int, orgs: int = ORGS) -> dict[str, MirrorRepo]:
    """Configs shaped like real ones; every 4th declares MTP, every 10th has a weight index."""
    repos: dict[str, MirrorRepo] = {}
    for i in range(n):
        repo_id = f"bench-org-{i % orgs}/model-{i:05d}"
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
        repos[repo_id] = MirrorRepo(repo_id, files, {"downloads": n - i})
    return repos


def listing_seconds(n: int, orgs: int) -> tuple[float, int]:
    """Seconds to list every org of an n-repo hub as the crawler does, and the models listed."""
    from huggingface_hub import HfApi

    repos = synthetic_repos(n, orgs)
    unlimited = {bucket: 10**9 for bucket in TIERS["anonymous"]}
    with HubServer(repos, page_size=100, limits=unlimited) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        t0 = time.perf_counter()
        listed = sum(1 for k in range(orgs) for _ in api.list_models(
            author=f"bench-org-{k}", pipeline_tag="text-generation", sort="downloads", expand=crawler.LISTING_EXPAND))
        return time.perf_counter() - t0, listed


def print_listing_scale() -> float:
    """The listing at 2 000 and 8 000 repos, in one org and in ORGS; returns the worst ratio of times."""
    worst = 0.0
    for orgs in (1, ORGS):
        (small_s, small_n), (big_s, big_n) = listing_seconds(2000, orgs), listing_seconds(8000, orgs)
        ratio = big_s / small_s
        worst = max(worst, ratio)
        print(f"hub listing, {orgs} org(s), 100 a page: 2000 repos {small_s:.2f} s ({small_n} listed), 8000 repos "
              f"{big_s:.2f} s ({big_n} listed); ratio 8000/2000 = {ratio:.1f} (linear ~4, quadratic ~16)")
    return worst


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def bucket_rates(hub: HubServer) -> dict[str, tuple[int, float, list[float]]]:
    """Per bucket: requests served, seconds from the first window's start to the last request,
    and how full each complete window was (served / quota)."""
    out: dict[str, tuple[int, float, list[float]]] = {}
    windows = hub.all_windows()
    last = {b: max((r["ts_mono"] for r in hub.requests if r.get("bucket") == b), default=None) for b in ("api", "resolvers")}
    for bucket in ("api", "resolvers"):
        mine = [w for w in windows if w[0] == bucket]
        if not mine or last[bucket] is None:
            continue
        served = sum(w[3] for w in mine)
        span = last[bucket] - mine[0][2]
        full = [w[3] / w[4] for w in mine[:-1]]  # every window but the last, which the crawl may end early
        out[bucket] = (served, span, full)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=5000)
    parser.add_argument("--tier", choices=sorted(TIERS), default="anonymous")
    parser.add_argument("--window-s", type=float, default=30.0, help=f"rate-limit window (the Hub's: {WINDOW_S} s)")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--listing-only", action="store_true", help="only the hub listing at 2000 and 8000 repos")
    args = parser.parse_args()

    listing_ratio = print_listing_scale()
    if args.listing_only:
        return 0 if listing_ratio < 8 else 1

    t0 = time.perf_counter()
    repos = synthetic_repos(args.repos)
    build_s = time.perf_counter() - t0
    quotas = TIERS[args.tier]
    with tempfile.TemporaryDirectory(prefix="atlas-bench-") as tmp:
        work = Path(tmp)
        watch = work / "watchlist.toml"
        watch.write_text(
            "orgs = [" + ", ".join(f'{{ author = "bench-org-{k}" }}' for k in range(ORGS)) + "]\n"
            "[defaults]\npipeline_tags = ['text-generation']\nmin_downloads = 0\nmax_models = 100000\n"
        )
        db = work / "atlas.duckdb"
        with HubServer(repos, page_size=1000, latency_s=args.latency_ms / 1000, tier=args.tier,
                       window_s=args.window_s) as hub:
            def run() -> crawler.CrawlSummary:  # the same crawl, first cold, then again unchanged
                return crawler.crawl(
                    db, watch, endpoint=hub.url, endpoint_label="bench", token=False, cache_dir=work / "cache",
                    concurrency=args.concurrency, progress=False,
                )
            t0 = time.perf_counter()
            first = run()
            first_s = time.perf_counter() - t0
            rates = bucket_rates(hub)
            limited_first = hub.rate_limited
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

    scale = WINDOW_S / args.window_s
    print(f"synthetic hub: {args.repos} repos in {ORGS} orgs, built in {build_s:.1f} s; latency {args.latency_ms:.0f} ms/request, "
          f"concurrency {args.concurrency}; small files 307 to the resolve cache (2 resolver requests each)")
    print(f"limits: the {args.tier} tier's quotas per window (api {quotas['api']}, resolvers {quotas['resolvers']}), "
          f"window scaled from {WINDOW_S} s to {args.window_s:g} s ({scale:g}x the Hub's rates)")
    print(f"{'bucket':10} {'requests':>9} {'allowed/s':>10} {'achieved/s':>11} {'ratio':>6}   complete windows (served/quota)")
    ratios = {}
    for bucket, (served, span, full) in rates.items():
        allowed = quotas[bucket] / args.window_s
        achieved = served / span if span > 0 else float("nan")
        ratios[bucket] = achieved / allowed
        if served < quotas[bucket]:  # never limited: its rate is the crawl's, not the pacing's
            print(f"{bucket:10} {served:>9} {allowed:>10.1f} {achieved:>11.1f} {'-':>6}   under one window's quota")
            continue
        windows = ", ".join(f"{f:.2f}" for f in full) or "none complete"
        print(f"{bucket:10} {served:>9} {allowed:>10.1f} {achieved:>11.1f} {achieved / allowed:>6.2f}   {windows}")
    tight = max(rates, key=lambda b: rates[b][0] / quotas[b]) if rates else None
    verdict = float("nan")
    if tight is not None:
        full = rates[tight][2]
        # over the whole crawl the ratio can pass 1: the last window is used at full speed and the
        # crawl ends before it does. Complete windows are the fair measure of the pacing.
        verdict = min(full) if full else ratios[tight]
        print(f"tightest bucket: {tight}: {ratios[tight]:.2f} of its allowance over the crawl"
              + (f"; each complete window filled to {statistics.median(full):.2f} (median), "
                 f"{min(full):.2f} (min) of its quota" if full else ""))
    lost = args.repos - first.fetched
    print(f"first crawl: {first.listed} listed, {first.fetched} fetched, {first.failed} failed, {lost} lost, "
          f"in {first_s:.1f} s; 429s sent by the hub {limited_first}, seen by the crawler {first.rate_limited}; "
          f"{first.waited_s:.1f} s of holds (all workers together)")
    print(f"no-change recrawl: {second.unchanged} unchanged, {file_requests_second} file requests, {second_s:.1f} s")
    print(f"fingerprint pass: pure rules {pure_s:.2f} s for {len(configs)} configs "
          f"({len(configs) / pure_s:,.0f}/s); --refingerprint (store read+write) {refp_s:.2f} s for {n_refp}")
    print(f"peak RSS (crawler + hub server, one process): {peak_rss_mb():.0f} MiB; store file {db_mb:.1f} MiB")
    ok = lost == 0 and first.failed == 0 and file_requests_second == 0 and verdict >= 0.95 and listing_ratio < 8
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

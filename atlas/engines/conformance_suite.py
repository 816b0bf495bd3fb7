"""The conformance suite: every check, for every layout, run through one engine's driver (vLLM's,
atlas.engines.vllm.client; llama.cpp's, atlas.engines.llamacpp.conformance) on the layout's oracle and
random checkpoints, gathered into one ConformanceRecord (atlas.conformance.record).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from atlas import AtlasError
from atlas.conformance.record import (
    ALPHA,
    ENGINE_SHAPES,
    LAYOUTS,
    RANDOM_HEAD_ACCEPTANCE,
    SCHEMA_VERSION,
    AppliedPatch,
    Check,
    ConformanceRecord,
    distribution_passed,
    known_causes,
)
from atlas.conformance.stats import acceptance_test, distribution_test
from atlas.engines.convert import without_remote_code

from atlas.engines.generated import Generated

SINGLES = 4  # requests rerun one at a time for the batching control
# The oracle's MTP head drafts from softmax(ORACLE_DRAFT_SCALE x the main model's logits): the same
# argmax (so T = 0 acceptance stays exactly 1), a flatter law than the target's at T = 1, so sampled
# drafts are rejected (about half of them in the mimo oracle) and the engine's correction after a rejection,
# a draw from the residual max(0, p - q), is exercised. With the target's own law (scale 1) no
# sampled draft is ever rejected, and an engine that corrects from p instead passed as lossless.
ORACLE_DRAFT_SCALE = 0.5


def write_checkpoints(layout: str, tmp: Path, seed: int, shapes: Mapping[str, dict[str, object]] = ENGINE_SHAPES) -> dict[str, Path]:
    """The layout's random and oracle checkpoints as the suite runs them, for the engine."""
    from atlas.checkpoints.oracles import write_checkpoint

    return {mode: for_the_engine(write_checkpoint(layout, tmp / f"{layout}-{mode}", mode, depth=2, overrides=dict(shapes[layout]),
                                                  seed=seed, draft_scale=ORACLE_DRAFT_SCALE if mode == "oracle" else 1.0))
            for mode in ("random", "oracle")}


def _prompts(requests: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=3).tolist() for _ in range(requests)]


def _tokens(generated: Generated) -> list[list[int]]:
    return [r.tokens for r in generated.results]


def for_the_engine(folder: Path) -> Path:
    """The oracle checkpoint, written from a real config (`auto_map` and all), as vLLM loads it
    with remote code off (engines.convert.without_remote_code); a temporary folder, rewritten in place."""
    rewritten = without_remote_code(json.loads((folder / "config.json").read_text()))
    if rewritten is not None:
        (folder / "config.json").write_text(json.dumps(rewritten, indent=2))
    return folder


def check_requests(requests: int) -> None:
    """Refuse a run with fewer requests than the batching control reruns one at a time: it would
    compare SINGLES outputs against fewer references and fail by construction, and a failed control
    makes every T = 0 difference on its checkpoint inconclusive."""
    if requests < SINGLES:
        raise AtlasError(f"--requests {requests}: a conformance run needs at least {SINGLES} requests, since the batching "
                         f"control reruns {SINGLES} of them one at a time (with fewer it fails by construction and "
                         "hides any T = 0 failure); its verdicts also need the sample: 16 requests is the default")


@dataclass
class _Layout:
    """One layout's two checkpoints (random, oracle) on the driver, and the checks recorded on them."""

    driver: Any  # the suite's driver protocol: hello, load, generate (vllm.client.Driver, llamacpp.conformance.LlamacppDriver)
    layout: str
    folders: dict[str, Path]
    p: np.ndarray  # the oracle's first-order law P and its draft Q
    q: np.ndarray
    prompts: list[list[int]]
    max_new_tokens: int
    max_len: int
    seed: int
    dtype: str
    checks: list[Check]
    log: Callable[[str], None]

    @classmethod
    def write(cls, driver: Any, layout: str, tmp: Path, ks: list[int], requests: int, max_new_tokens: int, seed: int,
              dtype: str, checks: list[Check], log: Callable[[str], None], shapes: Mapping[str, dict[str, object]]) -> _Layout:
        from atlas.checkpoints.oracles import bigram_tables

        if layout not in shapes:
            raise AtlasError(f"no conformance checkpoints for layout {layout!r} on this engine (known: {', '.join(shapes)})")
        folders = write_checkpoints(layout, tmp, seed, shapes)
        p, q = bigram_tables(folders["oracle"], layout)
        return cls(driver, layout, folders, p, q, _prompts(requests, p.shape[0], seed), max_new_tokens,
                   3 + max_new_tokens + max(ks) + 8, seed, dtype, checks, log)

    @property
    def requests(self) -> int:
        return len(self.prompts)

    def generate(self, t: float) -> Generated:
        reqs = [{"prompt": pr, "seed": self.seed * 100_003 + i} for i, pr in enumerate(self.prompts)]
        return self.driver.generate(requests=reqs, max_tokens=self.max_new_tokens, temperature=t)

    def load(self, mode: str, k: int, sampling: str = "greedy") -> None:
        spec = {"draft_sample_method": sampling} if k else {}
        self.driver.load(model=str(self.folders[mode]), draft_tokens=k, dtype=self.dtype, seed=self.seed, max_model_len=self.max_len,
                         speculative=spec, options={"enforce_eager": True})

    def add(self, mode: str, t: float, k: int, sampling: str, name: str, passed: bool, summary: str, figures: dict) -> None:
        self.checks.append(Check(layout=self.layout, checkpoint=mode, temperature=t, draft_tokens=k, draft_sampling=sampling,
                                 name=name, passed=passed, summary=summary, figures=figures))
        self.log(f"  {self.layout:<12} {mode:<6} T={t:g} k={k} {sampling:<13} {name:<12} {'pass' if passed else 'FAIL'}: {summary}")


def _plain_checks(run: _Layout, mode: str) -> list[list[int]]:
    """The plain (k = 0) engine's checks; returns its T = 0 output, the reference of every k > 0."""
    run.load(mode, 0)
    reference = _tokens(run.generate(0.0))
    if mode == "random":
        # control: is plain decoding itself independent of how requests are batched? If
        # not, a k > 0 difference below can be numerics rather than the MTP path
        single = [run.driver.generate(requests=[{"prompt": pr, "seed": 0}], max_tokens=run.max_new_tokens,
                                      temperature=0.0).results[0].tokens for pr in run.prompts[:SINGLES]]
        figures = _identity(single, reference[:SINGLES])
        same = figures["identical"] == SINGLES
        run.add(mode, 0.0, 0, "greedy", "identity", same, f"k=0 batched output equals one-request-at-a-time output in "
                f"{figures['identical']} of {SINGLES} requests" + ("" if same else f" (first difference at output token "
                f"{figures['first_difference']}: plain decoding itself depends on batching here)"), figures)
    if mode == "oracle":
        chain = all(b == int(run.p[a].argmax()) for out in reference for a, b in zip(out, out[1:]))
        run.add(mode, 0.0, 0, "greedy", "identity", chain, "k=0 output is the exact argmax chain" if chain
                else "k=0 output departs from the exact argmax chain", {"requests": run.requests})
        f = distribution_test(run.p, _tokens(run.generate(1.0)))
        ok = distribution_passed(f)
        run.add(mode, 1.0, 0, "greedy", "distribution", ok, _dist_summary(f), f)
    return reference


def _greedy_checks(run: _Layout, mode: str, k: int, reference: list[list[int]], sampling: str = "greedy") -> None:
    """T = 0 with greedy drafts: output identical to the plain engine's, and the drafts accepted as
    exactly as the checkpoint allows (all of them on the oracle, few on a random head). `sampling`:
    the engine's draft rule, where it drafts the argmax at T = 0 under any (llama.cpp)."""
    requests = run.requests
    out = run.generate(0.0)
    same = _tokens(out) == reference
    d = sum(sum(r.per_step_drafted) for r in out.results)
    a = sum(sum(r.per_step_accepted) for r in out.results)
    figures = _identity(_tokens(out), reference)
    run.add(mode, 0.0, k, sampling, "identity", same, "output identical to k=0 in all "
            f"{requests} requests" if same else f"output differs from k=0 in {requests - figures['identical']} "
            f"of {requests} requests (first difference at output token {figures['first_difference']})", figures)
    if mode == "oracle":
        # greedy drafts against the T = 0 target: each draft passes exactly when the head's argmax is
        # the target's, which the oracle's own head always is (all drafts accepted), a cut head not always
        target = np.zeros_like(run.p)
        target[np.arange(run.p.shape[0]), run.p.argmax(-1)] = 1.0
        runs = [(r.tokens, r.per_step_drafted, r.per_step_accepted) for r in out.results]
        exact = round(acceptance_test(target, head_law(run), True, k, runs)["expected_accepted"])
        run.add(mode, 0.0, k, sampling, "acceptance", a == exact,
                f"accepted {a} of {d} drafts where {exact} is exact", {"drafted": d, "accepted": a, "exact": exact})
    else:
        rate = a / d if d else 0.0
        run.add(mode, 0.0, k, sampling, "acceptance", rate < RANDOM_HEAD_ACCEPTANCE,
                f"acceptance {rate:.3f} (an unrelated random head: near 0 expected)", {"drafted": d, "accepted": a})


def head_law(run: _Layout) -> np.ndarray:
    """The law the engine's head drafts from: the oracle head's, or what a cut draft vocabulary leaves of it."""
    return run.driver.head_law(run.q) if hasattr(run.driver, "head_law") else run.q


def _draft_checks(run: _Layout, mode: str, k: int, sampling: str, reference: list[list[int]]) -> None:
    """One k > 0 engine's checks: T = 0 for greedy drafts, and on the oracle T = 1 acceptance and
    distribution against their exact values."""
    run.load(mode, k, sampling)
    if sampling == "greedy" or getattr(run.driver, "greedy_at_zero", False):
        _greedy_checks(run, mode, k, reference, sampling)
    if mode != "oracle":
        return
    out = run.generate(1.0)
    runs = [(r.tokens, r.per_step_drafted, r.per_step_accepted) for r in out.results]
    # the law drafts are sampled from: the head's own (vLLM), or what the engine makes of it (llama.cpp's top 10)
    q = run.driver.draft_law(head_law(run), 1.0) if hasattr(run.driver, "draft_law") else head_law(run)
    f = acceptance_test(run.p, q, sampling == "greedy", k, runs)
    run.add(mode, 1.0, k, sampling, "acceptance", f["p_value"] >= ALPHA,
            f"acceptance {f['acceptance']:.4f} where {f['expected_acceptance']:.4f} is exact (z {_z(f['z'])})", f)
    f = distribution_test(run.p, _tokens(out))
    ok = distribution_passed(f)
    run.add(mode, 1.0, k, sampling, "distribution", ok, _dist_summary(f), f)


def run_suite(
    open_driver: Callable[[], AbstractContextManager[Any]],
    engine: str = "vllm",
    layouts: Iterable[str] = LAYOUTS,
    draft_tokens: Iterable[int] = (1, 2, 3),
    draft_samplings: Iterable[str] = ("greedy", "probabilistic"),
    requests: int = 16,
    max_new_tokens: int = 64,
    seed: int = 0,
    dtype: str = "float32",
    command: str = "",
    log: Callable[[str], None] = print,
    patches: Iterable[str] = (),
    shapes: Mapping[str, dict[str, object]] = ENGINE_SHAPES,
    draft_vocab: int | None = None,
) -> ConformanceRecord:
    """Run every check for every layout through the driver `open_driver` opens (one engine at a
    time), with the named run-time patches applied in the driver first (the record then names a
    patched build); `shapes`: the layouts the engine takes, with its shape limits; `draft_vocab`: the
    cut the driver drafts over, which the record names (the driver's head_law applies it)."""
    check_requests(requests)
    checks: list[Check] = []
    ks = sorted(set(draft_tokens))
    with open_driver() as driver, tempfile.TemporaryDirectory(prefix="atlas-conformance-") as tmp:
        hello = driver.hello()
        applied = [AppliedPatch.model_validate(driver.patch(name)) for name in patches]
        for p in applied:
            log(f"  patched {p.replaces} with {p.name} (sha256 {p.sha256})")
        for layout in layouts:
            run = _Layout.write(driver, layout, Path(tmp), ks, requests, max_new_tokens, seed, dtype, checks, log, shapes)
            # plain engine: the T = 0 references, and the distribution test's calibration control
            for mode in ("random", "oracle"):
                reference = _plain_checks(run, mode)
                for k in ks:
                    # sampled drafts change only T > 0, which is checked on the oracle alone
                    for sampling in draft_samplings if mode == "oracle" else ["greedy"]:
                        _draft_checks(run, mode, k, sampling, reference)
    from atlas.engines.stamp import hardware

    import torch

    hw = hardware(torch.device("cpu")).text if not hello.gpus else f"GPU: {len(hello.gpus)} x {hello.gpus[0]}"
    return ConformanceRecord(
        schema_version=SCHEMA_VERSION, run_date=datetime.now(timezone.utc).replace(microsecond=0), engine=engine,
        package=hello.package, version=hello.version, hardware=hw, device=hello.device, dtype=dtype, command=command,
        seed=seed, alpha=ALPHA, requests=requests, max_new_tokens=max_new_tokens, triton=hello.triton, patches=applied,
        causes=known_causes(hello.package, hello.version, hello.triton, applied), checks=checks,
        oracle_draft_scale=ORACLE_DRAFT_SCALE, draft_vocab=draft_vocab,
    )


def _identity(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How many outputs equal the reference, and the earliest position where one departs from it."""
    firsts = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
              for a, b in zip(outputs, reference) if a != b]
    return {"requests": len(reference), "identical": len(reference) - len(firsts), "first_difference": min(firsts, default=None)}


def _z(z: float | str) -> str:
    """A z statistic for a summary: beyond ±1000 only its sign matters (an expectation of exactly 1
    has a variance of rounding size)."""
    return f"= {z}" if isinstance(z, str) or abs(z) < 1000 else ("< -1000" if z < 0 else "> 1000")


def _dist_summary(f: dict) -> str:
    if not f["transitions"]:
        return "no decode-phase transitions (every output one token or none): nothing to test, no power"
    return (f"mean NLL {f['mean_nll']:.3f} vs entropy {f['mean_entropy']:.3f} nats/token over {f['transitions']} tokens "
            f"(z {_z(f['z'])}; chi2 {f['chi2']:.0f} on {f['chi2_df']} df); detects a shift of {f['detectable_nll_shift']:.3f} "
            f"with power {f['power']}")

"""Engine conformance: is an engine's MTP lossless? Checked, per MTP layout the engine accepts, on
checkpoints whose right answers are known exactly, and kept as dated records under
evidence/conformance/ that the site shows beside the servable matrix.

Checkpoints (atlas.measure.oracles, with the engine's shape limits as overrides):
- oracle: the main model is first order (next-token law P[current token]) and the MTP head computes
  that same law, so at T = 0 every draft must be accepted and the output must be the argmax chain;
  at T = 1 the expected acceptance of every verify step follows exactly from P and the draft rule,
  given the token the step starts from (greedy drafts: accept d = argmax with probability P[c, d];
  sampled drafts: sum of min(P, Q)); and the emitted tokens must follow P.
- random: every weight random; output at T = 0 must equal the engine's own k = 0 output, and the
  acceptance is recorded (near 0 for an unrelated head).

Each check is a two-sided test at level ALPHA with its figures recorded; the distribution check also
states its power (the smallest mean-NLL shift it detects with probability 0.99), and the same check
run on the k = 0 engine is recorded as the calibration control.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atlas import AtlasError

SCHEMA_VERSION = 1
DEFAULT_DIR = "evidence/conformance"
ALPHA = 1e-4  # per check; about 30 checks a run keep a false failure under 0.5 %
POWER = 0.99
SINGLES = 4  # requests rerun one at a time for the batching control
# vLLM's shape limits on CPU (head sizes 32..256; MLA with kv_lora_rank 512 and qk_rope_head_dim 64)
# and the DeepSeek-V3 router as its real configs declare it (vLLM keeps e_score_correction_bias
# only for noaux_tc).
ENGINE_SHAPES: dict[str, dict[str, object]] = {
    "mimo": {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
    "deepseek_v3": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 64, "v_head_dim": 64, "num_attention_heads": 2, "num_key_value_heads": 2},
    "qwen3_next": {"head_dim": 32},
}
LAYOUTS = tuple(ENGINE_SHAPES)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Check(Strict):
    layout: str
    checkpoint: Literal["oracle", "random"]
    temperature: float = Field(ge=0)
    draft_tokens: int = Field(ge=0)  # 0: the plain engine, a calibration control
    draft_sampling: str  # "greedy" (vLLM's default) or "probabilistic"
    name: Literal["identity", "acceptance", "distribution"]
    passed: bool
    summary: str  # what was expected, what was observed
    figures: dict[str, float | int | str | list[float | None] | None]


class ConformanceRecord(Strict):
    schema_version: Literal[SCHEMA_VERSION]
    run_date: datetime
    engine: str
    package: str
    version: str
    hardware: str
    device: str
    dtype: str
    command: str
    seed: int
    alpha: float
    requests: int
    max_new_tokens: int
    checks: list[Check] = Field(min_length=1)


class Verdict(Strict):
    """One row of the site's table: an engine version on one layout, at T = 0 or T > 0."""

    package: str
    version: str
    hardware: str
    date: str
    layout: str
    temperature: str  # "0" or "> 0"
    draft_sampling: str
    passed: bool
    detail: str
    command: str
    source: str


# ---- records -------------------------------------------------------------------------------------


def load_records(folder: Path) -> list[tuple[Path, ConformanceRecord]]:
    """Every record under `folder` (sorted by name, so by date); AtlasError naming a bad file."""
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            out.append((path, ConformanceRecord.model_validate_json(path.read_bytes())))
        except (OSError, ValidationError) as exc:
            raise AtlasError(f"{path}: not a valid conformance record: {exc}") from None
    return out


def latest_records(folder: Path) -> list[tuple[Path, ConformanceRecord]]:
    """Per engine package, version and hardware, its newest record (older ones stay, by date)."""
    latest: dict[tuple[str, str, str], tuple[Path, ConformanceRecord]] = {}
    for path, rec in load_records(folder):  # sorted by date: the last one wins
        latest[(rec.package, rec.version, rec.hardware)] = (path, rec)
    return list(latest.values())


def write_record(record: ConformanceRecord, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record.run_date:%Y%m%dT%H%M%SZ}-{record.package}-{record.version}.json"
    path.write_text(record.model_dump_json(indent=1) + "\n")
    return path


def _t_class(t: float) -> str:
    return "0" if t == 0 else "> 0"


def verdicts(records: Iterable[tuple[Path, ConformanceRecord]], root: Path | None = None) -> list[Verdict]:
    """Per record, layout, temperature class and draft sampling: passed when every check passed;
    the detail names the failed checks' summaries (or the headline figures when all passed)."""
    rows = []
    for path, rec in records:
        groups: dict[tuple[str, str, str], list[Check]] = {}
        for c in rec.checks:
            sampling = c.draft_sampling if c.temperature > 0 else "any"
            groups.setdefault((c.layout, _t_class(c.temperature), sampling), []).append(c)
        for (layout, t, sampling), checks in groups.items():
            failed = [c for c in checks if not c.passed]
            shown = failed or [c for c in checks if c.draft_tokens > 0][:2]
            detail = "; ".join(f"k={c.draft_tokens} {c.checkpoint} {c.name}: {c.summary}" for c in shown[:3])
            if len(failed) > 3:
                detail += f"; and {len(failed) - 3} more failed"
            source = path.relative_to(root).as_posix() if root and path.is_relative_to(root) else path.name
            rows.append(Verdict(
                package=rec.package, version=rec.version, hardware=rec.hardware, date=rec.run_date.date().isoformat(),
                layout=layout, temperature=t, draft_sampling=sampling, passed=not failed,
                detail=f"{len(checks) - len(failed)}/{len(checks)} checks passed; {detail}", command=rec.command, source=source,
            ))
    return rows


def require_conforming(package: str, version: str, layout: str, temperatures: Iterable[float], draft_sampling: str,
                       folder: Path | None = None) -> None:
    """Refuse a T > 0 measurement unless the latest conformance record for this engine version and
    layout passed at T > 0 with this draft sampling (T = 0 output is checked by every run itself)."""
    if not any(t > 0 for t in temperatures):
        return
    from atlas.paths import project_path

    folder = folder or project_path(DEFAULT_DIR)
    rows = [v for v in verdicts(load_records(folder)) if (v.package, v.version, v.layout, v.temperature, v.draft_sampling)
            == (package, version, layout, "> 0", draft_sampling)]
    if not rows:
        raise AtlasError(
            f"no T > 0 conformance record for {package} {version} on the {layout} layout with {draft_sampling} drafts in "
            f"{folder}: a T > 0 measurement needs the engine checked lossless first (`atlas conformance run`), "
            "or measure at --temperatures 0"
        )
    latest = rows[-1]
    if not latest.passed:
        raise AtlasError(
            f"refused: {package} {version} failed the T > 0 conformance check on the {layout} layout with {draft_sampling} "
            f"drafts ({latest.date}, {latest.source}: {latest.detail}); its T > 0 output is not the model's distribution, "
            "so a T > 0 measurement from it would not measure lossless speculative decoding"
        )


# ---- statistics ----------------------------------------------------------------------------------


def _normal_quantile(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def _two_sided_p(z: float) -> float:
    return 2 * (1 - statistics.NormalDist().cdf(abs(z)))


def prefix_acceptance(p: np.ndarray, q: np.ndarray, greedy: bool, k: int) -> np.ndarray:
    """[k, V]: row i = probability that drafts 1..i+1 are all accepted in a verify step that starts
    from each current token, for a first-order target P and draft Q ([V, V], row = current token).
    A draft d from context c passes with mass min(P[c, d], q(d | c)), where q is Q[c] for sampled
    drafts and one-hot at argmax Q[c] for greedy ones (vLLM's default); the next draft's context is d."""
    p = np.asarray(p, dtype=np.float64)
    if greedy:
        qq = np.zeros_like(p)
        qq[np.arange(p.shape[0]), np.asarray(q).argmax(-1)] = 1.0
    else:
        qq = np.asarray(q, dtype=np.float64)
    passes = np.minimum(p, qq)
    rows, v = [], np.ones(p.shape[0])
    for _ in range(k):
        v = passes @ v
        rows.append(v)
    return np.stack(rows) if rows else np.zeros((0, p.shape[0]))


def step_starts(tokens: list[int], per_step_accepted: list[int]) -> list[int]:
    """The current token each verify step started from: the first output token (from the prefill),
    then after a step that accepted a drafts, the token a + 1 places on."""
    starts, at = [], 0
    for a in per_step_accepted:
        if at >= len(tokens):
            raise AtlasError("the engine reported more verify steps than its output explains")
        starts.append(tokens[at])
        at += a + 1
    return starts


def acceptance_test(p: np.ndarray, q: np.ndarray, greedy: bool, k: int, runs: list[tuple[list[int], list[int], list[int]]]) -> dict:
    """Observed accepted drafts against their exact expectation given each step's start token.
    runs: (tokens, per_step_drafted, per_step_accepted). Accepted counts per step are sums of
    prefix indicators with known probabilities, so the total's variance is exact."""
    v = prefix_acceptance(p, q, greedy, k)
    observed = drafted = 0
    expected = variance = 0.0
    per_pos_obs, per_pos_exp = [0] * k, [0.0] * k
    for tokens, d_steps, a_steps in runs:
        for c, d, a in zip(step_starts(tokens, a_steps), d_steps, a_steps):
            probs = v[:d, c]
            mean = float(probs.sum())
            second = float(sum((2 * j + 1) * probs[j] for j in range(d)))  # E[a²] = Σ (2j−1)·P(a ≥ j)
            observed += a
            drafted += d
            expected += mean
            variance += second - mean * mean
            for i in range(d):
                per_pos_obs[i] += int(a > i)
                per_pos_exp[i] += float(probs[i])
    sd = math.sqrt(variance)
    z = (observed - expected) / sd if sd > 0 else (0.0 if observed == round(expected) else math.inf)
    return {"drafted": drafted, "accepted": observed, "expected_accepted": round(expected, 3),
            "acceptance": observed / drafted if drafted else None, "expected_acceptance": expected / drafted if drafted else None,
            "z": round(z, 2) if math.isfinite(z) else str(z), "p_value": _two_sided_p(z) if math.isfinite(z) else 0.0,
            "per_position": [round(o / e, 4) if e else None for o, e in zip(per_pos_obs, per_pos_exp)]}


def distribution_test(p: np.ndarray, outputs: list[list[int]]) -> dict:
    """Do the emitted tokens follow the first-order law P? Two tests on the decode-phase
    transitions (token j -> j+1): mean NLL against the visited states' mean entropy (z-test, exact
    per-state variances), and a pooled chi-square of next-token counts per visited state (bins with
    an expected count under 5 merged), p-value by the Wilson-Hilferty approximation. Power: the
    smallest mean-NLL shift the z-test detects with probability POWER at level ALPHA."""
    logp = np.log(np.clip(np.asarray(p, dtype=np.float64), 1e-300, None))
    entropy = -(np.exp(logp) * logp).sum(-1)
    second = (np.exp(logp) * logp**2).sum(-1) - entropy**2  # Var of −log P[c, X], X ~ P[c]
    nll = mean_h = var = 0.0
    n = 0
    counts: dict[int, np.ndarray] = {}
    for tokens in outputs:
        for c, x in zip(tokens, tokens[1:]):
            nll -= logp[c, x]
            mean_h += entropy[c]
            var += second[c]
            n += 1
            counts.setdefault(c, np.zeros(p.shape[1]))[x] += 1
    z = (nll - mean_h) / math.sqrt(var)
    chi2 = 0.0
    df = 0
    for c, observed in counts.items():
        exp = observed.sum() * np.exp(logp[c])
        big = exp >= 5
        o_bins, e_bins = list(observed[big]), list(exp[big])
        if exp[~big].sum() > 0:
            o_bins.append(observed[~big].sum())
            e_bins.append(exp[~big].sum())
        if len(e_bins) < 2:
            continue
        chi2 += sum((o - e) ** 2 / e for o, e in zip(o_bins, e_bins))
        df += len(e_bins) - 1
    chi_z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df)) if df else 0.0
    detectable = (_normal_quantile(1 - ALPHA / 2) + _normal_quantile(POWER)) * math.sqrt(var) / n  # SD of the mean NLL
    return {"transitions": n, "mean_nll": round(nll / n, 4), "mean_entropy": round(mean_h / n, 4), "z": round(z, 2),
            "p_value": _two_sided_p(z), "chi2": round(chi2, 1), "chi2_df": df,
            "chi2_p_value": 1 - statistics.NormalDist().cdf(chi_z) if df else None,
            "detectable_nll_shift": round(detectable, 4), "power": POWER}


# ---- the suite -----------------------------------------------------------------------------------


def _prompts(requests: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=3).tolist() for _ in range(requests)]


def _tokens(generated) -> list[list[int]]:
    return [r.tokens for r in generated.results]


def run_suite(
    python: Path,
    layouts: Iterable[str] = LAYOUTS,
    draft_tokens: Iterable[int] = (1, 2, 3),
    draft_samplings: Iterable[str] = ("greedy", "probabilistic"),
    requests: int = 16,
    max_new_tokens: int = 64,
    seed: int = 0,
    dtype: str = "float32",
    command: str = "",
    log: Callable[[str], None] = print,
) -> ConformanceRecord:
    """Run every check for every layout through one vLLM driver (one engine at a time)."""
    from atlas.measure.engines.vllm_client import Driver
    from atlas.measure.oracles import bigram_tables, write_checkpoint

    checks: list[Check] = []
    ks = sorted(set(draft_tokens))
    with Driver(python) as driver, tempfile.TemporaryDirectory(prefix="atlas-conformance-") as tmp:
        hello = driver.hello()
        for layout in layouts:
            if layout not in ENGINE_SHAPES:
                raise AtlasError(f"no conformance checkpoints for layout {layout!r} (known: {', '.join(LAYOUTS)})")
            folders = {mode: write_checkpoint(layout, Path(tmp) / f"{layout}-{mode}", mode, depth=2,
                                              overrides=dict(ENGINE_SHAPES[layout]), seed=seed) for mode in ("random", "oracle")}
            p, q = bigram_tables(folders["oracle"], layout)
            prompts = _prompts(requests, p.shape[0], seed)
            max_len = 3 + max_new_tokens + max(ks) + 8

            def generate(t: float) -> object:
                reqs = [{"prompt": pr, "seed": seed * 100_003 + i} for i, pr in enumerate(prompts)]
                return driver.generate(requests=reqs, max_tokens=max_new_tokens, temperature=t)

            def load(mode: str, k: int, sampling: str = "greedy") -> None:
                spec = {"draft_sample_method": sampling} if k else {}
                driver.load(model=str(folders[mode]), draft_tokens=k, dtype=dtype, seed=seed, max_model_len=max_len,
                            speculative=spec, options={"enforce_eager": True})

            def add(mode: str, t: float, k: int, sampling: str, name: str, passed: bool, summary: str, figures: dict) -> None:
                checks.append(Check(layout=layout, checkpoint=mode, temperature=t, draft_tokens=k, draft_sampling=sampling,
                                    name=name, passed=passed, summary=summary, figures=figures))
                log(f"  {layout:<12} {mode:<6} T={t:g} k={k} {sampling:<13} {name:<12} {'pass' if passed else 'FAIL'}: {summary}")

            # plain engine: the T = 0 references, and the distribution test's calibration control
            for mode in ("random", "oracle"):
                load(mode, 0)
                reference = _tokens(generate(0.0))
                if mode == "random":
                    # control: is plain decoding itself independent of how requests are batched? If
                    # not, a k > 0 difference below can be numerics rather than the MTP path
                    single = [driver.generate(requests=[{"prompt": pr, "seed": 0}], max_tokens=max_new_tokens,
                                              temperature=0.0).results[0].tokens for pr in prompts[:SINGLES]]
                    figures = _identity(single, reference[:SINGLES])
                    same = figures["identical"] == SINGLES
                    add(mode, 0.0, 0, "greedy", "identity", same, f"k=0 batched output equals one-request-at-a-time output in "
                        f"{figures['identical']} of {SINGLES} requests" + ("" if same else f" (first difference at output token "
                        f"{figures['first_difference']}: plain decoding itself depends on batching here)"), figures)
                if mode == "oracle":
                    chain = all(b == int(p[a].argmax()) for out in reference for a, b in zip(out, out[1:]))
                    add(mode, 0.0, 0, "greedy", "identity", chain, "k=0 output is the exact argmax chain" if chain
                        else "k=0 output departs from the exact argmax chain", {"requests": requests})
                    f = distribution_test(p, _tokens(generate(1.0)))
                    ok = distribution_passed(f)
                    add(mode, 1.0, 0, "greedy", "distribution", ok, _dist_summary(f), f)
                for k in ks:
                    # sampled drafts change only T > 0, which is checked on the oracle alone
                    for sampling in draft_samplings if mode == "oracle" else ["greedy"]:
                        load(mode, k, sampling)
                        if sampling == "greedy":
                            out = generate(0.0)
                            same = _tokens(out) == reference
                            d = sum(sum(r.per_step_drafted) for r in out.results)
                            a = sum(sum(r.per_step_accepted) for r in out.results)
                            figures = _identity(_tokens(out), reference)
                            add(mode, 0.0, k, sampling, "identity", same, "output identical to k=0 in all "
                                f"{requests} requests" if same else f"output differs from k=0 in {requests - figures['identical']} "
                                f"of {requests} requests (first difference at output token {figures['first_difference']})", figures)
                            if mode == "oracle":
                                add(mode, 0.0, k, sampling, "acceptance", a == d,
                                    f"accepted {a} of {d} drafts where all {d} is exact", {"drafted": d, "accepted": a})
                            else:
                                rate = a / d if d else 0.0
                                add(mode, 0.0, k, sampling, "acceptance", rate < 0.25,
                                    f"acceptance {rate:.3f} (an unrelated random head: near 0 expected)", {"drafted": d, "accepted": a})
                        if mode != "oracle":
                            continue
                        out = generate(1.0)
                        runs = [(r.tokens, r.per_step_drafted, r.per_step_accepted) for r in out.results]
                        f = acceptance_test(p, q, sampling == "greedy", k, runs)
                        add(mode, 1.0, k, sampling, "acceptance", f["p_value"] >= ALPHA,
                            f"acceptance {f['acceptance']:.4f} where {f['expected_acceptance']:.4f} is exact (z {_z(f['z'])})", f)
                        f = distribution_test(p, _tokens(out))
                        ok = distribution_passed(f)
                        add(mode, 1.0, k, sampling, "distribution", ok, _dist_summary(f), f)
    from atlas.measure.stamp import hardware

    import torch

    hw = hardware(torch.device("cpu")).text if not hello.gpus else f"GPU: {len(hello.gpus)} x {hello.gpus[0]}"
    return ConformanceRecord(
        schema_version=SCHEMA_VERSION, run_date=datetime.now(timezone.utc).replace(microsecond=0), engine="vllm",
        package=hello.package, version=hello.version, hardware=hw, device=hello.device, dtype=dtype, command=command,
        seed=seed, alpha=ALPHA, requests=requests, max_new_tokens=max_new_tokens, checks=checks,
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


def distribution_passed(f: dict) -> bool:
    """Both tests at level ALPHA (a chi-square with no bin to test counts as passed)."""
    return f["p_value"] >= ALPHA and (f["chi2_p_value"] is None or f["chi2_p_value"] >= ALPHA)


def _dist_summary(f: dict) -> str:
    return (f"mean NLL {f['mean_nll']:.3f} vs entropy {f['mean_entropy']:.3f} nats/token over {f['transitions']} tokens "
            f"(z {_z(f['z'])}; chi2 {f['chi2']:.0f} on {f['chi2_df']} df); detects a shift of {f['detectable_nll_shift']:.3f} "
            f"with power {f['power']}")


# ---- the site's table ----------------------------------------------------------------------------


def record_ids(rows: Iterable[Verdict]) -> dict[str, str]:
    """Short ids C1, C2, … for the records behind these verdicts, newest first: the same ids in the
    conformance table and wherever a verdict is cited (the servable matrix)."""
    newest = sorted(rows, key=lambda v: (v.date, v.source), reverse=True)
    return {src: f"C{i}" for i, src in enumerate(dict.fromkeys(v.source for v in newest), 1)}


def evidence_table(folder: Path, root: Path | None = None) -> str:
    """Markdown: per engine version and hardware, its latest record's verdicts (one row per layout,
    temperature class and draft sampling), newest first; older records stay in the folder, named
    by date. What is the same for a whole record (file, hardware, date, command) is said once,
    under the table, by its short id, so the table fits the page."""
    from atlas.site.mdsafe import Markdown, code, escape, table

    rows = verdicts(latest_records(folder), root)
    if not rows:
        return "_No engine conformance record yet (`atlas conformance run`)._\n"
    rows.sort(key=lambda v: (v.date, v.package, v.version, v.layout, v.temperature, v.draft_sampling), reverse=True)
    ids = record_ids(rows)
    body = [
        [f"{v.package} {v.version}", v.layout, v.temperature, v.draft_sampling,
         Markdown("**checked lossless**") if v.passed else Markdown("**fails**"), v.detail, ids[v.source]]
        for v in rows
    ]
    first = {v.source: v for v in reversed(rows)}
    legend = "\n".join(
        f"- **{cid}**: {code(src)} — {escape(first[src].hardware)}, {first[src].date}, made by {code(first[src].command)}"
        for src, cid in ids.items()
    )
    return table(["Engine", "Layout", "T", "Drafts", "Verdict", "Figures", "Record"], body) + "\n\n" + legend + "\n"

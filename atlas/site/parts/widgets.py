"""Module 8's two interactive widgets, as HTML blocks that site/docs/javascripts/atlas-widgets.js
brings to life (plain offline JavaScript; without it the blocks still show their inputs and the
formula).

- `calculator`: acceptance per position (or one α), k, draft and verify cost in units of a plain
  step -> expected tokens per verify pass and ideal speed-up, formula shown with its numbers.
  Prefilled from a measured record of the atlas when one exists, and labelled as such; the verify
  cost then follows k from that record's timings until the reader types one of their own. Only the
  inputs of the selected mode are shown, and an invalid input clears the result.
- `accept_resample`: small editable p and q; shows the accept/resample rule's output law next to
  the target p, and can draw rounds one at a time or by the thousand.

All attribute values are escaped by mdsafe (numeric references are valid in HTML attributes)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from atlas.site.parts.mdsafe import Markdown, escape
from atlas.site.parts.numbers import fixed_list


class Prefill(BaseModel):
    """Calculator inputs taken from one measured cell, with what identifies it."""

    record_id: str
    run_date: str
    model_id: str
    hardware: str
    engine: str
    workload: str
    temperature: float
    conditional: list[float]  # per-position conditional acceptance, k = len
    draft_cost: float  # one MTP step / one plain step
    verify_cost: float  # one (k+1)-row verify pass / one plain step
    # the record's verify cost at every k it timed (k -> cost in plain steps), so the calculator's
    # verify cost can follow k when the reader shortens or lengthens the list
    verify_costs: dict[int, float]
    measured_tokens_per_pass: float | None  # the run's mean accepted length, bonus included
    measured_speedup: float
    ideal_speedup: float | None
    # what made the speed besides the hardware: engine, threads, kernels, draft vocabulary
    # (measured.record_setup); empty in a models.json written before it was recorded
    setup: str = ""


def _line(html: str) -> str:
    # Raw HTML must stay one block for Python-Markdown: no blank lines, no leading indentation.
    return " ".join(part.strip() for part in html.splitlines() if part.strip())


def calculator(prefill: Prefill | None) -> Markdown:
    if prefill is not None:
        conditional = prefill.conditional
        draft, verify = prefill.draft_cost, prefill.verify_cost
        label = (
            f"Prefilled from a <strong>measured</strong> record of the atlas: "
            f"<code>{escape(prefill.model_id)}</code>, workload {escape(prefill.workload)}, "
            f"T = {prefill.temperature:g}, k = {len(conditional)}, "
            f"{escape(prefill.setup) if prefill.setup else 'engine ' + escape(prefill.engine)}, "
            f"on {escape(prefill.hardware)}, run {escape(prefill.run_date)}, record "
            f"<code>{escape(prefill.record_id[:12])}</code>. That run measured "
            + (f"{prefill.measured_tokens_per_pass:.2f} tokens per verify pass and "
               if prefill.measured_tokens_per_pass else "")
            + f"a speed-up of {prefill.measured_speedup:.2f}×"
            + (f" against an ideal of {prefill.ideal_speedup:.2f}× from those tokens"
               if prefill.ideal_speedup else "")
            + ". The formula below can differ a little: it assumes every round drafts all k "
            "tokens, while the last rounds of each generation draft fewer. Change any value to "
            "explore; the result is then yours, not a measurement."
        )
        costs = prefill.verify_costs
    else:
        conditional, draft, verify = [0.8, 0.7, 0.6], 0.1, 1.1
        costs = {}
        label = ("No measured record in this build: the inputs are illustrative values, not a "
                 "measurement.")
    alpha = conditional[0] if conditional else 0.8
    # k -> verify cost as attribute text: "1:1.317 2:1.552 …" (read by atlas-widgets.js)
    follow = " ".join(f"{k}:{v:.6g}" for k, v in sorted(costs.items()))
    html = f"""
    <div class="atlas-widget atlas-calculator" data-atlas-widget="calculator" data-verify-costs="{escape(follow)}">
    <p class="atlas-widget-title">Speed-up calculator</p>
    <p class="atlas-widget-source">{label}</p>
    <fieldset class="atlas-widget-inputs">
    <label>acceptance given as <select data-in="mode">
    <option value="positions" selected>one value per draft position</option>
    <option value="alpha">one α for every position</option></select></label>
    <label data-mode="positions">conditional acceptance a₁, a₂, … (k = how many you list)
    <input type="text" data-in="conditional" value="{escape(fixed_list(conditional))}" inputmode="decimal"></label>
    <label data-mode="alpha" hidden>α <input type="number" data-in="alpha" min="0" max="1" step="0.01" value="{alpha:.3f}"></label>
    <label data-mode="alpha" hidden>k <input type="number" data-in="k" min="0" max="16" step="1" value="{len(conditional)}"></label>
    <label>draft cost c (one MTP step, in plain steps) <input type="number" data-in="draft" min="0" step="0.01" value="{draft:.3f}"></label>
    <label>verify cost v (one k+1-row pass, in plain steps) <input type="number" data-in="verify" min="0.01" step="0.01" value="{verify:.3f}"></label>
    </fieldset>
    <p class="atlas-widget-note" data-out="verify-note"></p>
    <p class="atlas-widget-result">Expected tokens per verify pass: <output data-out="tokens">–</output>;
    ideal speed-up: <output data-out="speedup">–</output></p>
    <p class="atlas-widget-formula"><code data-out="formula">E = 1 + a₁ + a₁a₂ + … + a₁⋯a_k;  speed-up = E / (v + k·c)</code></p>
    <p class="atlas-widget-error" data-out="error" hidden></p>
    </div>
    """
    return Markdown(_line(html))


def accept_resample(tokens: Sequence[str], p: Sequence[float], q: Sequence[float]) -> Markdown:
    rows = "".join(
        f'<tr data-token="{escape(t)}"><th scope="row"><code>{escape(t)}</code></th>'
        f'<td><input type="number" min="0" step="0.05" data-in="p" value="{pv:.2f}" aria-label="p of {escape(t)}"></td>'
        f'<td><input type="number" min="0" step="0.05" data-in="q" value="{qv:.2f}" aria-label="q of {escape(t)}"></td>'
        '<td data-out="accept"></td><td data-out="residual"></td><td data-out="output"></td>'
        '<td data-out="empirical"></td></tr>'
        for t, pv, qv in zip(tokens, p, q, strict=True)
    )
    html = f"""
    <div class="atlas-widget atlas-accept" data-atlas-widget="accept-resample">
    <p class="atlas-widget-title">The accept/resample rule, one token position</p>
    <p class="atlas-widget-source">Edit p (the main model) and q (the draft); each column is
    normalised to sum to 1. The rule's output law is computed exactly; the draws are a
    simulation with a fixed seed.</p>
    <table class="atlas-accept-table" data-atlas-sortable="1">
    <thead><tr><th>token</th><th>p</th><th>q</th><th>min(1, p/q)</th><th>residual norm(max(0, p−q))</th><th>output law</th><th>drawn</th></tr></thead>
    <tbody>{rows}</tbody>
    </table>
    <p class="atlas-widget-result">Acceptance Σ min(p, q) = <output data-out="acceptance">–</output>;
    largest |output − p| = <output data-out="maxdiff">–</output></p>
    <p class="atlas-widget-buttons"><button type="button" data-action="step">Draw one round</button>
    <button type="button" data-action="many">Draw 10 000 rounds</button>
    <button type="button" data-action="reset">Reset draws</button></p>
    <p class="atlas-widget-log" data-out="log" aria-live="polite">No draws yet.</p>
    <p class="atlas-widget-error" data-out="error" hidden></p>
    </div>
    """
    return Markdown(_line(html))

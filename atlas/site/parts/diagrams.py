"""Module 8's pictures as inline SVG, written at build time (no image files, nothing fetched).

- `wiring`: a sequential MTP module (DeepSeek-V3 style) beside parallel heads (Gloeckle et al.);
- `round_timeline`: one draft -> verify -> accept/resample -> bonus -> roll-back round, drawn from
  the worked round's own data (atlas.site.parts.worked_round), so picture and table agree;
- `tensor_layouts`: where each weight-name family keeps its MTP tensors, drawn from the fingerprint
  rules' own table (atlas.fingerprints.rules.WEIGHT_RULES), so a new rule shows up without an edit here.

Every text is XML-escaped; each SVG sits in one <div> line so Python-Markdown passes it through as
raw HTML (a blank line would end the block)."""

from __future__ import annotations

from html import escape as x

from atlas.fingerprints import rules as fingerprints
from atlas.site.parts import worked_round
from atlas.site.parts.mdsafe import Markdown

# Colours: main model blue, MTP parts orange, shared parts green, rejected grey/red.
MAIN, MAIN_EDGE = "#dbe4ff", "#3b5bdb"
MTP, MTP_EDGE = "#ffe8cc", "#e8590c"
SHARED, SHARED_EDGE = "#d3f9d8", "#2b8a3e"
GREY, RED, INK = "#e9ecef", "#c92a2a", "#212529"

# Which public models each weight-name family covers (teaching labels only: the rule's own
# family name is always drawn, so a family missing here still appears).
FAMILY_EXAMPLES = {
    "deepseek_glm": "DeepSeek-V3/R1/V3.2, GLM-4.5",
    "mimo": "MiMo-7B",
    "ernie": "ERNIE-4.5",
    "longcat": "LongCat-Flash",
    "nemotron_h": "Nemotron-H, Nemotron-3",
    "qwen3_next": "Qwen3-Next, Qwen3.5, DeepSeek-V4",
}


def _wrap(name: str, title: str, width: int, height: int, body: list[str], desc: str) -> Markdown:
    svg = (
        # scales with the column (width 100%, height from the viewBox), never wider than drawn
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" '
        f'style="max-width: {width}px" role="img" aria-labelledby="atlas-{name}-t atlas-{name}-d" '
        f'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif" font-size="13" '
        f'fill="{INK}"><title id="atlas-{name}-t">{x(title)}</title>'
        f'<desc id="atlas-{name}-d">{x(desc)}</desc>'
        '<defs><marker id="atlas-arrow-' + name + '" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        f'<path d="M0,0 L10,5 L0,10 z" fill="{INK}"/></marker></defs>'
        + "".join(body) + "</svg>"
    )
    return Markdown(f'<div class="atlas-diagram" data-atlas-diagram="{name}">{svg}</div>')


def _box(xx: float, y: float, w: float, h: float, label: str, fill: str, edge: str,
         sub: str = "", dashed: bool = False, bold: bool = False) -> str:
    dash = ' stroke-dasharray="5 4"' if dashed else ""
    weight = ' font-weight="600"' if bold else ""
    out = (f'<rect x="{xx:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="6" fill="{fill}" '
           f'stroke="{edge}" stroke-width="1.5"{dash}/>')
    cy = y + h / 2 + (0 if not sub else -6)
    out += (f'<text x="{xx + w / 2:.1f}" y="{cy + 4:.1f}" text-anchor="middle"{weight}>'
            f"{x(label)}</text>")
    if sub:
        out += (f'<text x="{xx + w / 2:.1f}" y="{cy + 19:.1f}" text-anchor="middle" font-size="11" '
                f'fill="#495057">{x(sub)}</text>')
    return out


def _arrow(name: str, x1: float, y1: float, x2: float, y2: float, colour: str = INK) -> str:
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
            f'stroke-width="1.4" marker-end="url(#atlas-arrow-{name})"/>')


def _text(xx: float, y: float, s: str, anchor: str = "start", size: int = 13, colour: str = INK,
          bold: bool = False) -> str:
    weight = ' font-weight="600"' if bold else ""
    return (f'<text x="{xx:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{colour}"{weight}>{x(s)}</text>')


def wiring() -> Markdown:
    n = "wiring"
    b: list[str] = []
    # Left: sequential module, drawn bottom-up.
    b.append(_text(10, 20, "Sequential MTP module (DeepSeek-V3 style)", bold=True, size=14))
    ax, bx, cxx, w = 10, 145, 265, 125  # columns: main path, main head, embedding path
    b.append(_box(ax, 420, w, 44, "main model", MAIN, MAIN_EDGE, "N layers, tokens ≤ t"))
    b.append(_box(cxx, 420, w, 44, "embedding", SHARED, SHARED_EDGE, "shared; token t+1"))
    b.append(_box(ax, 350, w, 36, "hidden state hₜ", MAIN, MAIN_EDGE))
    b.append(_arrow(n, ax + w / 2, 420, ax + w / 2, 386))
    b.append(_box(bx, 345, 110, 46, "main head", SHARED, SHARED_EDGE, "→ token t+1"))
    b.append(_arrow(n, ax + w, 368, bx, 368))
    b.append(_box(ax, 285, w, 36, "RMSNorm (hnorm)", MTP, MTP_EDGE))
    b.append(_arrow(n, ax + w / 2, 350, ax + w / 2, 321))
    b.append(_box(cxx, 285, w, 36, "RMSNorm (enorm)", MTP, MTP_EDGE))
    b.append(_arrow(n, cxx + w / 2, 420, cxx + w / 2, 321))
    b.append(_box(60, 220, 280, 36, "concatenate [e ; h]  (2H)", MTP, MTP_EDGE))
    b.append(_arrow(n, ax + w / 2, 285, 150, 256))
    b.append(_arrow(n, cxx + w / 2, 285, 250, 256))
    b.append(_box(60, 165, 280, 36, "projection 2H → H (eh_proj)", MTP, MTP_EDGE))
    b.append(_arrow(n, 200, 220, 200, 201))
    b.append(_box(60, 110, 280, 36, "one transformer block", MTP, MTP_EDGE, bold=True))
    b.append(_arrow(n, 200, 165, 200, 146))
    b.append(_box(60, 55, 280, 36, "output head (shared) → token t+2", SHARED, SHARED_EDGE))
    b.append(_arrow(n, 200, 110, 200, 91))
    b.append(_text(10, 490, "It is given the real token t+1: the causal chain holds.",
                   size=12, colour="#495057"))
    b.append(_text(10, 507, "Depth d runs on module d−1's hidden state.", size=12,
                   colour="#495057"))
    # Right: parallel heads on one trunk.
    ox = 420
    b.append(f'<line x1="{ox - 15}" y1="30" x2="{ox - 15}" y2="500" stroke="#ced4da"/>')
    b.append(_text(ox, 20, "Parallel heads (Gloeckle et al. 2024)", bold=True, size=14))
    b.append(_box(ox + 40, 420, 240, 44, "shared trunk", MAIN, MAIN_EDGE, "tokens ≤ t"))
    b.append(_box(ox + 40, 350, 240, 36, "hidden state hₜ", MAIN, MAIN_EDGE))
    b.append(_arrow(n, ox + 160, 420, ox + 160, 386))
    for i in range(4):
        hx = ox + 5 + i * 80
        b.append(_box(hx, 200, 70, 60, f"head {i + 1}", MTP if i else SHARED,
                      MTP_EDGE if i else SHARED_EDGE, "main" if i == 0 else "extra"))
        b.append(_arrow(n, ox + 160, 350, hx + 35, 260))
        b.append(_box(hx, 110, 70, 40, f"t+{i + 1}", "#ffffff", INK))
        b.append(_arrow(n, hx + 35, 200, hx + 35, 150))
    b.append(_text(ox, 90, "Each head: one layer, then the shared unembedding.", size=12,
                   colour="#495057"))
    b.append(_text(ox, 490, "Every head reads the same hₜ; none sees token t+1,", size=12,
                   colour="#495057"))
    b.append(_text(ox, 507, "so heads 2–4 guess without knowing what came before.", size=12,
                   colour="#495057"))
    return _wrap(n, "How an MTP module is wired: sequential (DeepSeek-V3) vs parallel heads", 760,
                 520, b,
                 "Left: the main model's hidden state at t and the embedding of token t+1 are "
                 "normalised separately, concatenated, projected back to the model width, passed "
                 "through one transformer block and the shared output head to predict token t+2. "
                 "Right: four independent heads on one shared trunk predict t+1 to t+4 from the "
                 "same hidden state.")


def round_timeline() -> Markdown:
    n = "round"
    steps = worked_round.steps()
    k = len(steps)
    emitted = worked_round.emitted()
    b: list[str] = []
    col0, colw, gap = 185, 120, 14

    def cx(i: int) -> float:  # left edge of column i (0 = the last emitted token)
        return col0 + i * (colw + gap)

    rows = [("1 draft", 40), ("2 verify", 130), ("3 accept / resample", 210), ("4 bonus", 300),
            ("5 roll back", 370)]
    for label, y in rows:
        b.append(_text(8, y + 24, label, bold=True))
    # 1 draft: the MTP module runs k times, each on its own previous output.
    b.append(_box(cx(0), 40, colw, 40, worked_round.LAST, MAIN, MAIN_EDGE, "from last pass"))
    for i, s in enumerate(steps, start=1):
        b.append(_box(cx(i), 40, colw, 40, s.position.draft, MTP, MTP_EDGE,
                      f"draft {i}, q = {s.position.q[s.position.draft]:.2f}"))
        b.append(_arrow(n, cx(i - 1) + colw, 60, cx(i), 60, MTP_EDGE))
    # 2 verify: one pass of the main model over all k + 1 positions.
    b.append(_box(cx(0), 130, cx(k) + colw - cx(0), 44,
                  f"ONE pass of the main model over {k + 1} positions → p at every position",
                  MAIN, MAIN_EDGE, bold=True))
    # 3 accept / resample, left to right.
    for i, s in enumerate(steps, start=1):
        pos = s.position
        if s.accepted:
            b.append(_box(cx(i), 210, colw, 44, f"✓ {pos.draft}", SHARED, SHARED_EDGE,
                          f"u {pos.u:.2f} < {s.accept_probability:.2f}"))
        elif s.accepted is False:
            b.append(_box(cx(i), 210, colw, 44, f"✗ {pos.draft}", "#ffe3e3", RED,
                          f"u {pos.u:.2f} ≥ {s.accept_probability:.2f}"))
            b.append(_box(cx(i), 262, colw, 30, f"resample → {emitted[-1]}", "#fff5f5", RED))
        else:
            b.append(_box(cx(i), 210, colw, 44, pos.draft, GREY, "#adb5bd", "discarded",
                          dashed=True))
        b.append(_arrow(n, cx(i) + colw / 2, 174, cx(i) + colw / 2, 210))
    # 4 bonus: only when every draft passed.
    all_ok = all(s.accepted for s in steps)
    b.append(_box(cx(k + 1) - 4, 300, colw, 40, "bonus token", SHARED if all_ok else GREY,
                  SHARED_EDGE if all_ok else "#adb5bd", "only if all k pass", dashed=not all_ok))
    b.append(_text(cx(0), 326, "not this round: a draft was rejected" if not all_ok else
                   "every draft passed: one more token from p", colour="#495057"))
    # 5 roll back: cache entries of accepted drafts stay; the rejected draft's and later ones go
    # (the replacement token's entry is written by the next round's pass).
    b.append(_box(cx(0), 370, colw, 34, "cache kept", SHARED, SHARED_EDGE))
    for i, s in enumerate(steps, start=1):
        keep = bool(s.accepted)
        b.append(_box(cx(i), 370, colw, 34, "cache kept" if keep else "cache dropped",
                      SHARED if keep else GREY, SHARED_EDGE if keep else "#adb5bd",
                      dashed=not keep))
    b.append(_text(8, 440, f"Emitted this round: {worked_round.emitted_quoted()} — {len(emitted)} tokens for one pass of "
                   f"the main model (k = {k}; at most k + 1 = {k + 1}).", bold=True))
    width = int(cx(k + 1) + colw + 10)
    return _wrap(n, f"One speculative round, k = {k}, with one rejection", width, 460, b,
                 f"After '{worked_round.CONTEXT} {worked_round.LAST}', the MTP module drafts "
                 + ", ".join(repr(s.position.draft) for s in steps)
                 + "; one main-model pass scores all positions; the first draft is accepted, the "
                 "second rejected and replaced by a token resampled from the residual, the third "
                 "discarded; no bonus token; the cache entries of the rejected drafts are dropped.")


def tensor_layouts(rules: tuple[fingerprints.WeightRule, ...] | None = None) -> Markdown:
    """One row per weight-name rule, in the order the fingerprinter tries them."""
    rules = fingerprints.WEIGHT_RULES if rules is None else rules
    n = "layouts"
    b: list[str] = []
    row_h, top = 66, 62
    b.append(_text(10, 22, "Where the MTP tensors live (first matching rule wins)", bold=True,
                   size=14))
    b.append(_text(10, 42, "Segments of a tensor name; orange = the MTP part. Main layers: "
                   "model.layers.0 … N−1. Multimodal: language_model. in front.",
                   size=12, colour="#495057"))
    for i, rule in enumerate(rules):
        y = top + i * row_h
        b.append(_text(10, y + 20, f"{i + 1}. {rule.family}", bold=True))
        b.append(_text(10, y + 37, FAMILY_EXAMPLES.get(rule.family, "(no example listed)"),
                       size=11, colour="#495057"))
        xx = 290.0
        in_mtp = False
        parts = rule.evidence.split(".")
        for j, part in enumerate(parts):
            shown = part.replace("{idx}", "i")
            in_mtp = in_mtp or "mtp" in part or "{idx}" in part
            w = max(36.0, 9.0 * len(shown) + 16)
            fill, edge = (MTP, MTP_EDGE) if in_mtp else (MAIN, MAIN_EDGE)
            if part == "*":
                fill, edge = "#ffffff", "#adb5bd"
            b.append(_box(xx, y + 6, w, 30, shown, fill, edge))
            xx += w + (14 if j < len(parts) - 1 else 0)
            if j < len(parts) - 1:
                b.append(_text(xx - 10, y + 26, ".", size=16))
        note = []
        if "{idx}" in rule.evidence and rule.evidence.startswith("model.layers."):
            note.append("i = N + d: the MTP layer continues the main layer list")
        if rule.requires_keys:
            note.append(f"only when the config has {' or '.join(rule.requires_keys)}")
        if rule.sublayers_from:
            note.append("its length = sub-layers per MTP layer")
        if note:
            # from the left edge: two key spellings do not fit right of the name column
            b.append(_text(10, y + 52, "; ".join(note), size=11, colour="#495057"))
    height = top + len(rules) * row_h + 6
    return _wrap(n, "Where each family keeps its MTP tensors", 800, height, b,
                 "One row per weight-name rule of the atlas fingerprinter: "
                 + "; ".join(f"{r.family}: {r.evidence}" for r in rules) + ".")


DIAGRAMS = {"wiring": wiring, "round": round_timeline, "layouts": tensor_layouts}


def diagram(name: str) -> Markdown:
    try:
        return DIAGRAMS[name]()
    except KeyError:
        raise KeyError(f"unknown diagram {name!r}; known: {', '.join(DIAGRAMS)}") from None

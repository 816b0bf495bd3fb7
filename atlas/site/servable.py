"""The checked-in support matrix (evidence/servable.toml): which engine serves MTP for which
architecture, dated and cited. Validated at load so a typo fails loudly instead of silently
matching nothing."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from atlas.site.curated import load_toml


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


def load(path: Path) -> Matrix:
    return load_toml(path, Matrix, "support matrix")

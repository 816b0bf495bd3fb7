"""Whether our loop (`atlas measure run`) can run one crawled model's MTP layout, by the family
table's rules applied to its real config and weight names: "runs", "refused" with the reason the
loader gives, or "not shipped". The same checks the loader makes before it loads anything
(atlas.families.table), so that the table and the loader cannot disagree;
tests/test_coverage.py shrinks every MTP-declaring config of the bundled mirror with the project's
own builder (atlas.checkpoints.oracles) and runs or refuses it, to back each line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from atlas import AtlasError
from atlas.fingerprints.rules import fingerprint
from atlas.families.table import FAMILIES, chain_length, chain_refusal, mtp_sublayers

Verdict = Literal["runs", "refused", "not shipped"]
RUNS = "runs (tested on checkpoints shrunk from this config)"


@dataclass(frozen=True)
class Coverage:
    verdict: Verdict
    family: str | None  # the family-table row, None when none reads the model_type
    reason: str  # for "runs", how (the regime it holds in); else why not

    def words(self) -> str:
        """The table's cell: "runs (...)", "refused: <reason>", "not shipped"."""
        if self.verdict == "runs":
            return RUNS + (f"; {self.reason}" if self.reason else "")
        return f"refused: {self.reason}" if self.verdict == "refused" else f"not shipped: {self.reason}"


def _transformers_has_mtp(config: Mapping[str, Any], model_type: str) -> bool:
    """Whether transformers' config class reads MTP layers its MtpModel loads from this config
    (the team model's Mellum: num_mtp_layers): the loader's fallback for a model_type with no row."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(config.get("model_type"), str) or config["model_type"] not in CONFIG_MAPPING:
        return False
    try:
        parsed = CONFIG_MAPPING[config["model_type"]].from_dict(dict(config)).get_text_config()
    except Exception:  # any failure: a crawled config transformers cannot read: no MTP it loads
        return False
    n = getattr(parsed, "num_mtp_layers", None)
    return isinstance(n, int) and n > 0


def coverage(config: Mapping[str, Any], names: Sequence[str] | None = None) -> Coverage:
    """The verdict for one model's config (and weight names, when read)."""
    fp = fingerprint(config, names)
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    model_type = str(text.get("model_type", config.get("model_type", "")))
    row = next((f for f in FAMILIES if model_type in f.model_types), None)
    if fp.shipped_mtp_layers == 0:
        return Coverage("not shipped", row.name if row else None, f"no MTP tensors among the {len(names or [])} weight names")
    if row is None:
        if _transformers_has_mtp(config, model_type):
            return Coverage("runs", None, f"transformers' own MTP loader (model_type {model_type})")
        return Coverage("refused", None, f"no family-table row for model_type {model_type!r} and transformers declares no MTP layer for it")
    if row.refuse:
        return Coverage("refused", row.name, row.refuse)
    if refusal := chain_refusal(row, chain_length(dict(text))):
        return Coverage("refused", row.name, refusal.split(": not measured: ", 1)[-1])
    if not row.dense_limit:
        try:
            mtp_sublayers(dict(text), row)
        except AtlasError as exc:
            return Coverage("refused", row.name, str(exc).split(": not measured: ", 1)[-1])
    how = f"{row.name} layout"
    if row.dense_limit:
        how += f", dense-equivalent only while the keys attended stay within {row.dense_limit} = {text.get(row.dense_limit, '?')}"
    return Coverage("runs", row.name, how)

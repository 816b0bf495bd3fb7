"""Coverage by rule: every MTP-declaring model of the bundled mirror is run by our loop on a
checkpoint shrunk from its own real config by the project's builder (atlas.checkpoints.oracles, random
weights: greedy speculative output must equal plain decoding), or refused with the named reason
that atlas.families.coverage states for it, or shown not to ship MTP tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hub_fixtures import MIRROR
from safetensors.torch import save_file

from atlas import AtlasError
from atlas.fingerprints.rules import fingerprint
from atlas.decode.checkpoint import load_checkpoint
from atlas.families.coverage import coverage
from atlas.decode.generate import Sampling, generate_plain, generate_speculative
from atlas.decode.model import build_fused_model
from atlas.checkpoints.oracles import LAYOUTS, write_checkpoint

CPU = torch.device("cpu")
PROMPT = [5, 9, 33, 2, 7, 100, 4]
# Shrunk depths with every layer kind of the family's pattern (a full-attention layer among the
# hybrids' linear ones; DeepSeek/GLM: a dense first layer, then MoE).
DEPTH = {"qwen3_5": 4, "qwen3_5_moe": 4, "qwen3_next": 4, "nemotron_h": 3}


def _config(repo: str) -> dict:
    return json.loads((MIRROR / repo / "config.json").read_text())


def _names(repo: str) -> list[str] | None:
    index = MIRROR / repo / "model.safetensors.index.json"
    return sorted(json.loads(index.read_text())["weight_map"]) if index.exists() else None


def _declaring() -> list[str]:
    out = []
    for path in sorted(MIRROR.glob("**/config.json")):
        repo = path.parent.relative_to(MIRROR).as_posix()
        fp = fingerprint(_config(repo), _names(repo))
        if (fp.declared_num_mtp_layers or 0) > 0 or (fp.shipped_mtp_layers or 0) > 0:
            out.append(repo)
    return out


DECLARING = _declaring()


def _layout(config: dict) -> str | None:
    """The builder's layout for a real config: its top-level model_type (Qwen3.5's multimodal one)."""
    return config["model_type"] if config["model_type"] in LAYOUTS else None


def test_the_mirror_holds_the_models_the_note_counts() -> None:
    verdicts = {repo: coverage(_config(repo), _names(repo)).verdict for repo in DECLARING}
    assert len(verdicts) == 24  # Nemotron-3 Ultra and Nemotron-3.5 Lightning (issue 29) included
    assert sorted(r for r, v in verdicts.items() if v != "runs") == [
        "Flagstone8878/Qwen3.5-18B-REAP-A3B-Coding",  # its weight index has no MTP tensors
        "MiniMaxAI/MiniMax-M2.7", "nvidia/MiniMax-M2.5-NVFP4",  # MiniMax ships none either: refused by name
    ]


@pytest.mark.parametrize("repo", DECLARING)
def test_each_mtp_declaring_mirror_config_runs_or_is_refused_by_name(tmp_path: Path, repo: str) -> None:
    config, names = _config(repo), _names(repo)
    said = coverage(config, names)
    if said.verdict == "not shipped":
        assert names is not None and fingerprint(config, names).shipped_mtp_layers == 0
        assert not any(n.startswith(("mtp.", "model.mtp")) or ".mtp." in n for n in names)  # counted here, not by the rules
        return
    layout = _layout(config)
    if said.verdict == "refused":
        # the loader refuses the real config with the reason the table gives, before reading a tensor
        (tmp_path / "config.json").write_text(json.dumps(config))
        save_file({"mtp.layers.0.input_layernorm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
        with pytest.raises(AtlasError) as err:
            load_checkpoint(str(tmp_path), CPU, torch.float32, peer=False)
        assert said.reason in " ".join(str(err.value).split())
        return
    if layout is None:  # no family row: transformers' own MTP loader, on the real (team) checkpoint itself
        folder = MIRROR / repo
    else:
        folder = write_checkpoint(layout, tmp_path / "shrunk", "random", depth=DEPTH.get(layout, 2), mirror=repo)
        shrunk = json.loads((folder / "config.json").read_text())
        assert (shrunk.get("text_config") or shrunk)["model_type"] == (config.get("text_config") or config)["model_type"]
    got = load_checkpoint(str(folder), CPU, torch.float32, peer=False)
    assert got.family == (said.family or "transformers MtpModel")
    engine = build_fused_model(got.model, got.mtp, 64, PROMPT)  # main model and MTP layer checked against their references
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 12, Sampling(), gen)
    for k in (1, 2):
        assert generate_speculative(engine, PROMPT, 12, k, Sampling(), gen).tokens == plain.tokens


def test_the_crawl_gives_one_coverage_table_for_the_finder_and_the_runs_page(tmp_path: Path) -> None:
    """The bundled mirror crawled for real: each model that declares or ships MTP carries the verdict
    the rule gives on its own mirror files, the finder row ends with it, and the Runs page's table lists
    the same cells under the count."""
    from site_helpers import REPO, crawl_mirror

    from atlas.store import db as store
    from atlas.site.pages import course, modelfinder
    from atlas.site.parts import models_json as modelpages
    from atlas.evidence import servable as servable_matrix

    db = tmp_path / "atlas.duckdb"
    crawl_mirror(db)
    with store.connect(db, read_only=True) as con:
        data = modelpages.collect(con, servable_matrix.load(REPO / "evidence" / "servable.toml"), REPO)
    covered = {m.repo_id: m for m in data.models if m.runner}
    assert sorted(covered) == [r for r in DECLARING if not r.startswith("_unattributed/")]  # those are in no crawl
    for repo, m in covered.items():
        assert m.runner == coverage(_config(repo), _names(repo)).words()
        assert modelfinder.finder_row(m)[-1] == m.runner
    assert modelfinder.FINDER_COLUMNS[-1] == "our loop"
    modelpages.write(data, tmp_path / "ev" / modelpages.FILE_NAME)
    text = str(course.Course(tmp_path / "ev").runner_coverage())
    runs = sum(1 for m in covered.values() if m.runner.startswith("runs"))
    assert text.startswith(f"{runs} of the {len(covered)} models in the crawl that declare or ship an MTP layer run in our loop; 2 are refused by name; 1 ship")
    assert text.count("\n| ") == len(covered) + 2  # header, separator, one row per model


def test_a_separate_drafter_repo_is_refused_by_name(tmp_path: Path) -> None:
    """Gemma 4's MTP ships as drafter repos of its own (model_type gemma4_assistant, sharing the
    target's KV cache): not a layout our loop runs, so refused by name, by the loader and the rule
    alike. (A hand-made config: no verbatim drafter config is in the mirror yet.)"""
    config = {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"]}
    said = coverage(config)
    assert said.verdict == "refused" and said.reason.startswith("a separate MTP drafter repo")
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"model.layers.0.input_layernorm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(AtlasError, match="Gemma 4 assistant: not measured: a separate MTP drafter repo"):
        load_checkpoint(str(tmp_path), CPU, torch.float32, peer=False)


@pytest.mark.parametrize("change", [
    {"text_config": "junk"}, {"model_type": ["x"]}, {"num_nextn_predict_layers": "two"}, {"num_nextn_predict_layers": 10**9},
    {"model_type": "nemotron_h", "mtp_hybrid_override_pattern": 5}, {"model_type": "nemotron_h", "mtp_hybrid_override_pattern": "*M"},
    {"model_type": "llama"}, {"model_type": "mellum", "num_mtp_layers": "x"},
])
def test_a_hostile_crawled_config_gets_a_verdict_not_a_crash(change: dict) -> None:
    """The site computes the verdict for every crawled config: junk in any key is a verdict."""
    said = coverage({**_config("zai-org/GLM-4.5"), **change})
    assert said.verdict in ("runs", "refused", "not shipped") and said.reason


def test_an_evidence_file_from_before_the_table_says_so(tmp_path: Path) -> None:
    """The committed models.json of an older evidence run has no verdicts: module 8 says to rerun
    `atlas evidence`, never that no model declares MTP."""
    from site_helpers import REPO

    from atlas.site.pages import course
    from atlas.site.parts import models_json as modelpages

    old = modelpages.read(REPO / "evidence" / modelpages.FILE_NAME)
    assert old is not None and any((m.current.declared or 0) > 0 for m in old.models if m.current)
    stripped = old.model_copy(update={"models": [m.model_copy(update={"runner": None}) for m in old.models]})
    modelpages.write(stripped, tmp_path / modelpages.FILE_NAME)
    assert "predates this table" in str(course.Course(tmp_path).runner_coverage())

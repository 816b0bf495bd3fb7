"""MTP forms (issue 37) through the local hub: every form recognised from what the crawl read
(configs, weight maps, GGUF headers by Range requests), stored with its evidence, linked across
repos (sidecar <-> base, drafter -> target, a conversion to its base), refilled by --refingerprint,
and the new config spellings read. The repos are synthetic (tests/mtp_form_fixtures.py)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hub_fixtures import build_mirror, rows, write_watchlist
from mtp_form_fixtures import (
    EVIL_GGUF, GLM_HEAD_BYTES, GLM_TOTAL, MISSING_BASE, ORG, PIN, UPSTREAM, evil_repo, repos, round_two, upstream,
)
from site_helpers import REPO

from atlas.fingerprints.form import FORMS
from atlas.fingerprints.rules import fingerprint
from atlas.hub import crawl as crawler
from atlas.hub.local.mirror import load_mirror
from atlas.export import tables as export
from atlas.hub.local.server import HubServer
from atlas.site.pages import modelfinder, modelpage
from atlas.site.parts import mtp_forms
from atlas.site.parts import models_json as modelpages

REPOS = [*repos(), evil_repo(), *round_two()]
OUTSIDE = upstream()  # on the hub, outside the crawled scope


def _meta() -> str:
    return "".join(f'["{r.repo_id}"]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in r.meta.items()) + "\n"
                   for r in [*REPOS, *OUTSIDE] if r.meta)


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[dict]]]:
    tmp = tmp_path_factory.mktemp("forms")
    mirror = build_mirror(tmp / "mirror", {r.repo_id: r.files for r in [*REPOS, *OUTSIDE]}, _meta())
    db = tmp / "atlas.duckdb"
    with HubServer(load_mirror(mirror)) as hub:
        summary = crawler.crawl(db, write_watchlist(tmp / "w.toml", [ORG]), endpoint=hub.url, endpoint_label="mirror:test",
                                token=False, cache_dir=tmp / "cache", progress=False)
        log = list(hub.requests) + list(hub.cdn_requests)
    assert summary.status == "complete" and summary.failed == 0, summary
    yield db, log


def forms(db: Path) -> dict[str, tuple[str, str]]:
    return {r: (f, e) for r, f, e in rows(db, "SELECT repo_id, mtp_form, mtp_form_evidence FROM mtp_fingerprints")}


def test_every_form_has_two_fixtures_at_least() -> None:
    by_form = {f: [r.repo_id for r in REPOS if r.form == f] for f in FORMS}
    assert {f: len(v) for f, v in by_form.items() if len(v) < 2 and f != "declared_unread"} == {}
    assert all(r.link for r in REPOS)


def test_each_repo_gets_its_form_through_the_local_hub(crawled) -> None:
    db, _ = crawled
    got = forms(db)
    assert {r.repo_id: got[r.repo_id][0] for r in REPOS} == {r.repo_id: r.form for r in REPOS}


def test_the_evidence_names_the_key_or_the_tensors(crawled) -> None:
    got = forms(crawled[0])
    assert got[f"{ORG}/MiniMax-M2.5-shaped"][1] == "num_mtp_modules = 3; none of the 9 tensor names is an MTP tensor"
    assert got[f"{ORG}/Qwen3.5-2B-PARO-shaped"][1].startswith("text_config.mtp_num_hidden_layers = 1; none of the")
    assert got[f"{ORG}/Step-3.5-shaped"][1] == "model.layers.2-4.* (3 layer(s))"
    assert got[f"{ORG}/GLM-4.5-Air-shaped-MTP-GGUF"][1] == "GLM-4.5-Air-MTP-Q8_0.gguf: only blk.2.* (MTP-only GGUF)"
    assert got[f"{ORG}/qwen3-5-0-8b-shaped-mtp"][1] == "model_type = qwen3_5_mtp"
    assert got[f"{ORG}/DeepSeek-V4.1-shaped"][1] == "text_config.dspark_block_size = 7"
    assert got[f"{ORG}/gemma-4-12B-it-assistant"][1] == "model_type = gemma4_unified_assistant"
    # the cross-repo rule: a GGUF with nothing of its own to say is stripped because its base ships MTP
    assert got[f"{ORG}/GLM-4.5-Air-shaped-GGUF"][1].startswith(
        f"base {ORG}/GLM-4.5-Air-shaped (in this snapshot) is in_checkpoint; this conversion (GGUF")
    assert "a conversion: quantization (MLX" in got[f"{ORG}/Qwen3.5-0.8B-shaped-MLX-4bit"][1]
    assert got[f"{ORG}/Qwen3.5-2B-shaped-MLX-bf16"][1].endswith("; a conversion: the Hub lists it with library_name mlx")


def test_sidecars_and_drafters_link_both_ways(crawled) -> None:
    db, _ = crawled
    got = {r[0]: r[1:] for r in rows(db, "SELECT repo_id, sidecar_base, sidecar_base_evidence, mtp_sidecars_published, "
                                         "drafter_target, mtp_drafters_published FROM mtp_fingerprints")}
    assert got[f"{ORG}/qwen3-5-0-8b-shaped-mtp"][:2] == (f"{ORG}/Qwen3.5-0.8B-shaped", "base_model")
    assert got[f"{ORG}/Qwen3.5-0.8B-shaped"][2] == f"{ORG}/qwen3-5-0-8b-shaped-mtp"
    assert got[f"{ORG}/GLM-4.5-Air-shaped-MTP-GGUF"][:2] == (f"{ORG}/GLM-4.5-Air-shaped-GGUF", "name")
    assert got[f"{ORG}/GLM-4.5-Air-shaped-GGUF"][2] == f"{ORG}/GLM-4.5-Air-shaped-MTP-GGUF"
    assert got[f"{ORG}/gemma-4-12B-it-assistant"][3] == f"{ORG}/gemma-4-12B-it"
    assert rows(db, f"SELECT sidecar_base, sidecar_base_problem FROM mtp_fingerprints WHERE repo_id = '{ORG}/evil-sidecar-mtp'") == [
        (None, "its card's base_model is not a Hub repo id")]
    assert got[f"{ORG}/gemma-4-12B-it"][4] == f"{ORG}/gemma-4-12B-it-assistant"


def test_gguf_facts_and_head_facts_are_stored(crawled) -> None:
    db, _ = crawled
    got = {r[0]: r[1:] for r in rows(db, "SELECT repo_id, gguf_layout, gguf_architecture, gguf_nextn_predict_layers, "
                                         "gguf_head_types, mtp_own_embedding, mtp_own_lm_head, mtp_head_params, mtp_head_bytes, "
                                         "mtp_head_share FROM mtp_fingerprints")}
    comb = got[f"{ORG}/GLM-4.5-Air-shaped-combined-GGUF"]
    assert comb[:4] == ("combined", "glm4moe", 1, "GLM-4.5-Air-Q4_K_M.gguf: F32×2, Q8_0×2")
    head_bytes = (64 * 64 + 128 * 64) // 32 * 34 + 128 * 4  # Q8_0: 34 bytes per 32 weights; two F32 norms
    assert comb[4:8] == ("no", "no", 64 * 64 + 128 * 64 + 128, head_bytes)
    trunk_bytes = 64 * 16 * 2 + 256 * 64 // 32 * 34 + 256 * 64 // 256 * 144 + 64 * 4 * 2 + 256 * 16 // 256 * 210
    assert comb[8] == round(head_bytes / (head_bytes + trunk_bytes), 4)
    sidecar = got[f"{ORG}/GLM-4.5-Air-shaped-MTP-GGUF"]
    assert sidecar[0] == "mtp-only" and sidecar[4:6] == ("yes", "yes")
    glm = got[f"{ORG}/GLM-4.5-Air-shaped"]  # a safetensors head: its shard's header read by ranges
    assert glm[6:] == (64 * 128 + 64 * 64 + 3 * 64, GLM_HEAD_BYTES, round(GLM_HEAD_BYTES / GLM_TOTAL, 4))
    (dtypes,) = rows(db, f"SELECT mtp_head_dtypes FROM mtp_fingerprints WHERE repo_id = '{ORG}/GLM-4.5-Air-shaped'")[0]
    assert dtypes == "BF16×2, F32×3 (model-00002-of-00002.safetensors)"
    step = got[f"{ORG}/Step-3.5-shaped"]
    assert step[4:6] == ("no", "yes")  # Step-3.5's own shared_head.head per MTP layer
    assert got[f"{ORG}/Qwen3.6-shaped-trunk-GGUF"][:3] == ("trunk-only", "qwen35", 1)


def test_gguf_headers_come_by_range_requests_never_whole_files(crawled) -> None:
    _, log = crawled
    gguf = [r for r in log if r["path"].endswith(".gguf")]
    assert gguf and all((r.get("range") or "").startswith("bytes=") for r in gguf)
    assert {r["status"] for r in gguf} <= {206, 302}  # partial content, or the resolve's redirect to the CDN


def test_a_hostile_gguf_is_that_files_error_and_the_crawl_goes_on(crawled) -> None:
    db, _ = crawled
    (status, side), = rows(db, f"SELECT fetch_status, side_file_error FROM hub_models WHERE repo_id = '{EVIL_GGUF}'")
    assert status == "ok" and side == "a-truncated.gguf: tensor count 10 cannot fit in the 176 bytes the header may still hold"
    assert forms(db)[EVIL_GGUF][0] == "in_checkpoint"  # the good file was read
    assert rows(db, f"SELECT filename FROM file_errors WHERE repo_id = '{EVIL_GGUF}'") == [("a-truncated.gguf",)]


def test_refingerprint_fills_the_forms_of_an_old_store(crawled, tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    db.write_bytes(crawled[0].read_bytes())
    before = forms(db)
    con = duckdb.connect(str(db))
    con.execute("DELETE FROM fingerprints WHERE name LIKE 'mtp_%' OR name LIKE 'gguf_%'")
    con.execute("UPDATE fingerprints SET rule_version = 'fp-2026.12.04.1'")
    con.close()
    assert set(f for f, _ in forms(db).values()) == {None}
    crawler.refingerprint(db)
    assert forms(db) == before


@pytest.mark.parametrize(("config", "declared", "pattern"), [
    # GLM-OCR 0.9B: the count under text_config
    ({"text_config": {"num_nextn_predict_layers": 1}}, (1, "text_config.num_nextn_predict_layers"), None),
    # Nemotron-3.5 Lightning: the MTP block as a list of layer kinds
    ({"num_nextn_predict_layers": 1, "mtp_layers_block_type": ["attention", "moe"]}, (1, "num_nextn_predict_layers"), "*E"),
])
def test_new_config_spellings(config: dict, declared: tuple, pattern: str | None) -> None:
    fp = fingerprint(config)
    assert (fp.declared_num_mtp_layers, fp.declared_key) == declared
    assert fp.facts.get("mtp_block_pattern", (None,))[0] == pattern


@pytest.fixture(scope="module")
def site(crawled, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("pages")
    models = modelpages.generate(crawled[0], out / modelpages.FILE_NAME, REPO / "evidence" / "servable.toml", REPO)
    modelpage.render(models, None, out / "models")
    return models, out / "models"


def test_every_form_shows_on_its_page_and_in_the_finder(site) -> None:
    models, folder = site
    by_id = {m.repo_id: m for m in models.models}
    column = modelfinder.FINDER_COLUMNS.index("MTP form") + 1
    for r in REPOS:
        m = by_id[r.repo_id]
        assert modelfinder.finder_row(m)[column].split(" (GGUF")[0] == mtp_forms.FINDER_WORDS[r.form]
        if r.form not in ("none", "declared_unread"):
            assert f"| MTP form | {mtp_forms.FORM_WORDS[r.form]} ({r.form}); evidence: " in page_text(folder, m), r.repo_id


def test_the_pages_link_sidecar_and_base_both_ways_and_state_the_head(site) -> None:
    models, folder = site
    by_id = {m.repo_id: m for m in models.models}
    sidecar, base = by_id[f"{ORG}/GLM-4.5-Air-shaped-MTP-GGUF"], by_id[f"{ORG}/GLM-4.5-Air-shaped-GGUF"]
    assert f"base: [{base.repo_id}]({base.slug}.md) (from its repo name without -MTP)" in page_text(folder, sidecar)
    assert f"MTP-only sidecar published: [{sidecar.repo_id}]({sidecar.slug}.md)" in page_text(folder, base)
    step = page_text(folder, by_id[f"{ORG}/Step-3.5-shaped"])
    assert "| MTP head | uses the trunk's embedding; its own lm_head; serve it with its own lm_head" in step
    glm = page_text(folder, by_id[f"{ORG}/GLM-4.5-Air-shaped"])
    assert (f"| MTP head | uses the trunk's embedding; uses the trunk's lm_head; 12,480 parameters, {GLM_HEAD_BYTES:,} bytes, "
            f"{GLM_HEAD_BYTES / GLM_TOTAL:.2%} of the checkpoint; safetensors head tensors BF16×2, F32×3 (model-00002-of-00002.safetensors)") in glm
    comb = page_text(folder, by_id[f"{ORG}/GLM-4.5-Air-shaped-combined-GGUF"])
    assert "12,416 parameters, 13,568 bytes, 29.42% of the checkpoint; GGUF: combined, head types GLM-4.5-Air-Q4_K_M.gguf: F32×2, Q8_0×2" in comb


def page_text(folder: Path, m) -> str:
    """A model page as a reader sees its text: entities decoded, <code> tags dropped."""
    return html.unescape(re.sub(r"</?code>", "", (folder / f"{m.slug}.md").read_text()))


def test_the_export_carries_form_evidence_links_and_head_facts(crawled, tmp_path: Path) -> None:
    out = tmp_path / "export"
    export.export(crawled[0], out, REPO / "evidence", REPO)
    with duckdb.connect() as con:
        got = {r[0]: r[1:] for r in con.execute(
            "SELECT repo_id, mtp_form, mtp_form_evidence, sidecar_base, gguf_layout, gguf_head_types, mtp_own_lm_head, "
            f"mtp_head_bytes FROM read_parquet('{out / 'fingerprints.parquet'}')").fetchall()}
    assert {r.repo_id: got[r.repo_id][0] for r in REPOS} == {r.repo_id: r.form for r in REPOS}
    assert got[f"{ORG}/GLM-4.5-Air-shaped-MTP-GGUF"][2:] == (f"{ORG}/GLM-4.5-Air-shaped-GGUF", "mtp-only",
                                                          "GLM-4.5-Air-MTP-Q8_0.gguf: F16×2, F32×2, Q8_0×2", "yes", 17_664)
    assert got[f"{ORG}/MiniMax-M2.5-shaped"][1] == "num_mtp_modules = 3; none of the 9 tensor names is an MTP tensor"


# ---- issue 63: each gap a test through the crawl (the fixtures: mtp_form_fixtures.round_two) -------------


def test_an_original_quantized_release_keeps_declared_but_missing(crawled) -> None:
    """A quantization config alone is no conversion: a lab's FP8 release (no base, or its own org's)
    whose index lacks the declared heads is declared_missing, not stripped."""
    got = forms(crawled[0])
    assert got[f"{ORG}/MiniMax-M2.7-shaped-FP8"] == (
        "declared_missing", "num_mtp_modules = 3; none of the 9 tensor names is an MTP tensor")
    assert got[f"{ORG}/Qwen3.5-2B-shaped-FP8"][0] == "declared_missing"


def test_the_bundled_minimax_m27_config_reads_declared_but_missing_with_a_trunk_index() -> None:
    """The docs' own example: MiniMax-M2.7's verbatim config (quant_method fp8) over a weight map
    without MTP tensors."""
    config = json.loads((REPO / "data/hub-mirror/MiniMaxAI/MiniMax-M2.7/config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "fp8"
    rows_ = {n: v for n, v, _ in fingerprint(config, ["model.embed_tokens.weight", "lm_head.weight"], "index").rows()}
    assert rows_["mtp_form"] == "declared_missing" and "mtp_conversion" not in rows_


def test_a_conversion_of_a_base_outside_the_snapshot_is_judged_by_that_base_read_on_demand(crawled) -> None:
    db, log = crawled
    got = forms(db)
    for repo in ("GLM-4.5-Air-base-trunk-GGUF", "Qwen3.5-4B-base-NVFP4", "Qwen3.5-4B-base-FP8-by-another"):
        assert got[f"{ORG}/{repo}"][0] == "stripped", repo
    glm = got[f"{ORG}/GLM-4.5-Air-base-trunk-GGUF"][1]
    assert re.match(rf"base {UPSTREAM}/GLM-4\.5-Air-base \(read on demand at [0-9a-f]{{12}}\) is in_checkpoint; "
                    r"this conversion \(GGUF files", glm), glm
    assert got[f"{ORG}/Qwen3.5-4B-base-NVFP4"][1].startswith(
        f"base {UPSTREAM}/Qwen3.5-4B-base (read on demand at ")
    assert f"quantization fp8 of {UPSTREAM}/Qwen3.5-4B-base by another author" in got[f"{ORG}/Qwen3.5-4B-base-FP8-by-another"][1]
    assert rows(db, f"SELECT gguf_base_model FROM mtp_fingerprints WHERE repo_id = '{ORG}/GLM-4.5-Air-base-trunk-GGUF'") == [
        (f"{UPSTREAM}/GLM-4.5-Air-base",)]
    # read through the same client: the base's repo info, config and index, never listed, never a weight
    asked = {r["path"] for r in log if f"/{UPSTREAM}/" in r["path"]}
    assert any(p.endswith(f"/api/models/{UPSTREAM}/GLM-4.5-Air-base") for p in asked), asked
    assert not any(p.endswith(".safetensors") for p in asked)
    lookups = dict(rows(db, "SELECT repo_id, status FROM base_lookups"))
    assert lookups[f"{UPSTREAM}/GLM-4.5-Air-base"] == "ok" and lookups[MISSING_BASE] == "missing"


def test_a_head_shipped_as_a_file_of_its_own_is_in_the_repo_with_the_files_it_pairs_with(crawled) -> None:
    db, _ = crawled
    got = {r[0]: r[1:] for r in rows(db, "SELECT repo_id, mtp_form, mtp_form_evidence, mtp_pairs_with, shipped_mtp_layers, "
                                         "mtp_head_params, sidecar_base FROM mtp_fingerprints")}
    gguf = got[f"{ORG}/GLM-4.5-Air-shaped-mixed-GGUF"]
    assert gguf[0] == "in_repo_separate" and gguf[1].startswith("GLM-4.5-Air-MTP-Q8_0.gguf: only blk.2.* (MTP-only GGUF); beside")
    assert gguf[2] == "GLM-4.5-Air-Q4_K_M.gguf, GLM-4.5-Air-Q8_0.gguf" and gguf[5] is None  # no sidecar of anything
    st = got[f"{ORG}/Qwen3.5-2B-shaped-MLX-separate-head"]
    assert st[:4] == ("in_repo_separate", "mtp.safetensors: mtp.* (1 layer(s)), a file of its own beside the 8 trunk tensors "
                      "of the index", "the trunk's shards", 1)
    assert st[4] == 4 * 64  # four 8x8 tensors, from mtp.safetensors' header read by ranges


def test_speculative_drafters_that_are_not_mtp_are_named_and_linked_to_their_target(crawled) -> None:
    db, _ = crawled
    got = {r[0]: r[1:] for r in rows(db, "SELECT repo_id, mtp_form, mtp_drafter, drafter_method, drafter_target, "
                                         "drafter_target_evidence, drafter_target_revision, drafter_target_problem "
                                         "FROM mtp_fingerprints")}
    assert got[f"{ORG}/EAGLE3-Llama-shaped"][:5] == ("separate_drafter", "eagle3", "EAGLE-3 drafter", f"{ORG}/Llama-shaped", "base_model")
    assert got[f"{ORG}/Llama-shaped-speculator-eagle3"][:5] == (
        "separate_drafter", "eagle3", "EAGLE-3 drafter", f"{ORG}/Llama-shaped", "config")
    assert got[f"{ORG}/Qwen3-8B-shaped-DFlash-b16"][:6] == (
        "separate_drafter", "dflash", "DFlash block-diffusion drafter", f"{UPSTREAM}/Qwen3-8B-base", "base_model", PIN)
    assert got[f"{ORG}/DeepSeek-V4-shaped-DSpark-drafter"][:4] == ("separate_drafter", "dspark", "DSpark block drafter",
                                                                  f"{ORG}/DeepSeek-V4-Flash-0731-shaped")
    # the target lists them, apart from MTP: its own form stays its own
    llama = rows(db, f"SELECT mtp_form, mtp_drafters_published FROM mtp_fingerprints WHERE repo_id = '{ORG}/Llama-shaped'")
    assert llama == [("none", f"{ORG}/EAGLE3-Llama-shaped,{ORG}/Llama-shaped-speculator-eagle3")]


def test_a_named_base_that_does_not_exist_is_a_problem_not_a_link(crawled) -> None:
    db, _ = crawled
    assert rows(db, f"SELECT sidecar_base, sidecar_base_problem FROM mtp_fingerprints WHERE repo_id = '{ORG}/qwen3-5-orphan-mtp'") == [
        (None, f"its card's base_model names {MISSING_BASE}, which is not on the Hub")]
    assert rows(db, f"SELECT drafter_target, drafter_target_problem FROM mtp_fingerprints WHERE repo_id = '{ORG}/orphan-DFlash'") == [
        (None, f"its card's base_model names {MISSING_BASE}, which is not on the Hub")]
    # a base outside the snapshot that exists is linked, with the commit the sidecar says it matches
    assert rows(db, "SELECT sidecar_base, sidecar_base_evidence, sidecar_base_revision, sidecar_base_problem FROM mtp_fingerprints "
                    f"WHERE repo_id = '{ORG}/qwen3-5-4b-pinned-mtp'") == [(f"{UPSTREAM}/Qwen3.5-4B-base", "base_model", PIN, None)]


def test_the_pages_show_the_new_forms_and_drafters_apart_from_mtp(site) -> None:
    models, folder = site
    by_id = {m.repo_id: m for m in models.models}
    mixed = page_text(folder, by_id[f"{ORG}/GLM-4.5-Air-shaped-mixed-GGUF"])
    assert "| MTP form | in the repo, as a separate file" in mixed
    assert "; pairs with GLM-4.5-Air-Q4_K_M.gguf, GLM-4.5-Air-Q8_0.gguf" in mixed
    eagle = page_text(folder, by_id[f"{ORG}/EAGLE3-Llama-shaped"])
    assert "| speculative drafter (own repo, not MTP) | EAGLE-3 drafter, not MTP (eagle3, config key architectures) for " in eagle
    dflash = page_text(folder, by_id[f"{ORG}/Qwen3-8B-shaped-DFlash-b16"])
    assert f"; trained against the target at {PIN}" in dflash
    orphan = page_text(folder, by_id[f"{ORG}/qwen3-5-orphan-mtp"])
    assert f"base unknown: its card's base_model names {MISSING_BASE}, which is not on the Hub" in orphan


def test_the_export_keeps_drafters_apart_and_carries_the_new_columns(crawled, tmp_path: Path) -> None:
    out = tmp_path / "export"
    export.export(crawled[0], out, REPO / "evidence", REPO)
    with duckdb.connect() as con:
        got = {r[0]: r[1:] for r in con.execute(
            "SELECT repo_id, mtp_form, drafter_method, mtp_pairs_with, sidecar_base_revision, gguf_base_model "
            f"FROM read_parquet('{out / 'fingerprints.parquet'}')").fetchall()}
    assert got[f"{ORG}/EAGLE3-Llama-shaped"][:2] == ("separate_drafter", "EAGLE-3 drafter")
    assert got[f"{ORG}/Qwen3.5-2B-shaped-MLX-separate-head"][2] == "the trunk's shards"
    assert got[f"{ORG}/qwen3-5-4b-pinned-mtp"][3] == PIN
    assert got[f"{ORG}/GLM-4.5-Air-base-trunk-GGUF"][4] == f"{UPSTREAM}/GLM-4.5-Air-base"

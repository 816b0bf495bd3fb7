"""MTP drafters that ship as repos of their own (issue 24 §2: Gemma 4's *-it-assistant repos): the
crawl fingerprints a drafter by its config, the store finds its target with the evidence it came
from (the card's base_model, else the repo name) or says the target is unknown, each repo keeps
its own declared count, and the model pages and the finder link drafter and target both ways.

The configs here are synthetic test repos in a temporary mirror (no verbatim gemma4_assistant
config is bundled): only the keys the rules read."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hub_fixtures import build_mirror, rows as _query, write_watchlist
from site_helpers import REPO

from atlas.fingerprints.rules import fingerprint
from atlas.hub import crawl as crawler
from atlas.hub.local.mirror import load_mirror
from atlas.hub.local.server import HubServer
from atlas.site import modelfinder, modelpage
from atlas.site import models_json as modelpages
from atlas.site.mdsafe import escape

DRAFTER = {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "num_hidden_layers": 4}
TARGET = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "num_hidden_layers": 35}
HOSTILE = '<img src=x onerror=alert(1)>/x'

BY_NAME = "google/gemma-4-E2B-it-assistant"  # no card: its target is the crawled repo its name names
BY_CARD = "google/gemma-4-E4B-it-assistant"  # card base_model names the target (in another case)
UNKNOWN = "google/gemma-4-31B-it-assistant"  # no card, and no google/gemma-4-31B-it in the crawl
EVIL = "evil/tiny-assistant"  # card base_model is a hostile id


def _config(body: dict) -> dict[str, bytes]:
    return {"config.json": json.dumps(body).encode()}


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("drafters")
    repos = {
        "google/gemma-4-E2B-it": _config(TARGET),
        "google/gemma-4-E4B-it": _config(TARGET),
        BY_NAME: _config(DRAFTER),
        # a drafter that (synthetically) declares MTP layers of its own: they stay its own
        BY_CARD: _config({**DRAFTER, "num_mtp_layers": 4}),
        UNKNOWN: _config(DRAFTER),
        EVIL: _config(DRAFTER),
    }
    meta = (f'["{BY_CARD}"]\nbase_model = "google/gemma-4-e4b-it"\n\n'
            f'["{EVIL}"]\nbase_model = {json.dumps(HOSTILE)}\n')
    mirror = build_mirror(tmp / "mirror", repos, meta)
    db = tmp / "atlas.duckdb"
    with HubServer(load_mirror(mirror)) as hub:
        summary = crawler.crawl(db, write_watchlist(tmp / "w.toml", ["google", "evil"]), endpoint=hub.url,
                                endpoint_label="mirror:test", token=False, cache_dir=tmp / "cache", progress=False)
    assert summary.status == "complete" and summary.failed == 0
    yield db


@pytest.fixture(scope="module")
def site(crawled: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[modelpages.Models, Path]:
    out = tmp_path_factory.mktemp("pages")
    models = modelpages.generate(crawled, out / modelpages.FILE_NAME, REPO / "evidence" / "servable.toml", REPO)
    modelpage.render(models, None, out / "models")
    return models, out / "models"


def test_a_drafter_is_fingerprinted_by_its_model_type_or_architecture_and_nothing_else() -> None:
    assert fingerprint(DRAFTER).drafter == ("gemma4_assistant", "model_type")
    assert fingerprint({"architectures": ["Gemma4AssistantForCausalLM"]}).drafter == ("gemma4_assistant", "architectures")
    assert fingerprint(TARGET).drafter is None
    # the drafter's own declared count is what its config says: none
    assert fingerprint(DRAFTER).declared_num_mtp_layers is None
    assert ("mtp_drafter", "gemma4_assistant", "model_type") in fingerprint(DRAFTER).rows()


def test_each_drafters_target_is_stored_with_its_evidence_or_said_unknown(crawled: Path) -> None:
    rows = {r[0]: r[1:] for r in _query(crawled, "SELECT repo_id, mtp_drafter, drafter_target, drafter_target_evidence, "
                                                 "mtp_drafters_published FROM mtp_fingerprints")}
    assert rows[BY_NAME] == ("gemma4_assistant", "google/gemma-4-E2B-it", "name", None)
    assert rows[BY_CARD] == ("gemma4_assistant", "google/gemma-4-e4b-it", "base_model", None)
    assert rows[UNKNOWN] == ("gemma4_assistant", None, None, None)
    assert rows[EVIL] == ("gemma4_assistant", HOSTILE, "base_model", None)
    # the target side: the drafter published for it, found whatever the card's case
    assert rows["google/gemma-4-E2B-it"] == (None, None, None, BY_NAME)
    assert rows["google/gemma-4-E4B-it"] == (None, None, None, BY_CARD)


def test_the_drafters_declared_count_is_never_merged_into_its_targets(crawled: Path, site) -> None:
    declared = dict(_query(crawled, "SELECT repo_id, declared_num_mtp_layers FROM mtp_fingerprints"))
    assert declared[BY_CARD] == 4 and declared["google/gemma-4-E4B-it"] is None
    assert declared[BY_NAME] is None and declared["google/gemma-4-E2B-it"] is None
    models, _ = site
    by_id = {m.repo_id: m for m in models.models}
    assert by_id["google/gemma-4-E4B-it"].current.declared is None
    assert by_id[BY_CARD].current.declared == 4
    assert modelfinder.finder_row(by_id["google/gemma-4-E4B-it"])[4] == "—"


def _page(folder: Path, m: modelpages.Model) -> str:
    return (folder / f"{m.slug}.md").read_text(encoding="utf-8")


def _finder_row_html(folder: Path, repo_id: str) -> str:
    text = (folder / "index.md").read_text(encoding="utf-8")
    first_cell = re.compile(r"<tr><td>(?:<div [^>]*>)?(?:<a [^>]*>)?([^<]*)")  # a finder cell is clamped in a div
    return next(r for r in re.findall(r"<tr><td>.*?</tr>", text) if first_cell.match(r).group(1) == repo_id)


@pytest.mark.parametrize("drafter, target, evidence", [
    (BY_NAME, "google/gemma-4-E2B-it", "from its repo name"),
    (BY_CARD, "google/gemma-4-E4B-it", "from its card's base_model"),
])
def test_the_drafter_and_its_target_link_to_each_other(site, drafter: str, target: str, evidence: str) -> None:
    models, folder = site
    by_id = {m.repo_id: m for m in models.models}
    d, t = by_id[drafter], by_id[target]
    assert d.has_page and t.has_page
    # the drafter's page names its target, linked, with the evidence; the target's, its drafter
    drafter_page, target_page = _page(folder, d), _page(folder, t)
    assert f"({t.slug}.md) (target {escape(evidence)}" in drafter_page
    assert f"MTP drafter published: [{drafter}]({d.slug}.md)" in target_page
    assert "MTP drafter published" not in drafter_page and "MTP drafter (<code>" not in target_page
    # the claim-level table carries it as a present claim of its own
    assert "| MTP drafter (own repo) |" in target_page and "| MTP drafter (own repo) |" in drafter_page
    # the finder: the first screen's rows, and the part files the script loads
    assert f'for <a href="{t.slug}/">' in _finder_row_html(folder, drafter)
    assert f'MTP drafter published: <a href="{d.slug}/">' in _finder_row_html(folder, target)
    parts = json.loads(re.sub(r"^atlasFinderPart\(0, |\);\n$", "", (folder / "finder" / "part-0000.js").read_text()))
    cells = {row[0]: row[modelfinder.FINDER_COLUMNS.index("MTP drafter") + 1] for row in parts}
    assert [t.slug] == [slug for _, slug in cells[drafter] if slug]
    assert [d.slug] == [slug for _, slug in cells[target] if slug]
    assert cells[target][0][0] == "MTP drafter published: "


def test_a_drafter_whose_target_is_not_known_says_so(site) -> None:
    models, folder = site
    m = next(x for x in models.models if x.repo_id == UNKNOWN)
    assert m.drafter is not None and m.drafter.target is None
    assert "target unknown" in _page(folder, m)
    assert modelfinder.drafter_cell(m) == [("drafter (gemma4_assistant), target unknown", None)]
    # no model of the crawl claims it as its drafter
    assert not any(p.repo_id == UNKNOWN for x in models.models for p in x.drafters)


def test_a_hostile_target_id_in_a_drafters_card_is_escaped(site) -> None:
    models, folder = site
    m = next(x for x in models.models if x.repo_id == EVIL)
    assert m.drafter is not None and m.drafter.target == HOSTILE and m.drafter.target_slug is None
    page = _page(folder, m)
    assert "<img" not in page and f"for {escape(HOSTILE)} (target" in page
    row = _finder_row_html(folder, EVIL)
    assert "<img" not in row and f"for {escape(HOSTILE)} (base" in row


def test_a_store_crawled_before_the_rule_gets_its_drafters_by_refingerprint(crawled: Path, tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    shutil.copy(crawled, db)
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM fingerprints WHERE name = 'mtp_drafter'")  # as the older rules left it
        assert con.execute("SELECT count(*) FROM mtp_drafter_links").fetchall() == [(0,)]
    finally:
        con.close()
    crawler.refingerprint(db)  # no network: the stored configs are read again
    links = dict(_query(db, "SELECT drafter, target FROM mtp_drafter_links"))
    assert links == {BY_NAME: "google/gemma-4-E2B-it", BY_CARD: "google/gemma-4-e4b-it", UNKNOWN: None, EVIL: HOSTILE}

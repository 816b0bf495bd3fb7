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
from click.testing import CliRunner
from hub_fixtures import build_mirror, rows as _query, write_watchlist
from site_helpers import REPO

from atlas.cli import cli
from atlas.fingerprints.rules import fingerprint
from atlas.hub import crawl as crawler
from atlas.site.pages import modelfinder, modelpage
from atlas.site.parts import models_json as modelpages
from atlas.site.parts.mdsafe import escape

DRAFTER = {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "num_hidden_layers": 4}
TARGET = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "num_hidden_layers": 35}
HOSTILE = '<img src=x onerror=alert(1)>/x'

BY_NAME = "google/gemma-4-E2B-it-assistant"  # no card: its target is the crawled repo its name names
BY_CARD = "google/gemma-4-E4B-it-assistant"  # card base_model names the target (in another case)
UNKNOWN = "google/gemma-4-31B-it-assistant"  # no card, and no google/gemma-4-31B-it in the crawl
EVIL = "evil/tiny-assistant"  # card base_model is a hostile id
# issue 40: targets the rule refuses, each with the reason the store keeps and the page shows
SELF = "evil/self-assistant"  # card base_model: itself
CYCLE_A, CYCLE_B = "evil/a-assistant", "evil/b-assistant"  # each card names the other
CHAIN = "evil/chain-assistant"  # card base_model: BY_NAME, a drafter with a target of its own
NOT_IDS = {"evil/path-assistant": "../../../../etc/passwd", "evil/js-assistant": "javascript:alert(1)",
           "evil/long-assistant": "a" * 5000, "evil/dash-assistant": "org/a--b"}
REFUSED = {
    EVIL: "its card's base_model is not a Hub repo id",
    SELF: "its card's base_model names the drafter itself",
    CYCLE_A: f"its card's base_model names {CYCLE_B}, a drafter whose own target is this one (a cycle)",
    CYCLE_B: f"its card's base_model names {CYCLE_A}, a drafter whose own target is this one (a cycle)",
    CHAIN: f"its card's base_model names {BY_NAME}, itself a drafter (a drafter drafts for a model, not for a drafter)",
    **{d: "its card's base_model is not a Hub repo id" for d in NOT_IDS},
}


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
        **{d: _config(DRAFTER) for d in [SELF, CYCLE_A, CYCLE_B, CHAIN, *NOT_IDS]},
    }
    cards = {BY_CARD: "google/gemma-4-e4b-it", EVIL: HOSTILE, SELF: SELF, CYCLE_A: CYCLE_B, CYCLE_B: CYCLE_A,
             CHAIN: BY_NAME, **NOT_IDS}
    meta = "".join(f'["{d}"]\nbase_model = {json.dumps(t)}\n\n' for d, t in cards.items())
    mirror = build_mirror(tmp / "mirror", repos, meta)
    db = tmp / "atlas.duckdb"
    # the public command, as a user crawls a mirror
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--mirror", str(mirror), "--no-progress",
                                      "--watchlist", str(write_watchlist(tmp / "w.toml", ["google", "evil"])),
                                      "--cache-dir", str(tmp / "cache")])
    assert result.exit_code == 0, result.output
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
    assert rows[EVIL] == ("gemma4_assistant", None, None, None)  # not a Hub id: refused (issue 40)
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
    assert f"speculative drafter published (not MTP): [{drafter}]({d.slug}.md)" in target_page
    assert "drafter published" not in drafter_page and "not MTP (<code>" not in target_page
    # the claim-level table carries it as a present claim of its own
    row = "| speculative drafter (own repo, not MTP) |"
    assert row in target_page and row in drafter_page
    # the finder: the first screen's rows, and the part files the script loads
    assert f'for <a href="{t.slug}/">' in _finder_row_html(folder, drafter)
    assert f'drafter published: <a href="{d.slug}/">' in _finder_row_html(folder, target)
    parts = json.loads(re.sub(r"^atlasFinderPart\(0, |\);\n$", "", (folder / "finder" / "part-0000.js").read_text()))
    cells = {row[0]: row[modelfinder.FINDER_COLUMNS.index("drafter (not MTP)") + 1] for row in parts}
    assert [t.slug] == [slug for _, slug in cells[drafter] if slug]
    assert [d.slug] == [slug for _, slug in cells[target] if slug]
    assert cells[target][0][0] == "drafter published: "


def test_a_drafter_whose_target_is_not_known_says_so(site) -> None:
    models, folder = site
    m = next(x for x in models.models if x.repo_id == UNKNOWN)
    assert m.drafter is not None and m.drafter.target is None
    assert "target unknown" in _page(folder, m)
    assert modelfinder.drafter_cell(m) == [("drafter (gemma4_assistant), target unknown", None)]
    # no model of the crawl claims it as its drafter
    assert not any(p.repo_id == UNKNOWN for x in models.models for p in x.drafters)


def test_a_hostile_target_id_in_a_drafters_card_is_not_shown(site) -> None:
    models, folder = site
    m = next(x for x in models.models if x.repo_id == EVIL)
    assert m.drafter is not None and m.drafter.target is None and m.drafter.target_slug is None
    page = _page(folder, m)
    # the card's base_model is still the Hub's claim, escaped; it is never taken for the target
    assert "<img" not in page and f"for {escape(HOSTILE)}" not in page
    assert f"target unknown: {escape(REFUSED[EVIL])}" in page
    row = _finder_row_html(folder, EVIL)
    assert "<img" not in row and "onerror" not in row and "target unknown" in row


# ---- issue 40: a claimed target is a Hub repo id, not the drafter, not a drafter ------------------


def test_refused_targets_are_stored_with_their_reason(crawled: Path) -> None:
    """Through `atlas query`: the store keeps no target for a refused claim, and says why."""
    result = CliRunner().invoke(cli, ["query", "--db", str(crawled), "--max-rows", "100", "SELECT repo_id || ' | ' || "
                                      "coalesce(drafter_target, '-') || ' | ' || coalesce(drafter_target_problem, '-') "
                                      "FROM mtp_fingerprints WHERE mtp_drafter IS NOT NULL"])
    assert result.exit_code == 0, result.output
    stored = dict(line.split(" | ", 1) for line in result.output.splitlines()[2:-1])
    for drafter, reason in REFUSED.items():
        assert stored[drafter] == f"- | {reason}", drafter
    # the kept links have no problem; the one without a claim says why
    assert stored[BY_NAME] == "google/gemma-4-E2B-it | -"
    assert stored[UNKNOWN].startswith("- | its card names no single base_model")
    # a refused claim publishes no drafter for anything: BY_NAME's target keeps its one drafter,
    # and neither cycle member, nor BY_NAME (named by CHAIN), is shown as having one
    published = dict(_query(crawled, "SELECT repo_id, mtp_drafters_published FROM mtp_fingerprints"))
    assert published["google/gemma-4-E2B-it"] == BY_NAME
    assert published[CYCLE_A] is None and published[CYCLE_B] is None and published[BY_NAME] is None
    assert published[SELF] is None


@pytest.mark.parametrize("drafter", sorted(REFUSED))
def test_a_refused_target_is_shown_as_target_unknown_with_the_reason(site, drafter: str) -> None:
    models, folder = site
    m = next(x for x in models.models if x.repo_id == drafter)
    assert m.drafter is not None and m.drafter.target is None and not m.drafters
    page = _page(folder, m)
    assert f"target unknown: {escape(REFUSED[drafter])}" in page
    assert " for [" not in page and f"for {escape(NOT_IDS.get(drafter, HOSTILE))}" not in page


def test_a_store_crawled_before_the_rule_gets_its_drafters_by_refingerprint(crawled: Path, tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    shutil.copy(crawled, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM fingerprints WHERE name = 'mtp_drafter'")  # as the older rules left it
        assert con.execute("SELECT count(*) FROM mtp_drafter_links").fetchall() == [(0,)]
    crawler.refingerprint(db)  # no network: the stored configs are read again
    links = dict(_query(db, "SELECT drafter, target FROM mtp_drafter_links"))
    assert links == {BY_NAME: "google/gemma-4-E2B-it", BY_CARD: "google/gemma-4-e4b-it", UNKNOWN: None,
                     **{d: None for d in REFUSED}}

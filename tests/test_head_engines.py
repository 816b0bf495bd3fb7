"""Which engines use the MTP head (evidence/head_engines.toml): a reported-level table, dated, each
row linked, in an evidence section of its own after the support matrix (never inside it: the servable
section stays free of acceptance figures); a malformed row fails with the file's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from site_helpers import REPO

from atlas import AtlasError
from atlas.evidence import head_engines
from atlas.site.parts import servable_tables

ASKED = ("llama.cpp", "vLLM", "SGLang", "TensorRT-LLM", "mlx-lm", "mlx-vlm", "transformers")


def test_the_committed_table_loads_dated_and_covers_every_engine_asked_about() -> None:
    data = head_engines.load(REPO / "evidence" / head_engines.FILE_NAME)
    assert data.date.isoformat() == "2026-12-04"
    # each engine has a row with its link, or is named as a gap: never silently absent
    assert {e for e in ASKED if e not in {r.engine for r in data.row}} == set(data.gaps)
    assert all(r.link.startswith("https://github.com/") for r in data.row)


def test_the_table_is_a_reported_box_of_its_own_with_every_link(tmp_path: Path) -> None:
    data = head_engines.load(REPO / "evidence" / head_engines.FILE_NAME)
    text = servable_tables.head_engines(data)
    assert text.startswith('!!! reported "Which engines use the MTP head (reported: public PRs and source files read 2026-12-04)"')
    for r in data.row:
        assert f"({r.link})" in text
    assert "measured" not in text.split("\n", 2)[2].lower().replace("not a measurement", "")
    assert "No public source on the head path was read for: TensorRT-LLM, mlx-vlm." in text
    assert servable_tables.head_engines(None) == ""
    # beside a matrix of its own, without a table: none
    (tmp_path / "servable.toml").write_text("")
    assert head_engines.beside(tmp_path / "servable.toml") is None


@pytest.mark.parametrize("row", [
    'link = "https://example.com/pull/1"',  # not a PR or source file on GitHub
    'link = "https://github.com/o/r/pull/1"\nstate = "probably"',  # a state no source gives
    'link = "https://github.com/o/r/pull/1"\nwhen = "last spring"',
])
def test_a_malformed_row_fails_naming_the_file(tmp_path: Path, row: str) -> None:
    path = tmp_path / head_engines.FILE_NAME
    path.write_text(f'date = "2026-12-04"\n[[row]]\nengine = "e"\nfamily = "f"\nwhat = "w"\n{row}\n')
    with pytest.raises(AtlasError, match=f"head-engines table {path}: malformed"):
        head_engines.load(path)


def test_the_evidence_file_holds_it_in_its_own_section_after_servable() -> None:
    from atlas.site.parts import evidence_file

    order = list(evidence_file.SECTIONS)
    assert order.index("head_engines") == order.index("conformance") + 1 > order.index("servable")
    assert '{{ evidence("head_engines") }}' in (REPO / "modules" / "fingerprints.md").read_text(encoding="utf-8")

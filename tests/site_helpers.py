"""Shared by the site tests: stores written through the store's own writer (hostile ids cannot come
through a real crawl: the Hub client rejects them), the real bundled-mirror crawl, and parsing of
rendered HTML tables."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import markdown
import yaml

from atlas.store import db as store
from atlas.site.pages.render import Layout
from atlas.evidence.servable import Matrix

REPO = Path(__file__).resolve().parents[1]

# Every character class the escaping must survive: table pipes, tags, backticks, line breaks,
# emphasis, link and attribute-list syntax, entities, and a comment terminator.
HOSTILE_ID = "evil/<script>alert('id')</script>|`tick`\nnew | row *em* [l](x) {: onclick=x} &amp; -->"
HOSTILE_KEY = "text_config.`mtp`|<b>bold</b>\r\n| injected | row |"
HOSTILE_TYPE = "<img src=x onerror=alert(1)>"


@dataclass
class Model:
    repo_id: str
    sha: str
    declared: int | None = None
    key: str | None = None
    shipped: int | None = None
    weight_names: str | None = None
    model_type: str = "llama"
    architectures: str = "LlamaForCausalLM"
    exemplar: bool = False
    derivative: bool = False
    base: list[str] = field(default_factory=list)
    created: datetime | None = None  # the Hub listing's createdAt

    @property
    def ours(self) -> bool:
        """Made by this project (its org), so never counted as a Hub model."""
        return self.repo_id.split("/", 1)[0] == "mtp-atlas"


def snapshot_row(day: int, n: int) -> store.SnapshotRow:
    return store.SnapshotRow(
        started_at=datetime(2026, 11, day, 8, 0), finished_at=datetime(2026, 11, day, 8, 30),
        endpoint="http://127.0.0.1:9/", watchlist_digest="d" * 64, status="complete",
        n_listed=n, n_fetched=n, n_unchanged=0, n_gated=0, n_missing=0, n_failed=0,
        rule_version="test-rules", n_requests=n, n_rate_limited=0, problems=None,
    )


def write_snapshot(db: Path, day: int, models: list[Model]) -> None:
    with store.connect(db) as con:
        rows = [
            store.ModelRow(
                repo_id=m.repo_id, sha=m.sha, last_modified=None, created_at=m.created, downloads=10,
                likes=1, gated=None, private=False, pipeline_tag="text-generation",
                library_name="transformers", tags=[], base_models=m.base, base_relation=None,
                is_derivative=m.derivative, is_exemplar=m.exemplar, param_total=None,
                fetch_status="ok", error=None,
            )
            for m in models
        ]
        fps: store.FingerprintRows = []
        for m in models:
            if m.declared is not None:
                fps.append((m.repo_id, m.sha, "test-rules", "declared_num_mtp_layers", str(m.declared), m.key))
            if m.shipped is not None:
                fps.append((m.repo_id, m.sha, "test-rules", "shipped_mtp_layers", str(m.shipped), m.weight_names))
            fps.append((m.repo_id, m.sha, "test-rules", "model_type", m.model_type, None))
            fps.append((m.repo_id, m.sha, "test-rules", "architectures", m.architectures, None))
        store.write_snapshot(con, snapshot_row(day, len(models)), rows, [], [], fps)


HOSTILE_MODELS = [
    Model("deepseek-ai/DeepSeek-V3", "1" * 40, 1, "num_nextn_predict_layers", 1, "model.layers.61.*",
          "deepseek_v3", "DeepseekV3ForCausalLM", exemplar=True, created=datetime(2024, 12, 25, 12, 0)),
    Model(HOSTILE_ID, "a" * 40, 3, HOSTILE_KEY, 0, None, HOSTILE_TYPE, "A|B,<i>C</i>", exemplar=True,
          created=datetime(2025, 3, 1, 0, 0)),
    Model("MiniMaxAI/MiniMax-M2.7", "2" * 40, 3, "num_mtp_modules", 0, None, "minimax_m2",
          "MiniMaxM2ForCausalLM", created=datetime(2025, 3, 20, 8, 0)),
    Model("Qwen/Qwen3-Next-80B-A3B-Thinking", "3" * 40, None, None, 1, "mtp.*", "qwen3_next",
          "Qwen3NextForCausalLM"),
    Model("moonshotai/Kimi-K2-Instruct", "4" * 40, 0, "num_nextn_predict_layers", None, None,
          "kimi_k2", "DeepseekV3ForCausalLM"),
    Model("mlx-community/DeepSeek-V3-4bit", "5" * 40, 1, "num_nextn_predict_layers", 0, None,
          "deepseek_v3", "DeepseekV3ForCausalLM", derivative=True, base=["deepseek-ai/DeepSeek-V3"],
          created=datetime(2022, 3, 2, 23, 29, 4)),  # the Hub's placeholder: creation date unknown
    Model("meta-llama/Llama-3.3-70B-Instruct", "6" * 40),
    # made by this project: shown in its own row group, never counted, charted or an exemplar
    Model("mtp-atlas/byte-mtp-8l", "7" * 40, 1, "num_nextn_predict_layers", 1, "mtp.*", "mellum",
          "MellumForCausalLM", exemplar=True, created=datetime(2026, 11, 1, 0, 0)),
]
HUB_MODELS = [m for m in HOSTILE_MODELS if not m.ours]


def hostile_store(db: Path) -> None:
    """Two complete snapshots (for the adoption chart); the second holds the hostile model."""
    write_snapshot(db, 20, HOSTILE_MODELS[:1] + HOSTILE_MODELS[2:4])
    write_snapshot(db, 29, HOSTILE_MODELS)


def _ignored_by_git(folder: str) -> set[Path]:
    """What `atlas site build` or `make demo` generated under `folder` (git ignores it): a copy of
    the sources leaves it out, or a page a test's own build no longer writes would linger there."""
    listed = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory", folder],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {(REPO / line.rstrip("/")).resolve() for line in listed.splitlines()}


def site_copy(root: Path, module_08: str | None = None) -> Layout:
    """A throwaway project root holding the real site/ sources and modules/ (optionally with a
    replacement module 8), so tests never write into the work tree."""
    generated = _ignored_by_git("site")
    shutil.copytree(REPO / "site", root / "site",
                    ignore=lambda folder, names: [n for n in names if Path(folder, n).resolve() in generated])
    shutil.copytree(REPO / "modules", root / "modules")
    (root / "evidence").mkdir()
    shutil.copy(REPO / "evidence" / "servable.toml", root / "evidence" / "servable.toml")
    shutil.copy(REPO / "evidence" / "head_engines.toml", root / "evidence" / "head_engines.toml")
    shutil.copy(REPO / "evidence" / "reported.toml", root / "evidence" / "reported.toml")
    if module_08 is not None:
        (root / "modules" / "module-08.md").write_text(module_08, encoding="utf-8")
    return Layout(root=root)


# A module 8 that shows every evidence section under a fixed heading (independent of the prose).
EVIDENCE_ONLY_MODULE = """---
number: 8
title: Evidence only
prev: null
next: null
---
# Module {{ page.number }} — {{ page.title }}

Exemplars: {{ facts.exemplars | join(", ") }}

{% for name in ["summary", "declared", "aggregate", "shipped", "mismatches", "servable", "head_engines",
                "conformance", "measured", "adoption_chart", "layers_chart", "provenance",
                "backfires", "verdict_measured", "answer", "runs"] %}
<h2 id="ev-{{ name | replace('_', '-') }}">{{ name | replace('_', ' ') }}</h2>

{{ evidence(name) }}

{% endfor %}
"""


@dataclass
class Table:
    section: str | None
    header: list[str]
    rows: list[list[str]]


class _Tables(HTMLParser):
    """Collects every <table> (header cells, body rows as cell text) and the section it sits in
    (the id of the nearest enclosing h2 seen before it), plus every element with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[Table] = []
        self.elements: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text = ""
        self.section: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_head = False
        self._h2: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, attrs))
        if tag == "h2":
            self._h2 = []
            ident = dict(attrs).get("id")
            self.section = ident.removeprefix("ev-").replace("-", "_") if ident else None
        elif tag == "table":
            self.tables.append(Table(self.section, [], []))
        elif tag == "thead":
            self._in_head = True
        elif tag == "tbody":
            self._in_head = False
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self.tables:
            if self._in_head:
                self.tables[-1].header = self._row
            else:
                self.tables[-1].rows.append(self._row)
            self._row = None
        elif tag == "h2":
            self._h2 = None

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._cell is not None:
            self._cell.append(data)


def parse_html(text: str) -> _Tables:
    parser = _Tables()
    parser.feed(text)
    parser.close()
    return parser


def crawl_mirror(db: Path) -> None:
    """A real crawl of the bundled mirror through the local hub server (the `make demo` path)."""
    from click.testing import CliRunner

    from atlas.cli import cli

    result = CliRunner().invoke(
        cli, ["crawl", "--db", str(db), "--mirror", str(REPO / "data" / "hub-mirror"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output


@dataclass
class DemoSite:
    """A site built the way `make demo` builds it, in a temporary root."""

    root: Path
    layout: Layout
    db: Path
    evidence: object  # atlas.site.parts.evidence_file.Evidence
    models: object  # atlas.site.parts.models_json.Models
    manifest: object | None  # atlas.export.tables.Manifest, when exported


def build_demo_site(root: Path, *, conformance: bool = False, sources: bool = False, export_data: bool = False,
                    copy_measurements: bool = False) -> DemoSite:
    """The bundled mirror crawled for real, the committed measurement records imported, evidence and
    model pages generated, the site built. `conformance`: the committed conformance records go into
    the site's evidence (the verdicts in the servable matrix); `sources`: the mirror's SOURCES.tsv is
    shown; `export_data`: the export is written first (the Data and Changelog pages);
    `copy_measurements`: the records are copied beside the evidence as well."""
    from atlas.export import tables as export
    from atlas.site.pages import write_evidence as evidence
    from atlas.site.parts import models_json as modelpages
    from atlas.site.pages import render

    layout = site_copy(root)
    if conformance and (REPO / "evidence" / "conformance").is_dir():
        shutil.copytree(REPO / "evidence" / "conformance", layout.evidence / "conformance")
    if copy_measurements:
        shutil.copytree(REPO / "evidence" / "measurements", layout.evidence / "measurements")
    db = root / "atlas.duckdb"
    crawl_mirror(db)
    assert import_folder(db, REPO / "evidence" / "measurements")
    manifest = export.export(db, layout.data, layout.evidence, REPO) if export_data else None
    ev = evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml",
                           REPO / "data" / "hub-mirror" / "SOURCES.tsv" if sources else None)
    models = modelpages.generate(db, layout.evidence / modelpages.FILE_NAME, layout.evidence / "servable.toml", REPO)
    render.build(layout)
    return DemoSite(root, layout, db, ev, models, manifest)


def declared_repo_ids(db: Path) -> list[str]:
    with store.connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT repo_id FROM mtp_fingerprints WHERE declared_num_mtp_layers IS NOT NULL"
        ).fetchall()
    return sorted(r[0] for r in rows)


HOSTILE_HARDWARE = "GPU: <b>H200</b> | `fast`\nsecond line"
PLANTED_SPEED = 1.37  # distinctive: must show in the measured table only
HOSTILE_BASELINE = "plain <b>decoder</b> | `same cache`"


def plant_measurement(db: Path, directory: Path, model_id: str, *, reached: list[int] | None = None,
                      quick: bool = False, day: int = 28, speed: float = PLANTED_SPEED) -> str:
    """Write a real record file through the measurement module's public interface and import it
    into the store; returns its record id (sha256 of the file). `reached` adds schema-2 reached
    counts per draft position (cut to each cell's k); `quick` marks a smoke run; `speed` is every
    repeat's speed-up."""
    import hashlib

    from atlas.records import gating, record as records, runcontext

    costs = records.PassCosts(plain=0.01, verify={1: 0.012, 2: 0.013}, draft=0.002)
    cells = []
    for workload, temperature, k in (("templated", 0.0, 1), ("prose|<i>x</i>", 0.7, 2)):
        repeats = [
            records.Repeat(tokens=100, seconds=1.0, baseline_seconds=speed,
                           drafted_per_position=[40] * k, accepted_per_position=[30, 20][:k],
                           reached_per_position=reached[:k] if reached else None,
                           verify_passes=40, identical_to_baseline=True if temperature == 0 else None)
            for _ in range(3)
        ]
        derived = gating.derive(repeats, temperature, k, costs, rule=1)
        g = gating.gate(derived, len(repeats), quick)
        cells.append(records.Cell(
            engine="atlas", engine_version="0.1.0", baseline=HOSTILE_BASELINE,
            workload=workload, temperature=temperature, draft_tokens=k, repeats=repeats,
            derived=derived, gate_enabled=g.enabled, gate_reason=g.reason,
        ))
    record = records.Record(
        schema_version=2 if reached or quick else 1, run_date=datetime(2026, 11, day, 12, 0),
        model_id=model_id,
        revision="b" * 40,
        hardware=runcontext.Hardware(text=HOSTILE_HARDWARE, cpu="test", cpu_cores=2, memory_gib=8.0,
                                  torch_threads=1),
        software=runcontext.Software(python="3.11", torch="2.13.0", transformers="5.24.0",
                                  atlas="0.1.0", atlas_commit=None),
        command="atlas measure run --model `x` | <script>", seed=0, prompt_set="test-prompts",
        prompt_set_digest="0" * 64,
        settings=runcontext.Settings(device="cpu", dtype="float32", workloads=["templated"],
                                  temperatures=[0.0, 0.7], draft_tokens=[1, 2], max_new_tokens=100,
                                  repeats=3, prompts_per_workload=1, quick=quick),
        pass_costs=costs, cells=cells,
    )
    path = records.write_record(record, directory)
    assert import_folder(db, directory) == 1
    return hashlib.sha256(path.read_bytes()).hexdigest()


def import_folder(db: Path, folder: Path) -> int:
    """`atlas measure import` of `folder` into the store at `db`, as the CLI runs it: how many
    records were loaded; a rejected record fails the test."""
    from atlas.records import record as records

    with store.connect(db) as con:
        loaded, _, errors = records.import_records(con, folder)
    assert not errors, errors
    return loaded


# ---- the model finder (helper DATA) ------------------------------------------------------


def engines_in(cell: str, matrix: Matrix) -> list[str]:
    """The support-matrix engines a finder cell lists, in the matrix's order (whatever words follow
    each name), leaving out those named only as having run in a measured record."""
    names = dict.fromkeys(e.engine for e in matrix.entry)
    return [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])(?! \(measured run\))", cell)]


SCHEMES = ("javascript:", "vbscript:", "data:")


def assert_inert(html: str, reference: str, where: str) -> None:
    """No link to a script scheme, no script beyond the theme's own, no event handler, no embedded
    object: whatever the record said, it is text."""
    page, base = parse_html(html), parse_html(reference)
    for tag, attrs in page.elements:
        for name, value in attrs:
            assert not name.lower().startswith("on"), (where, tag, name)
            if name.lower() in ("href", "src", "xlink:href", "action", "formaction"):
                cleaned = re.sub(r"[\s\x00-\x1f]", "", value or "").lower()
                assert not cleaned.startswith(SCHEMES), (where, tag, name, value)
        assert tag not in ("img", "iframe", "object", "embed"), (where, tag, attrs)

    def own(p, tag: str) -> list[str]:
        """The theme's elements of a kind, named by their file, not path (and not the finder's data
        parts, which its script adds once it ran)."""
        return sorted(Path(dict(a).get("src") or "").name + str(sorted(k for k, _ in a)) for t, a in p.elements
                      if t == tag and not re.fullmatch(r"finder/part-\d{4}\.js", dict(a).get("src") or ""))

    for tag in ("script", "form", "style"):
        assert own(page, tag) == own(base, tag), (where, tag)


def site_markdown(text: str) -> str:
    """Markdown -> HTML with the extensions the site's mkdocs.yml enables."""
    config = yaml.safe_load((REPO / "site" / "mkdocs.yml").read_text(encoding="utf-8"))
    names, configs = [], {}
    for ext in config["markdown_extensions"]:
        if isinstance(ext, dict):
            (name, options), = ext.items()
            names.append(name)
            configs[name] = options
        else:
            names.append(ext)
    return markdown.markdown(text, extensions=names, extension_configs=configs)

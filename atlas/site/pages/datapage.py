"""The Data and Changelog pages: what a reader can take away.

`atlas site build` copies what `atlas export` wrote (tables as Parquet and CSV, the data
dictionary, the manifest; their names and the manifest's schema are atlas.export.formats's, so this
page never imports the exporter) into docs/data/files/, and the committed record files
(evidence/measurements/*.json, evidence/conformance/*.json) into docs/data/records/, so mkdocs
ships them as downloadable files; docs/data/index.md lists each with its rows, date and sha256,
then per table its columns (type, definition) and first rows, the licence and a citation, and
docs/changelog.md renders the changelog's data. The dataset card (README.md) would be a page
to mkdocs, so it is copied into the built site after mkdocs ran (add_card), byte for byte.
Without an export both pages say how to make one; the record files are listed either way.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import duckdb

from atlas.export import croissant, formats as exportformat
from atlas.conformance import record as conformance
from atlas.records import record as records
from atlas.evidence import changelog as changelog_data
from atlas.site.pages import changelog
from atlas.site.parts.mdsafe import Markdown, code, escape, file_link, table

RECORD_KINDS = ("measurements", "conformance")
RECORDS = "data/records"  # under docs/: the record files, one folder per kind


def _sha(digest: str) -> Markdown:
    # 64 hex digits, breakable every 16 so a narrow column wraps them instead of overflowing
    parts = [digest[i:i + 16] for i in range(0, len(digest), 16)]
    return Markdown('<code class="atlas-rev">' + "<wbr>".join(str(escape(p)) for p in parts) + "</code>")


def _record_rows(evidence: Path, docs: Path) -> tuple[list[list[object]], dict[str, str]]:
    """Copy the record files into docs/data/records/KIND/ and describe each; also the link of each
    record, by its repository path, relative to the docs root (for the changelog)."""
    rows: list[list[object]] = []
    links: dict[str, str] = {}
    for kind in RECORD_KINDS:
        folder = evidence / kind
        checked = dict(conformance.load_records(folder)) if kind == "conformance" else {}
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            target = docs / RECORDS / kind / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            if kind == "measurements":
                rec = records.read_record(path)
                what = f"{rec.model_id}, record id {records.record_id(rec)[:12]}" + (
                    " (smoke run, not evidence)" if rec.settings.quick else "")
                when = rec.run_date
            else:
                crec = checked[path]
                what, when = f"{crec.package} {crec.version}, {crec.hardware}", crec.run_date
            links[f"evidence/{kind}/{path.name}"] = f"{RECORDS}/{kind}/{path.name}"
            # linked from the Data page, docs/data/index.md
            rows.append([file_link(path.name, f"records/{kind}/{path.name}"), kind,
                         Markdown(f'<span class="atlas-nowrap">{when:%Y-%m-%d %H:%M}</span>'),
                         escape(what), _sha(hashlib.sha256(path.read_bytes()).hexdigest())])
    return rows, links


PREVIEW_ROWS = 3
PREVIEW_CHARS = 60  # a preview cell's text is cut here (the file holds it whole)


def preview_value(value: object) -> str:
    """A value as the preview shows it: NULL as —, a float to 6 significant digits, a list as
    [a, b], text cut at PREVIEW_CHARS characters with an ellipsis."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        text = "[" + ", ".join(preview_value(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def _breakable(text: str) -> Markdown:
    """`text` escaped, with a break opportunity every 16 characters inside a long unbroken run (a
    digest, a path), so that a narrow column wraps it instead of overflowing."""
    out = []
    for word in text.split(" "):
        parts = [word[i:i + 16] for i in range(0, len(word), 16)] or [""]
        out.append("<wbr>".join(str(escape(p)) for p in parts))
    return Markdown(" ".join(out))


def _columns(data: Path, manifest: exportformat.Manifest) -> list[str]:
    """Per table: its columns with their types and definitions (the data dictionary), and its first
    PREVIEW_ROWS rows, transposed (a row per column) so that a wide table stays narrow."""
    with duckdb.connect() as con:
        dictionary = con.execute("SELECT * FROM read_parquet(?)", [str(data / f"{exportformat.DICTIONARY}.parquet")]).fetchall()
        lines: list[str] = ["## Columns and preview", "",
                            f"Each table's columns with their DuckDB type and definition, then its first "
                            f"{PREVIEW_ROWS} rows in file order (floats to 6 significant digits, text cut at "
                            f"{PREVIEW_CHARS} characters: the files hold every value whole).", ""]
        for f in manifest.files:
            if f.format != "parquet":
                continue
            cur = con.execute(f"SELECT * FROM read_parquet(?) LIMIT {PREVIEW_ROWS}", [str(data / f.path)])
            names = [d[0] for d in cur.description]
            first = cur.fetchall()
            lines += [f"### {code(f.table)}", "", escape(manifest.description[f.table]), "",
                      table(["column", "type", "definition"],
                            [[code(c), code(t), escape(m)] for tab, c, t, m in dictionary if tab == f.table]), ""]
            lines += [table(["column"] + [f"row {i + 1}" for i in range(len(first))],
                            [[code(n)] + [_breakable(preview_value(r[i])) for r in first] for i, n in enumerate(names)])
                      if first else "No rows yet.", ""]
    return lines


def _citation(manifest: exportformat.Manifest) -> list[str]:
    bibtex, plain = exportformat.citation(manifest)
    return ["## Licence and citation", "",
            f"Licence: {code(exportformat.LICENSE)}, the Apache License 2.0 (the project's LICENSE, as pyproject.toml "
            "declares it). The tables hold facts read from public model repositories at the revisions given, "
            "not their weights.", "",
            "BibTeX:", "", "```bibtex", bibtex, "```", "",
            f"Plain: {escape(plain)}", ""]


def _tables(manifest: exportformat.Manifest, data: Path, out: Path) -> list[str]:
    files = out / "files"
    files.mkdir(parents=True)
    for f in manifest.files:
        shutil.copyfile(data / f.path, files / f.path)
    for name in (exportformat.MANIFEST, croissant.FILE_NAME):
        shutil.copyfile(data / name, files / name)
    rows = [[file_link(f.path, f"files/{f.path}"), code(f.table), f.format, f.rows,
             Markdown(f'<span class="atlas-nowrap">{f.as_of or "—"}</span>'), _sha(f.sha256)]
            for f in manifest.files]
    snaps = "\n".join(f"- snapshot #{s['snapshot_id']}: crawl finished {escape(s['finished'])} UTC, "
                      f"from {code(s['source'])}, data of {escape(s['data_date'])}" for s in manifest.snapshots)
    described = "\n".join(f"- {code(t)}: {escape(d)}" for t, d in manifest.description.items())
    first = manifest.files[0].path if manifest.files else "fingerprints.parquet"
    return [
        "## Tables", "",
        "Written by `atlas export` from the atlas store with DuckDB's `COPY ... TO`. *Data as of*: "
        "the newest snapshot, run or reading date among a table's rows (the export adds no date of "
        "its own, so the same data always gives the same files and sha256).", "",
        table(["file", "table", "format", "#rows", "data as of", "sha256"], rows), "",
        described, "", escape(exportformat.CSV_NOTE), "",
        Markdown('The folder is a dataset as it is: its card, <a href="files/README.md">README.md</a> '
                 "(Hugging Face dataset-card format, one config per table), the "
                 f"[manifest](files/{exportformat.MANIFEST}), its Croissant 1.1 description "
                 f"[{croissant.FILE_NAME}](files/{croissant.FILE_NAME}) and the files above."), "",
        "```python",
        "import duckdb",
        f"duckdb.sql(\"SELECT * FROM read_parquet('{first}')\")",
        "from datasets import load_dataset",
        f"load_dataset(\"parquet\", data_files=\"{first}\")",
        "```", "",
        "Snapshots in these files:", "", snaps, "",
    ] + _columns(data, manifest) + _citation(manifest)


def render(data: Path, evidence: Path, docs: Path) -> list[Path]:
    """Write docs/data/ (page and files) and docs/changelog.md; both rebuilt whole."""
    out = docs / "data"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    manifest = exportformat.read_manifest(data) if data.is_dir() else None
    record_rows, links = _record_rows(evidence, docs)
    lines = ["# Data", "",
             "Everything the atlas's tables show, as files: the exported tables and the dated record "
             "files the measured and conformance tables are drawn from.", ""]
    if manifest is None:
        lines += ["No export in this build: `atlas export` writes the tables from the store "
                  "(`make demo` does), then `atlas site build` lists them here.", ""]
    else:
        # the data's own date: the newest data date of the files (a mirror crawl's is the mirror's)
        lines += [f"Data of {escape(exportformat.data_date(manifest) or '—')}.", ""]
        lines += _tables(manifest, data, out)
    lines += ["## Record files", "",
              "The committed records, byte for byte (the sha256 is the file's; a measurement's "
              "record id is the sha256 of its canonical serialisation, which the tables cite).", ""]
    lines += [table(["file", "kind", "run (UTC)", "what", "sha256"], record_rows) if record_rows
              else "No record file yet.", ""]
    page = out / "index.md"
    page.write_text(_front("Data") + "\n".join(str(x) for x in lines), encoding="utf-8")
    log_page = docs / changelog_data.FILE_NAME.replace(".json", ".md")
    log = changelog_data.read(data / changelog_data.FILE_NAME) if manifest is not None else None
    # docs/changelog.md sits at the docs root, so the records' links from there start at data/
    log_page.write_text(_front("Changelog") + changelog.page(log, links), encoding="utf-8")
    return [page, log_page]


def _front(title: str) -> str:
    return f"---\ntitle: {title}\n---\n\n"


def add_card(data: Path, build: Path) -> None:
    """Copy the dataset card into the built site beside the files it describes."""
    card = data / exportformat.CARD
    if (build / "data" / "files").is_dir() and card.is_file():
        shutil.copyfile(card, build / "data" / "files" / exportformat.CARD)

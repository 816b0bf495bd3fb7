"""How an export describes itself: the dataset card (README.md, after the Hugging Face dataset-card
template) and croissant.json (Croissant 1.1), both read back from the files just written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from string import Template
from typing import Any

import duckdb
import yaml

from atlas import __version__
from atlas.export import croissant
from atlas.evidence.changelog import FILE_NAME as CHANGELOG_FILE
from atlas.export.formats import (CARD, CREATOR, CSV_NOTE, DICTIONARY, LICENSE, MANIFEST, Manifest, citation,
                                  data_date, published_date, quote_path)
from atlas.hub.local.mirror import MIRROR_PREFIX


# ---- Croissant ----------------------------------------------------------------------------------


def write_croissant(folder: Path, manifest: Manifest) -> None:
    """croissant.json beside the card: every file and field, read from what was just written."""
    columns = read_dictionary(folder)
    tables = dict.fromkeys(f.table for f in manifest.files)
    bibtex, _ = citation(manifest)
    doc = croissant.describe(
        folder, {t: manifest.description[t] for t in tables}, columns,
        {CARD: "the dataset card (Hugging Face dataset-card format)",
         MANIFEST: "rows, sha256 and data date of every table file; the snapshots and records the tables come from",
         CHANGELOG_FILE: "what changed between snapshots and records, as the site's Changelog shows it"},
        {"name": "MTP Atlas",
         "description": "Dated facts about how open-weight language models use multi-token prediction (MTP): "
                        "what their configs declare and their weights ship (present claims), and the atlas's "
                        "own measurements of self-speculative decoding with an MTP head (measured claims), in "
                        "separate tables. " + CSV_NOTE,
         "license": croissant.LICENSE_URL,
         "creator": {"@type": "sc:Organization", "name": CREATOR},
         "citeAs": bibtex,
         "version": __version__,
         "keywords": card_metadata(manifest, columns)["tags"],
         "isLiveDataset": False} | ({"datePublished": published_date(manifest)} if published_date(manifest) else {}))
    (folder / croissant.FILE_NAME).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ---- the dataset card -------------------------------------------------------------------------------


# Untrusted text in the card (a record's hardware, record and conformance file names, a snapshot's
# source): the Hub renders a card as Markdown that may hold HTML, so every character that could open
# a tag, a link, a code span, emphasis or a table cell becomes a numeric character reference (shown
# as itself, never markup), line breaks become spaces and control characters go. An HTML <code>
# element stands in for backticks: a backtick in the value would close a backtick span. (The site's
# atlas.site.parts.mdsafe does this for its pages; the export sits below the site and does not import it.)
_MARKUP = str.maketrans({c: f"&#{ord(c)};" for c in "&<>\"'|`*_[]{}\\~#"})
_BREAKS = re.compile(r"[\r\n\u0085\u2028\u2029\x0b\x0c]+")
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def text(value: object) -> str:
    """An untrusted value as card text that renders as exactly that text."""
    return _CONTROLS.sub("", _BREAKS.sub(" ", str(value))).translate(_MARKUP)


def code(value: object) -> str:
    """An untrusted value in a monospace span of the card."""
    return f"<code>{text(value)}</code>"


# The Hugging Face `datasets` feature type of each DuckDB column type the export writes.
HF_DTYPES = {"VARCHAR": "string", "JSON": "string", "BOOLEAN": "bool", "BIGINT": "int64", "INTEGER": "int32",
             "DOUBLE": "float64", "DATE": "date32", "TIMESTAMP": "timestamp[us]"}


def _feature(column: str, ctype: str) -> dict[str, str]:
    if ctype.endswith("[]"):
        return {"name": column, "sequence": HF_DTYPES[ctype[:-2]]}
    return {"name": column, "dtype": HF_DTYPES[ctype]}


def card_metadata(manifest: Manifest, columns: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    """The card's YAML front matter (the Hugging Face dataset-card fields): one config per table,
    each reading its Parquet file, with its features (columns and types) and its one split."""
    tables = list(dict.fromkeys(f.table for f in manifest.files))
    rows = max((f.rows for f in manifest.files), default=0)
    parquet = {f.table: f for f in manifest.files if f.format == "parquet"}
    return {
        "pretty_name": "MTP Atlas",
        "license": LICENSE,
        "language": ["en"],
        # the rows are facts about models and measurements: no machine-learning task is trained on them
        "task_categories": ["other"],
        "source_datasets": ["original"],
        # fingerprints are read from configs and weight names by rule; measurements are the atlas's runs
        "annotations_creators": ["machine-generated"],
        "language_creators": ["machine-generated"],
        "creators": [CREATOR],
        "tags": ["multi-token-prediction", "speculative-decoding", "model-architecture"],
        "size_categories": ["n<1K" if rows < 1000 else "1K<n<10K" if rows < 10_000 else "10K<n<100K"
                            if rows < 100_000 else "100K<n<1M"],
        "configs": [
            {"config_name": t, "data_files": [{"split": "train", "path": f"{t}.parquet"}]}
            | ({"default": True} if i == 0 else {})
            for i, t in enumerate(tables)
        ],
        "dataset_info": [
            {"config_name": t,
             "features": [_feature(c, ctype) for table, c, ctype, _ in columns if table == t],
             "splits": [{"name": "train", "num_bytes": parquet[t].bytes, "num_examples": parquet[t].rows}]}
            for t in tables
        ],
    }


def read_dictionary(folder: Path) -> list[tuple[str, str, str, str]]:
    """(table, column, type, meaning) of every exported column, from the data dictionary written there."""
    with duckdb.connect() as con:
        return [tuple(r) for r in con.execute(  # type: ignore[misc]
            f"SELECT * FROM read_parquet({quote_path(folder / (DICTIONARY + '.parquet'))})").fetchall()]


def _limits(folder: Path, manifest: Manifest) -> str:
    """What the data cannot tell, from the data: how many models the latest crawl read and from
    where, and on what hardware and of whose checkpoints every measurement is."""
    with duckdb.connect() as con:
        (hardware, ours, cells) = con.execute(
            "SELECT list(DISTINCT hardware ORDER BY hardware), bool_and(made_by_atlas), count(*) "
            f"FROM read_parquet({quote_path(folder / 'measured_cells.parquet')})").fetchone()
        (models, own) = con.execute("SELECT count(*) FILTER (NOT made_by_atlas), count(*) FILTER (made_by_atlas) "
                                    f"FROM read_parquet({quote_path(folder / 'model_facts.parquet')})").fetchone()
    latest = manifest.snapshots[-1] if manifest.snapshots else None
    source = latest["source"] if latest else None
    besides = f" (besides {own} of this project's own)" if own else ""
    if source and source.startswith(MIRROR_PREFIX):
        crawl = (f"The latest snapshot is a crawl of a bundled mirror ({code(source)}) of {models} model configs{besides}, "
                 "not of the Hub: it says what those files declare, not how common MTP is on the Hub.")
    else:
        crawl = (f"The latest snapshot read {models} models{besides} from {code(source)}: the watch list's, "
                 "not every Hub model.")
    if not cells:
        return crawl + " There are no measurements in this export."
    whose = "of checkpoints this project made" if ours else "of checkpoints, some from the Hub"
    measured = f"Every one of the {cells} measured cells is a run {whose}, on " + "; ".join(code(h) for h in hardware) + "."
    if all(h.startswith("CPU") for h in hardware):  # the stamp names a GPU run's device first
        measured += " None of the measured figures was taken on a GPU."
    if ours:
        measured += " None of them is the speed-up of a model published on the Hub."
    return crawl + " " + measured + " Figures other people published are in `reported_figures`, with their sources."


# The card's text: the Hugging Face dataset-card sections, filled from the manifest and the data.
CARD_TEMPLATE = Template("""---
${meta}---

# MTP Atlas

## Dataset Details

### Dataset Description

Dated facts about how open-weight language models use multi-token prediction (MTP), and the
atlas's own measurements of self-speculative decoding with an MTP head. Exported by `atlas export`
from the atlas store; every row says where it came from. Data of ${data_date}.

Present claims (what a config declares, what the weights ship, which engine has code to serve
it) and measured claims (a dated run on named hardware) are different tables and never mix: a
speed-up appears only in `measured_cells`, and figures other people published only in
`reported_figures`.

- **Curated by:** the ${creator}
- **Language(s):** English (the text fields: definitions, conditions, sources)
- **License:** ${license}

### Dataset Sources

- **Repository:** the MTP Atlas project that ran `atlas export` (it has no public address yet)
- **Paper:** none
- **Demo:** the atlas's course site (`atlas site build`), whose Data page lists these files

## Dataset Structure

| config | rows | data as of | what it holds |
|---|---|---|---|
${table_lines}

`data_dictionary` names every column's type and meaning (the YAML above lists each config's
features); `croissant.json` describes every file and field in Croissant 1.1. Each table is also
written as CSV (list columns as `[a, b]`). ${csv_note}

## Uses

### Direct Use

Looking up what a model's config declares about MTP and what its weights ship, at a dated
revision; which engines have code to draft with its MTP layers; and what the atlas measured when
it ran MTP self-speculative decoding, with the gate's verdict and its paired 95 % bounds.

```python
import duckdb
duckdb.sql("SELECT * FROM read_parquet('${first}.parquet')")

from datasets import load_dataset
load_dataset("parquet", data_files="${first}.parquet")   # one table
load_dataset("/path/to/this/folder", "${first}")        # by the configs above (a folder path, not ".")

import mlcroissant as mlc   # pip install "mlcroissant[parquet]": the [parquet] extra reads the files
rows = list(mlc.Dataset(jsonld="croissant.json").records("${first}"))
```

Loading through `croissant.json` needs `mlcroissant[parquet]`, not bare `mlcroissant`: its record
sets read the Parquet files, which the extra (pyarrow) opens.

### Out-of-Scope Use

Not a benchmark of Hub models' decoding speed, and not a census of the Hub: see the limits below.
The tables hold facts read from configs and weight names, never weights.

## Dataset Creation

### Curation Rationale

Whether a model ships MTP layers, and whether using them pays, is usually stated without a date,
a revision or a device. Each row here has all three, or says it has none.

### Source Data

#### Data Collection and Processing

`atlas crawl` reads each watched repository's config.json and weight names at a revision (or a
mirror folder of verbatim configs with their provenance) and applies versioned fingerprint rules
(`rule_version`); `atlas measure` runs the atlas's own decoding loop and writes a record whose
derived figures are recomputed from its raw counts on import. Snapshots (crawls) in these files:

${snaps}

Measurement records (ids are the sha256 of each record's canonical serialisation):

${records}

Conformance records:

${conf}

Servable engines (`model_facts.servable_engines`): the support matrix `evidence/servable.toml` of
${servable_date}, which cites the engine source it was read from.

#### Who are the source data producers?

The model configs and weight names are the model publishers' (named by `repo_id`); the
measurements and conformance checks are the atlas's own runs; `reported_figures` quote their
sources, which each row names.

### Personal and Sensitive Information

None collected. The rows are facts about public model repositories (ids, config keys, weight
names, revisions) and the atlas's own timing runs. A `repo_id` names its publisher, a person or an
organisation, as the Hub shows it publicly; no other data about people is read or stored.

## Bias, Risks, and Limitations

${limits}

A speed-up is for the named hardware, engine, workload, temperature and draft length only.
`speedup_slowest_repeat` / `speedup_fastest_repeat` are the range of the repeats, not confidence
bounds; `speedup_paired_lower_95` / `speedup_paired_upper_95` are the gate's one-sided 95 % bounds.

### Recommendations

Quote a speed-up with its record (hardware, engine, date) and never beside a reported figure as if
the two were one measurement. Take a model's present claims as of the revision given: a repository
can change after the crawl. Count MTP adoption only from a crawl of the live Hub, never from the
bundled mirror.

## Glossary

- **MTP** (multi-token prediction): extra prediction modules that guess tokens beyond the next.
- **Declared / shipped**: a config's MTP layer count / MTP tensors present in the weight index.
- **Servable**: an engine version has code to draft with that architecture's MTP layers.
- **Reported**: a figure published by others (papers, engines, model cards), with its stated conditions.
- **Measured**: a dated run of the atlas on named hardware; acceptance is accepted ÷ drafted
  drafts, a speed-up is plain time ÷ speculative time for the same tokens.
- **Gate**: the atlas's per workload and temperature decision to switch MTP on, from paired repeats.

## More Information

`manifest.json` lists every file with its rows, sha256 and data date, and the snapshots and
records the tables come from; `changelog.json` says what changed between them.

## Citation

**BibTeX:**

```bibtex
${bibtex}
```

**Plain:** ${plain}

## License

${license} (the Apache License 2.0, the atlas project's; LICENSE in its repository). The model
configs' facts are read from public repositories at the revisions given; their own licences are
their publishers'.

## Dataset Card Authors

The ${creator}, generated by `atlas export` (atlas ${version}).

## Dataset Card Contact

The ${creator}: open an issue in the repository this export was made from.
""")


def card(manifest: Manifest, folder: Path) -> str:
    """The dataset card (README.md), after the Hugging Face dataset-card template, for the tables
    written into `folder`."""
    columns = read_dictionary(folder)
    meta = yaml.safe_dump(card_metadata(manifest, columns), sort_keys=False, allow_unicode=False)
    parquet = [f for f in manifest.files if f.format == "parquet"]
    table_lines = "\n".join(
        f"| `{f.table}` | {f.rows} | {text(f.as_of or '—')} | {manifest.description[f.table]} |" for f in parquet)
    snaps = "\n".join(f"- snapshot #{text(s['snapshot_id'])}: crawl finished {text(s['finished'])} UTC, from "
                      f"{code(s['source'])}, data of {text(s['data_date'])}" for s in manifest.snapshots)
    records = "\n".join(f"- {code(r['record_id'])} ({code(r['source_path'])})"
                        for r in manifest.measurement_records) or "- none"
    conf = "\n".join(f"- {code(c)}" for c in manifest.conformance_records) or "- none"
    first = parquet[0].table if parquet else "fingerprints"
    bibtex, plain = citation(manifest)
    return CARD_TEMPLATE.substitute(
        meta=meta, table_lines=table_lines, snaps=snaps, records=records, conf=conf, first=first, bibtex=bibtex,
        plain=plain, creator=CREATOR, csv_note=CSV_NOTE, license=LICENSE, data_date=text(data_date(manifest) or "—"),
        servable_date=text(manifest.servable_date), limits=_limits(folder, manifest), version=__version__)

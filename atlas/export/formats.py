"""What an `atlas export` folder holds, as its writer (atlas.export.tables) and its readers (the site's
Data page, atlas.site.pages.datapage) both need it: the file names and formats, the manifest that lists
every file, and the citation of the data.

A leaf: it imports nothing of the atlas but its version and error type, so the site reads an export without
importing the exporter, and the exporter never reaches up into the site for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from atlas import __version__
from atlas.jsonfile import read_written

MANIFEST = "manifest.json"
CARD = "README.md"
FORMATS = ("parquet", "csv")
LICENSE = "apache-2.0"  # the project's (pyproject.toml)
DICTIONARY = "data_dictionary"
# What the export does to CSV cells a spreadsheet would run (atlas.export.tables FORMULA_STARTS).
CSV_NOTE = ("In the CSV files a text value that starts with =, +, -, @, a tab or a carriage return has a "
            "quote (') put before it, so that a spreadsheet shows it as text instead of running it as a "
            "formula; the Parquet files hold the exact value, and numeric columns are never changed.")


def quote_path(path: Path) -> str:
    """A path as a DuckDB string literal."""
    return "'" + str(path).replace("'", "''") + "'"


class FileEntry(BaseModel):
    path: str  # relative to the export folder
    table: str
    format: str
    rows: int
    bytes: int
    sha256: str
    as_of: str | None  # date of the newest row's data (snapshot, run, record or reading date)


class Manifest(BaseModel):
    description: dict[str, str]  # table -> what it holds
    files: list[FileEntry]
    snapshots: list[dict[str, Any]]  # id, finished (UTC), source of every complete snapshot
    measurement_records: list[dict[str, str]]  # record_id, source_path
    conformance_records: list[str]
    servable_date: str  # the support matrix model_facts.servable_engines comes from


def read_manifest(folder: Path) -> Manifest | None:
    return read_written(folder / MANIFEST, Manifest, "atlas export")


CREATOR = "MTP Atlas project"


def data_date(manifest: Manifest) -> str | None:
    """The newest data date of the export's files (snapshot data date, run, record or reading)."""
    return max((f.as_of for f in manifest.files if f.as_of), default=None)


def published_date(manifest: Manifest) -> str | None:
    """When the export's content was complete: the newest of its data date and its snapshots' crawl
    dates (a mirror crawl's data is older than the crawl that read it). Croissant's datePublished;
    taken from the manifest, so the same data gives the same bytes."""
    dates = [d for d in [data_date(manifest), *(str(s.get("finished") or "")[:10] for s in manifest.snapshots)] if d]
    return max(dates, default=None)


def citation(manifest: Manifest) -> tuple[str, str]:
    """(BibTeX, plain text) for the export: the project, its version and the data's own date."""
    date = data_date(manifest) or "undated"
    year = date[:4] if date != "undated" else "n.d."
    title = "MTP Atlas: multi-token prediction in open-weight language models, and measured self-speculative decoding"
    bibtex = (f"@misc{{mtp_atlas_{date.replace('-', '')},\n"
              f"  title = {{{title}}},\n"
              f"  author = {{{{{CREATOR}}}}},\n"
              f"  year = {{{year}}},\n"
              f"  version = {{{__version__}}},\n"
              f"  note = {{Dataset exported by atlas export, data of {date}; license {LICENSE}}}\n"
              "}")
    plain = f"{CREATOR} ({year}). {title}. Dataset, version {__version__}, data of {date}. License: Apache-2.0."
    return bibtex, plain

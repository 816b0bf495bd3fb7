"""The export's Croissant 1.1 description (croissant.json, JSON-LD, beside the dataset card): every
file of the export as a FileObject with its sha256, and every table as a RecordSet whose fields are
the table's columns, with their types and meanings from the data dictionary, read from its Parquet
file. Tools that read Croissant (mlcroissant, dataset search engines) load the tables from it.

Deterministic as the rest of the export: the only date in it is the data's own (datePublished: the
newest data date of the files), so the same data gives the same bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

FILE_NAME = "croissant.json"
CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
LICENSE_URL = "https://www.apache.org/licenses/LICENSE-2.0"

# The JSON-LD context of a Croissant 1.1 document: the vocabulary's terms as the specification maps them.
CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "arrayShape": "cr:arrayShape",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "containedIn": "cr:containedIn",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isArray": "cr:isArray",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}

ENCODINGS = {".parquet": "application/x-parquet", ".csv": "text/csv", ".json": "application/json",
             ".md": "text/markdown"}

# DuckDB column types -> Croissant data types (schema.org's, and cr: sized integers where DuckDB's is)
_TYPES = {"VARCHAR": "sc:Text", "JSON": "sc:Text", "BOOLEAN": "sc:Boolean", "BIGINT": "cr:Int64",
          "INTEGER": "cr:Int32", "DOUBLE": "cr:Float64", "DATE": "sc:Date", "TIMESTAMP": "sc:DateTime"}


def data_type(duckdb_type: str) -> tuple[str, bool]:
    """(Croissant data type, is an array) of a DuckDB column type; KeyError for one the export
    does not write, so a new column type cannot slip out undescribed."""
    if duckdb_type.endswith("[]"):
        return _TYPES[duckdb_type[:-2]], True
    return _TYPES[duckdb_type], False


def _file_object(path: Path, description: str) -> dict[str, Any]:
    return {"@type": "cr:FileObject", "@id": path.name, "name": path.name, "description": description,
            "contentUrl": path.name, "contentSize": f"{path.stat().st_size} B",
            "encodingFormat": ENCODINGS[path.suffix], "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def describe(folder: Path, tables: dict[str, str], columns: list[tuple[str, str, str, str]],
             other_files: dict[str, str], meta: dict[str, Any]) -> dict[str, Any]:
    """The Croissant document of the export in `folder`. `tables`: table -> description (each has
    <table>.parquet and <table>.csv there); `columns`: (table, column, DuckDB type, meaning), the
    data dictionary's rows; `other_files`: file name -> description (card, manifest, changelog);
    `meta`: the dataset's own keys (name, description, license, creator, citeAs, version, ...)."""
    distribution = []
    for table, about in tables.items():
        distribution.append(_file_object(folder / f"{table}.parquet", f"{about} (Parquet: exact values)"))
        distribution.append(_file_object(folder / f"{table}.csv", f"{about} (CSV, with a header row)"))
    distribution += [_file_object(folder / name, about) for name, about in other_files.items()]
    record_sets = []
    for table, about in tables.items():
        fields = []
        for t, column, ctype, meaning in columns:
            if t != table:
                continue
            dtype, is_array = data_type(ctype)
            fields.append({"@type": "cr:Field", "@id": f"{table}/{column}", "name": column,
                           "description": meaning, "dataType": dtype}
                          | ({"isArray": True, "arrayShape": "-1"} if is_array else {})
                          | {"source": {"fileObject": {"@id": f"{table}.parquet"}, "extract": {"column": column}}})
        record_sets.append({"@type": "cr:RecordSet", "@id": table, "name": table, "description": about,
                            "field": fields})
    return {"@context": CONTEXT, "@type": "sc:Dataset", "conformsTo": CONFORMS_TO} | meta | {
        "distribution": distribution, "recordSet": record_sets}

"""The present-claim sections of the evidence file: the declared and shipped tables, where config
and weights disagree, the aggregate counts, and the adoption and layer charts.

Declared and shipped are *present* claims and never show a speed-up. Every row carries its
revision and crawl date (atlas.site.parts.evidence_format.Revisions); after a mirror crawl the mirror's
files' real origin (SOURCES.tsv) is listed under the declared table. Models this project made
itself are left out of every count and chart and shown in their own row group.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from atlas import AtlasError
from atlas.site.parts.charts import Bar, Stack, bar_chart, stacked_bar_chart
from atlas.site.parts.evidence_file import Facts
from atlas.site.parts.evidence_format import Revisions, capital, date_text, guardrail, indent, key_cell
from atlas.site.parts.mdsafe import Markdown, code, escape, table


# Repos created before the Hub recorded creation dates all carry this createdAt (Hub API docs).
HUB_PLACEHOLDER_CREATED = dt.datetime(2022, 3, 2, 23, 29, 4)


class MirrorSource(BaseModel):
    """One row of the mirror's SOURCES.tsv: where a bundled file was copied from."""

    repo_id: str
    file: str
    source_repo: str
    source_path: str
    source_commit: str
    notes: str = ""


def load_mirror_sources(path: Path | None) -> list[MirrorSource]:
    """SOURCES.tsv of the bundled mirror (tab-separated, header row); [] when there is none."""
    if path is None or not path.exists():
        return []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        try:
            return [MirrorSource.model_validate(row) for row in reader]
        except ValidationError as exc:
            raise AtlasError(f"{path}: a row does not have the SOURCES.tsv columns: {exc}") from None


def known_created(value: dt.datetime | None) -> bool:
    return value is not None and value != HUB_PLACEHOLDER_CREATED


OURS_NOTE = (
    "Made by this project (not Hub models): never counted in the totals, charts or exemplars above."
)


def declared(rows: list[dict[str, Any]], revs: Revisions, mirror: list[MirrorSource]) -> str:
    head = guardrail(
        "declared",
        "Declared: what the config says",
        "A key and its value in config.json at the revision shown. It says nothing about whether "
        "the weights ship, whether an engine serves them, or how fast anything runs.",
    )
    if not rows:
        return head + "\nNo model in this snapshot declares an MTP key.\n"

    def body(group: list[dict[str, Any]]) -> list[list[object]]:
        out = []
        for r in group:
            notes: list[str] = []
            if r["is_exemplar"]:
                notes.append("exemplar")
            if r["declared_num_mtp_layers"] == 0:
                notes.append("0 declares no MTP")
            if r["is_derivative"]:
                notes.append("derivative" + (f" of {escape(r['base_model'])}" if r["base_model"] else ""))
            out.append([
                escape(r["repo_id"]),
                r["declared_num_mtp_layers"],
                key_cell(r["declared_key"]),
                revs.cell(r["repo_id"], r["revision"]),
                revs.day(r["snapshot_date"]),
                Markdown("; ".join(notes)) if notes else Markdown(""),
            ])
        return out

    headers = ["model", "#MTP layers", "key", revs.header, revs.date_header, "note"]
    hub = [r for r in rows if not r["is_ours"]]
    ours = [r for r in rows if r["is_ours"]]
    text = head + "\n" + (table(headers, body(hub)) if hub else "No Hub model declares an MTP key.")
    if ours:
        text += "\n\n" + escape(OURS_NOTE) + "\n\n" + table(headers, body(ours))
    if mirror:
        text += "\n\n" + _mirror_sources([r["repo_id"] for r in rows], mirror)
    return text + "\n"


def _github_link(src: MirrorSource) -> Markdown:
    if not re.fullmatch(r"[0-9a-f]{40}", src.source_commit) or src.source_repo.count("/") != 1:
        # not copied from a public repository (e.g. made by this project)
        return Markdown(f"{escape(src.source_repo)}: {escape(src.source_path)}")
    href = (f"https://github.com/{quote(src.source_repo)}/blob/{src.source_commit}/"
            f"{quote(src.source_path)}")
    return Markdown(
        f'<a href="{escape(href)}">{escape(src.source_repo)}</a> @'
        f'<code class="atlas-rev">{src.source_commit[:12]}</code>: {key_cell(src.source_path)}'
    )


def _mirror_sources(repo_ids: list[str], mirror: list[MirrorSource]) -> str:
    wanted = set(repo_ids)
    rows = [[escape(s.repo_id), code(s.file), _github_link(s)]
            for s in mirror if s.repo_id in wanted
            and s.file in ("config.json", "model.safetensors.index.json", "model.safetensors")]
    if not rows:
        return ""
    return (
        '??? declared "Where the mirror\'s files come from (SOURCES.tsv)"\n'
        + indent(
            "This site was built from a crawl of the bundled offline mirror, so the revisions above "
            "are content hashes of the mirror's folders, not Hub commits. Each file was copied "
            "verbatim from the public repository and commit below.\n\n"
            + table(["model", "file", "copied from"], rows)
        )
    )


def aggregate(facts: Facts, snap: dict[str, Any] | None, revs: Revisions) -> str:
    if snap is None:
        return "No complete snapshot in the store yet: nothing to count.\n"
    by_value = ", ".join(
        f"{n} with {v}" for v, n in sorted(facts.n_layers.items()) if v > 0
    )
    line = (
        f"{capital(revs.stamp(facts))}: of {facts.n_models} "
        f"current Hub models, {facts.n_declaring} declare MTP (num_mtp_layers > 0)"
    )
    line += f": {by_value}." if by_value else "."
    if facts.n_declaring:
        line += (
            f" Of those, {facts.n_originals_declaring} are originals and "
            f"{facts.n_derivatives_declaring} derivatives (quantizations, fine-tunes, conversions)."
        )
    if facts.n_declaring_zero:
        line += f" {facts.n_declaring_zero} set the key to 0, which declares no MTP."
    line += (
        f" {facts.n_undeclared} have no MTP key (not declared, which is not the same as no MTP)."
    )
    if facts.n_not_fetched:
        line += f" {facts.n_not_fetched} could not be read (gated, missing or failed)."
    if facts.n_project_models:
        line += (f" Not counted: {facts.n_project_models} model(s) this project made itself "
                 f"(listed separately).")
    return escape(line) + "\n"


def shipped(rows: list[dict[str, Any]], facts: Facts, revs: Revisions) -> str:
    head = guardrail(
        "shipped",
        "Shipped: what the weight index holds",
        "MTP tensors counted from weight names at the revision shown. Weights present do not "
        "mean MTP is enabled when the model is served.",
    )
    known = escape(
        f"Weight names are known for {facts.n_shipped_known} of {facts.n_models} Hub models in "
        f"{revs.stamp(facts)}; elsewhere shipped is "
        f"unknown, not no."
    )
    if not rows:
        return head + "\n" + known + "\n\nNo model with known weight names declares or ships MTP.\n"

    def body(group: list[dict[str, Any]]) -> list[list[object]]:
        out = []
        for r in group:
            d, s = r["declared_num_mtp_layers"], r["shipped_mtp_layers"]
            if (d or 0) > 0 and s == 0:
                verdict = "declared, not shipped"
            elif (d or 0) == 0 and s > 0:
                verdict = "shipped, not declared"
            elif d != s:
                verdict = "counts differ"
            else:
                verdict = "agrees"
            out.append([
                escape(r["repo_id"]),
                d,
                s,
                key_cell(r["shipped_evidence"]),
                revs.cell(r["repo_id"], r["revision"]),
                revs.day(r["snapshot_date"]),
                verdict,
            ])
        return out

    headers = ["model", "#declared", "#shipped", "weight names", revs.header, revs.date_header,
               "config vs weights"]
    hub = [r for r in rows if not r["is_ours"]]
    ours = [r for r in rows if r["is_ours"]]
    text = head + "\n" + known + "\n\n"
    text += table(headers, body(hub)) if hub else "No Hub model with known weight names declares or ships MTP."
    if ours:
        text += "\n\n" + escape(OURS_NOTE) + "\n\n" + table(headers, body(ours))
    return text + "\n"


def mismatches(rows: list[dict[str, Any]], revs: Revisions) -> str:
    if not rows:
        return "No mismatch between declared and shipped among models with known weight names.\n"
    body = [
        [
            r["kind"],
            escape(r["repo_id"]),
            r["declared_num_mtp_layers"],
            key_cell(r["declared_key"]),
            r["shipped_mtp_layers"],
            key_cell(r["shipped_evidence"]),
            revs.cell(r["repo_id"], r["revision"]),
            revs.day(r["snapshot_date"]),
        ]
        for r in rows
    ]
    return table(
        ["mismatch", "model", "#declared", "key", "#shipped", "weight names", revs.header,
         revs.date_header],
        body,
    ) + "\n"


def adoption(rows: list[dict[str, Any]], created: list[dict[str, Any]]) -> str:
    """Adoption over time: creation months of the MTP-declaring Hub models of the latest snapshot
    (cumulative, by lab) when most of their creation dates are known, and per-snapshot counts when
    the store holds several snapshots. A chart placing a few of the models would read as "adoption
    is flat", so without either a sentence says why there is none."""
    if not rows:
        return "No complete snapshot yet: no adoption chart.\n"
    known = sum(1 for r in created if known_created(r["created_at"]))
    if created and known * 2 > len(created):
        parts = [_by_month(created)]
    else:
        parts = [escape(
            f"No chart by creation month: a creation date is known for only {known} of the "
            f"{len(created)} MTP-declaring Hub models of this snapshot, too few to show when MTP "
            f"spread (a chart of those alone would look like no adoption at all)."
        )]
    dates = [date_text(r["snapshot_date"]) for r in rows]
    if len(rows) > 1:
        bars = [
            Bar(
                label=d if dates.count(d) == 1 else f"{d} #{r['snapshot_id']}",
                value=100.0 * r["n_declaring"] / r["n_models"] if r["n_models"] else 0.0,
                annotation=f"{r['n_declaring']}/{r['n_models']}",
            )
            for d, r in zip(dates, rows)
        ]
        parts.append(bar_chart(
            "Hub models declaring MTP, per snapshot", bars, "% of models", y_max=100.0,
            note=f"Share of the crawled Hub models whose config declares num_mtp_layers > 0, in each "
                 f"of the {len(rows)} complete snapshots from {dates[0]} to {dates[-1]}. The watch "
                 f"list can change between snapshots, so read the share, not the count.",
        ))
    else:
        parts.append(escape(
            f"The store holds one complete snapshot ({dates[0]}), so there is no per-snapshot "
            f"trend yet; each further crawl adds a point."
        ))
    return "\n\n".join(parts) + "\n"


def _by_month(created: list[dict[str, Any]]) -> str:
    known = [r for r in created if known_created(r["created_at"])]
    unknown = len(created) - len(known)
    months = _month_range(min(r["created_at"] for r in known), max(r["created_at"] for r in known))
    labs = sorted({r["repo_id"].split("/", 1)[0] for r in known},
                  key=lambda lab: (min(r["created_at"] for r in known if r["repo_id"].startswith(lab + "/")), lab))
    stacks = []
    for lab in labs:
        running, values = 0, []
        for m in months:
            running += sum(1 for r in known if r["repo_id"].startswith(lab + "/")
                           and r["created_at"].strftime("%Y-%m") == m)
            values.append(float(running))
        stacks.append(Stack(name=lab, values=values))
    note = ("Cumulative count of the Hub models in this snapshot that declare MTP, by the month "
            "their repository was created on the Hub (listing field createdAt), coloured by lab "
            "(org). A repository created in a month may have declared MTP only later.")
    if unknown:
        note += f" {unknown} model(s) with an unknown creation date are not placed."
    chart = stacked_bar_chart("MTP-declaring Hub models by creation month, cumulative", months,
                              stacks, "models", note=note)
    running = 0
    rows = []
    for m in months:
        new = [r["repo_id"] for r in known if r["created_at"].strftime("%Y-%m") == m]
        running += len(new)
        if new:
            rows.append([m, len(new), running, Markdown(", ".join(escape(i) for i in new))])
    lab_rows = []
    for lab in labs:
        mine = [r for r in known if r["repo_id"].startswith(lab + "/")]
        lab_rows.append([escape(lab), len(mine), min(r["created_at"] for r in mine).strftime("%Y-%m"),
                         max(r["created_at"] for r in mine).strftime("%Y-%m")])
    tables = (
        table(["month created", "#new", "#cumulative", "models"], rows)
        + "\n\n"
        + table(["lab (org)", "#models", "first", "latest"], lab_rows)
    )
    return chart + "\n\n" + '??? declared "The table behind the chart"\n' + indent(tables)


def _month_range(start: dt.datetime, end: dt.datetime) -> list[str]:
    months, y, m = [], start.year, start.month
    while (y, m) <= (end.year, end.month):
        months.append(f"{y:04d}-{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return months


def layers_chart(layers: dict[int, int], facts: Facts, revs: Revisions) -> str:
    if not layers:
        return "No Hub model declares an MTP key in this snapshot: no distribution to chart.\n"
    bars = [Bar(label=f"{v} layer" + ("" if v == 1 else "s"), value=n) for v, n in layers.items()]
    chart = bar_chart(
        "Declared num_mtp_layers, current Hub models", bars, "models",
        note=f"{capital(revs.stamp(facts))}: the "
             f"{sum(layers.values())} Hub models that carry an MTP key, by declared value. Models "
             f"without the key, and models this project made, are not counted.",
    )
    return chart + "\n"

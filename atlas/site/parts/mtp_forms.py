"""The MTP form on the model pages and in the finder (issue 37): which form the repo ships MTP in,
the evidence (which key, which tensors), its links (a sidecar to its base and back, a conversion to
the base it was judged by) and the head's facts (own embedding or lm_head, GGUF layout, types,
size and share). Read from the store's mtp_fingerprints view (atlas.store.schema); present claims
only, never a measured figure."""

from __future__ import annotations

from typing import Any

import duckdb
from pydantic import BaseModel

from atlas.site.parts.mdsafe import Markdown, code, escape

FORM_WORDS = {
    "in_checkpoint": "in the checkpoint: the weights hold the MTP head",
    "in_repo_separate": "in the repo, as a separate file: the head ships as a file of its own beside trunk files "
                        "that lack it (load the two together)",
    "declared_missing": "declared but missing: the config declares MTP layers the weights lack (an engine that "
                        "loads it initialises the head at random)",
    "stripped": "stripped by a conversion: this copy lacks the head its base declares or ships",
    "mtp_sidecar": "MTP-only sidecar: a repo with only the head, for a base in another repo",
    "separate_drafter": "speculative drafter, not MTP: a model of its own that drafts for a target model",
    "block_drafter": "block drafter in the checkpoint (not MTP)",
    "declared_unread": "declared; no weight names read to check it against",
    "none": "none: no MTP key declared and no MTP tensor found",
}


class MTPForm(BaseModel):
    form: str
    evidence: str | None
    base: str | None = None  # the base a conversion was judged by (stripped / declared_missing by its base)
    sidecar_base: str | None = None
    sidecar_base_evidence: str | None = None  # 'base_model' or 'name'
    sidecar_base_slug: str | None = None
    sidecars: list[tuple[str, str | None]] = []  # sidecar repos published for this model, with their pages
    gguf_layout: str | None = None
    gguf_architecture: str | None = None
    gguf_nextn_predict_layers: int | None = None
    gguf_head_types: str | None = None
    own_embedding: str | None = None
    own_lm_head: str | None = None
    head_params: int | None = None
    head_bytes: int | None = None
    head_share: float | None = None
    mtp_dtype: str | None = None
    head_dtypes: str | None = None  # per safetensors shard read
    dspark_block_size: int | None = None
    sidecar_block_size: int | None = None
    pairs_with: str | None = None  # the trunk files a separate head file pairs with
    sidecar_base_problem: str | None = None  # why a sidecar's claimed base is no base (it may not exist)
    sidecar_base_revision: str | None = None  # the base commit the sidecar says it matches

    @property
    def noteworthy(self) -> bool:
        """A form that earns the repo a page of its own even without a declared or shipped count."""
        return self.form not in ("none", "declared_unread")


_FORMS = """
    SELECT repo_id, mtp_form, mtp_form_evidence, sidecar_base, sidecar_base_evidence, mtp_sidecars_published,
        gguf_layout, gguf_architecture, gguf_nextn_predict_layers, gguf_head_types, mtp_own_embedding,
        mtp_own_lm_head, mtp_head_params, mtp_head_bytes, mtp_head_share, mtp_dtype, dspark_block_size,
        sidecar_block_size, f.mtp_form_base, mtp_head_dtypes, mtp_pairs_with, sidecar_base_problem, sidecar_base_revision
    FROM mtp_fingerprints_history h
    LEFT JOIN (SELECT snapshot_id AS s, repo_id AS r, mtp_form_base FROM mtp_forms) f ON f.s = h.snapshot_id AND f.r = h.repo_id
    WHERE h.snapshot_id = $latest AND h.mtp_form IS NOT NULL"""


def read_forms(con: duckdb.DuckDBPyConnection, latest: int | None) -> dict[str, MTPForm]:
    """The latest snapshot's forms by repo; none for a store whose views predate them (opened
    read-only, it keeps the views it was written with)."""
    if latest is None:
        return {}
    has = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'mtp_fingerprints_history' "
                      "AND column_name = 'mtp_form'").fetchone()
    if not has or not has[0]:
        return {}
    cur = con.execute(_FORMS, {"latest": latest})
    cols = [d[0] for d in cur.description]
    out: dict[str, MTPForm] = {}
    for row in cur.fetchall():
        r = dict(zip(cols, row))
        out[r["repo_id"]] = MTPForm(
            form=r["mtp_form"], evidence=r["mtp_form_evidence"], base=r["mtp_form_base"], sidecar_base=r["sidecar_base"],
            sidecar_base_evidence=r["sidecar_base_evidence"],
            sidecars=[(s, None) for s in (r["mtp_sidecars_published"] or "").split(",") if s],
            gguf_layout=r["gguf_layout"], gguf_architecture=r["gguf_architecture"],
            gguf_nextn_predict_layers=r["gguf_nextn_predict_layers"], gguf_head_types=r["gguf_head_types"],
            own_embedding=r["mtp_own_embedding"], own_lm_head=r["mtp_own_lm_head"], head_params=r["mtp_head_params"],
            head_bytes=r["mtp_head_bytes"], head_share=r["mtp_head_share"], mtp_dtype=r["mtp_dtype"],
            dspark_block_size=r["dspark_block_size"], sidecar_block_size=r["sidecar_block_size"],
            head_dtypes=r["mtp_head_dtypes"], pairs_with=r["mtp_pairs_with"], sidecar_base_problem=r["sidecar_base_problem"],
            sidecar_base_revision=r["sidecar_base_revision"])
    return out


def linked(form: MTPForm | None, page_slugs: dict[str, str], in_snapshot: dict[str, str]) -> MTPForm | None:
    """The form with its links resolved to the pages of repos in the snapshot."""
    if form is None:
        return None
    base = in_snapshot.get((form.sidecar_base or "").lower())
    return form.model_copy(update={
        "sidecar_base_slug": page_slugs.get(base) if base else None,
        "sidecars": [(s, page_slugs.get(in_snapshot.get(s.lower(), ""))) for s, _ in form.sidecars],
    })


def _link(text: str, slug: str | None) -> Markdown:
    return Markdown(f"[{escape(text)}]({slug}.md)") if slug else escape(text)


def _md(*parts: Markdown) -> Markdown:
    """Safe pieces joined (a str + str is a plain str, which escape() would escape again)."""
    return Markdown("".join(parts))


def form_words(f: MTPForm) -> Markdown:
    """The form in words with its evidence and links, for the model page's claims table."""
    out = [escape(FORM_WORDS.get(f.form, f.form)), Markdown(" ("), code(f.form), Markdown(")")]
    if f.evidence:
        out += [Markdown("; evidence: "), code(f.evidence)]
    if f.form == "mtp_sidecar" and f.sidecar_base:
        how = {"base_model": "its card's base_model", "name": "its repo name without -MTP"}
        how = {"base_model": "its card's base_model", "name": "its repo name without -MTP",
               "gguf": "its GGUF header's general.base_model"}
        out += [Markdown("; base: "), _link(f.sidecar_base, f.sidecar_base_slug),
                escape(f" (from {how.get(f.sidecar_base_evidence or '', '')})")]
        if f.sidecar_base_revision:
            out += [Markdown("; matches the base at "), code(f.sidecar_base_revision)]
    elif f.form == "mtp_sidecar":
        out.append(escape("; base unknown: " + (f.sidecar_base_problem or "its card names no single base_model")))
    if f.pairs_with:
        out += [Markdown("; pairs with "), code(f.pairs_with)]
    if f.sidecars:
        out += [Markdown("; MTP-only sidecar published: "), Markdown(", ".join(_link(s, slug) for s, slug in f.sidecars))]
    if f.sidecar_block_size is not None:
        out.append(escape(f"; block_size {f.sidecar_block_size}"))
    if f.dspark_block_size is not None:
        out.append(escape(f"; dspark_block_size {f.dspark_block_size} (draft with k equal to it)"))
    return _md(*out)


def head_words(f: MTPForm) -> Markdown | None:
    """The head's facts in words; None when nothing about the head was read."""
    parts: list[Markdown] = []
    for what, value in (("embedding", f.own_embedding), ("lm_head", f.own_lm_head)):
        if value is not None:
            parts.append(escape(f"its own {what}" if value == "yes" else f"uses the trunk's {what}"))
    if f.own_lm_head == "yes":
        parts.append(escape("serve it with its own lm_head, not the trunk's (the head-engines table has why)"))
    if f.head_params is not None:
        size = f"{f.head_params:,} parameters" + (f", {f.head_bytes:,} bytes" if f.head_bytes is not None else "")
        parts.append(escape(size + (f", {f.head_share:.2%} of the checkpoint" if f.head_share is not None else "")))
    if f.gguf_layout:
        parts.append(_md(Markdown("GGUF: "), escape(f.gguf_layout),
                         _md(Markdown(", head types "), code(f.gguf_head_types)) if f.gguf_head_types else Markdown("")))
    if f.head_dtypes:
        parts.append(_md(Markdown("safetensors head tensors "), code(f.head_dtypes)))
    if f.mtp_dtype:
        parts.append(_md(Markdown("safetensors dtype "), escape(f.mtp_dtype)))
    return Markdown("; ".join(parts)) if parts else None


def page_rows(f: MTPForm | None, provenance: Any) -> list[list[Any]]:
    """Claims-table rows: the form, and the head's facts when read."""
    if f is None:
        return []
    rows: list[list[Any]] = [["MTP form", form_words(f), provenance]]
    head = head_words(f)
    if head is not None:
        rows.append(["MTP head", head, provenance])
    return rows


# The finder's words for each form: short, and broken at spaces (an underscored key is one word
# that widened the finder past the content column); the model's page gives FORM_WORDS and the key.
FINDER_WORDS = {"in_checkpoint": "in checkpoint", "in_repo_separate": "in repo, separate file", "declared_missing": "declared, missing", "stripped": "stripped",
                "mtp_sidecar": "MTP sidecar", "separate_drafter": "drafter (not MTP)", "block_drafter": "block drafter",
                "declared_unread": "declared, unread", "none": "none"}


def finder_cell(f: MTPForm | None) -> str:
    """The finder's MTP-form cell: the form in short words, with the GGUF layout where one was read."""
    if f is None:
        return "—"
    return FINDER_WORDS.get(f.form, f.form) + (f" (GGUF {f.gguf_layout})" if f.gguf_layout else "")

"""Bases named outside the snapshot, asked of the hub on demand (issue 63).

A lookup settled by a crawl of the last REUSE_DAYS days is reused, not asked again.

A conversion is judged by the base it names, a sidecar and a drafter are linked to theirs; when
that base is not in the snapshot (another org, under the listing's minimum), it is looked up here
through the same client, pacing, bounds and error classes as every other request: its repo info
(does it exist at all, at which commit), then its config and weight index at that commit, each
bounded like a repo's own and cached by commit. The result is the base's MTP form by the same
rules, or why there is none (missing, gated, an error); one base's failure is that base's row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from atlas import AtlasError
from atlas.fingerprints.rules import MAX_CONFIG_BYTES, MAX_INDEX_BYTES, fingerprint, parse_config_bytes, parse_weight_index
from atlas.hub.context import Context, call
from atlas.hub.errors import ErrorKind, RepoProblem
from atlas.hub.fetch import REPO_ID, SHA, WEIGHT_INDEX, Listed, download
from atlas.store.db import BaseLookup

MAX_LOOKUPS = 32  # bases looked up per crawl: each costs up to three requests
# a settled lookup (the base exists or not, its form) is reused by the crawls of this many days after
# it: an unchanged scope then costs no request, and a base that appears or changes is seen within a week
REUSE_DAYS = 7
# the fingerprints that say whether a repo needs its base judged, and which base it names
NEEDED = ("mtp_form", "mtp_conversion", "quant_method", "gguf_base_model", "drafter_target_config")
LINKED_FORMS = ("mtp_sidecar", "separate_drafter")  # a base or target checked to exist
ABSENT_FORMS = ("none", "declared_missing", "stripped")  # a conversion's form decided by its base


def claimed_base(listed: Listed, fp: Mapping[str, str]) -> str | None:
    """The base a repo names: its card's one base_model, else its GGUF header's, else its config's
    drafter target."""
    bases = listed.row.base_models
    return bases[0] if len(bases) == 1 else fp.get("gguf_base_model") or fp.get("drafter_target_config")


def wanted(repos: Sequence[tuple[Listed, Mapping[str, str]]]) -> list[str]:
    """The bases to look up: named by a sidecar or drafter, or by a conversion without MTP tensors
    of its own, and not in the snapshot; at most MAX_LOOKUPS, in name order."""
    present = {listed.repo_id.lower() for listed, _ in repos}
    out: set[str] = set()
    for listed, fp in repos:
        form = fp.get("mtp_form")
        row = listed.row
        conversion = ("mtp_conversion" in fp or "quant_method" in fp or row.base_relation == "quantized"
                      or (row.library_name or "").lower() in ("gguf", "mlx"))
        if form not in LINKED_FORMS and not (form in ABSENT_FORMS and conversion):
            continue
        base = claimed_base(listed, fp)
        if base and REPO_ID.fullmatch(base) and base.lower() not in present and base.lower() != listed.repo_id.lower():
            out.add(base)
    return sorted(out)[:MAX_LOOKUPS]


def look_up(ctx: Context, repo_id: str) -> BaseLookup:
    """One base: exists or not, and its MTP form from its config and weight index."""
    try:
        info = call(ctx, lambda: ctx.api.model_info(repo_id, expand=["sha", "siblings", "gated"]))
    except RepoProblem as exc:
        status = "missing" if exc.kind is ErrorKind.MISSING else "gated" if exc.kind is ErrorKind.GATED else "error"
        return BaseLookup(repo_id, None, status, str(exc), None, None)
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not SHA.fullmatch(sha):
        return BaseLookup(repo_id, None, "error", f"the hub gave no commit sha for it (got {sha!r:.60})", None, None)
    siblings = {s.rfilename for s in getattr(info, "siblings", None) or [] if isinstance(getattr(s, "rfilename", None), str)}
    if "config.json" not in siblings:
        return BaseLookup(repo_id, sha, "ok", None, None, "no config.json to read")
    try:
        config = parse_config_bytes(download(ctx, repo_id, sha, "config.json", MAX_CONFIG_BYTES))
    except RepoProblem as exc:
        return BaseLookup(repo_id, sha, "gated" if exc.kind is ErrorKind.GATED else "error", str(exc), None, None)
    except AtlasError as exc:
        return BaseLookup(repo_id, sha, "error", str(exc), None, None)
    names, note = None, None
    if WEIGHT_INDEX in siblings:
        try:
            names = parse_weight_index(download(ctx, repo_id, sha, WEIGHT_INDEX, MAX_INDEX_BYTES))
        except (RepoProblem, AtlasError) as exc:  # the config alone still says what it declares
            note = f"{WEIGHT_INDEX}: {exc}"
    rows = {name: (value, path) for name, value, path in fingerprint(config, names, "index").rows()}
    form, evidence = rows.get("mtp_form", (None, None))
    return BaseLookup(repo_id, sha, "ok", note, form, evidence)

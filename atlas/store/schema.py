"""The store's tables and views (DuckDB DDL), run on every writable connect (atlas.store.db.connect):
the tables are created once, the views replaced so that they follow the current rules. Columns
added to a view are appended, so readers of the earlier columns keep their positions."""

from atlas.fingerprints.rules import DRAFTER_RULES

# A Hub repo id as huggingface_hub's validate_repo_id reads one: an optional namespace and a name,
# each word characters, '-' and '.', starting and ending on a word character (ASCII here); the view
# adds its other rules (at most 96 characters, no '--' or '..', no '.git' ending). No quote in it.
_PART = "[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
HUB_REPO_ID = f"(?:{_PART}/)?{_PART}"

SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_id INTEGER, started_at TIMESTAMP, finished_at TIMESTAMP, endpoint VARCHAR,
    watchlist_digest VARCHAR, status VARCHAR,
    n_listed INTEGER, n_fetched INTEGER, n_unchanged INTEGER, n_gated INTEGER, n_missing INTEGER,
    n_failed INTEGER, rule_version VARCHAR, n_requests INTEGER, n_rate_limited INTEGER,
    problems VARCHAR
);
CREATE TABLE IF NOT EXISTS hub_models (
    snapshot_id INTEGER, repo_id VARCHAR, sha VARCHAR, last_modified TIMESTAMP,
    created_at TIMESTAMP, downloads BIGINT, likes BIGINT, gated VARCHAR, private BOOLEAN,
    pipeline_tag VARCHAR, library_name VARCHAR, tags VARCHAR[], base_models VARCHAR[],
    base_relation VARCHAR, is_derivative BOOLEAN, is_exemplar BOOLEAN, param_total BIGINT,
    fetch_status VARCHAR, error VARCHAR
);
CREATE TABLE IF NOT EXISTS raw_files (
    repo_id VARCHAR, sha VARCHAR, filename VARCHAR, content VARCHAR, fetched_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS weight_names (
    repo_id VARCHAR, sha VARCHAR, source VARCHAR, names VARCHAR[]
);
CREATE TABLE IF NOT EXISTS file_errors (
    repo_id VARCHAR, sha VARCHAR, filename VARCHAR, error VARCHAR
);
CREATE TABLE IF NOT EXISTS fingerprints (
    repo_id VARCHAR, sha VARCHAR, rule_version VARCHAR, name VARCHAR, value VARCHAR, path VARCHAR
);
-- side files (weight index, safetensors header, hf_quant_config.json) that could not be read in
-- that snapshot; `error` stays about the config. Added after the first stores were written.
ALTER TABLE hub_models ADD COLUMN IF NOT EXISTS side_file_error VARCHAR;
-- listing coverage: models seen on the listing pages fetched, and per org (JSON) seen vs kept
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS n_seen INTEGER;
ALTER TABLE snapshots ADD COLUMN IF NOT EXISTS coverage VARCHAR;

-- TRY_CAST: a stored value that is not a number of the column's type reads as NULL, so one repo's
-- junk can never fail a query over the whole store.
CREATE OR REPLACE VIEW fingerprints_wide AS
SELECT repo_id, sha, any_value(rule_version) AS rule_version,
    TRY_CAST(max(value) FILTER (WHERE name = 'declared_num_mtp_layers') AS INTEGER) AS declared_num_mtp_layers,
    max(path) FILTER (WHERE name = 'declared_num_mtp_layers') AS declared_key,
    TRY_CAST(max(value) FILTER (WHERE name = 'shipped_mtp_layers') AS INTEGER) AS shipped_mtp_layers,
    max(path) FILTER (WHERE name = 'shipped_mtp_layers') AS shipped_evidence,
    max(value) FILTER (WHERE name = 'shipped_family') AS shipped_family,
    max(path) FILTER (WHERE name = 'shipped_family') AS weight_source,
    max(value) FILTER (WHERE name = 'model_type') AS model_type,
    max(value) FILTER (WHERE name = 'architectures') AS architectures,
    TRY_CAST(max(value) FILTER (WHERE name = 'num_hidden_layers') AS INTEGER) AS num_hidden_layers,
    TRY_CAST(max(value) FILTER (WHERE name = 'hidden_size') AS BIGINT) AS hidden_size,
    TRY_CAST(max(value) FILTER (WHERE name = 'vocab_size') AS BIGINT) AS vocab_size,
    max(value) FILTER (WHERE name = 'torch_dtype') AS torch_dtype,
    max(value) FILTER (WHERE name = 'quant_method') AS quant_method,
    TRY_CAST(max(value) FILTER (WHERE name = 'num_experts') AS INTEGER) AS num_experts,
    max(value) FILTER (WHERE name = 'warnings') AS warnings,
    -- the MTP layer's precision (atlas.fingerprints.precision); NULL in fingerprints from before the rule
    -- (atlas crawl --refingerprint adds it without the network). Appended: the view is replaced on
    -- every writable connect, and readers of the columns above keep their positions.
    max(value) FILTER (WHERE name = 'mtp_quantized') AS mtp_quantized,
    max(path) FILTER (WHERE name = 'mtp_quantized') AS mtp_quantized_evidence,
    max(value) FILTER (WHERE name = 'mtp_dtype') AS mtp_dtype,
    -- the repo's own MTP form (atlas.fingerprints.form) and what it read; appended likewise
    max(value) FILTER (WHERE name = 'mtp_form') AS own_mtp_form,
    max(path) FILTER (WHERE name = 'mtp_form') AS own_mtp_form_evidence,
    max(path) FILTER (WHERE name = 'mtp_conversion') AS mtp_conversion,
    max(value) FILTER (WHERE name = 'gguf_layout') AS gguf_layout,
    max(path) FILTER (WHERE name = 'gguf_layout') AS gguf_layout_evidence,
    max(value) FILTER (WHERE name = 'gguf_architecture') AS gguf_architecture,
    TRY_CAST(max(value) FILTER (WHERE name = 'gguf_nextn_predict_layers') AS INTEGER) AS gguf_nextn_predict_layers,
    max(path) FILTER (WHERE name = 'gguf_nextn_predict_layers') AS gguf_nextn_key,
    max(value) FILTER (WHERE name = 'gguf_head_types') AS gguf_head_types,
    max(path) FILTER (WHERE name = 'gguf_head_types') AS gguf_head_tensors,
    max(value) FILTER (WHERE name = 'mtp_own_embedding') AS mtp_own_embedding,
    max(path) FILTER (WHERE name = 'mtp_own_embedding') AS mtp_own_embedding_evidence,
    max(value) FILTER (WHERE name = 'mtp_own_lm_head') AS mtp_own_lm_head,
    max(path) FILTER (WHERE name = 'mtp_own_lm_head') AS mtp_own_lm_head_evidence,
    TRY_CAST(max(value) FILTER (WHERE name = 'mtp_head_params') AS BIGINT) AS mtp_head_params,
    TRY_CAST(max(value) FILTER (WHERE name = 'mtp_head_bytes') AS BIGINT) AS mtp_head_bytes,
    TRY_CAST(max(value) FILTER (WHERE name = 'mtp_head_share') AS DOUBLE) AS mtp_head_share,
    max(path) FILTER (WHERE name = 'mtp_head_params') AS mtp_head_evidence,
    TRY_CAST(max(value) FILTER (WHERE name = 'block_size') AS INTEGER) AS sidecar_block_size,
    TRY_CAST(max(value) FILTER (WHERE name = 'dspark_block_size') AS INTEGER) AS dspark_block_size,
    max(value) FILTER (WHERE name = 'dspark_target_layer_ids') AS dspark_target_layer_ids,
    max(value) FILTER (WHERE name = 'mtp_head_dtypes') AS mtp_head_dtypes
FROM fingerprints GROUP BY repo_id, sha;

-- Each repo's MTP form in each snapshot: its own (atlas.fingerprints.form), with the rules that need
-- the Hub's metadata or the base's form: a conversion (GGUF, MLX, a quantization config, a card
-- that says `quantized`, or a Hub library_name / tag gguf or mlx) holding no MTP tensor of a base
-- that ships or declares them is `stripped`; a repo whose own rule says declared_missing and that
-- the Hub lists as a GGUF or MLX conversion is `stripped` too; and a conversion of a base whose heads
-- are missing is `declared_missing` like its base. The base is the card's base_model when it names
-- exactly one repo of the same snapshot.
CREATE OR REPLACE VIEW mtp_forms AS
WITH own AS (
    SELECT h.snapshot_id, h.repo_id, h.base_models, h.base_relation, f.own_mtp_form, f.own_mtp_form_evidence,
        f.mtp_conversion, CASE WHEN lower(h.library_name) IN ('gguf', 'mlx') THEN 'library_name ' || lower(h.library_name)
            WHEN list_contains(h.tags, 'gguf') THEN 'tag gguf' WHEN list_contains(h.tags, 'mlx') THEN 'tag mlx'
        END AS hub_conversion
    FROM hub_models h LEFT JOIN fingerprints_wide f ON f.repo_id = h.repo_id AND f.sha = h.sha
), based AS (
    SELECT o.*, b.repo_id AS base_repo, b.own_mtp_form AS base_form
    FROM own o LEFT JOIN own b ON b.snapshot_id = o.snapshot_id AND len(o.base_models) = 1
        AND lower(b.repo_id) = lower(o.base_models[1]) AND b.repo_id <> o.repo_id
), ruled AS (
    SELECT *,
        own_mtp_form IN ('none', 'declared_missing')
            AND (mtp_conversion IS NOT NULL OR hub_conversion IS NOT NULL OR base_relation = 'quantized')
            AND base_form IN ('in_checkpoint', 'declared_unread') AS to_stripped,
        own_mtp_form = 'declared_missing' AND hub_conversion IS NOT NULL AS to_stripped_by_hub,
        own_mtp_form = 'stripped' AND base_form = 'declared_missing' AS to_missing
    FROM based
)
SELECT snapshot_id, repo_id,
    CASE WHEN to_stripped OR to_stripped_by_hub THEN 'stripped' WHEN to_missing THEN 'declared_missing'
        ELSE own_mtp_form END AS mtp_form,
    CASE WHEN to_stripped THEN 'base ' || base_repo || ' is ' || base_form || '; this conversion ('
            || coalesce(mtp_conversion, 'Hub ' || hub_conversion, 'card: quantized') || '): ' || own_mtp_form_evidence
         WHEN to_stripped_by_hub THEN own_mtp_form_evidence || '; a conversion: the Hub lists it with ' || hub_conversion
         WHEN to_missing THEN 'base ' || base_repo || ' declares heads its weights lack too; ' || own_mtp_form_evidence
         ELSE own_mtp_form_evidence END AS mtp_form_evidence,
    own_mtp_form, CASE WHEN to_stripped OR to_missing THEN base_repo END AS mtp_form_base
FROM ruled;

-- MTP-only sidecar repos and, per snapshot, the base each is for: the card's base_model when it
-- names exactly one model ('base_model'), else a repo of the same snapshot whose id is the
-- sidecar's without `-MTP` (`org/X-MTP` -> `org/X`, `org/X-MTP-GGUF` -> `org/X-GGUF`; 'name'). A claimed
-- base is judged as a drafter's target is (mtp_drafter_links): not a Hub repo id, the sidecar
-- itself, or another sidecar is no base, and base_problem says which.
CREATE OR REPLACE VIEW mtp_sidecar_links AS
WITH sidecars AS (
    SELECT h.snapshot_id, h.repo_id, h.base_models
    FROM hub_models h JOIN fingerprints f ON f.repo_id = h.repo_id AND f.sha = h.sha
        AND f.name = 'mtp_form' AND f.value = 'mtp_sidecar'
), by_name AS (
    SELECT s.snapshot_id, s.repo_id, min(n.repo_id) AS base
    FROM sidecars s JOIN hub_models n ON n.snapshot_id = s.snapshot_id AND n.repo_id <> s.repo_id
        AND (lower(s.repo_id) = lower(n.repo_id) || '-mtp'
             OR (lower(n.repo_id) LIKE '%-gguf' AND lower(s.repo_id) = left(lower(n.repo_id), -5) || '-mtp-gguf'))
    GROUP BY s.snapshot_id, s.repo_id
), claimed AS (
    SELECT s.snapshot_id, s.repo_id,
        CASE WHEN len(s.base_models) = 1 THEN s.base_models[1] ELSE b.base END AS claim,
        CASE WHEN len(s.base_models) = 1 THEN 'base_model' WHEN b.base IS NOT NULL THEN 'name' END AS evidence,
        CASE WHEN len(s.base_models) = 1 THEN 'its card''s base_model' ELSE 'its repo name' END AS source
    FROM sidecars s LEFT JOIN by_name b ON b.snapshot_id = s.snapshot_id AND b.repo_id = s.repo_id
), judged AS (
    SELECT c.*, CASE
        WHEN c.claim IS NULL THEN 'its card names no single base_model and no repo of this snapshot has its name without -MTP'
        WHEN NOT regexp_full_match(c.claim, '{hub_repo_id}') OR length(c.claim) > 96
                OR contains(c.claim, '--') OR contains(c.claim, '..') OR lower(c.claim) LIKE '%.git' THEN
            c.source || ' is not a Hub repo id'
        WHEN lower(c.claim) = lower(c.repo_id) THEN c.source || ' names the sidecar itself'
        WHEN o.repo_id IS NOT NULL THEN c.source || ' names ' || o.repo_id || ', itself an MTP-only sidecar'
        END AS problem
    FROM claimed c LEFT JOIN claimed o ON o.snapshot_id = c.snapshot_id AND lower(o.repo_id) = lower(c.claim)
)
SELECT snapshot_id, repo_id AS sidecar, CASE WHEN problem IS NULL THEN claim END AS base,
    CASE WHEN problem IS NULL THEN evidence END AS base_evidence, problem AS base_problem
FROM judged;

-- MTP drafters that ship as repos of their own (fingerprint `mtp_drafter`, atlas.fingerprints.rules
-- DRAFTER_RULES) and, per snapshot, the target each is for, with the evidence: the card's
-- base_model when it names exactly one model ('base_model'), else a repo of the same snapshot whose
-- name is the drafter's with the rule's suffix stripped ('name'), else NULL (target unknown). The
-- config never names its target, so nothing else is taken for one. A claimed target is kept only
-- when it is a Hub repo id (huggingface_hub's validate_repo_id rules), not the drafter itself and
-- not another drafter of the snapshot (which refuses cycles and drafter-of-drafter chains alike);
-- otherwise target is NULL and target_problem says why (also why a drafter has no claim at all).
CREATE OR REPLACE VIEW mtp_drafter_links AS
WITH drafters AS (
    SELECT h.snapshot_id, h.repo_id, h.base_models, f.value AS kind, f.path AS kind_key
    FROM hub_models h JOIN fingerprints f ON f.repo_id = h.repo_id AND f.sha = h.sha AND f.name = 'mtp_drafter'
), by_name AS (
    SELECT d.snapshot_id, d.repo_id, min(n.repo_id) AS target
    FROM drafters d
    JOIN (VALUES {drafter_suffixes}) s(kind, suffix) ON s.kind = d.kind
    JOIN hub_models n ON n.snapshot_id = d.snapshot_id AND lower(d.repo_id) = lower(n.repo_id) || s.suffix
    GROUP BY d.snapshot_id, d.repo_id
), claimed AS (
    SELECT d.snapshot_id, d.repo_id, d.kind, d.kind_key,
        CASE WHEN len(d.base_models) = 1 THEN d.base_models[1] ELSE b.target END AS claim,
        CASE WHEN len(d.base_models) = 1 THEN 'base_model' WHEN b.target IS NOT NULL THEN 'name' END AS evidence,
        CASE WHEN len(d.base_models) = 1 THEN 'its card''s base_model' ELSE 'its repo name' END AS source
    FROM drafters d LEFT JOIN by_name b ON b.snapshot_id = d.snapshot_id AND b.repo_id = d.repo_id
), judged AS (
    SELECT c.*, CASE
        WHEN c.claim IS NULL THEN
            'its card names no single base_model and no repo of this snapshot has its name without the drafter suffix'
        WHEN NOT regexp_full_match(c.claim, '{hub_repo_id}') OR length(c.claim) > 96
                OR contains(c.claim, '--') OR contains(c.claim, '..') OR lower(c.claim) LIKE '%.git' THEN
            c.source || ' is not a Hub repo id'
        WHEN lower(c.claim) = lower(c.repo_id) THEN c.source || ' names the drafter itself'
        WHEN lower(o.claim) = lower(c.repo_id) THEN
            c.source || ' names ' || o.repo_id || ', a drafter whose own target is this one (a cycle)'
        WHEN o.repo_id IS NOT NULL THEN
            c.source || ' names ' || o.repo_id || ', itself a drafter (a drafter drafts for a model, not for a drafter)'
        END AS problem
    FROM claimed c LEFT JOIN claimed o ON o.snapshot_id = c.snapshot_id AND lower(o.repo_id) = lower(c.claim)
)
SELECT snapshot_id, repo_id AS drafter, kind AS drafter_kind, kind_key AS drafter_kind_key,
    CASE WHEN problem IS NULL THEN claim END AS target,
    CASE WHEN problem IS NULL THEN evidence END AS target_evidence,
    problem AS target_problem
FROM judged;

CREATE OR REPLACE VIEW mtp_fingerprints_history AS
SELECT h.repo_id, h.sha AS revision, s.snapshot_id, s.finished_at AS snapshot_date,
    f.model_type, f.architectures, f.declared_num_mtp_layers, f.declared_key,
    f.shipped_mtp_layers, f.shipped_evidence, h.is_exemplar, h.is_derivative,
    nullif(array_to_string(h.base_models, ','), '') AS base_model, h.fetch_status,
    coalesce(h.error, f.warnings) AS error, h.downloads, h.likes, h.last_modified,
    f.rule_version, h.base_relation, h.pipeline_tag, f.shipped_family, f.weight_source,
    h.side_file_error,
    -- appended, like the precision columns: the drafter side and the target side of a drafter
    -- link, each its own claim; the declared counts above stay each repo's own
    l.drafter_kind AS mtp_drafter, l.target AS drafter_target, l.target_evidence AS drafter_target_evidence,
    p.drafters AS mtp_drafters_published,
    l.target_problem AS drafter_target_problem,
    -- appended: the MTP form (mtp_forms), a sidecar's base and a base's sidecars, GGUF and head facts
    m.mtp_form, m.mtp_form_evidence, sl.base AS sidecar_base, sl.base_evidence AS sidecar_base_evidence,
    sp.sidecars AS mtp_sidecars_published, f.gguf_layout, f.gguf_architecture, f.gguf_nextn_predict_layers,
    f.gguf_head_types, f.mtp_own_embedding, f.mtp_own_lm_head, f.mtp_head_params, f.mtp_head_bytes, f.mtp_head_share,
    f.mtp_dtype, f.dspark_block_size, f.sidecar_block_size, f.mtp_head_dtypes, sl.base_problem AS sidecar_base_problem
FROM hub_models h
JOIN snapshots s ON s.snapshot_id = h.snapshot_id AND s.status = 'complete'
LEFT JOIN fingerprints_wide f ON f.repo_id = h.repo_id AND f.sha = h.sha
LEFT JOIN mtp_drafter_links l ON l.snapshot_id = h.snapshot_id AND l.drafter = h.repo_id
LEFT JOIN mtp_forms m ON m.snapshot_id = h.snapshot_id AND m.repo_id = h.repo_id
LEFT JOIN mtp_sidecar_links sl ON sl.snapshot_id = h.snapshot_id AND sl.sidecar = h.repo_id
LEFT JOIN (
    SELECT snapshot_id, lower(base) AS base, string_agg(sidecar, ',' ORDER BY sidecar) AS sidecars
    FROM mtp_sidecar_links WHERE base IS NOT NULL GROUP BY snapshot_id, lower(base)
) sp ON sp.snapshot_id = h.snapshot_id AND sp.base = lower(h.repo_id)
LEFT JOIN (
    SELECT snapshot_id, lower(target) AS target, string_agg(drafter, ',' ORDER BY drafter) AS drafters
    FROM mtp_drafter_links WHERE target IS NOT NULL GROUP BY snapshot_id, lower(target)
) p ON p.snapshot_id = h.snapshot_id AND p.target = lower(h.repo_id);

CREATE OR REPLACE VIEW mtp_fingerprints AS
SELECT * FROM mtp_fingerprints_history
WHERE snapshot_id = (SELECT max(snapshot_id) FROM snapshots WHERE status = 'complete');

CREATE OR REPLACE VIEW model_facts AS
SELECT h.repo_id, h.sha AS revision, s.snapshot_id, s.finished_at AS snapshot_date,
    f.model_type, f.architectures, f.num_hidden_layers, f.hidden_size, f.vocab_size,
    f.torch_dtype, f.quant_method, f.num_experts
FROM hub_models h
JOIN snapshots s ON s.snapshot_id = h.snapshot_id
LEFT JOIN fingerprints_wide f ON f.repo_id = h.repo_id AND f.sha = h.sha
WHERE s.snapshot_id = (SELECT max(snapshot_id) FROM snapshots WHERE status = 'complete');
""".replace(
    # the rules' own constants (identifier-like, no quote), not data from a hub
    "{drafter_suffixes}", ", ".join(f"('{r.kind}', '{r.name_suffix}')" for r in DRAFTER_RULES)).replace(
    "{hub_repo_id}", HUB_REPO_ID)

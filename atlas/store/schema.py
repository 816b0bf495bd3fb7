"""The store's tables and views (DuckDB DDL), run on every writable connect (atlas.store.db.connect):
the tables are created once, the views replaced so that they follow the current rules. Columns
added to a view are appended, so readers of the earlier columns keep their positions."""

from atlas.fingerprints.rules import DRAFTER_RULES

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
    max(value) FILTER (WHERE name = 'mtp_dtype') AS mtp_dtype
FROM fingerprints GROUP BY repo_id, sha;

-- MTP drafters that ship as repos of their own (fingerprint `mtp_drafter`, atlas.fingerprints.rules
-- DRAFTER_RULES) and, per snapshot, the target each is for, with the evidence: the card's
-- base_model when it names exactly one model ('base_model'), else a repo of the same snapshot whose
-- name is the drafter's with the rule's suffix stripped ('name'), else NULL (target unknown). The
-- config never names its target, so nothing else is taken for one.
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
)
SELECT d.snapshot_id, d.repo_id AS drafter, d.kind AS drafter_kind, d.kind_key AS drafter_kind_key,
    CASE WHEN len(d.base_models) = 1 THEN d.base_models[1] ELSE b.target END AS target,
    CASE WHEN len(d.base_models) = 1 THEN 'base_model' WHEN b.target IS NOT NULL THEN 'name' END AS target_evidence
FROM drafters d LEFT JOIN by_name b ON b.snapshot_id = d.snapshot_id AND b.repo_id = d.repo_id;

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
    p.drafters AS mtp_drafters_published
FROM hub_models h
JOIN snapshots s ON s.snapshot_id = h.snapshot_id AND s.status = 'complete'
LEFT JOIN fingerprints_wide f ON f.repo_id = h.repo_id AND f.sha = h.sha
LEFT JOIN mtp_drafter_links l ON l.snapshot_id = h.snapshot_id AND l.drafter = h.repo_id
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
    "{drafter_suffixes}", ", ".join(f"('{r.kind}', '{r.name_suffix}')" for r in DRAFTER_RULES))

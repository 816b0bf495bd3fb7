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
-- the base commit a card says the repo matches (its base_model_revision); added with issue 63
ALTER TABLE hub_models ADD COLUMN IF NOT EXISTS base_revision VARCHAR;
-- bases named by repos of a snapshot and not in it, asked of the hub on demand (atlas.hub.bases):
-- whether each exists, and its MTP form at the commit read
CREATE TABLE IF NOT EXISTS base_lookups (
    snapshot_id INTEGER, repo_id VARCHAR, sha VARCHAR, status VARCHAR, error VARCHAR, mtp_form VARCHAR,
    mtp_form_evidence VARCHAR
);

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
    max(value) FILTER (WHERE name = 'mtp_head_dtypes') AS mtp_head_dtypes,
    -- issue 63, appended likewise: the base a GGUF header names (and the commit its URL pins), the
    -- target a drafter's config names, the drafting method, the trunk files a separate head pairs with
    max(value) FILTER (WHERE name = 'gguf_base_model') AS gguf_base_model,
    max(value) FILTER (WHERE name = 'gguf_base_revision') AS gguf_base_revision,
    max(value) FILTER (WHERE name = 'drafter_target_config') AS drafter_target_config,
    max(path) FILTER (WHERE name = 'drafter_target_config') AS drafter_target_config_key,
    max(value) FILTER (WHERE name = 'drafter_method') AS drafter_method,
    max(value) FILTER (WHERE name = 'mtp_pairs_with') AS mtp_pairs_with
FROM fingerprints GROUP BY repo_id, sha;

-- Every base a repo of a snapshot names, and what is known of it: the repo of the same snapshot,
-- else the on-demand lookup (base_lookups). `claim` is the card's one base_model, else the base a
-- GGUF header names; `base_state` says 'snapshot', or the lookup's status ('ok', 'gated', 'missing',
-- 'error'), or NULL when it was not looked up (over the crawl's bound).
CREATE OR REPLACE VIEW named_bases AS
WITH claims AS (
    SELECT h.snapshot_id, h.repo_id, h.sha,
        CASE WHEN len(h.base_models) = 1 THEN h.base_models[1] ELSE f.gguf_base_model END AS claim,
        CASE WHEN len(h.base_models) = 1 THEN 'base_model' WHEN f.gguf_base_model IS NOT NULL THEN 'gguf' END AS claim_evidence
    FROM hub_models h LEFT JOIN fingerprints_wide f ON f.repo_id = h.repo_id AND f.sha = h.sha
)
SELECT c.*, coalesce(b.repo_id, l.repo_id) AS base_repo,
    CASE WHEN b.repo_id IS NOT NULL THEN 'snapshot' ELSE l.status END AS base_state,
    CASE WHEN b.repo_id IS NOT NULL THEN fb.own_mtp_form ELSE l.mtp_form END AS base_form,
    CASE WHEN b.repo_id IS NOT NULL THEN 'in this snapshot' ELSE 'read on demand at ' || left(l.sha, 12) END AS base_read,
    l.error AS base_error
FROM claims c
LEFT JOIN hub_models b ON b.snapshot_id = c.snapshot_id AND lower(b.repo_id) = lower(c.claim) AND b.repo_id <> c.repo_id
LEFT JOIN fingerprints_wide fb ON fb.repo_id = b.repo_id AND fb.sha = b.sha
LEFT JOIN base_lookups l ON b.repo_id IS NULL AND l.snapshot_id = c.snapshot_id AND lower(l.repo_id) = lower(c.claim);

-- Each repo's MTP form in each snapshot: its own (atlas.fingerprints.form), with the rules that need
-- the Hub's metadata or the base's form (issue 63). A repo is a conversion when its format says so
-- (GGUF, MLX: its own rule), the Hub lists it as gguf / mlx, or it names a base (named_bases) and is
-- a quantization of it: the relation `quantized`, or a quantization config from another author than
-- the base's. A quantization config alone is no conversion: a lab's own FP8 release with no base
-- keeps declared_missing. A conversion holding no MTP tensor of a base that ships or declares them is
-- `stripped`; one whose base lacks its declared heads too is `declared_missing` like it; a
-- quantization by another author whose base could not be read is `stripped` from its own declaration;
-- a repo whose own rule says declared_missing and that the Hub lists as GGUF or MLX is `stripped`.
-- The base is read from the snapshot, else on demand (base_lookups); the evidence says which.
CREATE OR REPLACE VIEW mtp_forms AS
WITH own AS (
    SELECT h.snapshot_id, h.repo_id, h.base_relation, f.own_mtp_form, f.own_mtp_form_evidence, f.quant_method,
        f.mtp_conversion, CASE WHEN lower(h.library_name) IN ('gguf', 'mlx') THEN 'library_name ' || lower(h.library_name)
            WHEN list_contains(h.tags, 'gguf') THEN 'tag gguf' WHEN list_contains(h.tags, 'mlx') THEN 'tag mlx'
        END AS hub_conversion,
        n.claim, n.base_repo, n.base_state, n.base_form, n.base_read
    FROM hub_models h LEFT JOIN fingerprints_wide f ON f.repo_id = h.repo_id AND f.sha = h.sha
    LEFT JOIN named_bases n ON n.snapshot_id = h.snapshot_id AND n.repo_id = h.repo_id
), judged AS (
    SELECT *,
        CASE WHEN mtp_conversion IS NOT NULL THEN mtp_conversion
            WHEN hub_conversion IS NOT NULL THEN 'Hub ' || hub_conversion
            WHEN claim IS NOT NULL AND base_relation = 'quantized' THEN 'card: quantized from ' || claim
            WHEN claim IS NOT NULL AND quant_method IS NOT NULL
                AND lower(split_part(claim, '/', 1)) <> lower(split_part(repo_id, '/', 1)) THEN
                'quantization ' || quant_method || ' of ' || claim || ' by another author'
        END AS conversion
    FROM own
), ruled AS (
    SELECT *,
        own_mtp_form IN ('none', 'declared_missing') AND conversion IS NOT NULL
            AND base_form IN ('in_checkpoint', 'in_repo_separate', 'declared_unread') AS to_stripped,
        own_mtp_form = 'declared_missing' AND hub_conversion IS NOT NULL AS to_stripped_by_hub,
        own_mtp_form IN ('stripped', 'declared_missing') AND conversion IS NOT NULL AND base_form = 'declared_missing' AS to_missing,
        own_mtp_form = 'declared_missing' AND mtp_conversion IS NULL AND hub_conversion IS NULL
            AND conversion IS NOT NULL AND base_form IS NULL AS to_stripped_unread
    FROM judged
)
SELECT snapshot_id, repo_id,
    CASE WHEN to_missing THEN 'declared_missing' WHEN to_stripped OR to_stripped_by_hub OR to_stripped_unread THEN 'stripped'
        ELSE own_mtp_form END AS mtp_form,
    CASE WHEN to_missing THEN 'base ' || base_repo || ' (' || base_read || ') declares heads its weights lack too; '
            || own_mtp_form_evidence
         WHEN to_stripped THEN 'base ' || base_repo || ' (' || base_read || ') is ' || base_form || '; this conversion ('
            || conversion || '): ' || own_mtp_form_evidence
         WHEN to_stripped_by_hub THEN own_mtp_form_evidence || '; a conversion: the Hub lists it with ' || hub_conversion
         WHEN to_stripped_unread THEN own_mtp_form_evidence || '; a conversion (' || conversion || '); its base '
            || CASE WHEN base_state IS NULL THEN 'was not read' ELSE 'could not be read (' || base_state || ')' END
         ELSE own_mtp_form_evidence END AS mtp_form_evidence,
    own_mtp_form, CASE WHEN to_stripped OR to_missing THEN base_repo END AS mtp_form_base
FROM ruled;

-- MTP-only sidecar repos and, per snapshot, the base each is for: the card's base_model when it
-- names exactly one model ('base_model'), else a repo of the same snapshot whose id is the
-- sidecar's without `-MTP` (`org/X-MTP` -> `org/X`, `org/X-MTP-GGUF` -> `org/X-GGUF`; 'name'), else
-- the base its GGUF header names ('gguf'). A claimed base is judged as a drafter's target is
-- (mtp_drafter_links): not a Hub repo id, the sidecar itself, another sidecar, or a repo that neither
-- the snapshot holds nor the hub knows (base_lookups) is no base, and base_problem says which.
-- base_revision: the base commit its card (base_model_revision) or GGUF header URL says it matches.
CREATE OR REPLACE VIEW mtp_sidecar_links AS
WITH sidecars AS (
    SELECT h.snapshot_id, h.repo_id, h.base_models, coalesce(h.base_revision, w.gguf_base_revision) AS base_revision,
        w.gguf_base_model
    FROM hub_models h JOIN fingerprints f ON f.repo_id = h.repo_id AND f.sha = h.sha
        AND f.name = 'mtp_form' AND f.value = 'mtp_sidecar'
    LEFT JOIN fingerprints_wide w ON w.repo_id = h.repo_id AND w.sha = h.sha
), by_name AS (
    SELECT s.snapshot_id, s.repo_id, min(n.repo_id) AS base
    FROM sidecars s JOIN hub_models n ON n.snapshot_id = s.snapshot_id AND n.repo_id <> s.repo_id
        AND (lower(s.repo_id) = lower(n.repo_id) || '-mtp'
             OR (lower(n.repo_id) LIKE '%-gguf' AND lower(s.repo_id) = left(lower(n.repo_id), -5) || '-mtp-gguf'))
    GROUP BY s.snapshot_id, s.repo_id
), claimed AS (
    SELECT s.snapshot_id, s.repo_id, s.base_revision,
        CASE WHEN len(s.base_models) = 1 THEN s.base_models[1] ELSE coalesce(b.base, s.gguf_base_model) END AS claim,
        CASE WHEN len(s.base_models) = 1 THEN 'base_model' WHEN b.base IS NOT NULL THEN 'name'
            WHEN s.gguf_base_model IS NOT NULL THEN 'gguf' END AS evidence,
        CASE WHEN len(s.base_models) = 1 THEN 'its card''s base_model' WHEN b.base IS NOT NULL THEN 'its repo name'
            ELSE 'its GGUF header''s general.base_model' END AS source
    FROM sidecars s LEFT JOIN by_name b ON b.snapshot_id = s.snapshot_id AND b.repo_id = s.repo_id
), judged AS (
    SELECT c.*, CASE
        WHEN c.claim IS NULL THEN 'its card names no single base_model and no repo of this snapshot has its name without -MTP'
        WHEN NOT regexp_full_match(c.claim, '{hub_repo_id}') OR length(c.claim) > 96
                OR contains(c.claim, '--') OR contains(c.claim, '..') OR lower(c.claim) LIKE '%.git' THEN
            c.source || ' is not a Hub repo id'
        WHEN lower(c.claim) = lower(c.repo_id) THEN c.source || ' names the sidecar itself'
        WHEN o.repo_id IS NOT NULL THEN c.source || ' names ' || o.repo_id || ', itself an MTP-only sidecar'
        {exists_problem}
        END AS problem
    FROM claimed c LEFT JOIN claimed o ON o.snapshot_id = c.snapshot_id AND lower(o.repo_id) = lower(c.claim)
    {exists_join}
)
SELECT snapshot_id, repo_id AS sidecar, CASE WHEN problem IS NULL THEN claim END AS base,
    CASE WHEN problem IS NULL THEN evidence END AS base_evidence, problem AS base_problem, base_revision
FROM judged;

-- Speculative drafters that ship as repos of their own (fingerprint `mtp_drafter`,
-- atlas.fingerprints.rules DRAFTER_RULES: Gemma assistants, EAGLE-3, DFlash, DSpark; none of them
-- MTP) and, per snapshot, the target each is for, with the evidence: the card's base_model when it
-- names exactly one model ('base_model'), else the target its config names ('config': the
-- speculators format's verifier), else a repo of the same snapshot whose name is the drafter's with
-- the rule's suffix stripped ('name'), else NULL (target unknown). A claimed target is kept only
-- when it is a Hub repo id (huggingface_hub's validate_repo_id rules), not the drafter itself, not
-- another drafter of the snapshot (which refuses cycles and drafter-of-drafter chains alike), and
-- in the snapshot or known to the hub (base_lookups); otherwise target is NULL and target_problem
-- says why (also why a drafter has no claim at all). target_revision: the target commit its card
-- (base_model_revision) says it was trained against.
CREATE OR REPLACE VIEW mtp_drafter_links AS
WITH drafters AS (
    SELECT h.snapshot_id, h.repo_id, h.base_models, h.base_revision, f.value AS kind, f.path AS kind_key,
        w.drafter_method, w.drafter_target_config, w.drafter_target_config_key
    FROM hub_models h JOIN fingerprints f ON f.repo_id = h.repo_id AND f.sha = h.sha AND f.name = 'mtp_drafter'
    LEFT JOIN fingerprints_wide w ON w.repo_id = h.repo_id AND w.sha = h.sha
), by_name AS (
    SELECT d.snapshot_id, d.repo_id, min(n.repo_id) AS target
    FROM drafters d
    JOIN (VALUES {drafter_suffixes}) s(kind, suffix) ON s.kind = d.kind AND s.suffix <> ''
    JOIN hub_models n ON n.snapshot_id = d.snapshot_id AND lower(d.repo_id) = lower(n.repo_id) || s.suffix
    GROUP BY d.snapshot_id, d.repo_id
), claimed AS (
    SELECT d.snapshot_id, d.repo_id, d.kind, d.kind_key, d.drafter_method, d.base_revision,
        CASE WHEN len(d.base_models) = 1 THEN d.base_models[1] ELSE coalesce(d.drafter_target_config, b.target) END AS claim,
        CASE WHEN len(d.base_models) = 1 THEN 'base_model' WHEN d.drafter_target_config IS NOT NULL THEN 'config'
            WHEN b.target IS NOT NULL THEN 'name' END AS evidence,
        CASE WHEN len(d.base_models) = 1 THEN 'its card''s base_model'
            WHEN d.drafter_target_config IS NOT NULL THEN 'its config''s ' || d.drafter_target_config_key
            ELSE 'its repo name' END AS source
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
        {exists_problem}
        END AS problem
    FROM claimed c LEFT JOIN claimed o ON o.snapshot_id = c.snapshot_id AND lower(o.repo_id) = lower(c.claim)
    {exists_join}
)
SELECT snapshot_id, repo_id AS drafter, kind AS drafter_kind, kind_key AS drafter_kind_key,
    CASE WHEN problem IS NULL THEN claim END AS target,
    CASE WHEN problem IS NULL THEN evidence END AS target_evidence,
    problem AS target_problem, drafter_method, base_revision AS target_revision
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
    f.mtp_dtype, f.dspark_block_size, f.sidecar_block_size, f.mtp_head_dtypes, sl.base_problem AS sidecar_base_problem,
    -- appended (issue 63): the drafting method of a drafter (never MTP), the base revision a sidecar or
    -- drafter says it matches, the trunk files a separate head file pairs with, the base a GGUF names
    l.drafter_method, l.target_revision AS drafter_target_revision, sl.base_revision AS sidecar_base_revision,
    f.mtp_pairs_with, f.gguf_base_model
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
    # a claimed base or target must exist: in the snapshot, or known to the hub when looked up
    "{exists_problem}", """WHEN x.repo_id IS NULL AND (l.status IS NULL OR l.status NOT IN ('ok', 'gated')) THEN
            c.source || ' names ' || c.claim || CASE WHEN l.status = 'missing' THEN ', which is not on the Hub'
                WHEN l.status = 'error' THEN ', which could not be checked (' || l.error || ')'
                ELSE ', neither in this snapshot nor looked up' END""").replace(
    "{exists_join}", """LEFT JOIN hub_models x ON x.snapshot_id = c.snapshot_id AND lower(x.repo_id) = lower(c.claim)
    LEFT JOIN base_lookups l ON l.snapshot_id = c.snapshot_id AND lower(l.repo_id) = lower(c.claim)""").replace(
    # the rules' own constants (identifier-like, no quote), not data from a hub
    "{drafter_suffixes}", ", ".join(f"('{r.kind}', '{r.name_suffix}')" for r in DRAFTER_RULES)).replace(
    "{hub_repo_id}", HUB_REPO_ID)

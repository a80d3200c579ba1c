"""The Postgres schema of :class:`~gae.storage.postgres.PostgresStore`: its tables,
indexes and row-level security policy, as templates filled with the store's table names."""

import re

TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}")  # leaves room in Postgres' 63 bytes for the suffixes
TSV = "to_tsvector('simple', coalesce(content, ''))"  # the GIN index's expression, spelled the same
TSQ = "to_tsquery('simple', %(tsq)s)"
COLUMNS = ("seq", "scope_type", "scope_id", "memory_type", "content", "embedding", "confidence", "sensitivity",
            "source_ids", "valid_from", "valid_until", "importance", "created_at")

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE {version} (version integer NOT NULL);
CREATE TABLE {meta} (key text PRIMARY KEY, value text NOT NULL, checksum bigint);
CREATE TABLE {t} (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq bigint UNIQUE NOT NULL,
    scope_type text NOT NULL,
    scope_id text NOT NULL,
    memory_type text NOT NULL CHECK (memory_type IN ('episode', 'semantic')),
    content text,
    embedding vector({dim}),
    confidence double precision NOT NULL,
    sensitivity text NOT NULL,
    source_ids jsonb NOT NULL,
    valid_from double precision NOT NULL,
    valid_until double precision NOT NULL,
    importance double precision NOT NULL,
    created_at double precision NOT NULL,
    deleted_at double precision,
    deleted_reason text,
    checksum bigint
);
CREATE INDEX {filter_index} ON {t} (scope_type, scope_id, memory_type, valid_until);
CREATE INDEX {hnsw_index} ON {t} USING hnsw (embedding vector_cosine_ops) WHERE deleted_at IS NULL;
CREATE INDEX {text_index} ON {t} USING gin (to_tsvector('simple', coalesce(content, ''))) WHERE deleted_at IS NULL;
CREATE INDEX {created_index} ON {t} (created_at) WHERE deleted_at IS NULL;
CREATE INDEX {importance_index} ON {t} (importance) WHERE deleted_at IS NULL;
CREATE TABLE {audit} (
    n bigserial PRIMARY KEY,
    action text NOT NULL CHECK (action IN ('add', 'evict', 'delete', 'expire', 'reject')),
    time double precision NOT NULL,
    ids jsonb NOT NULL,
    reason text NOT NULL,
    version bigint NOT NULL,
    actor text NOT NULL,
    checksum bigint
)
"""

# A scope list in gae.scopes (JSON) restricts every statement of the session; unset or '': all scopes.
RLS = """
ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {t} FORCE ROW LEVEL SECURITY;
CREATE POLICY {policy} ON {t} USING (
    coalesce(current_setting('gae.scopes', true), '') = ''
    OR (CASE WHEN scope_type = 'int' THEN '#' || scope_id ELSE scope_id END)
       = ANY (ARRAY(SELECT jsonb_array_elements_text(current_setting('gae.scopes', true)::jsonb))))
"""

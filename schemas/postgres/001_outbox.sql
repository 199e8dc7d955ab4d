-- The transactional outbox that hookline's users write in the same transaction as their own state
-- change; Debezium's Outbox Event Router turns each inserted row into one record on
-- outbox.event.<aggregatetype> (key = aggregateid, header id = id, headers eventType = type and
-- tenant = tenant_id, value = payload). Rows can be deleted right after insert (even in the same
-- transaction): the router ignores deletes, so the table need not grow.
--
-- Idempotent: `tests/services up` applies it on every start.
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid        PRIMARY KEY,
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    type          text        NOT NULL,
    tenant_id     text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

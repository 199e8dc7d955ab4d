//! hookline: Kafka-native webhook delivery.
//!
//! Map of the crate:
//! - [`attempt`]: the vocabulary of one HTTP attempt (error classes, what came back), shared by the
//!   sender, the retry policy, the attempt log and metrics.
//! - [`id`]: identifier newtypes (endpoint, event, tenant, delivery) and the deterministic
//!   delivery id.
//! - [`signing`]: Standard Webhooks signatures (HMAC-SHA256 `v1`, Ed25519 `v1a`), secrets with
//!   redacted `Debug`, and the verifier receivers can use.
//! - [`retry_policy`]: the one table that classifies an attempt (success, retry, dead) and the one
//!   home of backoff: full jitter, `Retry-After` clamp, total window.
//! - [`ssrf`]: which addresses a delivery may reach, checked for literal hosts and inside the
//!   resolver for every resolved address.
//! - [`sender`]: the outbound HTTP client (rustls, no redirects, no proxies, capped body reads,
//!   connect and total timeouts) that turns a signed request into an [`attempt::AttemptResult`].
//! - [`kafka`]: producer/consumer settings, topic creation, the embedded mock cluster.
//! - [`storage`]: the delivery store trait (attempt log, delivery state and history, replay
//!   audit), its embedded and CQL (ScyllaDB/Cassandra) implementations and the suite every
//!   implementation passes.
//! - [`migrate`]: the versioned CQL schema migrator behind `hookline migrate`.
//! - [`telemetry`]: typed events that emit a log line and their metrics together; the
//!   Prometheus listener.
//! - [`offsets`]: the contiguous-offset tracker: per partition, which offset may be committed
//!   while records complete out of order.
//! - [`breaker`]: the per-endpoint circuit breaker (closed, open with growing cool-down,
//!   half-open with one probe) and the health [`breaker::Outcome`] of an attempt.
//! - [`lag`]: how late hookline's own runtime wakes a task (`hookline_runtime_lag_seconds`)
//!   and how busy its workers are (`hookline_runtime_busy_ratio`).
//! - [`lane`]: per-endpoint admission (AIMD concurrency limit, token-bucket rate limit, no
//!   queue) and the per-partition map of lanes and breakers.
//! - [`record`]: the delivery record on the wire (body bytes serialised once, `hookline-*`
//!   headers) and the transitions the stages make (retry, park, DLQ, replay).
//! - [`input`]: parsing an input record (Debezium outbox or native envelope) into an event, or
//!   into the reason it goes to `hookline.invalid`.
//! - [`subscription`]: event-type filters and the per-tenant index the fan-out queries.
//! - [`delay_tier`]: retry tiers: which tier a delay goes to, and the stage that holds each
//!   tier partition's head until due, then forwards it to the deliveries topic.
//! - [`deliver`]: the delivery stage: per-endpoint lanes, sign, send, classify, log, settle;
//!   parking into delay tiers; DLQ records.
//! - [`fanout`]: the fan-out stage: input records to one delivery record per subscribed
//!   endpoint, invalid records to the invalid topic.
//! - [`stage`]: what every Kafka stage shares: rebalance events, settled-offset tracking and
//!   storing, partition flow control, produce-until-acknowledged.
//! - [`intake`]: a queue and a reader task per assigned partition, so a stage takes a backlog
//!   a batch per partition in turn.
//! - [`config`]: the one typed, layered configuration (defaults < `--config` TOML < `HOOKLINE_*`
//!   environment), validated at start-up with errors that name the key.
//! - [`sealed`]: secrets at rest: the master key and XChaCha20-Poly1305 sealing bound to context.
//! - [`endpoint`]: the endpoint model (stored form with sealed secrets, in-memory form with opened
//!   ones) and the admin API's request shapes and rules.
//! - [`registry`]: every instance's materialised view of the compacted endpoints topic, and the
//!   writer that waits for its own view to catch up.
//! - [`replay`]: republishing a DLQ offset range with a fresh window, a replay id and an audit entry.
//! - [`service`]: assembling the roles from a config and running them under one shutdown token.
//! - [`admin`]: the admin API (axum, JSON, bearer tokens): endpoints, secret rotation, event
//!   ingest, delivery history, health.
//! - [`cli`]: the `hookline` command line (`sign`, `verify`, `send`, ...).

pub mod admin;
pub mod attempt;
pub mod breaker;
pub mod cli;
pub mod config;
pub mod delay_tier;
pub mod deliver;
pub mod endpoint;
pub mod fanout;
pub mod id;
pub mod input;
pub mod intake;
pub mod kafka;
pub mod lag;
pub mod lane;
pub mod migrate;
pub mod offsets;
pub mod record;
pub mod registry;
pub mod replay;
pub mod retry_policy;
pub mod sealed;
pub mod sender;
pub mod service;
pub mod signing;
pub mod ssrf;
pub mod stage;
pub mod storage;
pub mod subscription;
pub mod telemetry;

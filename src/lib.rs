//! hookline: Kafka-native webhook delivery.
//!
//! The crate is built in five layers, and a module imports only from its own layer or those
//! below it (`docs/architecture.md` holds the table; a test keeps it).
//!
//! Vocabulary: names every other layer speaks.
//! - [`id`]: identifier newtypes (endpoint, event, tenant, delivery) and the deterministic
//!   delivery id.
//! - [`attempt`]: one HTTP attempt's error classes and what came back.
//! - [`event_type`]: the event type subscriptions filter on.
//! - [`dead_reason`]: why a delivery was dead-lettered.
//! - [`park_reason`]: why a record was parked in a delay tier.
//! - [`limits`]: record sizes and the bound on per-endpoint maps.
//! - [`repeat_log`]: logging a lasting problem once per interval, not once per record.
//! - [`kafka_error`]: what a Kafka error means (a lost broker or not).
//! - [`listen`]: binding hookline's HTTP listeners.
//! - [`serde_field`]: config field deserialisers whose errors quote the value.
//!
//! Domain rules: pure decisions, no I/O.
//! - [`signing`]: Standard Webhooks signatures (HMAC-SHA256 `v1`, Ed25519 `v1a`), secrets with
//!   redacted `Debug`, and the verifier receivers can use.
//! - [`sealed`]: secrets at rest: the master key and XChaCha20-Poly1305 sealing.
//! - [`retry_policy`]: the one table that classifies an attempt and the one home of backoff.
//! - [`breaker`]: the per-endpoint circuit breaker and an attempt's health outcome.
//! - [`ssrf`]: which addresses a delivery may reach.
//! - [`endpoint`]: the endpoint model and the admin API's request shapes and rules.
//! - [`record`]: the delivery record on the wire and the transitions the stages make.
//! - [`input`]: an input record (Debezium outbox or native envelope) into an event, or into
//!   the reason it is invalid.
//! - [`subscription`]: event-type filters and the per-tenant index the fan-out queries.
//! - [`tenant`]: tenant API keys (stored hashed), portal-link tokens, and per-tenant ceilings.
//!
//! Infrastructure: Kafka, stores, HTTP and metrics, each behind its own interface.
//! - [`telemetry`]: typed events that emit a log line and their metrics together; the
//!   Prometheus listener.
//! - [`lag`]: how late and how busy hookline's own runtime is.
//! - [`kafka`]: client settings, topic creation, the embedded mock cluster.
//! - [`offsets`]: the contiguous-offset tracker.
//! - [`stage`]: what every Kafka stage shares: rebalances, settled offsets, flow control,
//!   producing until acknowledged.
//! - [`intake`]: a queue and a reader per assigned partition.
//! - [`storage`]: the delivery store (attempt log, history, replay audit), in memory and in CQL,
//!   with the CQL schema migrator.
//! - [`registry`]: the materialised view of the compacted endpoints topic and its writer.
//! - [`sender`]: the outbound HTTP client.
//! - [`lane`]: per-endpoint admission (AIMD concurrency, rate limit) and breakers per partition.
//!
//! Stages: the Kafka consumers that move a delivery along.
//! - [`fanout`]: input records to one delivery record per subscribed endpoint; repeats dropped,
//!   each event recorded in the store.
//! - [`deliver`]: sign, send, classify, log, settle; parking and dead letters.
//! - [`delay_tier`]: holding retry records until due, then forwarding them.
//! - [`replay`]: republishing dead letters with a fresh window and an audit entry.
//!
//! Edges: what operators and customers touch.
//! - [`config`]: the typed, layered configuration, validated at start-up.
//! - [`admin`]: the admin API.
//! - [`service`]: assembling the roles from a config under one shutdown token.
//! - [`cli`]: the `hookline` command line.

// Vocabulary.
pub mod attempt;
pub mod dead_reason;
pub mod event_type;
pub mod id;
pub mod kafka_error;
pub mod limits;
pub mod listen;
pub mod park_reason;
pub mod repeat_log;
pub mod serde_field;

// Domain rules.
pub mod breaker;
pub mod endpoint;
pub mod input;
pub mod record;
pub mod retry_policy;
pub mod sealed;
pub mod signing;
pub mod ssrf;
pub mod subscription;
pub mod tenant;

// Infrastructure.
pub mod intake;
pub mod kafka;
pub mod lag;
pub mod lane;
pub mod offsets;
pub mod registry;
pub mod sender;
pub mod stage;
pub mod storage;
pub mod telemetry;

// Stages.
pub mod delay_tier;
pub mod deliver;
pub mod fanout;
pub mod replay;

// Edges.
pub mod admin;
pub mod cli;
pub mod config;
pub mod service;

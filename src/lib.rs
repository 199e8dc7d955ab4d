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
//! - [`lane`]: per-endpoint admission (AIMD concurrency limit, token-bucket rate limit, no
//!   queue) and the per-partition map of lanes and breakers.
//! - [`cli`]: the `hookline` command line (`sign`, `verify`, `send`, ...).

pub mod attempt;
pub mod breaker;
pub mod cli;
pub mod id;
pub mod kafka;
pub mod lane;
pub mod migrate;
pub mod offsets;
pub mod retry_policy;
pub mod sender;
pub mod signing;
pub mod ssrf;
pub mod storage;
pub mod telemetry;

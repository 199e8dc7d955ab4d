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
//! - [`config`]: the one typed, layered configuration (defaults < `--config` TOML < `HOOKLINE_*`
//!   environment), validated at start-up with errors that name the key.
//! - [`sealed`]: secrets at rest: the master key and XChaCha20-Poly1305 sealing bound to context.
//! - [`endpoint`]: the endpoint model (stored form with sealed secrets, in-memory form with opened
//!   ones) and the admin API's request shapes and rules.
//! - [`registry`]: every instance's materialised view of the compacted endpoints topic, and the
//!   writer that waits for its own view to catch up.
//! - [`cli`]: the `hookline` command line (`sign`, `verify`, `send`, ...).

pub mod attempt;
pub mod cli;
pub mod config;
pub mod endpoint;
pub mod id;
pub mod registry;
pub mod retry_policy;
pub mod sealed;
pub mod sender;
pub mod signing;
pub mod ssrf;

//! hookline's integration tests: one binary, shared support in `support`.

mod cql_every_delivery;
mod cql_pipeline;
mod cql_store;
mod delivery_states;
mod dev;
mod events_api;
mod helm;
mod image;
mod ingest_dedupe;
mod layers;
mod outage;
mod pipeline;
mod readme;
mod replay;
mod send;
mod services;
mod signing;
mod ssrf;
mod support;
mod tenants;

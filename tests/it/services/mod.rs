//! Tests against the real servers that `tests/services up` starts: Kafka, Cassandra (the CQL
//! stand-in for ScyllaDB), PostgreSQL and Debezium's outbox route. Each test names its own topics
//! and keyspaces, so they run in parallel and against servers other runs share.

pub mod fixture;

mod cql;
mod intake;
mod kafka;
mod outbox;

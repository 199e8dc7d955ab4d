//! hookline's integration tests: one binary, shared support in `support`.

mod cql_store;
mod send;
mod signing;
mod ssrf;
mod support;

//! hookline's integration tests: one binary, shared support in `support`.

mod pipeline;
mod send;
mod services;
mod signing;
mod ssrf;
mod support;

//! hookline's integration tests: one binary, shared support in `support`.

mod signing;
mod support;

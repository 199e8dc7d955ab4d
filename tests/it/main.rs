//! hookline's integration tests: one binary, shared support in `support`.

mod services;
mod support;

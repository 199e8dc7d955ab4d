//! Shared test support: paths to the built binary, local receivers, server fixtures.

/// Path to the `hookline` binary Cargo built for these tests.
#[allow(dead_code)]
pub fn hookline_bin() -> &'static str {
    env!("CARGO_BIN_EXE_hookline")
}

//! Shared test support: paths to the built binary, local receivers, server fixtures.
//!
//! Everything here listens on loopback only (127.0.0.1:0); tests never send traffic elsewhere.

#![allow(dead_code)]

pub mod dns;
pub mod receiver;

/// Path to the `hookline` binary Cargo built for these tests.
pub fn hookline_bin() -> &'static str {
    env!("CARGO_BIN_EXE_hookline")
}

//! `hookline sign` and `hookline verify`.

use std::process::ExitCode;

use super::{SignArgs, VerifyArgs};

pub(super) fn sign(_args: &SignArgs) -> ExitCode {
    eprintln!("hookline sign: not built yet");
    ExitCode::FAILURE
}

pub(super) fn verify(_args: &VerifyArgs) -> ExitCode {
    eprintln!("hookline verify: not built yet");
    ExitCode::FAILURE
}

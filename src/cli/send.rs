//! `hookline send`.

use std::process::ExitCode;

use super::SendArgs;

pub(super) fn send(_args: &SendArgs) -> ExitCode {
    eprintln!("hookline send: not built yet");
    ExitCode::FAILURE
}

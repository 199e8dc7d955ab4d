//! `hookline sign` and `hookline verify`.
//!
//! Exit codes: 0 signed / valid; 1 the signature is not valid; 2 the command itself is wrong (bad
//! secret, unreadable body, bad id), the same code clap uses for bad flags. Secrets are never
//! printed: key errors name the `--secret` by position.

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use crate::signing::{
    SignedHeaders, Signer, SignerKey, SigningKey, VerificationKey, Verifier, unix_now,
};

use super::{SignArgs, VerifyArgs};

const USAGE_ERROR: u8 = 2;

pub(super) fn sign(args: &SignArgs) -> ExitCode {
    match try_sign(args) {
        Ok(lines) => {
            print!("{lines}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("hookline sign: {message}");
            ExitCode::from(USAGE_ERROR)
        }
    }
}

fn try_sign(args: &SignArgs) -> Result<String, String> {
    check_id(&args.id)?;
    let keys: Vec<SignerKey> = parse_keys::<SigningKey>(&args.secrets)?
        .into_iter()
        .enumerate()
        .map(|(i, key)| SignerKey::new(format!("cli-{}", i + 1), key))
        .collect();
    let body = args.body.bytes()?;
    let signer = Signer::new(&keys).map_err(|e| e.to_string())?;
    let timestamp = args.timestamp.unwrap_or_else(unix_now);
    let headers = signer.headers(&args.id, timestamp, &body);
    Ok(headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\n"))
        .collect())
}

pub(super) fn verify(args: &VerifyArgs) -> ExitCode {
    let keys = match parse_keys::<VerificationKey>(&args.secrets) {
        Ok(keys) => keys,
        Err(message) => {
            eprintln!("hookline verify: {message}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let body = match args.body.bytes() {
        Ok(body) => body,
        Err(message) => {
            eprintln!("hookline verify: {message}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let verifier = Verifier::new(&keys).with_tolerance(Duration::from_secs(args.tolerance));
    let headers = SignedHeaders {
        id: &args.id,
        timestamp: &args.timestamp,
        signature: &args.signature,
    };
    match verifier.verify(&headers, &body, unix_now()) {
        Ok(()) => {
            println!("valid");
            ExitCode::SUCCESS
        }
        Err(reason) => {
            eprintln!("invalid: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// Parses every `--secret`; errors say which one (by position) and why, never what it was.
fn parse_keys<K>(secrets: &[String]) -> Result<Vec<K>, String>
where
    K: FromStr,
    K::Err: std::fmt::Display,
{
    secrets
        .iter()
        .enumerate()
        .map(|(i, s)| s.parse().map_err(|e| format!("--secret #{}: {e}", i + 1)))
        .collect()
}

/// The id goes into an HTTP header and into the signed content, whose fields are separated by
/// `.`: refuse what would make a broken header or an ambiguous signature.
fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("--id must not be empty".into());
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("--id must be printable ASCII without spaces".into());
    }
    if id.contains('.') {
        return Err("--id must not contain '.', the signed content's separator".into());
    }
    Ok(())
}

//! `hookline replay`: republish a range of DLQ offsets with a fresh window and a replay id.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::{Config, StoreKind};
use crate::id::EndpointId;
use crate::replay::{ReplayRequest, check};
use crate::service;

/// `hookline replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// DLQ partition to read (0 or more).
    // Negative numbers are parsed (not taken for flags) so the range check can name them.
    #[arg(long, allow_negative_numbers = true, value_parser = non_negative::<i32>)]
    pub partition: i32,
    /// First DLQ offset to replay (inclusive, 0 or more).
    #[arg(long, value_name = "A", allow_negative_numbers = true,
          value_parser = non_negative::<i64>)]
    pub from_offset: i64,
    /// Last DLQ offset to replay (inclusive, at least --from-offset).
    #[arg(long, value_name = "B", allow_negative_numbers = true,
          value_parser = non_negative::<i64>)]
    pub to_offset: i64,
    /// Only replay records for this endpoint.
    #[arg(long, value_name = "ID")]
    pub endpoint: Option<String>,
    /// Who is replaying (recorded in the audit trail).
    #[arg(long)]
    pub actor: String,
    /// Why (recorded in the audit trail).
    #[arg(long)]
    pub reason: String,
    /// Count what would be replayed; publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The service's config file (Kafka, topics, store).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

pub(super) fn run(args: &ReplayArgs) -> ExitCode {
    super::serve::init_tracing();
    // Mistakes in the arguments fail here, before the store or Kafka is contacted: either may
    // take its whole start-up wait to answer, and its error would hide the real problem.
    let request = match request(args) {
        Ok(r) => r,
        Err(e) => return super::serve::fail(e),
    };
    let config = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return super::serve::fail(e),
    };
    let target = config.replay_target();
    if config.store.kind == StoreKind::Memory {
        eprintln!(
            "warning: store.kind = \"memory\": the audit entry lives only in this process; \
             it is also printed below"
        );
    }
    let rt = match super::runtime(super::Threads::Many) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let terminal = std::io::stderr().is_terminal();
    let result = rt.block_on(async {
        // Kafka first: it answers within seconds, where an unreachable store takes its whole
        // start-up wait. The store opens before anything is republished, so the audit entry
        // has somewhere to go.
        let checked = check(&target, &request).await.map_err(|e| e.to_string())?;
        let store = service::open_store(&config)
            .await
            .map_err(|e| e.to_string())?;
        let mut progress = |done: u64, total: u64| {
            if terminal {
                eprint!("\rreplaying: {done}/{total} read");
                let _ = std::io::stderr().flush();
            }
        };
        checked
            .asked_by("cli")
            .run(store.as_ref(), &mut progress)
            .await
            .map_err(|e| e.to_string())
    });
    if terminal {
        eprintln!();
    }
    match result {
        Ok(s) => {
            let line = serde_json::json!({
                "replay_id": s.replay_id,
                "dry_run": request.dry_run,
                "actor": request.actor,
                "reason": request.reason,
                "partition": request.partition,
                "from_offset": request.from_offset,
                "to_offset": request.to_offset,
                "last_offset": s.last_offset,
                "scanned": s.scanned,
                "replayed": s.replayed,
                "filtered": s.filtered,
                "skipped_not_dead_letters": s.undecodable,
                "skipped_being_replayed": s.skipped_being_replayed,
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => super::serve::fail(e),
    }
}

/// Parses a partition or an offset: a whole number, 0 or more.
fn non_negative<T>(value: &str) -> Result<T, String>
where
    T: std::str::FromStr + Default + PartialOrd,
    T::Err: std::fmt::Display,
{
    let n: T = value.parse().map_err(|e| format!("{e}"))?;
    if n < T::default() {
        return Err("must be 0 or more (DLQ partitions and offsets are numbered from 0)".into());
    }
    Ok(n)
}

/// The request the arguments describe, checked as far as that is possible without a server.
fn request(args: &ReplayArgs) -> Result<ReplayRequest, String> {
    let endpoint = args
        .endpoint
        .as_deref()
        .map(|raw| match EndpointId::parse(raw) {
            Ok(id) if id.is_generated() => Ok(id),
            // It would match no record, and the replay would quietly do nothing.
            Ok(_) => Err(format!(
                "--endpoint: {raw} is not an endpoint id (ep_ and 32 hex digits, as the admin API gives them)"
            )),
            Err(e) => Err(format!("--endpoint: {e}")),
        })
        .transpose()?;
    let request = ReplayRequest {
        partition: args.partition,
        from_offset: args.from_offset,
        to_offset: args.to_offset,
        endpoint,
        actor: args.actor.clone(),
        reason: args.reason.clone(),
        dry_run: args.dry_run,
    };
    request.validate().map_err(|e| e.to_string())?;
    Ok(request)
}

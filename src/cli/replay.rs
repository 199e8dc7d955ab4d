//! `hookline replay`: republish a range of DLQ offsets with a fresh window and a replay id.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::{Config, StoreKind};
use crate::id::EndpointId;
use crate::replay::{ReplayRequest, ReplayTarget, replay};
use crate::service;

/// `hookline replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// DLQ partition to read.
    #[arg(long)]
    pub partition: i32,
    /// First DLQ offset to replay (inclusive).
    #[arg(long, value_name = "A")]
    pub from_offset: i64,
    /// Last DLQ offset to replay (inclusive).
    #[arg(long, value_name = "B")]
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
    let config = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return super::serve::fail(e),
    };
    let endpoint = match args.endpoint.as_deref().map(EndpointId::parse).transpose() {
        Ok(e) => e,
        Err(e) => return super::serve::fail(format!("--endpoint: {e}")),
    };
    let request = ReplayRequest {
        partition: args.partition,
        from_offset: args.from_offset,
        to_offset: args.to_offset,
        endpoint,
        actor: args.actor.clone(),
        reason: args.reason.clone(),
        dry_run: args.dry_run,
    };
    let target = ReplayTarget {
        bootstrap: config.kafka.bootstrap_servers.clone(),
        client: config.kafka.client.clone(),
        dlq: config.kafka.topics.dlq.clone(),
        deliveries: config.kafka.topics.deliveries.clone(),
    };
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
        let store = service::open_store(&config)
            .await
            .map_err(|e| e.to_string())?;
        let mut progress = |done: u64, total: u64| {
            if terminal {
                eprint!("\rreplaying: {done}/{total} read");
                let _ = std::io::stderr().flush();
            }
        };
        replay(&target, &request, store.as_ref(), &mut progress)
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
                "scanned": s.scanned,
                "replayed": s.replayed,
                "filtered": s.filtered,
                "skipped_not_dead_letters": s.undecodable,
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => super::serve::fail(e),
    }
}

//! `hookline dev` and `hookline run`: the service itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, StoreKind, Token};
use crate::kafka::EmbeddedKafka;
use crate::service::{self, Role, ServiceError};

/// `hookline dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Admin API address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Prometheus metrics address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_listen: SocketAddr,
    /// Operator token for the admin API; a random one is made and printed when omitted.
    #[arg(long, value_name = "TOKEN")]
    pub admin_token: Option<String>,
    /// The same config file `hookline run` takes (e.g. for a short retry schedule); Kafka and
    /// the store are always the embedded ones.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `hookline run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The config file (TOML); `HOOKLINE_*` environment variables override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Which stages this process runs.
    #[arg(long, value_enum, default_value = "all")]
    pub role: Role,
}

/// Logs go to stderr; `HOOKLINE_LOG` (or `RUST_LOG`) sets the filter.
pub fn init_tracing() {
    let filter = std::env::var("HOOKLINE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,librdkafka=warn,rdkafka=warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Resolves on SIGINT or SIGTERM.
async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Waits for a signal, then stops every task within a deadline.
async fn serve_until_signal(shutdown: CancellationToken, tasks: TaskTracker, deadline: Duration) {
    termination().await;
    tracing::info!("shutting down: finishing or parking in-flight deliveries");
    shutdown.cancel();
    tasks.close();
    if tokio::time::timeout(deadline, tasks.wait()).await.is_err() {
        tracing::warn!("some tasks did not stop within {deadline:?}; exiting anyway");
    } else {
        tracing::info!("stopped cleanly");
    }
}

pub(super) fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// `hookline dev`.
pub(super) fn dev(args: &DevArgs) -> ExitCode {
    init_tracing();
    let mut config = match &args.config {
        Some(path) => match Config::load(Some(path)) {
            Ok(c) => c.with_ephemeral_master_key(),
            Err(e) => return fail(e),
        },
        None => Config::dev_defaults(),
    };
    config.store.kind = StoreKind::Memory;
    config.admin.listen = args.listen;
    config.metrics.listen = args.metrics_listen;
    config.http.dangerous_allow_http = true;
    for net in ["127.0.0.0/8", "::1/128"] {
        let net = net.parse().expect("literal CIDR");
        if !config.http.allow_cidrs.contains(&net) {
            config.http.allow_cidrs.push(net);
        }
    }
    config
        .kafka
        .client
        .entry("linger.ms".into())
        .or_insert_with(|| "0".into());
    let token = args
        .admin_token
        .clone()
        .unwrap_or_else(|| format!("dev_{}", uuid::Uuid::new_v4().simple()));
    config.admin.operator_tokens = vec![Token::new(token.clone())];
    let rt = match super::runtime(super::Threads::Many) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let kafka = match EmbeddedKafka::start(&service::topic_specs(&config)) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    config.kafka.bootstrap_servers = kafka.bootstrap_servers().to_owned();
    let result = rt.block_on(async {
        service::install_metrics(&config)?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let handles = service::start(&config, Role::All, &shutdown, &tasks).await?;
        super::admin_hook::serve(&config, &handles, &shutdown, &tasks).await?;
        tracing::warn!(
            "dev mode: plain http and loopback endpoints are allowed, Kafka and the store are in \
             memory; nothing survives a restart"
        );
        println!("hookline dev is running");
        println!("  admin API:  http://{}", config.admin.listen);
        println!("  metrics:    http://{}/metrics", config.metrics.listen);
        println!(
            "  kafka:      {} (embedded; for `hookline replay`, set HOOKLINE_KAFKA__BOOTSTRAP_SERVERS)",
            config.kafka.bootstrap_servers
        );
        println!("  token:      {token}");
        println!("  Ctrl-C stops it.");
        serve_until_signal(
            shutdown,
            tasks,
            config.http.total_timeout + Duration::from_secs(10),
        )
        .await;
        Ok::<_, ServiceError>(())
    });
    drop(kafka);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// `hookline run`.
pub(super) fn run(args: &RunArgs) -> ExitCode {
    init_tracing();
    let config = match Config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if let Err(e) = config.require_master_key() {
        return fail(e);
    }
    let rt = match super::runtime(super::Threads::Many) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = rt.block_on(async {
        service::install_metrics(&config)?;
        service::prepare_topics(&config).await?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let handles = service::start(&config, args.role, &shutdown, &tasks).await?;
        super::admin_hook::serve(&config, &handles, &shutdown, &tasks).await?;
        tracing::info!(role = ?args.role, admin = %config.admin.listen, metrics = %config.metrics.listen, "hookline is running");
        serve_until_signal(shutdown, tasks, config.http.total_timeout + Duration::from_secs(10))
            .await;
        Ok::<_, ServiceError>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

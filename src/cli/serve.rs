//! `hookline dev` and `hookline run`: the service itself.

use std::ffi::OsStr;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, StoreKind, Token, token_problem};
use crate::kafka::EmbeddedKafka;
use crate::service::{self, Role, ServiceError};

/// `hookline dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Admin API address [default: the config file's admin.listen, else 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Prometheus metrics address [default: the config file's metrics.listen, else
    /// 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// An operator token for the admin API, added to the config file's (16 to 1024 characters,
    /// as in a config file); a random one is made and printed when omitted.
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

/// Logs go to stderr; `HOOKLINE_LOG` (or `RUST_LOG`) sets the filter. Colours only on a
/// terminal, and never with `NO_COLOR` set.
pub fn init_tracing() {
    let filter = std::env::var("HOOKLINE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,librdkafka=warn,rdkafka=warn".into());
    let ansi = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// Whether logs carry ANSI colours: on a terminal, unless `NO_COLOR` is set and not empty
/// (no-color.org). A file or pipe gets plain text.
fn use_colour(terminal: bool, no_color: Option<&OsStr>) -> bool {
    terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Forwards every SIGINT and SIGTERM to the returned channel, for as long as it is open. The
/// handlers are in place when this returns.
fn signals() -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(4);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            _ = int.recv() => {}
                            _ = term.recv() => {}
                        }
                        if tx.send(()).await.is_err() {
                            return;
                        }
                    }
                });
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot listen for SIGINT and SIGTERM");
            }
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send(()).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// How the service stopped after a signal.
#[derive(Debug, PartialEq, Eq)]
enum Stopped {
    /// Every task finished within the deadline; offsets are committed.
    Drained,
    /// Some tasks were still running at the deadline.
    DeadlinePassed,
    /// A second signal came while draining: exit now, uncommitted records are read again.
    Abandoned,
    /// A stage stopped on its own, and the rest were drained: exit non-zero so the process is
    /// started again.
    StageFailed,
}

impl Stopped {
    /// The process's exit code; an abandoned drain exits as a process stopped by SIGINT does.
    fn exit_code(&self) -> ExitCode {
        match self {
            Stopped::Drained | Stopped::DeadlinePassed => ExitCode::SUCCESS,
            Stopped::Abandoned => ExitCode::from(ABANDONED_EXIT),
            Stopped::StageFailed => ExitCode::from(STAGE_FAILED_EXIT),
        }
    }
}

/// How long a signalled process waits for its tasks: an attempt's HTTP timeout, plus time to
/// log it, park what is queued and commit.
fn drain_deadline(config: &Config) -> Duration {
    config.http.total_timeout + Duration::from_secs(10)
}

/// Exit status after a second signal (128 + SIGINT, as shells report an interrupted command).
const ABANDONED_EXIT: u8 = 130;

/// Exit status after a stage stopped on its own (sysexits' EX_SOFTWARE).
const STAGE_FAILED_EXIT: u8 = 70;

/// Waits for a signal, or for a stage to stop on its own (`failed`), then stops every task
/// within `deadline`; a second signal while draining stops waiting at once.
async fn serve_until_signal(
    mut signals: mpsc::Receiver<()>,
    failed: CancellationToken,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    deadline: Duration,
) -> Stopped {
    let stage_failed = tokio::select! {
        signal = signals.recv() => {
            if signal.is_none() {
                // Nothing can ask for a stop any more (the listener failed and said so): keep
                // serving until a stage fails.
                failed.cancelled().await;
            }
            failed.is_cancelled()
        }
        () = failed.cancelled() => true,
    };
    if stage_failed {
        tracing::error!(
            "a stage stopped on its own (logged above): stopping the others; records not yet \
             committed will be read again when hookline starts again"
        );
    }
    let in_flight = crate::telemetry::attempts_in_flight();
    tracing::info!(
        in_flight_attempts = in_flight,
        deadline_s = deadline.as_secs(),
        "shutting down: fetching stopped, waiting up to {}s for {in_flight} in-flight attempts \
         to finish and queued records to park, then committing offsets; a second signal exits \
         at once",
        deadline.as_secs()
    );
    shutdown.cancel();
    tasks.close();
    tokio::select! {
        drained = tokio::time::timeout(deadline, tasks.wait()) => match drained {
            Ok(()) if stage_failed => Stopped::StageFailed,
            Ok(()) => {
                tracing::info!("stopped cleanly");
                Stopped::Drained
            }
            Err(_) => {
                tracing::warn!("some tasks did not stop within {deadline:?}; exiting anyway");
                if stage_failed { Stopped::StageFailed } else { Stopped::DeadlinePassed }
            }
        },
        Some(()) = signals.recv() => {
            tracing::warn!(
                "second signal: exiting without draining; records not yet committed will be \
                 delivered again"
            );
            Stopped::Abandoned
        }
    }
}

/// Ends the process after [`serve_until_signal`]: at once after a second signal, skipping
/// the embedded broker's and the runtime's teardown, which would wait for the very work the
/// second signal gave up on.
fn finish(stopped: Stopped) -> ExitCode {
    if stopped == Stopped::Abandoned {
        std::process::exit(i32::from(ABANDONED_EXIT));
    }
    stopped.exit_code()
}

pub(super) fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// `hookline dev`'s config: the file's (layered with the environment, as for `run`) when one
/// is given, the dev defaults otherwise; then the embedded Kafka's and the in-memory store's
/// settings, the listen flags given explicitly, and `token` as an operator token beside the
/// file's. Addresses not given by a flag stay the file's, or the loopback defaults.
fn dev_config(args: &DevArgs, file: Option<Config>, token: &str) -> Result<Config, String> {
    let mut config = match file {
        Some(c) => c.with_ephemeral_master_key(),
        None => Config::dev_defaults(),
    };
    config.store.kind = StoreKind::Memory;
    if let Some(addr) = args.listen {
        config.admin.listen = addr;
    }
    if let Some(addr) = args.metrics_listen {
        config.metrics.listen = addr;
    }
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
    if let Some(why) = token_problem(token) {
        return Err(format!("--admin-token {why}"));
    }
    let token = Token::new(token);
    if config.admin.tenant_tokens.contains_key(&token) {
        return Err(
            "--admin-token is one of the config file's admin.tenant_tokens; an operator token \
             must differ"
                .into(),
        );
    }
    if !config.admin.operator_tokens.contains(&token) {
        config.admin.operator_tokens.push(token);
    }
    // The flags may have made the two listeners clash.
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// Binds the admin API and starts the metrics listener, before Kafka or any stage starts, so
/// an address in use is the first and only thing said.
async fn listen(config: &Config) -> Result<TcpListener, ServiceError> {
    let admin = super::admin_hook::bind(config)?;
    service::install_metrics(config)?;
    Ok(admin)
}

/// `hookline dev`.
pub(super) fn dev(args: &DevArgs) -> ExitCode {
    init_tracing();
    let file = match &args.config {
        Some(path) => match Config::load(Some(path)) {
            Ok(c) => Some(c),
            Err(e) => return fail(e),
        },
        None => None,
    };
    let token = args
        .admin_token
        .clone()
        .unwrap_or_else(|| format!("dev_{}", uuid::Uuid::new_v4().simple()));
    let mut config = match dev_config(args, file, &token) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let rt = match super::runtime(super::Threads::Many) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let admin_listener = match rt.block_on(listen(&config)) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let kafka = match EmbeddedKafka::start(&service::topic_specs(&config)) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    config.kafka.bootstrap_servers = kafka.bootstrap_servers().to_owned();
    let result = rt.block_on(async {
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let handles = service::start(&config, Role::All, &shutdown, &tasks).await?;
        super::admin_hook::serve(&config, admin_listener, &handles, &shutdown, &tasks).await?;
        tracing::warn!(
            "dev mode: plain http and loopback endpoints are allowed, Kafka and the store are in \
             memory; nothing survives a restart"
        );
        for (what, addr) in [
            ("admin API", config.admin.listen),
            ("metrics", config.metrics.listen),
        ] {
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    "dev mode: the {what} listens on {addr}, which is not loopback (set by the \
                     config file or a flag); anyone who can reach it can reach dev's data"
                );
            }
        }
        println!("hookline dev is running");
        println!("  admin API:  http://{}", config.admin.listen);
        println!("  metrics:    http://{}/metrics", config.metrics.listen);
        println!(
            "  kafka:      {} (embedded; for `hookline replay`, set HOOKLINE_KAFKA__BOOTSTRAP_SERVERS)",
            config.kafka.bootstrap_servers
        );
        println!("  token:      {token}");
        println!("  Ctrl-C stops it.");
        let deadline = drain_deadline(&config);
        Ok::<_, ServiceError>(
            serve_until_signal(signals(), handles.failed.clone(), shutdown, tasks, deadline).await,
        )
    });
    if let Ok(Stopped::Abandoned) = result {
        // Exits at once: the embedded broker's teardown would wait for what was abandoned.
        return finish(Stopped::Abandoned);
    }
    drop(kafka);
    match result {
        Ok(stopped) => finish(stopped),
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
        let admin_listener = listen(&config).await?;
        service::prepare_topics(&config).await?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let handles = service::start(&config, args.role, &shutdown, &tasks).await?;
        super::admin_hook::serve(&config, admin_listener, &handles, &shutdown, &tasks).await?;
        tracing::info!(role = ?args.role, admin = %config.admin.listen, metrics = %config.metrics.listen, "hookline is running");
        let deadline = drain_deadline(&config);
        Ok::<_, ServiceError>(
            serve_until_signal(signals(), handles.failed.clone(), shutdown, tasks, deadline).await,
        )
    });
    match result {
        Ok(stopped) => finish(stopped),
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE_TOKEN: &str = "file_operator_token_0123";
    const DEV_TOKEN: &str = "dev_token_given_0123456";

    fn args(listen: Option<&str>, metrics: Option<&str>) -> DevArgs {
        DevArgs {
            listen: listen.map(|a| a.parse().unwrap()),
            metrics_listen: metrics.map(|a| a.parse().unwrap()),
            admin_token: None,
            config: None,
        }
    }

    fn file(text: &str) -> Config {
        Config::from_sources(Some(("f.toml", text)), vec![]).unwrap()
    }

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(
            use_colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
    }

    #[test]
    fn dev_adds_its_token_beside_the_files() {
        let f = file(&format!("[admin]\noperator_tokens = [\"{FILE_TOKEN}\"]"));
        let c = dev_config(&args(None, None), Some(f), DEV_TOKEN).unwrap();
        assert_eq!(
            c.admin.principal(FILE_TOKEN),
            Some(crate::config::Principal::Operator)
        );
        assert_eq!(
            c.admin.principal(DEV_TOKEN),
            Some(crate::config::Principal::Operator)
        );
        // The same token in both places is one token, not a repeat.
        let f = file(&format!("[admin]\noperator_tokens = [\"{FILE_TOKEN}\"]"));
        let c = dev_config(&args(None, None), Some(f), FILE_TOKEN).unwrap();
        assert_eq!(c.admin.operator_tokens.len(), 1);
        let f = file(&format!(
            "[admin.tenant_tokens]\n\"{DEV_TOKEN}\" = \"acme\""
        ));
        let e = dev_config(&args(None, None), Some(f), DEV_TOKEN).unwrap_err();
        assert!(
            e.contains("one of the config file's admin.tenant_tokens"),
            "{e}"
        );
        assert!(!e.contains(DEV_TOKEN), "{e}");
    }

    #[test]
    fn dev_keeps_the_files_addresses_unless_a_flag_is_given() {
        let text = "[admin]\nlisten = \"127.0.0.2:7000\"\n[metrics]\nlisten = \"127.0.0.2:7001\"";
        let c = dev_config(&args(None, None), Some(file(text)), DEV_TOKEN).unwrap();
        assert_eq!(c.admin.listen.to_string(), "127.0.0.2:7000");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.2:7001");
        let c = dev_config(
            &args(Some("127.0.0.3:1"), None),
            Some(file(text)),
            DEV_TOKEN,
        )
        .unwrap();
        assert_eq!(c.admin.listen.to_string(), "127.0.0.3:1");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.2:7001");
        // A file that sets no address, and no file at all, keep the loopback defaults.
        for f in [Some(file("[retry]\nbase = \"1s\"")), None] {
            let c = dev_config(&args(None, None), f, DEV_TOKEN).unwrap();
            assert_eq!(c.admin.listen.to_string(), "127.0.0.1:8080");
            assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:9464");
        }
    }

    #[test]
    fn dev_checks_a_given_token_and_address_clash_as_run_does() {
        let e = dev_config(&args(None, None), None, "x").unwrap_err();
        assert_eq!(e, "--admin-token must be 16 to 1024 characters (got 1)");
        let e = dev_config(&args(None, None), None, "has a space 0123456").unwrap_err();
        assert!(e.contains("must not contain spaces"), "{e}");
        let same = Some("127.0.0.1:18080");
        let e = dev_config(&args(same, same), None, DEV_TOKEN).unwrap_err();
        assert_eq!(
            e,
            "metrics.listen = \"127.0.0.1:18080\" is the same address as admin.listen"
        );
    }

    /// A task that stops only when told, or never.
    fn tracked(tasks: &TaskTracker, shutdown: &CancellationToken, stops: bool) {
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            shutdown.cancelled().await;
            if !stops {
                std::future::pending::<()>().await;
            }
        });
    }

    async fn stop_after(signals: usize, task_stops: bool) -> Stopped {
        let (tx, rx) = mpsc::channel(4);
        let (shutdown, tasks) = (CancellationToken::new(), TaskTracker::new());
        tracked(&tasks, &shutdown, task_stops);
        for _ in 0..signals {
            tx.send(()).await.unwrap();
        }
        let deadline = Duration::from_secs(25);
        let stopped = serve_until_signal(
            rx,
            CancellationToken::new(),
            shutdown.clone(),
            tasks,
            deadline,
        )
        .await;
        assert!(shutdown.is_cancelled());
        drop(tx);
        stopped
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_stage_stops_the_process_with_a_failure_status() {
        let (_tx, rx) = mpsc::channel(4);
        let (failed, shutdown, tasks) = (
            CancellationToken::new(),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        tracked(&tasks, &shutdown, true);
        failed.cancel();
        let stopped =
            serve_until_signal(rx, failed, shutdown.clone(), tasks, Duration::from_secs(25)).await;
        assert!(
            shutdown.is_cancelled(),
            "the other stages were told to stop"
        );
        assert_eq!(stopped, Stopped::StageFailed);
        assert_eq!(stopped.exit_code(), ExitCode::from(70));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_signal_abandons_the_drain() {
        let started = tokio::time::Instant::now();
        assert_eq!(stop_after(2, false).await, Stopped::Abandoned);
        assert!(started.elapsed() < Duration::from_secs(1), "did not wait");
        assert_eq!(stop_after(1, true).await, Stopped::Drained);
        assert_eq!(stop_after(1, false).await, Stopped::DeadlinePassed);
        assert_eq!(Stopped::Abandoned.exit_code(), ExitCode::from(130));
        assert_eq!(Stopped::Drained.exit_code(), ExitCode::SUCCESS);
    }
}

//! The `hookline` command line. Each subcommand lives in its own file and is a thin shell over
//! the library: parse, call, print.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod admin_hook;
mod migrate;
mod receive;
mod replay;
mod send;
mod serve;
mod sign;

/// hookline: Kafka-native webhook delivery.
#[derive(Debug, Parser)]
#[command(name = "hookline", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every stage in one process on an embedded Kafka and in-memory store (start here).
    Dev(serve::DevArgs),
    /// A small receiver that prints incoming webhooks and checks their signatures.
    Receive(receive::ReceiveArgs),
    /// Republish a range of DLQ offsets to the deliveries topic (fresh window, replay header).
    Replay(replay::ReplayArgs),
    /// Run the service against real Kafka and ScyllaDB (`--role fanout|deliver|delay|all`).
    Run(serve::RunArgs),
    /// Print Standard Webhooks headers for a body (webhook-id, webhook-timestamp, webhook-signature).
    Sign(SignArgs),
    /// Check a Standard Webhooks signature; prints `valid` or the reason it is not.
    Verify(VerifyArgs),
    /// Make one signed delivery attempt through the service's own sender and print the outcome as JSON.
    Send(SendArgs),
    /// Create the CQL keyspace and apply the missing schema versions (idempotent).
    Migrate(MigrateArgs),
}

/// Where a body comes from: a file (exact bytes) or a string on the command line.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct BodySource {
    /// Read the body bytes from this file, exactly as they are.
    #[arg(long, value_name = "FILE")]
    pub body_file: Option<PathBuf>,
    /// Use this string as the body.
    #[arg(long, value_name = "STR")]
    pub body: Option<String>,
}

/// `hookline sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// A signing secret (`whsec_...` for HMAC, `whsk_...` for Ed25519); repeat for rotation.
    #[arg(long = "secret", value_name = "S", required = true)]
    pub secrets: Vec<String>,
    /// The message id (`webhook-id`).
    #[arg(long)]
    pub id: String,
    /// Unix seconds for `webhook-timestamp`; now when omitted.
    #[arg(long)]
    pub timestamp: Option<u64>,
    #[command(flatten)]
    pub body: BodySource,
}

/// `hookline verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A secret to verify with (`whsec_...` or `whpk_...`); repeat to accept any of several.
    #[arg(long = "secret", value_name = "S", required = true)]
    pub secrets: Vec<String>,
    /// The `webhook-id` header value.
    #[arg(long)]
    pub id: String,
    /// The `webhook-timestamp` header value.
    #[arg(long, allow_hyphen_values = true)]
    pub timestamp: String,
    /// The `webhook-signature` header value (space-separated `v1,...` / `v1a,...` entries).
    #[arg(long)]
    pub signature: String,
    /// Accepted clock difference in seconds, in both directions.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub tolerance: u64,
    #[command(flatten)]
    pub body: BodySource,
}

/// `hookline migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The config file `hookline run` takes (TOML, layered with `HOOKLINE_*` environment
    /// variables); migrate uses its `[store.scylla]`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// CQL contact points (host:port), replacing the config's; comma-separated or repeated.
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// The keyspace, replacing the config's.
    #[arg(long)]
    pub keyspace: Option<String>,
}

/// `hookline send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The endpoint URL.
    pub url: String,
    /// A signing secret; repeat to sign with several.
    #[arg(long = "secret", value_name = "S", required = true)]
    pub secrets: Vec<String>,
    #[command(flatten)]
    pub body: BodySource,
    /// The message id (`webhook-id`); a fresh `msg_...` id when omitted.
    #[arg(long)]
    pub id: Option<String>,
    /// Total timeout for the attempt, in seconds (the connect timeout stays at its default).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Resolve host names through this DNS server instead of the system's; repeatable.
    #[arg(long = "dns-server", value_name = "IP:PORT")]
    pub dns_servers: Vec<std::net::SocketAddr>,
    /// Allow this CIDR even if the SSRF policy blocks it; repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    pub allow_cidrs: Vec<ipnet::IpNet>,
    /// Allow plain http:// URLs (unsafe outside development).
    #[arg(long)]
    pub dangerous_allow_http: bool,
}

impl BodySource {
    /// The body bytes, read from the file or taken from the string.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        match (&self.body_file, &self.body) {
            (Some(path), _) => std::fs::read(path)
                .map_err(|e| format!("cannot read --body-file {}: {e}", path.display())),
            (None, Some(s)) => Ok(s.clone().into_bytes()),
            (None, None) => Err("one of --body-file or --body is required".into()),
        }
    }
}

/// Which async runtime a command needs.
#[derive(Clone, Copy)]
enum Threads {
    /// One thread: a single request or a small server.
    One,
    /// The service itself, or work that blocks in librdkafka calls (`block_in_place`).
    Many,
}

/// The command's async runtime, or the exit code after saying why there is none.
fn runtime(threads: Threads) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::Many => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}

/// Parses `std::env::args` and runs the chosen subcommand.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Dev(args) => serve::dev(&args),
        Command::Run(args) => serve::run(&args),
        Command::Replay(args) => replay::run(&args),
        Command::Receive(args) => receive::run(&args),
        Command::Sign(args) => sign::sign(&args),
        Command::Verify(args) => sign::verify(&args),
        Command::Send(args) => send::send(&args),
        Command::Migrate(args) => migrate::run(&args),
    }
}

//! Helpers the end-to-end benches share: CPU time from `/proc` for this process, a local Kafka
//! broker and the whole machine; percentiles; the run's topics on the test broker.

use std::time::{Duration, Instant};

use hookline::config::Config;
use hookline::kafka::client_config;
use hookline::service;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;

/// Whether this bench (`name`) runs: only under `cargo bench` (`cargo test --all-targets` runs
/// bench binaries without `--bench`, and these need minutes and a broker), and not when the
/// filter argument names another bench target.
pub fn asked_for(name: &str) -> bool {
    if !std::env::args().any(|a| a == "--bench") {
        println!("{name}: not run under `cargo test`; run it with `cargo bench --bench {name}`");
        return false;
    }
    !std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && a != name)
}

/// The variable `name` parsed, or `default` when it is unset; a value that does not parse
/// stops the bench with the variable's name.
pub fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} does not parse")),
        Err(_) => default,
    }
}

/// Adds `HOOKLINE_BENCH_CLIENT` (`k=v,k=v`: librdkafka properties) to every client of `c`.
pub fn client_overrides(c: &mut Config) {
    if let Ok(extra) = std::env::var("HOOKLINE_BENCH_CLIENT") {
        for kv in extra.split(',').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("HOOKLINE_BENCH_CLIENT: {kv:?} is not k=v"));
            c.kafka.client.insert(k.into(), v.into());
        }
    }
}

pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU time so far, from `/proc` (Linux), in USER_HZ ticks (100 a second on Linux): this
/// process (the bench: hookline's stages and the load the bench puts on them), a Kafka broker
/// running on this machine if there is one, and the whole machine.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    pub bench: u64,
    pub broker: Option<u64>,
    pub busy: u64,
    pub total: u64,
}

/// Clock ticks per second of `/proc` times (`USER_HZ`, 100 on Linux).
pub const TICKS_PER_S: f64 = 100.0;

/// Field `n` (1-based, as `man proc` numbers them) of `/proc/<pid>/stat`, from field 3 on: the
/// command name before it is in parentheses and may hold spaces.
pub fn stat_field<T: std::str::FromStr>(stat: &str, n: usize) -> Option<T> {
    let after_name = stat.rsplit_once(')')?.1;
    after_name
        .split_whitespace()
        .nth(n.checked_sub(3)?)?
        .parse()
        .ok()
}

/// utime + stime of a process, from `/proc/<pid>/stat` (fields 14 and 15).
pub fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat_field::<u64>(&stat, 14)? + stat_field::<u64>(&stat, 15)?)
}

/// How long the process `pid` has run: its start time (`/proc/<pid>/stat` field 22) against
/// the machine's uptime.
pub fn process_age(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let started_s = stat_field::<f64>(&stat, 22)? / TICKS_PER_S;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let up_s: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_secs_f64((up_s - started_s).max(0.0)))
}

/// A broker younger than this may still be compiling its hot paths: in runs that started within
/// 90 s of a restart its CPU per paced delivery was 1.6-2.4 times a later run's, and p99
/// 0.3-1.2 s.
pub const BROKER_WARM: Duration = Duration::from_secs(180);

/// The pid of the Kafka broker at `bootstrap` (its first `host:port`) when it runs on this
/// machine (see [`local_server_pid`]).
pub fn local_broker_pid(bootstrap: &str) -> Option<String> {
    local_server_pid(bootstrap, b"kafka.Kafka")
}

/// The pid of the server at `addrs` (the first of its comma-separated `host:port`s) when it
/// runs on this machine: the process holding the socket that listens on that port. When the
/// sockets of other users cannot be read, the first process with `main_class` on its command
/// line.
pub fn local_server_pid(addrs: &str, main_class: &[u8]) -> Option<String> {
    let port: u16 = addrs.split(',').next()?.rsplit_once(':')?.1.parse().ok()?;
    let listening: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let local_port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
                    let inode = f.get(9)?;
                    (local_port == port && *f.get(3)? == "0A").then(|| format!("socket:[{inode}]"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if listening.is_empty() {
        return None;
    }
    let pids = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let pid = entry.file_name().into_string().ok()?;
                pid.bytes()
                    .all(|b| b.is_ascii_digit())
                    .then_some((pid, entry.path()))
            })
    };
    let by_socket = pids().find_map(|(pid, path)| {
        std::fs::read_dir(path.join("fd"))
            .ok()?
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|target| listening.iter().any(|l| target.as_os_str() == l.as_str()))
            .then_some(pid)
    });
    by_socket.or_else(|| {
        pids().find_map(|(pid, path)| {
            std::fs::read(path.join("cmdline"))
                .ok()?
                .split(|&b| b == 0)
                .any(|arg| arg == main_class)
                .then_some(pid)
        })
    })
}

pub fn cpu_sample(broker: Option<&str>) -> Option<CpuSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    // cpu  user nice system idle iowait irq softirq steal ...
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some(CpuSample {
        bench: process_ticks("self")?,
        broker: broker.and_then(process_ticks),
        busy: total - idle,
        total,
    })
}

/// CPU spent per delivery in one phase, and how busy the machine was (share of all cores).
#[derive(Debug, Clone, Copy)]
pub struct CpuUse {
    pub bench_us: f64,
    pub broker_us: Option<f64>,
    pub busy_pct: f64,
}

impl CpuUse {
    /// "bench / broker" CPU per delivery: in µs, or in raw-ceiling requests of `raw_us` µs each.
    pub fn per_delivery(&self, raw_us: Option<f64>) -> String {
        let fmt = |us: f64| match raw_us {
            None => format!("{us:.0}"),
            Some(unit) => format!("{:.1}", us / unit),
        };
        format!(
            "{} / {}",
            fmt(self.bench_us),
            self.broker_us.map_or_else(|| "not local".into(), fmt)
        )
    }
}

pub fn cpu_use(
    before: Option<CpuSample>,
    after: Option<CpuSample>,
    delivered: u64,
) -> Option<CpuUse> {
    let (a, b) = (before?, after?);
    let per = |ticks: u64| ticks as f64 * 1e6 / TICKS_PER_S / delivered.max(1) as f64;
    Some(CpuUse {
        bench_us: per(b.bench - a.bench),
        broker_us: a.broker.zip(b.broker).map(|(x, y)| per(y - x)),
        busy_pct: (b.busy - a.busy) as f64 * 100.0 / (b.total - a.total).max(1) as f64,
    })
}

/// Waits until every partition of the run's topics answers a watermark query: a broker answers
/// `NotLeaderForPartition` for a moment after creating them, and the endpoint registry's
/// start-up treats that as fatal.
pub async fn wait_for_leaders(config: &Config) {
    let client: rdkafka::consumer::BaseConsumer =
        client_config(&config.kafka.bootstrap_servers, &config.kafka.client)
            .set("group.id", "bench-metadata")
            .create()
            .expect("metadata client");
    let specs = service::topic_specs(config);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = specs.iter().all(|spec| {
            (0..spec.partitions).all(|p| {
                client
                    .fetch_watermarks(&spec.name, p, Duration::from_secs(5))
                    .is_ok()
            })
        });
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the run's topics have no leaders after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn delete_topics(config: &Config) {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        client_config(&config.kafka.bootstrap_servers, &config.kafka.client).create();
    let Ok(admin) = admin else { return };
    let names: Vec<String> = service::topic_specs(config)
        .into_iter()
        .map(|t| t.name)
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let _ = admin.delete_topics(&refs, &AdminOptions::new()).await;
}

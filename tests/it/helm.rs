//! The Helm chart in `helm/hookline`, checked with a real `helm` (v3, which `tests/run` builds
//! once with `go install` and points `HOOKLINE_HELM` at): it lints; it renders with the default
//! values and with overrides; each role's Deployment runs `hookline run` with arguments hookline's
//! own command line accepts; the TOML in the ConfigMap passes hookline's config validation with
//! the variables the Secret supplies; probes and ports are the ones hookline serves, and the
//! startup budget and grace period the ones values set; pods run unprivileged unless values say
//! otherwise; the PodMonitor scrapes every role's pods and gives
//! their series the labels the alert rules select on; and every metric and label an alert rule
//! queries is one hookline exports. A real promtool (also built by `tests/run`, found through
//! `HOOKLINE_PROMTOOL`) checks the rendered rules and runs unit tests of alerts on hookline's
//! series.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use axum::body::Body;
use clap::{Parser, ValueEnum};
use hookline::admin::events::MemoryEventSink;
use hookline::admin::{AdminState, router};
use hookline::cli::Cli;
use hookline::config::{AdminConfig, Config, ConfigError};
use hookline::registry::MemoryEndpointStore;
use hookline::sealed::MasterKey;
use hookline::service::Role;
use hookline::storage::memory::MemoryStore;
use regex::Regex;
use serde_json::{Value, json};
use tower::ServiceExt;

const RELEASE: &str = "hl";
const NAMESPACE: &str = "webhooks";
/// The Secret's keys, as values.yaml documents them for `existingSecret`.
const OPERATOR_TOKENS_VAR: &str = "HOOKLINE_ADMIN__OPERATOR_TOKENS";
const MASTER_KEY_VAR: &str = "HOOKLINE_SECURITY__MASTER_KEY";
/// Labels Prometheus puts on every scraped series; alert selectors may use them.
const TARGET_LABELS: &[&str] = &["namespace", "pod", "job", "instance", "container"];

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/hookline")
}

/// `env_var`, else the newest `name` that `tests/run` built under the tools cache
/// (`<tools>/<name>-<version>/<name>`), else `name` on PATH.
fn tool_bin(name: &str, env_var: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os(env_var) {
        return bin.into();
    }
    let tools = std::env::var_os("HOOKLINE_TOOLS_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/hookline/tools")));
    let mut built: Vec<PathBuf> = tools
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(name))
        .filter(|p| p.is_file())
        .collect();
    built.sort();
    built.pop().unwrap_or_else(|| PathBuf::from(name))
}

/// Runs a tool `tests/run` builds; one that cannot be started fails the test with how to get it.
fn run_tool(name: &str, env_var: &str, module: &str, args: &[&str]) -> Output {
    let bin = tool_bin(name, env_var);
    Command::new(&bin).args(args).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {name} ({}: {e}). Run `tests/run`, which builds the pinned {name} with \
             `go install {module}@...` into ~/.cache/hookline/tools, or set {env_var} to a \
             {name} binary",
            bin.display()
        )
    })
}

/// Runs helm and returns its stdout; any failure, a missing helm included, fails the test.
fn helm(args: &[&str]) -> String {
    let out = run_tool("helm", "HOOKLINE_HELM", "helm.sh/helm/v3/cmd/helm", args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {} failed ({}):\n{stdout}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs promtool; a report of any problem, or a missing promtool, fails the test with its output.
fn promtool(args: &[&str]) {
    let out = run_tool(
        "promtool",
        "HOOKLINE_PROMTOOL",
        "github.com/prometheus/prometheus/cmd/promtool",
        args,
    );
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The manifests `helm template` renders, as JSON values.
struct Rendered {
    docs: Vec<Value>,
}

impl Rendered {
    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} among the rendered manifests"))
    }
}

fn render(args: &[&str]) -> Rendered {
    let chart = chart();
    let mut all = vec![
        "template",
        RELEASE,
        chart.to_str().expect("chart path is UTF-8"),
        "--namespace",
        NAMESPACE,
    ];
    all.extend_from_slice(args);
    let text = helm(&all);
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            let yaml = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc)
                .unwrap_or_else(|e| panic!("helm rendered invalid YAML ({e}):\n{text}"));
            serde_json::to_value(yaml).expect("manifest as JSON")
        })
        .filter(|d| !d.is_null())
        .collect();
    Rendered { docs }
}

/// Writes a file for helm or promtool under the test binary's temp dir; returns its path.
fn tmp_file(name: &str, text: &str) -> String {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path.to_str().expect("UTF-8 path").to_owned()
}

/// Writes a values file for `helm template -f`, named by the test that uses it.
fn values_file(test: &str, yaml: &str) -> String {
    tmp_file(&format!("helm-{test}.yaml"), yaml)
}

/// The roles a Deployment exists for: every role hookline's `--role` takes except `all`.
fn roles() -> Vec<String> {
    Role::value_variants()
        .iter()
        .filter(|r| **r != Role::All)
        .map(|r| {
            r.to_possible_value()
                .expect("role has a name")
                .get_name()
                .to_owned()
        })
        .collect()
}

fn fullname() -> String {
    format!("{RELEASE}-hookline")
}

/// The variables the operator's Secret supplies (fresh values: nothing here is a real secret).
fn secret_env() -> Vec<(String, String)> {
    vec![
        (MASTER_KEY_VAR.into(), MasterKey::generate().to_base64()),
        (
            OPERATOR_TOKENS_VAR.into(),
            format!("[\"{}\"]", uuid::Uuid::new_v4().simple()),
        ),
    ]
}

/// What one role's Deployment says about the process it runs.
struct Pod {
    config: Config,
    liveness: String,
    readiness: String,
    startup: String,
    /// How long the startup probe lets the pod fail before the kubelet restarts it.
    startup_seconds: u64,
    /// terminationGracePeriodSeconds, or Kubernetes' default.
    grace_seconds: u64,
}

/// A container port by name or number.
fn container_port(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let name = port.as_str().expect("port is a name or a number");
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

/// Checks one role's Deployment and loads the config its process would run with.
fn check_deployment(r: &Rendered, role: &str, replicas: u64) -> Pod {
    let name = format!("{}-{role}", fullname());
    let d = r.get("Deployment", &name);
    assert_eq!(d["spec"]["replicas"], replicas, "{name} replicas");
    let pod = &d["spec"]["template"];
    for (k, v) in d["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            &pod["metadata"]["labels"][k], v,
            "{name}: its selector must match its own pods ({k})"
        );
    }
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{name}: one container");
    let c = &containers[0];

    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    if let Err(e) = Cli::try_parse_from(std::iter::once("hookline").chain(args.iter().copied())) {
        panic!("{name}: hookline rejects the args {args:?}: {e}");
    }
    let flag = |f: &str| -> &str {
        let i = args
            .iter()
            .position(|a| *a == f)
            .unwrap_or_else(|| panic!("{name}: no {f} in {args:?}"));
        args[i + 1]
    };
    assert_eq!(args[0], "run", "{name} runs `hookline run`");
    assert_eq!(flag("--role"), role, "{name} runs its own role");

    // --config names a file of the ConfigMap, through a volume mount.
    let config_path = Path::new(flag("--config"));
    let mount = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| config_path.parent() == Some(Path::new(m["mountPath"].as_str().unwrap_or(""))))
        .unwrap_or_else(|| panic!("{name}: nothing is mounted where --config points"));
    let volume = pod["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume exists");
    let cm_name = volume["configMap"]["name"]
        .as_str()
        .expect("the config volume is a ConfigMap");
    let key = config_path
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file name");
    let toml = r.get("ConfigMap", cm_name)["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} has no key {key}"));

    assert_eq!(
        c["envFrom"][0]["secretRef"]["name"], "hookline-secrets",
        "{name} takes the master key and tokens from existingSecret"
    );
    let mut env = secret_env();
    for e in c["env"].as_array().into_iter().flatten() {
        let var = e["name"].as_str().expect("env name").to_owned();
        let value = e["value"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: env {var} has no plain value"));
        env.push((var, value.to_owned()));
    }
    let origin = format!("ConfigMap {cm_name} {key}");
    let config = Config::from_sources(Some((&origin, toml)), env)
        .unwrap_or_else(|e| panic!("{name}: hookline refuses its config: {e}\n{toml}"));
    config
        .require_master_key()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // A file the config names (the CQL cluster's CA) lies on a volume the pod mounts.
    if let Some(ca) = config
        .store
        .scylla
        .tls
        .as_ref()
        .and_then(|t| t.ca_file.as_deref())
    {
        let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
        let mounted = c["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .any(|m| {
                ca.starts_with(m["mountPath"].as_str().unwrap_or("\0"))
                    && volumes.iter().any(|v| v["name"] == m["name"])
            });
        assert!(
            mounted,
            "{name}: store.scylla.tls.ca_file {} is on no volume the pod mounts",
            ca.display()
        );
    }

    // Probes come from the kubelet and scrapes from Prometheus, both over the pod's address.
    for (what, listen, port_name) in [
        ("admin", config.admin.listen, "admin"),
        ("metrics", config.metrics.listen, "metrics"),
    ] {
        assert!(
            listen.ip().is_unspecified(),
            "{name}: {what} listens on {listen}, unreachable from outside the pod"
        );
        assert_eq!(
            u64::from(listen.port()),
            container_port(c, &Value::from(port_name)),
            "{name}: the {port_name} container port is where hookline's {what} listener is"
        );
    }
    // `hookline run` drains for the HTTP total timeout plus 10 s after SIGTERM (cli/serve.rs);
    // a shorter grace period kills attempts in flight instead of letting them settle or park.
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    assert!(
        grace > config.http.total_timeout.as_secs() + 10,
        "{name}: terminationGracePeriodSeconds {grace} is shorter than hookline's drain"
    );
    let annotations = &pod["metadata"]["annotations"];
    if annotations["prometheus.io/scrape"] == "true" {
        assert_eq!(
            annotations["prometheus.io/port"],
            config.metrics.listen.port().to_string(),
            "{name}: the scrape annotation names the metrics port"
        );
    }

    let probe = |which: &str| -> String {
        assert!(c[which].is_object(), "{name}: the container has no {which}");
        let get = &c[which]["httpGet"];
        assert_eq!(
            container_port(c, &get["port"]),
            u64::from(config.admin.listen.port()),
            "{name}: {which} goes to the admin listener"
        );
        get["path"].as_str().expect("probe path").to_owned()
    };
    // Kubernetes' defaults for a field the probe leaves out.
    let startup = &c["startupProbe"];
    let startup_seconds = startup["periodSeconds"].as_u64().unwrap_or(10)
        * startup["failureThreshold"].as_u64().unwrap_or(3);
    Pod {
        liveness: probe("livenessProbe"),
        readiness: probe("readinessProbe"),
        startup: probe("startupProbe"),
        startup_seconds,
        grace_seconds: grace,
        config,
    }
}

/// Every Deployment, the ConfigMap and the Service, for the replica counts expected.
fn check_workloads(r: &Rendered, replicas: &BTreeMap<&str, u64>) -> Vec<Pod> {
    let roles = roles();
    assert_eq!(
        r.of_kind("Deployment").len(),
        roles.len(),
        "one Deployment per role ({roles:?})"
    );
    let pods: Vec<Pod> = roles
        .iter()
        .map(|role| check_deployment(r, role, replicas[role.as_str()]))
        .collect();

    let svc = r.get("Service", &format!("{}-admin", fullname()));
    let selector = svc["spec"]["selector"].as_object().expect("selector");
    let selected: Vec<&Value> = r
        .of_kind("Deployment")
        .into_iter()
        .filter(|d| {
            selector
                .iter()
                .all(|(k, v)| &d["spec"]["template"]["metadata"]["labels"][k] == v)
        })
        .collect();
    assert!(!selected.is_empty(), "the Service selects no pod");
    for port in svc["spec"]["ports"].as_array().expect("ports") {
        for d in &selected {
            let c = &d["spec"]["template"]["spec"]["containers"][0];
            let target = container_port(c, &port["targetPort"]);
            assert!(target > 0, "Service port {port} has a target");
        }
    }
    pods
}

/// The probe paths answer as probes need: startup and liveness whatever Kafka does (a restart
/// would not bring Kafka back), readiness only while Kafka is reachable.
async fn check_probes(pod: &Pod) {
    let (kafka_tx, kafka_rx) = tokio::sync::watch::channel(true);
    let app = router(AdminState::new(
        Arc::new(MemoryEndpointStore::new(MasterKey::generate())),
        Arc::new(MemoryStore::default()),
        Arc::new(MemoryEventSink::default()),
        AdminConfig::default(),
        kafka_rx,
    ));
    let status = |path: String| {
        let app = app.clone();
        async move {
            let req = axum::http::Request::get(&path)
                .body(Body::empty())
                .expect("request");
            app.oneshot(req).await.expect("router answers").status()
        }
    };
    assert_eq!(status(pod.startup.clone()).await, 200, "startup probe");
    assert_eq!(status(pod.liveness.clone()).await, 200, "liveness probe");
    assert_eq!(status(pod.readiness.clone()).await, 200, "readiness probe");
    kafka_tx.send_replace(false);
    for (path, which) in [(&pod.startup, "startup"), (&pod.liveness, "liveness")] {
        assert_eq!(
            status(path.clone()).await,
            200,
            "{which} must not follow Kafka"
        );
    }
    assert_eq!(
        status(pod.readiness.clone()).await,
        503,
        "readiness follows Kafka"
    );
}

/// One role's Deployment: its pod's and its container's security contexts.
fn security_contexts<'a>(r: &'a Rendered, role: &str) -> (&'a Value, &'a Value) {
    let pod = &r.get("Deployment", &format!("{}-{role}", fullname()))["spec"]["template"]["spec"];
    (
        &pod["securityContext"],
        &pod["containers"][0]["securityContext"],
    )
}

/// Every role runs as a numeric non-root user, under the runtime's seccomp filter, with no
/// capabilities, no way to gain privileges and a read-only root filesystem (hookline writes
/// nothing to disk; `hookline run` only reads its config).
fn check_unprivileged(r: &Rendered) {
    for role in roles() {
        let (pod, c) = security_contexts(r, &role);
        assert_eq!(pod["runAsNonRoot"], true, "{role}: pod runAsNonRoot");
        for id in ["runAsUser", "runAsGroup"] {
            assert!(
                pod[id].as_u64().is_some_and(|n| n > 0),
                "{role}: pod {id} must be a numeric non-root id, got {}",
                pod[id]
            );
        }
        assert_eq!(
            pod["seccompProfile"]["type"], "RuntimeDefault",
            "{role}: pod seccompProfile"
        );
        assert_eq!(
            c["allowPrivilegeEscalation"], false,
            "{role}: container allowPrivilegeEscalation"
        );
        assert_eq!(
            c["readOnlyRootFilesystem"], true,
            "{role}: container readOnlyRootFilesystem"
        );
        assert_eq!(
            c["capabilities"]["drop"],
            json!(["ALL"]),
            "{role}: container capabilities"
        );
        assert_ne!(c["privileged"], true, "{role}: container privileged");
    }
}

/// The labels of one scrape target's series, its `up` included.
type Target = BTreeMap<String, String>;

/// A Kubernetes label key as the Prometheus Operator names it on series (`podTargetLabels`):
/// every character that may not stand in a Prometheus label name becomes `_`.
fn series_label(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The PodMonitor selects every role's pods and scrapes them on a port their container has.
/// Returns the targets it makes, one per pod, labelled as the Prometheus Operator labels them:
/// namespace, pod, container, job, endpoint and instance, plus each `podTargetLabels` key.
fn check_pod_monitor(r: &Rendered) -> Vec<Target> {
    let pm = r.get("PodMonitor", &fullname());
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        pm["spec"]["namespaceSelector"]["matchNames"],
        json!([NAMESPACE]),
        "the PodMonitor looks in the release's namespace"
    );
    let selector = pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("PodMonitor matchLabels");
    assert_eq!(
        selector["app.kubernetes.io/instance"], RELEASE,
        "the PodMonitor selects this release's pods only"
    );
    let copied: Vec<&str> = pm["spec"]["podTargetLabels"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| l.as_str().expect("podTargetLabels are strings"))
        .collect();
    let endpoints = pm["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("podMetricsEndpoints");
    assert_eq!(
        endpoints.len(),
        1,
        "one scrape endpoint: hookline's metrics"
    );
    let endpoint = &endpoints[0];
    assert_eq!(endpoint["path"], "/metrics");
    let port = endpoint["port"]
        .as_str()
        .expect("the endpoint names a port");

    let mut targets = Vec::new();
    for d in r.of_kind("Deployment") {
        let name = d["metadata"]["name"].as_str().expect("name");
        let pod = &d["spec"]["template"];
        let labels = &pod["metadata"]["labels"];
        for (k, v) in selector {
            assert_eq!(
                &labels[k], v,
                "the PodMonitor does not select {name}'s pods ({k})"
            );
        }
        let c = &pod["spec"]["containers"][0];
        let ports = c["ports"].as_array().expect("ports");
        let number = ports
            .iter()
            .find(|p| p["name"] == port)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| {
                let names: Vec<&str> = ports.iter().filter_map(|p| p["name"].as_str()).collect();
                panic!(
                    "the PodMonitor scrapes port {port:?}, which {name}'s container does not \
                     have (its ports: {names:?})"
                )
            });
        for i in 0..d["spec"]["replicas"].as_u64().expect("replicas") {
            let mut t = Target::from([
                ("namespace".into(), NAMESPACE.into()),
                ("pod".into(), format!("{name}-{i}")),
                ("container".into(), c["name"].as_str().expect("name").into()),
                ("job".into(), format!("{NAMESPACE}/{}", fullname())),
                ("endpoint".into(), port.into()),
                ("instance".into(), format!("10.0.0.{i}:{number}")),
            ]);
            for key in &copied {
                let value = labels[*key].as_str().unwrap_or_else(|| {
                    panic!("podTargetLabels names {key}, which {name}'s pods do not carry")
                });
                t.insert(series_label(key), value.into());
            }
            targets.push(t);
        }
    }
    targets
}

/// Whether a series with `labels` satisfies the PromQL matchers `name op "value"`.
fn selects(matchers: &[(String, String, String)], labels: &Target) -> bool {
    matchers.iter().all(|(name, op, value)| {
        let have = labels.get(name).map(String::as_str).unwrap_or("");
        let re = || Regex::new(&format!("^(?:{value})$")).expect("matcher regex");
        match op.as_str() {
            "=" => have == value,
            "!=" => have != value,
            "=~" => re().is_match(have),
            _ => !re().is_match(have),
        }
    })
}

/// What `src/telemetry/` (the one home of metric names) exports: name → (labels,
/// is a histogram).
fn exported_metrics() -> BTreeMap<String, (BTreeSet<String>, bool)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/telemetry");
    let mut files: Vec<_> = std::fs::read_dir(&path)
        .expect("read src/telemetry/")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    files.sort();
    let src: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("read a telemetry file"))
        .collect();
    let consts: BTreeMap<&str, &str> = Regex::new(r#"pub const (\w+): &str = "(hookline_\w+)";"#)
        .expect("regex")
        .captures_iter(&src)
        .map(|c| (c.get(1).unwrap().as_str(), c.get(2).unwrap().as_str()))
        .collect();
    assert!(consts.len() > 5, "found the metric names in {path:?}");
    let mut out: BTreeMap<String, (BTreeSet<String>, bool)> = consts
        .values()
        .map(|n| ((*n).to_owned(), (BTreeSet::new(), false)))
        .collect();
    let emit =
        Regex::new(r#"(counter|gauge|histogram)!\(\s*name::(\w+)((?:\s*,\s*"\w+"\s*=>[^,)]*)*)\)"#)
            .expect("regex");
    let label = Regex::new(r#""(\w+)"\s*=>"#).expect("regex");
    for c in emit.captures_iter(&src) {
        let name = consts[c.get(2).unwrap().as_str()];
        let entry = out.get_mut(name).expect("emitted metric is named");
        entry.1 |= &c[1] == "histogram";
        entry
            .0
            .extend(label.captures_iter(&c[3]).map(|l| l[1].to_owned()));
    }
    out
}

/// Every rule of the PrometheusRule: well formed, querying only what hookline exports, and
/// selecting `up` series that the `targets` (the PodMonitor's) have. Returns alert name →
/// expressions.
fn check_rules(r: &Rendered, targets: &[Target]) -> BTreeMap<String, Vec<String>> {
    let rules = r.get("PrometheusRule", &fullname());
    assert_eq!(rules["apiVersion"], "monitoring.coreos.com/v1");
    let exported = exported_metrics();
    let metric = Regex::new(r"\b(hookline_[a-z0-9_]+)").expect("regex");
    let selector = Regex::new(r"\b([a-z_][a-z0-9_]*)\{([^}]*)\}").expect("regex");
    let matcher = Regex::new(r#"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)""#).expect("regex");
    let by = Regex::new(r"\bby \(([^)]*)\)").expect("regex");
    let roles = roles();
    let mut alerts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for group in rules["spec"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let alert = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().expect("expr");
            for key in [
                "for",
                "labels.severity",
                "annotations.summary",
                "annotations.description",
            ] {
                let v = key.split('.').fold(rule, |v, k| &v[k]);
                assert!(
                    v.as_str().is_some_and(|s| !s.trim().is_empty()),
                    "{alert} has no {key}"
                );
            }
            // Names: a histogram's series carry _bucket/_sum/_count.
            let mut labels_here: BTreeSet<String> =
                TARGET_LABELS.iter().map(|s| s.to_string()).collect();
            for m in metric.captures_iter(expr) {
                let used = &m[1];
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| used.strip_suffix(s))
                    .filter(|b| exported.get(*b).is_some_and(|(_, hist)| *hist));
                let known = exported
                    .get(used)
                    .or_else(|| base.and_then(|b| exported.get(b)));
                let Some((labels, _)) = known else {
                    panic!("{alert} queries {used}, which hookline does not export: {expr}");
                };
                labels_here.extend(labels.iter().cloned());
                if base.is_some() && used.ends_with("_bucket") {
                    labels_here.insert("le".into());
                }
            }
            // Labels in selectors and aggregations exist on what is selected.
            for s in selector.captures_iter(expr) {
                let on = &s[1];
                let own: BTreeSet<String> = if on == "up" {
                    targets.iter().flat_map(|t| t.keys().cloned()).collect()
                } else {
                    labels_here.clone()
                };
                for m in matcher.captures_iter(&s[2]) {
                    let l = &m[1];
                    assert!(
                        TARGET_LABELS.contains(&l) || own.contains(l),
                        "{alert}: {on} has no label {l}: {expr}"
                    );
                    if l == "stage" || l == "app_kubernetes_io_component" {
                        for v in m[3].split('|') {
                            assert!(roles.iter().any(|r| r == v), "{alert}: {l}={v} is no stage");
                        }
                    }
                }
                if on == "up" {
                    let matchers: Vec<(String, String, String)> = matcher
                        .captures_iter(&s[2])
                        .map(|m| (m[1].to_owned(), m[2].to_owned(), m[3].to_owned()))
                        .collect();
                    assert!(
                        targets.iter().any(|t| selects(&matchers, t)),
                        "{alert}: no pod the PodMonitor scrapes has an `up` series that {} \
                         selects; its targets: {targets:?}",
                        &s[0]
                    );
                }
            }
            for b in by.captures_iter(expr) {
                for l in b[1].split(',').map(str::trim) {
                    assert!(
                        labels_here.contains(l),
                        "{alert} aggregates by {l}, which its metrics lack: {expr}"
                    );
                }
            }
            alerts
                .entry(alert.to_owned())
                .or_default()
                .push(expr.to_owned());
        }
    }
    alerts
}

/// The chart with alerts and the PodMonitor on, checked as `overridden_values_...` checks them:
/// the rule groups (the PrometheusRule's `spec`, a Prometheus rule file) and the PodMonitor's
/// targets.
fn monitored() -> (Value, Vec<Target>) {
    let r = render(&[
        "--set",
        "alerts.enabled=true",
        "--set",
        "podMonitor.enabled=true",
    ]);
    let targets = check_pod_monitor(&r);
    check_rules(&r, &targets);
    (
        r.get("PrometheusRule", &fullname())["spec"].clone(),
        targets,
    )
}

fn yaml(doc: &Value) -> String {
    serde_yaml_ng::to_string(doc).expect("YAML")
}

/// A series in PromQL notation, of a metric hookline exports with labels it or Prometheus sets.
fn hookline_series(name: &str, labels: &[(&str, &str)]) -> String {
    let exported = exported_metrics();
    let (own, _) = exported
        .get(name)
        .unwrap_or_else(|| panic!("hookline exports no {name}"));
    for (l, _) in labels {
        assert!(
            TARGET_LABELS.contains(l) || own.contains(*l),
            "{name} has no label {l}"
        );
    }
    series(name, labels.iter().map(|(k, v)| (*k, *v)))
}

fn series<'a>(name: &str, labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let labels: Vec<String> = labels.map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", labels.join(", "))
}

/// promtool unit tests of eight alerts on the series hookline exports (at the defaults'
/// thresholds and `for:` durations), one sample a minute.
fn rule_tests(rules: &str, targets: &[Target]) -> Value {
    use hookline::dead_reason::DeadReason;
    use hookline::telemetry::ParkReason;
    use hookline::telemetry::name::{
        BREAKERS_OPEN, DEAD_LETTERS, PARKED, RUNTIME_LAG, STORE_TLS_CERT_EXPIRY, STORE_TLS_REFUSED,
    };
    let deliver = format!("{}-deliver", fullname());
    let pod = |i: u32| format!("{deliver}-{i}");
    let dead = |ns: &str, reason: DeadReason| {
        hookline_series(
            DEAD_LETTERS,
            &[
                ("namespace", ns),
                ("pod", &pod(0)),
                ("reason", reason.as_str()),
            ],
        )
    };
    let open = |i| hookline_series(BREAKERS_OPEN, &[("namespace", NAMESPACE), ("pod", &pod(i))]);
    let parked = |reason: ParkReason| {
        hookline_series(
            PARKED,
            &[
                ("namespace", NAMESPACE),
                ("pod", &pod(0)),
                ("reason", reason.as_str()),
            ],
        )
    };
    // How late pod i's runtime woke its ticks (100 a second), by bucket bound: its cumulative
    // count grows by `per_minute` a minute.
    let lag = |i: u32, le: &str, per_minute: u32| {
        assert!(
            exported_metrics()[RUNTIME_LAG].1,
            "{RUNTIME_LAG} is a histogram"
        );
        let bucket = format!("{RUNTIME_LAG}_bucket");
        let labels = [("namespace", NAMESPACE), ("pod", &pod(i)), ("le", le)];
        json!({"series": series(&bucket, labels.into_iter()), "values": format!("0+{per_minute}x40")})
    };
    let cert_expiry = |i: u32| {
        hookline_series(
            STORE_TLS_CERT_EXPIRY,
            &[("namespace", NAMESPACE), ("pod", &pod(i))],
        )
    };
    let tls_refused = |i: u32, file: &str| {
        hookline_series(
            STORE_TLS_REFUSED,
            &[("namespace", NAMESPACE), ("pod", &pod(i)), ("file", file)],
        )
    };
    // Deliver pods stop answering scrapes after 10 minutes; the other roles stay up.
    let up: Vec<Value> = targets
        .iter()
        .map(|t| {
            let values = if t["app_kubernetes_io_component"] == "deliver" {
                "1x10 0x30"
            } else {
                "1x40"
            };
            let labels = t.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            json!({"series": series("up", labels), "values": values})
        })
        .collect();
    json!({
        "rule_files": [rules],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "dead letters: 5 a minute for one reason, in this namespace only",
                "interval": "1m",
                "input_series": [
                    {"series": dead(NAMESPACE, DeadReason::HttpStatus), "values": "0+5x40"},
                    {"series": dead(NAMESPACE, DeadReason::WindowExhausted), "values": "3x40"},
                    {"series": dead("elsewhere", DeadReason::WindowExhausted), "values": "0+50x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "HooklineDeadLetters", "exp_alerts": []},
                    {
                        "eval_time": "30m",
                        "alertname": "HooklineDeadLetters",
                        "exp_alerts": [{"exp_labels": {
                            "severity": "warning",
                            "reason": DeadReason::HttpStatus.as_str(),
                        }}],
                    },
                ],
            },
            {
                "name": "breakers: 6 open on each of two deliver pods",
                "interval": "1m",
                "input_series": [
                    {"series": open(0), "values": "6x60"},
                    {"series": open(1), "values": "6x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "20m", "alertname": "HooklineManyBreakersOpen", "exp_alerts": []},
                    {
                        "eval_time": "45m",
                        "alertname": "HooklineManyBreakersOpen",
                        "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                    },
                ],
            },
            {
                "name": "attempt panics: one, beside many parked for a full lane",
                "interval": "1m",
                "input_series": [
                    {"series": parked(ParkReason::Panicked), "values": "0x5 1x30"},
                    {"series": parked(ParkReason::LaneFull), "values": "0+100x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "HooklineAttemptPanics", "exp_alerts": []},
                    {
                        "eval_time": "8m",
                        "alertname": "HooklineAttemptPanics",
                        "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
                    },
                    {"eval_time": "30m", "alertname": "HooklineAttemptPanics", "exp_alerts": []},
                ],
            },
            {
                "name": "endpoint view behind: 5 deliveries a minute wait for it",
                "interval": "1m",
                "input_series": [
                    {"series": parked(ParkReason::ViewBehind), "values": "0+5x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "HooklineEndpointViewBehind", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "HooklineEndpointViewBehind",
                        "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
                    },
                ],
            },
            {
                "name": "runtime starved: a third of one pod's ticks over 250 ms late",
                "interval": "1m",
                "input_series": [
                    lag(0, "0.0025", 3000), lag(0, "0.05", 4000), lag(0, "0.25", 4000),
                    lag(0, "0.5", 6000), lag(0, "+Inf", 6000),
                    lag(1, "0.0025", 5900), lag(1, "0.05", 6000), lag(1, "0.25", 6000),
                    lag(1, "0.5", 6000), lag(1, "+Inf", 6000),
                ],
                "alert_rule_test": [
                    {"eval_time": "12m", "alertname": "HooklineRuntimeStarved", "exp_alerts": []},
                    {
                        "eval_time": "30m",
                        "alertname": "HooklineRuntimeStarved",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "pod": pod(0)}}],
                    },
                ],
            },
            {
                "name": "store TLS: one pod's rotated client certificate cannot be used",
                "interval": "1m",
                "input_series": [
                    {"series": tls_refused(0, "client_cert"), "values": "0x3 1x40"},
                    {"series": tls_refused(0, "ca"), "values": "0x40"},
                    {"series": tls_refused(1, "client_cert"), "values": "0x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "HooklineStoreTlsFilesRefused", "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": "HooklineStoreTlsFilesRefused",
                        "exp_alerts": [{"exp_labels": {
                            "severity": "warning", "pod": pod(0), "file": "client_cert",
                        }}],
                    },
                ],
            },
            {
                "name": "store TLS: one pod's client certificate has 10 days left, another's a year",
                "interval": "1m",
                // Unix times: the evaluation starts at 0, so 10 days is 864000.
                "input_series": [
                    {"series": cert_expiry(0), "values": "864000x120"},
                    {"series": cert_expiry(1), "values": "31536000x120"},
                ],
                "alert_rule_test": [
                    {"eval_time": "30m", "alertname": "HooklineStoreClientCertExpiring", "exp_alerts": []},
                    {
                        "eval_time": "90m",
                        "alertname": "HooklineStoreClientCertExpiring",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", "pod": pod(0)}}],
                    },
                ],
            },
            {
                "name": "role down: the PodMonitor's deliver targets stop answering",
                "interval": "1m",
                "input_series": up,
                "alert_rule_test": [
                    {"eval_time": "8m", "alertname": "HooklineRoleDown", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "HooklineRoleDown",
                        "exp_alerts": [{"exp_labels": {"severity": "critical", "role": "deliver"}}],
                    },
                ],
            },
        ],
    })
}

/// Prometheus's own parser and linter accept the rule groups the chart renders (PromQL, `for:`,
/// label and annotation templates, duplicate rules).
#[test]
fn alert_rules_pass_promtool_check() {
    let (groups, _) = monitored();
    let rules = tmp_file("promtool-check-rules.yaml", &yaml(&groups));
    promtool(&["check", "rules", "--lint=all", "--lint-fatal", &rules]);
}

/// Prometheus's rule engine fires the alerts on the series hookline exports, labelled as the
/// PodMonitor labels them, after their `for:` and not before.
#[test]
fn alerts_fire_on_the_series_hookline_exports() {
    let (mut groups, targets) = monitored();
    // promtool compares annotations too; they are prose for people (`promtool check rules`
    // parses their templates), so the unit tests run on the rules without them.
    for group in groups["groups"].as_array_mut().expect("groups") {
        for rule in group["rules"].as_array_mut().expect("rules") {
            rule.as_object_mut().expect("rule").remove("annotations");
        }
    }
    let rules = tmp_file("promtool-unit-rules.yaml", &yaml(&groups));
    let tests = tmp_file(
        "promtool-unit-tests.yaml",
        &yaml(&rule_tests(&rules, &targets)),
    );
    promtool(&["test", "rules", &tests]);
}

/// The pods carry scrape annotations unless the PodMonitor scrapes them, so that by default no
/// series is scraped twice (which would double every sum the alerts take); `prometheusScrape`
/// decides it either way when set.
#[test]
fn pods_are_scraped_once_by_default() {
    let annotated = |args: &[&str]| -> Vec<bool> {
        let r = render(args);
        let deployments = r.of_kind("Deployment");
        assert_eq!(deployments.len(), roles().len());
        deployments
            .iter()
            .map(|d| {
                d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
            })
            .collect()
    };
    let every = |on: bool| vec![on; roles().len()];
    assert_eq!(annotated(&[]), every(true), "no PodMonitor: annotated");
    assert_eq!(
        annotated(&["--set", "podMonitor.enabled=true"]),
        every(false),
        "the PodMonitor scrapes them: not annotated as well"
    );
    assert_eq!(
        annotated(&[
            "--set",
            "podMonitor.enabled=true",
            "--set",
            "prometheusScrape=true"
        ]),
        every(true),
        "asked for both"
    );
    assert_eq!(
        annotated(&["--set", "prometheusScrape=false"]),
        every(false),
        "asked for none"
    );
}

#[test]
fn helm_is_v3() {
    let v = helm(&["version", "--short"]);
    assert!(v.starts_with("v3."), "the chart is for helm v3, got {v}");
}

#[test]
fn chart_lints_strictly() {
    let chart = chart();
    let chart = chart.to_str().expect("UTF-8");
    helm(&["lint", "--strict", chart]);
    helm(&[
        "lint",
        "--strict",
        chart,
        "--set",
        "alerts.enabled=true",
        "--set",
        "podMonitor.enabled=true",
    ]);
}

#[tokio::test]
async fn default_values_render_a_working_deployment() {
    let r = render(&[]);
    for kind in ["PrometheusRule", "PodMonitor"] {
        assert!(
            r.of_kind(kind).is_empty(),
            "no {kind} by default: the Prometheus Operator's CRDs may not be installed"
        );
    }
    check_unprivileged(&r);
    let replicas = BTreeMap::from([("fanout", 1), ("deliver", 2), ("delay", 1)]);
    let pods = check_workloads(&r, &replicas);
    for pod in &pods {
        check_probes(pod).await;
    }
}

#[tokio::test]
async fn overridden_values_render_alerts_and_their_config() {
    let values = values_file(
        "overrides",
        r#"
alerts:
  enabled: true
  ruleLabels: { release: kube-prometheus-stack }
  consumerLag: { records: 5000 }
podMonitor:
  enabled: true
  interval: 15s
  labels: { release: kube-prometheus-stack }
podSecurityContext:
  runAsUser: 10001
  runAsGroup: null
  fsGroup: 10001
securityContext:
  capabilities: { add: [NET_BIND_SERVICE] }
roles:
  delay: { replicas: 0 }
extraVolumes: [{ name: cql-ca, secret: { secretName: scylla-client-ca } }]
extraVolumeMounts: [{ name: cql-ca, mountPath: /etc/hookline-cql, readOnly: true }]
config: |
  [kafka]
  bootstrap_servers = "broker-0.kafka:9093,broker-1.kafka:9093"
  partitions = 24

  [store.scylla]
  nodes = ["scylla-0.scylla:9042"]
  keyspace = "webhooks"

  [store.scylla.tls]
  ca_file = "/etc/hookline-cql/ca.pem"
"#,
    );
    let r = render(&["-f", &values, "--set", "roles.deliver.replicas=6"]);
    let replicas = BTreeMap::from([("fanout", 1), ("deliver", 6), ("delay", 0)]);
    let pods = check_workloads(&r, &replicas);
    for pod in &pods {
        assert_eq!(
            pod.config.kafka.partitions, 24,
            "the overridden config is the one loaded"
        );
        assert_eq!(pod.config.store.scylla.keyspace, "webhooks");
        assert!(
            pod.config.store.scylla.tls.is_some(),
            "the CA's mount was checked"
        );
        check_probes(pod).await;
    }

    // Operators' security settings merge into the defaults; null drops a default.
    for role in roles() {
        let (pod, c) = security_contexts(&r, &role);
        let set = |ctx: &Value, key: &str, want: Value, why: &str| {
            let have = key.split('.').fold(ctx, |v, k| &v[k]);
            assert_eq!(have, &want, "{role}: {key} should be {want}: {why}");
        };
        set(pod, "runAsUser", json!(10001), "values override it");
        set(pod, "fsGroup", json!(10001), "values add it");
        set(pod, "runAsGroup", Value::Null, "values set it to null");
        set(pod, "runAsNonRoot", json!(true), "the default");
        set(
            pod,
            "seccompProfile.type",
            json!("RuntimeDefault"),
            "the default",
        );
        set(
            c,
            "capabilities.add",
            json!(["NET_BIND_SERVICE"]),
            "values add it",
        );
        set(c, "capabilities.drop", json!(["ALL"]), "the default");
        set(c, "readOnlyRootFilesystem", json!(true), "the default");
    }

    let targets = check_pod_monitor(&r);
    let monitor = r.get("PodMonitor", &fullname());
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["interval"], "15s");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let alerts = check_rules(&r, &targets);
    let rule = r.get("PrometheusRule", &fullname());
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let expected = [
        "HooklineConsumerLagGrowing",
        "HooklineDeadLetters",
        "HooklineAttemptLogWritesSlow",
        "HooklineAttemptLogWriteErrors",
        "HooklineStoreTlsFilesRefused",
        "HooklineStoreClientCertExpiring",
        "HooklineProduceFailing",
        "HooklineConsumerErrors",
        "HooklineManyBreakersOpen",
        "HooklineRuntimeStarved",
        "HooklineAttemptPanics",
        "HooklineEndpointViewBehind",
        "HooklineInvalidInputRecords",
        "HooklineRoleDown",
    ];
    assert_eq!(
        alerts.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from(expected)
    );
    assert!(
        alerts["HooklineConsumerLagGrowing"][0].contains("> 5000"),
        "the lag threshold comes from values"
    );
    assert!(
        alerts
            .values()
            .flatten()
            .all(|e| e.contains(&format!("namespace=\"{NAMESPACE}\"")))
    );
    // A role scaled to zero is not "down".
    let down = &alerts["HooklineRoleDown"];
    assert_eq!(down.len(), 2, "{down:?}");
    for role in ["fanout", "deliver"] {
        assert!(
            down.iter()
                .any(|e| e.contains(&format!("component=\"{role}\"")))
        );
    }
}

/// `helm template` with `args`, which must fail; returns what helm said.
fn render_error(args: &[&str]) -> String {
    let chart = chart();
    let mut all = vec!["template", RELEASE, chart.to_str().expect("UTF-8")];
    all.extend_from_slice(args);
    let out = run_tool("helm", "HOOKLINE_HELM", "helm.sh/helm/v3/cmd/helm", &all);
    assert!(
        !out.status.success(),
        "helm {} should have failed",
        all.join(" ")
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn startup_budget_and_grace_period_come_from_values() {
    let replicas = BTreeMap::from([("fanout", 1), ("deliver", 2), ("delay", 1)]);
    let check = |args: &[&str], startup: u64, grace: u64| {
        let r = render(args);
        for pod in check_workloads(&r, &replicas) {
            assert_eq!(pod.startup_seconds, startup, "startup budget with {args:?}");
            assert_eq!(pod.grace_seconds, grace, "grace period with {args:?}");
        }
        for role in roles() {
            let d = r.get("Deployment", &format!("{}-{role}", fullname()));
            let probe = &d["spec"]["template"]["spec"]["containers"][0]["startupProbe"];
            assert_eq!(probe["periodSeconds"], 5, "{role}: {probe}");
        }
    };
    check(&[], 180, 45);
    // Rounded up to whole probe periods.
    check(
        &[
            "--set",
            "startupSeconds=242",
            "--set",
            "terminationGracePeriodSeconds=60",
        ],
        245,
        60,
    );

    for (set, said) in [
        (
            "startupSeconds=3",
            "startupSeconds must be at least 5, got 3",
        ),
        (
            "startupSeconds=3m",
            r#"startupSeconds must be a whole number of seconds, got "3m""#,
        ),
        (
            "terminationGracePeriodSeconds=-1",
            "terminationGracePeriodSeconds must be at least 0, got -1",
        ),
    ] {
        let e = render_error(&["--set", set]);
        assert!(e.contains(said), "--set {set}: {e}");
    }
    let e = render_error(&["--set-json", "terminationGracePeriodSeconds=45.5"]);
    assert!(
        e.contains("terminationGracePeriodSeconds must be a whole number of seconds, got 45.5"),
        "{e}"
    );
}

#[test]
fn a_config_hookline_refuses_fails_the_check() {
    let values = values_file(
        "bad-config",
        "config: |\n  [kafka]\n  bootstrap_server = \"kafka:9092\"\n",
    );
    let r = render(&["-f", &values]);
    let cm = r.get("ConfigMap", &fullname());
    let toml = cm["data"]["hookline.toml"].as_str().expect("hookline.toml");
    match Config::from_sources(Some(("ConfigMap", toml)), secret_env()) {
        Err(ConfigError::UnknownKey { key, .. }) => assert_eq!(key, "kafka.bootstrap_server"),
        other => panic!("expected an unknown-key error, got {other:?}"),
    }
}

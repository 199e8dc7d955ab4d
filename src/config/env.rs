//! The environment layer: `HOOKLINE_*` variables over the file.
//!
//! A variable `HOOKLINE_<SECTION>__<KEY>` sets `<section>.<key>`: the name after `HOOKLINE_` is
//! lower-cased and `__` separates levels, so `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS` sets
//! `kafka.bootstrap_servers` and `HOOKLINE_STORE__SCYLLA__KEYSPACE` sets `store.scylla.keyspace`.
//! Variables without `__` (such as `HOOKLINE_LOG`) are not configuration and are ignored, except
//! one that starts with a section's name and one `_` (`HOOKLINE_KAFKA_BOOTSTRAP_SERVERS`): that
//! is a mistyped setting, and an error says how to spell it.
//! - Under `kafka.client`, the rest of the name is an rdkafka property with `_` for `.`:
//!   `HOOKLINE_KAFKA__CLIENT__SECURITY_PROTOCOL=ssl` sets `security.protocol` (librdkafka property
//!   names have no underscores). These values are always strings, as are
//!   `HOOKLINE_STORE__SCYLLA__USERNAME` and `HOOKLINE_STORE__SCYLLA__PASSWORD`.
//! - Elsewhere a value that reads as a TOML number, boolean, array or inline table is taken as
//!   one (`HOOKLINE_KAFKA__PARTITIONS=24`, `HOOKLINE_RETRY__TIERS='["5s","1m"]'`,
//!   `HOOKLINE_ADMIN__TENANT_TOKENS='{ "tok..." = "acme" }'`); anything else is a string
//!   (`HOOKLINE_ADMIN__LISTEN=0.0.0.0:8080`). Quote it to force a string:
//!   `HOOKLINE_STORE__SCYLLA__KEYSPACE='"2024"'`.

use std::ffi::OsString;

use super::error::{ConfigError, secret_path};

/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "HOOKLINE_";
/// Separator of levels in an environment variable name.
pub const ENV_SEPARATOR: &str = "__";

/// Every environment variable, failing on a `HOOKLINE_` one that is not Unicode (the others are
/// none of hookline's business).
pub(super) fn env_vars() -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = vec![];
    for (k, v) in std::env::vars_os() {
        let (Some(k), v) = (k.to_str().map(str::to_owned), v) else {
            continue;
        };
        if !k.starts_with(ENV_PREFIX) {
            continue;
        }
        let v: String = v.into_string().map_err(|_: OsString| ConfigError::Env {
            var: k.clone(),
            reason: "value is not valid Unicode".into(),
        })?;
        out.push((k, v));
    }
    Ok(out)
}

/// The config file's top-level tables, which a variable names first.
pub(super) const SECTIONS: &[&str] = &[
    "kafka", "retry", "delivery", "http", "admin", "metrics", "security", "store", "ingest",
    "tenants",
];

/// A variable without `__` is not configuration, but one that starts with a section's name and
/// a single `_` (`HOOKLINE_KAFKA_BOOTSTRAP_SERVERS`) is a mistyped one: ignored, it would leave
/// the default in place and the failure that follows would not point at it.
fn section_with_one_underscore(var: &str, rest: &str) -> Result<Option<String>, ConfigError> {
    let lower = rest.to_ascii_lowercase();
    let Some(section) = SECTIONS
        .iter()
        .find(|s| lower.strip_prefix(**s).is_some_and(|r| r.starts_with('_')))
    else {
        return Ok(None);
    };
    let upper = section.to_ascii_uppercase();
    // The rest of an admin variable's name could be a token: never repeat it.
    let (shown, key) = if *section == "admin" {
        (format!("{ENV_PREFIX}{upper}_..."), "KEY".to_owned())
    } else {
        (var.to_owned(), rest[section.len() + 1..].to_owned())
    };
    Err(ConfigError::Env {
        var: shown,
        reason: format!(
            "is not read: configuration variables separate the section from the key with \
             {ENV_SEPARATOR}, e.g. {ENV_PREFIX}{upper}{ENV_SEPARATOR}{key}"
        ),
    })
}

/// Puts one environment variable into the TOML tree. Returns the key it set, or `None` when
/// the variable is not configuration.
pub(super) fn overlay_env(
    tree: &mut toml::Table,
    var: &str,
    raw: &str,
) -> Result<Option<String>, ConfigError> {
    let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
        return Ok(None);
    };
    if !rest.contains(ENV_SEPARATOR) {
        return section_with_one_underscore(var, rest);
    }
    let env_err = |reason: String| ConfigError::Env {
        var: var.to_owned(),
        reason,
    };
    let mut path: Vec<String> = rest
        .split(ENV_SEPARATOR)
        .map(|s| s.to_ascii_lowercase())
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(env_err("has an empty key segment".into()));
    }
    let is_client = path.len() >= 3 && path[0] == "kafka" && path[1] == "client";
    if !is_client && path.len() > 2 && path[..2] == ["admin", "tenant_tokens"] {
        // The rest of the name would be a token: never repeat it.
        return Err(ConfigError::Env {
            var: format!("{ENV_PREFIX}ADMIN{ENV_SEPARATOR}TENANT_TOKENS{ENV_SEPARATOR}..."),
            reason: "a token cannot be part of a variable's name; set the whole table, \
                     HOOKLINE_ADMIN__TENANT_TOKENS='{ \"<token>\" = \"<tenant>\" }'"
                .into(),
        });
    }
    let value = if is_client {
        let prop = path.split_off(2).join(".").replace('_', ".");
        path.push(prop);
        toml::Value::String(raw.to_owned())
    } else if VERBATIM_ENV_KEYS.contains(&path.join(".").as_str()) {
        toml::Value::String(raw.to_owned())
    } else {
        let secret = secret_path(&path.join("."));
        env_value(raw).map_err(|reason| match secret {
            Some(s) => env_err(format!(
                "value for {} is not valid TOML (not shown: it is a secret)",
                s.shown
            )),
            None => env_err(reason),
        })?
    };
    let key = path.join(".");
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut table = tree;
    let mut walked = String::new();
    for seg in parents {
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(seg);
        let entry = table
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| env_err(format!("{walked} is a value, not a section")))?;
    }
    table.insert(last.clone(), value);
    Ok(Some(key))
}

/// Keys whose environment value is always taken as it is, a string: a password may read as a
/// number, a boolean or the start of an array and is still a password.
const VERBATIM_ENV_KEYS: &[&str] = &["store.scylla.username", "store.scylla.password"];

/// Reads an environment value: TOML when it looks like a number, boolean, array, inline table
/// or quoted string; a plain string otherwise.
fn env_value(raw: &str) -> Result<toml::Value, String> {
    let t = raw.trim();
    let looks_typed = t == "true"
        || t == "false"
        || t.starts_with(['[', '{', '"', '\''])
        || t.parse::<i64>().is_ok()
        || (t.parse::<f64>().is_ok() && t.chars().any(|c| c.is_ascii_digit()) && !t.contains(':'));
    if !looks_typed {
        return Ok(toml::Value::String(raw.to_owned()));
    }
    let doc = format!("v = {t}");
    let mut table: toml::Table =
        toml::from_str(&doc).map_err(|e| format!("value is not valid TOML: {}", e.message()))?;
    Ok(table.remove("v").expect("parsed one key"))
}

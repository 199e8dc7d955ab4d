//! What a configuration error says, and what it never says: the key, where it was set and why
//! it is wrong, with the value of a secret-bearing key (admin tokens, whose tenant-token names
//! are the tokens, `security.master_key`, `store.scylla.password`, secret `kafka.client`
//! properties) replaced by the kind of value given. Deserialisation errors are rebuilt in one
//! place, [`de_error`], so no other path can quote a secret.

use crate::kafka::is_secret_client_property;

/// What went wrong while loading or checking the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML.
    #[error("config file {origin} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        origin: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// An environment variable cannot be mapped onto a key.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Why.
        reason: String,
    },
    /// A key that does not exist.
    #[error("unknown key {key}{}{}", suggestion.as_ref().map(|s| format!(" (did you mean {s}?)")).unwrap_or_default(), origin_suffix(origin))]
    UnknownKey {
        /// The full key path.
        key: String,
        /// The closest known key at that level, when one is close.
        suggestion: Option<String>,
        /// Where the key came from (file or environment variable).
        origin: Option<String>,
    },
    /// A value that is not acceptable: `key = value why` or `key why`.
    #[error("{key} {detail}{}", origin_suffix(origin))]
    Invalid {
        /// The full key path, e.g. `retry.tiers[2]`.
        key: String,
        /// `= "value" why`, or just why.
        detail: String,
        /// Where the key came from (file or environment variable).
        origin: Option<String>,
    },
}

fn origin_suffix(origin: &Option<String>) -> String {
    origin
        .as_ref()
        .map(|o| format!(" (set by {o})"))
        .unwrap_or_default()
}

/// A [`ConfigError::Invalid`] at `key`; where it was set is added by the loader.
pub(super) fn invalid(key: impl Into<String>, detail: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        detail: detail.into(),
        origin: None,
    }
}

/// `line L, column C` of byte `offset` in `text`, for TOML syntax errors.
pub(super) fn line_col(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("line {line}, column {col}")
}

/// How errors tell of a key that holds a secret without showing it.
pub(super) struct SecretPath {
    /// The key as errors name it; never the secret itself (a tenant token is a table key).
    pub(super) shown: String,
    /// What belongs there, for errors about the shape of what was given.
    expected: &'static str,
    /// The error is about a value beside the secret (a tenant token's tenant), which may be
    /// told.
    beside: bool,
}

impl SecretPath {
    /// `message` with anything that could quote the secret replaced by what was expected and
    /// the kind of value given.
    fn untold(&self, message: String) -> String {
        if self.beside {
            return message;
        }
        match unexpected_kind(&message) {
            Some(kind) => format!(
                "expected {}, got {kind} (value not shown: it is a secret)",
                self.expected
            ),
            None if message.contains(['"', '\'', '`']) => {
                format!(
                    "expected {} (value not shown: it is a secret)",
                    self.expected
                )
            }
            None => message,
        }
    }
}

/// The secret-bearing key at `key` (a full path such as `admin.operator_tokens[2]`), if any:
/// admin tokens (the names of `admin.tenant_tokens` are tokens), `security.master_key`,
/// `store.scylla.password`, and secret rdkafka properties under `kafka.client`.
pub(super) fn secret_path(key: &str) -> Option<SecretPath> {
    let secret = |expected| {
        Some(SecretPath {
            shown: key.to_owned(),
            expected,
            beside: false,
        })
    };
    match key {
        "admin.operator_tokens" => secret("a list of tokens"),
        "admin.tenant_tokens" => secret("a table of token = tenant"),
        "security.master_key" => secret("base64 of 32 bytes"),
        "store.scylla.password" => secret("a string"),
        _ if key.starts_with("admin.operator_tokens[") => secret("a token"),
        _ if key.starts_with("admin.tenant_tokens.") => Some(SecretPath {
            shown: "admin.tenant_tokens (a token)".into(),
            expected: "a tenant",
            beside: true,
        }),
        _ => match key.strip_prefix("kafka.client.") {
            Some(prop) if is_secret_client_property(prop) => secret("a string"),
            _ => None,
        },
    }
}

/// The kind of value serde reports in `invalid type: string "...", expected ...` (`a string`),
/// without the value.
fn unexpected_kind(message: &str) -> Option<String> {
    let rest = ["invalid type: ", "invalid value: "]
        .iter()
        .find_map(|p| message.strip_prefix(p))?;
    let kind = rest.split(['"', '\'', '`', ',']).next()?.trim();
    let kind = match kind {
        "" => return None,
        "sequence" => "list",
        "map" => "table",
        k => k,
    };
    let article = if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    Some(format!("{article} {kind}"))
}

/// Turns a deserialisation error at `key` into a [`ConfigError`], recognising unknown keys.
pub(super) fn de_error(key: String, message: String, origin: Option<String>) -> ConfigError {
    // toml appends "\nin `section`" context that the key path already carries.
    let message = message
        .split("\nin `")
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let (key, message) = match secret_path(&key) {
        Some(secret) => {
            let message = secret.untold(message);
            (secret.shown, message)
        }
        None => (key, message),
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let field = rest.split('`').next().unwrap_or("");
        let expected: Vec<&str> = rest
            .split('`')
            .skip(2)
            .step_by(2)
            .map(|s| s.trim())
            .collect();
        let suggestion = expected
            .iter()
            .map(|e| (strsim::jaro_winkler(field, e), *e))
            .filter(|(score, _)| *score >= 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, e)| e.to_owned());
        return ConfigError::UnknownKey {
            key,
            suggestion,
            origin,
        };
    }
    if message.starts_with("= ") {
        return ConfigError::Invalid {
            key,
            detail: message,
            origin,
        };
    }
    ConfigError::Invalid {
        key,
        detail: format!("is wrong: {message}"),
        origin,
    }
}

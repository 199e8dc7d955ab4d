//! `[admin]`: the admin API's listener and bearer tokens, and who a token belongs to.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Deserializer};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::error::{ConfigError, invalid};
use crate::id::Tenant;
use crate::serde_field::addr;

/// Shortest admin token accepted: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest admin token accepted.
pub const MAX_TOKEN_LEN: usize = 1024;

/// A bearer token for the admin API. Wiped on drop, `<redacted>` in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Zeroizing<String>);

impl PartialOrd for Token {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Token {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.as_str().cmp(other.0.as_str())
    }
}

impl Token {
    /// Wraps a token.
    pub fn new(s: impl Into<String>) -> Token {
        Token(Zeroizing::new(s.into()))
    }

    /// Compares with a presented token in constant time (for equal lengths).
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }

    /// The token itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Token::new)
    }
}

/// Why `token` cannot be an admin token, said without the token (`must be 16 to 1024
/// characters (got 5)`), or `None` when it can. Config tokens and `hookline dev --admin-token`
/// pass the same check.
pub fn token_problem(token: &str) -> Option<String> {
    let n = token.chars().count();
    if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&n) {
        return Some(format!(
            "must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters (got {n})"
        ));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("must not contain spaces or control characters".into());
    }
    None
}

/// Who a bearer token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Sees and changes everything.
    Operator,
    /// Sees and changes only its tenant's endpoints and events.
    Tenant(Tenant),
}

/// `[admin]`: the admin API listener and its tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Listen address.
    #[serde(deserialize_with = "addr")]
    pub listen: SocketAddr,
    /// Tokens that see every tenant.
    pub operator_tokens: Vec<Token>,
    /// Token → the one tenant it may act for.
    pub tenant_tokens: BTreeMap<Token, Tenant>,
    /// Where people reach the admin API (and the portal under it), for the portal links it
    /// issues; `http://<listen>` when unset.
    pub public_url: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            operator_tokens: vec![],
            tenant_tokens: BTreeMap::new(),
            public_url: None,
        }
    }
}

impl AdminConfig {
    /// Whom a presented bearer token belongs to. Every configured token is compared, in constant
    /// time each, so the answer's timing does not reveal which one was close.
    pub fn principal(&self, presented: &str) -> Option<Principal> {
        let mut found = None;
        for t in &self.operator_tokens {
            if t.matches(presented) && found.is_none() {
                found = Some(Principal::Operator);
            }
        }
        for (t, tenant) in &self.tenant_tokens {
            if t.matches(presented) && found.is_none() {
                found = Some(Principal::Tenant(tenant.clone()));
            }
        }
        found
    }
}

impl AdminConfig {
    /// The base of the portal links this API issues: `public_url` without a trailing `/`, or
    /// `http://<listen>`.
    pub fn public_base(&self) -> String {
        match &self.public_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("http://{}", self.listen),
        }
    }

    /// Every token usable and none repeated, across operators and tenants.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(u) = &self.public_url {
            check_public_url(u)?;
        }
        let mut seen = BTreeSet::new();
        let check = |key: String, t: &Token, seen: &mut BTreeSet<Token>| {
            if let Some(why) = token_problem(t.expose()) {
                return Err(invalid(key, why));
            }
            if !seen.insert(t.clone()) {
                return Err(invalid(key, "repeats another admin token"));
            }
            Ok(())
        };
        for (i, t) in self.operator_tokens.iter().enumerate() {
            check(format!("admin.operator_tokens[{i}]"), t, &mut seen)?;
        }
        for (t, tenant) in &self.tenant_tokens {
            check(
                format!("admin.tenant_tokens (token for {tenant})"),
                t,
                &mut seen,
            )?;
        }
        Ok(())
    }
}

/// `admin.public_url`: an absolute http(s) URL with a host and no query, fragment or
/// credentials (a link is built by appending `/portal/#token=...`).
fn check_public_url(raw: &str) -> Result<(), ConfigError> {
    let key = "admin.public_url";
    let url =
        url::Url::parse(raw).map_err(|e| invalid(key, format!("= {raw:?} is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(invalid(
            key,
            format!("= {raw:?} must be an http or https URL with a host"),
        ));
    }
    let credentials = !url.username().is_empty() || url.password().is_some();
    if url.query().is_some() || url.fragment().is_some() || credentials {
        return Err(invalid(
            key,
            format!("= {raw:?} must not carry a query, a fragment or credentials"),
        ));
    }
    Ok(())
}

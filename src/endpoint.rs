//! The endpoint model: what a customer registered, as stored and as used.
//!
//! Two forms, so plaintext secrets never reach Kafka:
//! - [`EndpointRecord`] is the stored form, the JSON value of the compacted `hookline.endpoints`
//!   topic (key = endpoint id, tombstone = deleted). Its secrets are [`SealedSecret`]s, sealed
//!   under the master key and bound to (endpoint id, key id).
//! - [`Endpoint`] is the in-memory form the registry's view holds, with opened [`Secret`]s whose
//!   [`SecretMaterial`] prints as `<redacted>`.
//!
//! It also holds the request shapes the admin API accepts ([`CreateEndpoint`], [`PatchEndpoint`],
//! [`RotateSecret`]) and the rules they are checked against; every error names its field.
//!
//! `whsec_` parsing and generation live here for now, minimally; the `signing` module takes them
//! over once both are merged.

use std::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand_core::{OsRng, RngCore};
use serde::{Deserialize, Deserializer, Serialize};
use zeroize::Zeroizing;

use crate::id::{EndpointId, Tenant};
use crate::sealed::{self, MasterKey, SealError};

/// Longest endpoint URL accepted.
pub const MAX_URL_LEN: usize = 2048;
/// Most event-type filters one endpoint may hold.
pub const MAX_EVENT_TYPES: usize = 100;
/// Longest single event-type filter.
pub const MAX_EVENT_TYPE_LEN: usize = 256;
/// Most secrets one endpoint keeps (current plus those still expiring after rotations).
pub const MAX_SECRETS: usize = 10;
/// Longest `disabled_reason`.
pub const MAX_REASON_LEN: usize = 256;
/// Highest per-endpoint `max_in_flight` accepted.
pub const MAX_IN_FLIGHT_CEILING: u32 = 10_000;
/// Fewest random bytes a `whsec_` secret given by a customer must carry.
pub const MIN_SECRET_BYTES: usize = 24;
/// Most bytes a `whsec_` secret may carry (keeps records small; HMAC gains nothing past a block).
pub const MAX_SECRET_BYTES: usize = 64;
/// Random bytes in a generated secret.
pub const GENERATED_SECRET_BYTES: usize = 32;
/// How long the previous secrets keep signing after a rotation when the request does not say.
pub const DEFAULT_OLD_SECRET_GRACE: Duration = Duration::from_secs(24 * 3600);
/// Longest a rotation lets the previous secrets keep signing: long enough for a receiver to
/// deploy the new secret, short enough that a rotation still retires the old one.
pub const MAX_OLD_SECRET_GRACE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Smallest accepted rate limit: one request per 1000 s. Lower rates are a disabled endpoint.
pub const MIN_RATE_PER_S: f64 = 0.001;
/// Largest accepted rate limit.
pub const MAX_RATE_PER_S: f64 = 1_000_000.0;
/// `disabled_reason` when the receiver answered 410 Gone.
pub const DISABLED_GONE: &str = "gone";
/// `disabled_reason` when an operator or tenant disabled the endpoint through the API.
pub const DISABLED_MANUAL: &str = "manual";
const WHSEC_PREFIX: &str = "whsec_";

/// Why an endpoint, a request or a stored record is not acceptable. `Invalid` names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// A field breaks a rule; displayed as `field: why`.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, as named in the API (`url`, `event_types[3]`, `secret`, ...).
        field: String,
        /// What is wrong, for a human.
        reason: String,
    },
    /// A stored secret does not open with the master key (wrong key, or moved between
    /// endpoints).
    #[error("secret {key_id} of endpoint {endpoint} does not open: {source}")]
    Sealed {
        /// The endpoint.
        endpoint: EndpointId,
        /// The secret's key id.
        key_id: String,
        /// Why.
        source: SealError,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> EndpointError {
    EndpointError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// How a secret signs: HMAC-SHA256 (`v1,`) or Ed25519 (`v1a,`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretKind {
    /// Standard Webhooks symmetric signature.
    Hmac,
    /// Standard Webhooks asymmetric signature; the material is the 32-byte private seed.
    Ed25519,
}

/// A secret's id (`k_` + 12 hex chars), shown to receivers in DLQ headers and the API so they
/// can tell which key signed; never secret itself.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct KeyId(String);

impl KeyId {
    /// A fresh key id from the OS RNG.
    pub fn generate() -> KeyId {
        let mut b = [0u8; 6];
        OsRng.fill_bytes(&mut b);
        KeyId(format!(
            "k_{}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        ))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for KeyId {
    type Error = EndpointError;
    fn try_from(s: String) -> Result<KeyId, EndpointError> {
        if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "key_id",
                "must be 1 to 64 printable ASCII characters",
            ));
        }
        Ok(KeyId(s))
    }
}

impl From<KeyId> for String {
    fn from(k: KeyId) -> String {
        k.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({:?})", self.0)
    }
}

/// Raw secret key bytes (HMAC key or Ed25519 seed). Wiped on drop, `<redacted>` in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretMaterial(Zeroizing<Vec<u8>>);

impl SecretMaterial {
    /// Wraps raw key bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> SecretMaterial {
        SecretMaterial(Zeroizing::new(bytes))
    }

    /// `n` random bytes from the OS RNG.
    pub fn generate(n: usize) -> SecretMaterial {
        let mut v = Zeroizing::new(vec![0u8; n]);
        OsRng.fill_bytes(&mut v);
        SecretMaterial(v)
    }

    /// Parses a customer-given `whsec_<base64>` secret of [`MIN_SECRET_BYTES`] to
    /// [`MAX_SECRET_BYTES`] bytes. The error names the field `secret`.
    pub fn parse_whsec(s: &str) -> Result<SecretMaterial, EndpointError> {
        let b64 = s
            .strip_prefix(WHSEC_PREFIX)
            .ok_or_else(|| invalid("secret", "must start with whsec_"))?;
        // With or without `=` padding, as `hookline sign` and `verify` read secrets.
        let bytes = Zeroizing::new(
            crate::signing::KEY_BASE64
                .decode(b64)
                .map_err(|_| invalid("secret", "must be whsec_ followed by base64"))?,
        );
        if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&bytes.len()) {
            return Err(invalid(
                "secret",
                format!(
                    "must carry {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, got {}",
                    bytes.len()
                ),
            ));
        }
        Ok(SecretMaterial(bytes))
    }

    /// The secret as `whsec_<base64>`, the form handed to the customer once.
    pub fn to_whsec(&self) -> Zeroizing<String> {
        Zeroizing::new(format!(
            "{WHSEC_PREFIX}{}",
            STANDARD.encode(self.0.as_slice())
        ))
    }

    /// The raw bytes, for signing.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretMaterial(<redacted>)")
    }
}

/// An opened signing secret: what the signer needs (key id, kind, raw bytes) and when it stops.
#[derive(Debug, Clone, PartialEq)]
pub struct Secret {
    /// Which key this is.
    pub key_id: KeyId,
    /// How it signs.
    pub kind: SecretKind,
    /// The key bytes.
    pub material: SecretMaterial,
    /// When it was added.
    pub created_at: SystemTime,
    /// When it stops signing; `None` while it is current.
    pub expires_at: Option<SystemTime>,
}

impl Secret {
    /// A fresh current HMAC secret with `material`.
    pub fn new_hmac(material: SecretMaterial, now: SystemTime) -> Secret {
        Secret {
            key_id: KeyId::generate(),
            kind: SecretKind::Hmac,
            material,
            created_at: now,
            expires_at: None,
        }
    }

    /// Whether it still signs at `now` (expiry is exclusive: at `expires_at` it is gone).
    pub fn is_active(&self, now: SystemTime) -> bool {
        self.expires_at.is_none_or(|t| now < t)
    }
}

/// A secret as stored: sealed material only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedSecret {
    /// Which key this is.
    pub key_id: KeyId,
    /// How it signs.
    pub kind: SecretKind,
    /// [`sealed::seal`] output, bound to (endpoint id, key id).
    pub sealed: String,
    /// When it was added.
    #[serde(with = "humantime_serde")]
    pub created_at: SystemTime,
    /// When it stops signing.
    #[serde(default, with = "humantime_serde")]
    pub expires_at: Option<SystemTime>,
}

fn secret_aad(endpoint: &EndpointId, key_id: &KeyId) -> Vec<u8> {
    // NUL cannot occur in either id, so the binding is unambiguous.
    format!("hookline/endpoint-secret/v1\0{endpoint}\0{key_id}").into_bytes()
}

/// The stored form of an endpoint: the JSON value in `hookline.endpoints`.
///
/// Unknown fields are tolerated so that an older instance still materialises records written
/// by a newer one during a rolling upgrade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// The endpoint's id (also the record key).
    pub id: EndpointId,
    /// Its owner.
    pub tenant: Tenant,
    /// Where deliveries go.
    pub url: String,
    /// Event-type filters (parsed by the subscription index).
    pub event_types: Vec<String>,
    /// Sealed signing secrets.
    pub secrets: Vec<SealedSecret>,
    /// Per-endpoint concurrency ceiling; the delivery default applies when absent.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// Requests per second; unlimited when absent.
    #[serde(default)]
    pub rate_limit_per_s: Option<f64>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why it is disabled (`gone`, `manual`, ...).
    #[serde(default)]
    pub disabled_reason: Option<String>,
    /// Creation time.
    #[serde(with = "humantime_serde")]
    pub created_at: SystemTime,
    /// Last write time.
    #[serde(with = "humantime_serde")]
    pub updated_at: SystemTime,
    /// Bumped on every write.
    pub version: u64,
}

impl EndpointRecord {
    /// Opens every secret with `key`, checks the fields, and gives the in-memory form.
    pub fn open(self, key: &MasterKey) -> Result<Endpoint, EndpointError> {
        let mut secrets = Vec::with_capacity(self.secrets.len());
        for s in self.secrets {
            let plain = sealed::open(key, &s.sealed, &secret_aad(&self.id, &s.key_id)).map_err(
                |source| EndpointError::Sealed {
                    endpoint: self.id.clone(),
                    key_id: s.key_id.to_string(),
                    source,
                },
            )?;
            secrets.push(Secret {
                key_id: s.key_id,
                kind: s.kind,
                material: SecretMaterial(Zeroizing::new(plain.to_vec())),
                created_at: s.created_at,
                expires_at: s.expires_at,
            });
        }
        let endpoint = Endpoint {
            id: self.id,
            tenant: self.tenant,
            url: self.url,
            event_types: self.event_types,
            secrets,
            max_in_flight: self.max_in_flight,
            rate_limit_per_s: self.rate_limit_per_s,
            enabled: self.enabled,
            disabled_reason: self.disabled_reason,
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
        };
        endpoint.validate()?;
        Ok(endpoint)
    }
}

/// An endpoint in memory, secrets opened. Cloning copies the (wiped-on-drop) secret bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// The endpoint's id.
    pub id: EndpointId,
    /// Its owner.
    pub tenant: Tenant,
    /// Where deliveries go (validated: http(s), host, no userinfo, <= 2048 chars).
    pub url: String,
    /// Event-type filters, as given (the subscription index parses them).
    pub event_types: Vec<String>,
    /// Signing secrets, newest last.
    pub secrets: Vec<Secret>,
    /// Per-endpoint concurrency ceiling; `delivery.max_in_flight` applies when `None`.
    pub max_in_flight: Option<u32>,
    /// Requests per second; unlimited when `None`.
    pub rate_limit_per_s: Option<f64>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why it is disabled.
    pub disabled_reason: Option<String>,
    /// Creation time.
    pub created_at: SystemTime,
    /// Last write time.
    pub updated_at: SystemTime,
    /// Bumped on every write.
    pub version: u64,
}

impl Endpoint {
    /// Builds a new endpoint from a create request: fresh id, version 1, the given secret or a
    /// generated one.
    pub fn create(req: CreateEndpoint, now: SystemTime) -> Result<Endpoint, EndpointError> {
        let material = match req.secret.as_deref() {
            Some(s) => SecretMaterial::parse_whsec(s)?,
            None => SecretMaterial::generate(GENERATED_SECRET_BYTES),
        };
        let endpoint = Endpoint {
            id: EndpointId::generate(),
            tenant: req.tenant,
            url: normalise_url(&req.url)?,
            event_types: req.event_types,
            secrets: vec![Secret::new_hmac(material, now)],
            max_in_flight: req.max_in_flight,
            rate_limit_per_s: req.rate_limit_per_s,
            enabled: true,
            disabled_reason: None,
            created_at: now,
            updated_at: now,
            version: 1,
        };
        endpoint.validate()?;
        Ok(endpoint)
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), EndpointError> {
        normalise_url(&self.url)?;
        validate_event_types(&self.event_types)?;
        validate_max_in_flight(self.max_in_flight)?;
        validate_rate_limit(self.rate_limit_per_s)?;
        if self.secrets.len() > MAX_SECRETS {
            return Err(invalid(
                "secrets",
                format!("at most {MAX_SECRETS} are kept, got {}", self.secrets.len()),
            ));
        }
        if let Some(r) = &self.disabled_reason
            && r.len() > MAX_REASON_LEN
        {
            return Err(invalid(
                "disabled_reason",
                format!("must be at most {MAX_REASON_LEN} bytes"),
            ));
        }
        Ok(())
    }

    /// The secrets that sign at `now` (not expired), oldest first.
    pub fn active_secrets(&self, now: SystemTime) -> impl Iterator<Item = &Secret> {
        self.secrets.iter().filter(move |s| s.is_active(now))
    }

    /// The stored form: every secret sealed afresh under `key`, bound to this endpoint.
    pub fn seal(&self, key: &MasterKey) -> EndpointRecord {
        EndpointRecord {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            url: self.url.clone(),
            event_types: self.event_types.clone(),
            secrets: self
                .secrets
                .iter()
                .map(|s| SealedSecret {
                    key_id: s.key_id.clone(),
                    kind: s.kind,
                    sealed: sealed::seal(
                        key,
                        s.material.expose(),
                        &secret_aad(&self.id, &s.key_id),
                    ),
                    created_at: s.created_at,
                    expires_at: s.expires_at,
                })
                .collect(),
            max_in_flight: self.max_in_flight,
            rate_limit_per_s: self.rate_limit_per_s,
            enabled: self.enabled,
            disabled_reason: self.disabled_reason.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
        }
    }

    /// Applies a patch (all fields optional) and bumps the version. Nothing changes when the
    /// patch is invalid.
    pub fn apply_patch(
        &mut self,
        patch: PatchEndpoint,
        now: SystemTime,
    ) -> Result<(), EndpointError> {
        let mut next = self.clone();
        if let Some(url) = patch.url {
            next.url = normalise_url(&url)?;
        }
        if let Some(types) = patch.event_types {
            next.event_types = types;
        }
        if let Some(m) = patch.max_in_flight {
            next.max_in_flight = m;
        }
        if let Some(r) = patch.rate_limit_per_s {
            next.rate_limit_per_s = r;
        }
        match patch.enabled {
            Some(true) => {
                next.enabled = true;
                next.disabled_reason = None;
            }
            Some(false) if self.enabled => {
                next.enabled = false;
                next.disabled_reason = Some(DISABLED_MANUAL.to_owned());
            }
            _ => {}
        }
        next.validate()?;
        next.touch(now);
        *self = next;
        Ok(())
    }

    /// Rotates the signing secret: the new one (given or generated) becomes current, the
    /// previous ones keep signing until the grace ends, and already-expired ones are dropped.
    /// Returns the new secret's key id.
    pub fn rotate(&mut self, req: RotateSecret, now: SystemTime) -> Result<KeyId, EndpointError> {
        let old_until = old_secrets_until(&req, now)?;
        let material = match req.secret.as_deref() {
            Some(s) => SecretMaterial::parse_whsec(s)?,
            None => SecretMaterial::generate(GENERATED_SECRET_BYTES),
        };
        let mut secrets: Vec<Secret> = self
            .secrets
            .iter()
            .filter(|s| s.is_active(now))
            .cloned()
            .map(|mut s| {
                s.expires_at = Some(s.expires_at.map_or(old_until, |t| t.min(old_until)));
                s
            })
            .filter(|s| s.is_active(now))
            .collect();
        if secrets.len() >= MAX_SECRETS {
            return Err(invalid(
                "secret",
                format!(
                    "{} older secrets are still active; at most {MAX_SECRETS} are kept",
                    secrets.len()
                ),
            ));
        }
        let new = Secret::new_hmac(material, now);
        let key_id = new.key_id.clone();
        secrets.push(new);
        self.secrets = secrets;
        self.touch(now);
        Ok(key_id)
    }

    /// Disables the endpoint with a reason (e.g. [`DISABLED_GONE`] after a 410) and bumps the
    /// version.
    pub fn disable(&mut self, reason: &str, now: SystemTime) {
        self.enabled = false;
        self.disabled_reason = Some(reason.chars().take(MAX_REASON_LEN).collect());
        self.touch(now);
    }

    /// Marks a write: bumps the version and sets `updated_at`.
    pub fn touch(&mut self, now: SystemTime) {
        self.version += 1;
        self.updated_at = now.max(self.created_at);
    }
}

/// When a rotation's previous secrets stop signing: `old_expires_in` from `now`, or
/// `old_expires_at`, at most [`MAX_OLD_SECRET_GRACE`] ahead. `"0s"` retires them at once; a time
/// already past is refused, as it is more likely a typo than a wish to retire them.
fn old_secrets_until(req: &RotateSecret, now: SystemTime) -> Result<SystemTime, EndpointError> {
    let max = humantime::format_duration(MAX_OLD_SECRET_GRACE);
    match (req.old_expires_in, req.old_expires_at) {
        (Some(_), Some(_)) => Err(invalid(
            "old_expires_in",
            "give old_expires_in or old_expires_at, not both",
        )),
        (Some(d), None) if d > MAX_OLD_SECRET_GRACE => {
            Err(invalid("old_expires_in", format!("must be at most {max}")))
        }
        (Some(d), None) => Ok(now + d),
        (None, Some(t)) if t < now => Err(invalid(
            "old_expires_at",
            "is in the past; to stop the previous secrets signing now, give old_expires_in \"0s\"",
        )),
        (None, Some(t)) if t > now + MAX_OLD_SECRET_GRACE => Err(invalid(
            "old_expires_at",
            format!("must be at most {max} from now"),
        )),
        (None, Some(t)) => Ok(t),
        (None, None) => Ok(now + DEFAULT_OLD_SECRET_GRACE),
    }
}

/// Checks an endpoint URL and returns its normalised form.
pub fn normalise_url(raw: &str) -> Result<String, EndpointError> {
    if raw.len() > MAX_URL_LEN {
        return Err(invalid(
            "url",
            format!("must be at most {MAX_URL_LEN} characters"),
        ));
    }
    let url = url::Url::parse(raw).map_err(|e| invalid("url", format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("url", "must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("url", "must have a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("url", "must not contain credentials (user:pass@)"));
    }
    let normalised = String::from(url);
    if normalised.len() > MAX_URL_LEN {
        return Err(invalid(
            "url",
            format!("must be at most {MAX_URL_LEN} characters"),
        ));
    }
    Ok(normalised)
}

fn validate_event_types(types: &[String]) -> Result<(), EndpointError> {
    if types.is_empty() {
        return Err(invalid("event_types", "must not be empty"));
    }
    if types.len() > MAX_EVENT_TYPES {
        return Err(invalid(
            "event_types",
            format!("at most {MAX_EVENT_TYPES} entries, got {}", types.len()),
        ));
    }
    for (i, t) in types.iter().enumerate() {
        if t.is_empty() || t.len() > MAX_EVENT_TYPE_LEN {
            return Err(invalid(
                format!("event_types[{i}]"),
                format!("must be 1 to {MAX_EVENT_TYPE_LEN} bytes"),
            ));
        }
    }
    Ok(())
}

fn validate_max_in_flight(m: Option<u32>) -> Result<(), EndpointError> {
    match m {
        Some(0) => Err(invalid("max_in_flight", "must be at least 1")),
        Some(m) if m > MAX_IN_FLIGHT_CEILING => Err(invalid(
            "max_in_flight",
            format!("must be at most {MAX_IN_FLIGHT_CEILING}"),
        )),
        _ => Ok(()),
    }
}

fn validate_rate_limit(r: Option<f64>) -> Result<(), EndpointError> {
    match r {
        Some(r) if !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&r) => Err(invalid(
            "rate_limit_per_s",
            format!("must be between {MIN_RATE_PER_S} and {MAX_RATE_PER_S} requests per second"),
        )),
        _ => Ok(()),
    }
}

/// `POST /v1/endpoints`: what a tenant may set when registering an endpoint.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// The owner (a tenant token may only name its own tenant; the admin API checks that).
    pub tenant: Tenant,
    /// Where deliveries go.
    pub url: String,
    /// Event-type filters.
    pub event_types: Vec<String>,
    /// Concurrency ceiling.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// Requests per second.
    #[serde(default)]
    pub rate_limit_per_s: Option<f64>,
    /// A `whsec_` secret to use; generated when absent.
    #[serde(default)]
    pub secret: Option<String>,
}

impl fmt::Debug for CreateEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateEndpoint")
            .field("tenant", &self.tenant)
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("max_in_flight", &self.max_in_flight)
            .field("rate_limit_per_s", &self.rate_limit_per_s)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `PATCH /v1/endpoints/{id}`: every field optional; `null` clears the optional limits.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchEndpoint {
    /// New URL.
    #[serde(default)]
    pub url: Option<String>,
    /// New filters (replace the old list).
    #[serde(default)]
    pub event_types: Option<Vec<String>>,
    /// New ceiling; `Some(None)` (JSON `null`) clears it.
    #[serde(default, deserialize_with = "some")]
    pub max_in_flight: Option<Option<u32>>,
    /// New rate; `Some(None)` (JSON `null`) clears it.
    #[serde(default, deserialize_with = "some")]
    pub rate_limit_per_s: Option<Option<f64>>,
    /// Enable (clears the disabled reason) or disable (reason `manual`).
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// Tells "field absent" (outer `None`, via `default`) from "field is null" (`Some(None)`).
fn some<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `POST /v1/endpoints/{id}/secret/rotate`.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// A `whsec_` secret to use; generated when absent.
    #[serde(default)]
    pub secret: Option<String>,
    /// How long the previous secrets keep signing (`"24h"`); default 24 h.
    #[serde(default, with = "humantime_serde")]
    pub old_expires_in: Option<Duration>,
    /// When the previous secrets stop signing (RFC 3339, any offset); exclusive with
    /// `old_expires_in`.
    #[serde(default, deserialize_with = "rfc3339")]
    pub old_expires_at: Option<SystemTime>,
}

/// An RFC 3339 time with any UTC offset (`Z`, `+02:00`), as `occurred_at` and `since` take.
fn rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let time = chrono::DateTime::parse_from_rfc3339(&text).map_err(|e| {
        serde::de::Error::custom(format!(
            "{text:?} is not an RFC 3339 time such as \"2030-01-01T00:00:00Z\" ({e})"
        ))
    })?;
    let utc = time.with_timezone(&chrono::Utc);
    Ok(Some(SystemTime::from(utc)))
}

impl fmt::Debug for RotateSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RotateSecret")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("old_expires_in", &self.old_expires_in)
            .field("old_expires_at", &self.old_expires_at)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn create(json: &str) -> Result<Endpoint, EndpointError> {
        Endpoint::create(serde_json::from_str(json).unwrap(), now())
    }

    fn ok() -> Endpoint {
        create(r#"{"tenant":"acme","url":"https://example.com/hook","event_types":["order.*"]}"#)
            .unwrap()
    }

    fn err(json: &str) -> String {
        create(json).unwrap_err().to_string()
    }

    #[test]
    fn create_generates_a_secret_and_an_id() {
        let e = ok();
        assert!(e.id.as_str().starts_with("ep_"));
        assert_eq!(e.version, 1);
        assert!(e.enabled);
        assert_eq!(e.secrets.len(), 1);
        assert_eq!(e.secrets[0].material.expose().len(), 32);
        assert!(e.secrets[0].key_id.as_str().starts_with("k_"));
        let whsec = e.secrets[0].material.to_whsec();
        assert_eq!(
            SecretMaterial::parse_whsec(&whsec).unwrap(),
            e.secrets[0].material
        );
        // Without its `=` padding, as `hookline sign` and `verify` take it, the same secret.
        let unpadded = whsec.trim_end_matches('=');
        assert_ne!(
            unpadded,
            whsec.as_str(),
            "32 bytes of base64 end in padding"
        );
        assert_eq!(
            SecretMaterial::parse_whsec(unpadded).unwrap(),
            e.secrets[0].material
        );
        assert_eq!(
            SecretMaterial::parse_whsec("whsec_!!!!")
                .unwrap_err()
                .to_string(),
            "secret: must be whsec_ followed by base64"
        );
    }

    #[test]
    fn create_validation_names_the_field() {
        let base = |url: &str, types: &str| {
            format!(r#"{{"tenant":"acme","url":"{url}","event_types":{types}}}"#)
        };
        assert_eq!(
            err(&base("ftp://example.com", r#"["a"]"#)),
            "url: must be http or https"
        );
        assert_eq!(
            err(&base("https://u:p@example.com", r#"["a"]"#)),
            "url: must not contain credentials (user:pass@)"
        );
        assert!(err(&base("not a url", r#"["a"]"#)).starts_with("url: is not a URL"));
        let long = format!("https://example.com/{}", "a".repeat(2048));
        assert!(err(&base(&long, r#"["a"]"#)).starts_with("url: must be at most"));
        assert_eq!(
            err(&base("https://example.com", "[]")),
            "event_types: must not be empty"
        );
        let many = serde_json::to_string(&vec!["a"; 101]).unwrap();
        assert!(err(&base("https://example.com", &many)).starts_with("event_types: at most 100"));
        assert!(err(&base("https://example.com", r#"["a",""]"#)).starts_with("event_types[1]:"));
        let j = r#"{"tenant":"acme","url":"https://example.com","event_types":["a"],"#;
        assert!(err(&format!(r#"{j}"rate_limit_per_s":0}}"#)).starts_with("rate_limit_per_s:"));
        assert!(err(&format!(r#"{j}"max_in_flight":0}}"#)).starts_with("max_in_flight:"));
        assert_eq!(
            err(&format!(r#"{j}"secret":"abc"}}"#)),
            "secret: must start with whsec_"
        );
        let short = format!("whsec_{}", STANDARD.encode([7u8; 16]));
        assert!(err(&format!(r#"{j}"secret":"{short}"}}"#)).contains("24 to 64 bytes, got 16"));
        let given = format!("whsec_{}", STANDARD.encode([7u8; 24]));
        let e = create(&format!(r#"{j}"secret":"{given}"}}"#)).unwrap();
        assert_eq!(e.secrets[0].material.expose(), &[7u8; 24]);
        // Unknown fields are refused at the API edge.
        assert!(
            serde_json::from_str::<CreateEndpoint>(
                r#"{"tenant":"a","url":"https://x","event_types":["a"],"urls":1}"#
            )
            .is_err()
        );
    }

    #[test]
    fn seal_and_open_round_trip_and_bind_to_the_endpoint() {
        let key = MasterKey::generate();
        let e = ok();
        let record = e.seal(&key);
        let json = serde_json::to_string(&record).unwrap();
        let whsec = e.secrets[0].material.to_whsec();
        assert!(!json.contains(whsec.trim_start_matches("whsec_")));
        let back: EndpointRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.clone().open(&key).unwrap(), e);
        // Wrong key.
        assert!(matches!(
            back.clone().open(&MasterKey::generate()),
            Err(EndpointError::Sealed { .. })
        ));
        // A sealed secret moved onto another endpoint does not open.
        let mut moved = back;
        moved.id = EndpointId::parse("ep_other").unwrap();
        assert!(matches!(
            moved.open(&key),
            Err(EndpointError::Sealed { .. })
        ));
    }

    #[test]
    fn debug_never_shows_secret_material() {
        let e = ok();
        let whsec = e.secrets[0].material.to_whsec();
        let dbg = format!("{e:?}");
        assert!(dbg.contains("<redacted>"));
        assert!(!dbg.contains(whsec.trim_start_matches("whsec_")));
        let req: CreateEndpoint = serde_json::from_str(&format!(
            r#"{{"tenant":"a","url":"https://x","event_types":["a"],"secret":"{}"}}"#,
            whsec.as_str()
        ))
        .unwrap();
        assert!(!format!("{req:?}").contains(whsec.as_str()));
    }

    #[test]
    fn patch_bumps_the_version_and_validates() {
        let mut e = ok();
        let p: PatchEndpoint =
            serde_json::from_str(r#"{"max_in_flight":4,"enabled":false}"#).unwrap();
        e.apply_patch(p, now() + Duration::from_secs(1)).unwrap();
        assert_eq!(e.version, 2);
        assert_eq!(e.max_in_flight, Some(4));
        assert!(!e.enabled);
        assert_eq!(e.disabled_reason.as_deref(), Some(DISABLED_MANUAL));
        let p: PatchEndpoint =
            serde_json::from_str(r#"{"max_in_flight":null,"enabled":true}"#).unwrap();
        e.apply_patch(p, now()).unwrap();
        assert_eq!(e.max_in_flight, None);
        assert!(e.enabled && e.disabled_reason.is_none());
        let before = e.clone();
        let p: PatchEndpoint = serde_json::from_str(r#"{"event_types":[]}"#).unwrap();
        assert_eq!(
            e.apply_patch(p, now()).unwrap_err().to_string(),
            "event_types: must not be empty"
        );
        assert_eq!(e, before, "a failed patch changes nothing");
        assert!(serde_json::from_str::<PatchEndpoint>(r#"{"tenant":"b"}"#).is_err());
    }

    #[test]
    fn old_expires_at_takes_any_utc_offset() {
        let at = |json: &str| serde_json::from_str::<RotateSecret>(json).map(|r| r.old_expires_at);
        let utc = at(r#"{"old_expires_at":"2030-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(
            at(r#"{"old_expires_at":"2030-01-01T02:00:00+02:00"}"#).unwrap(),
            utc,
            "the same instant"
        );
        assert_eq!(
            utc.unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000)
        );
        let err = at(r#"{"old_expires_at":"tomorrow"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not an RFC 3339 time"), "{err}");
        assert_eq!(at("{}").unwrap(), None);
        assert_eq!(at(r#"{"old_expires_at":null}"#).unwrap(), None);
    }

    #[test]
    fn rotation_keeps_old_secrets_until_the_grace_ends() {
        let mut e = ok();
        let first = e.secrets[0].key_id.clone();
        let r: RotateSecret = serde_json::from_str(r#"{"old_expires_in":"1h"}"#).unwrap();
        let new = e.rotate(r, now()).unwrap();
        assert_eq!(e.secrets.len(), 2);
        let active = |t| {
            e.active_secrets(t)
                .map(|s| s.key_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(active(now()), vec![first.clone(), new.clone()]);
        assert_eq!(active(now() + Duration::from_secs(3600)), vec![new.clone()]);
        // Rotating after the grace drops the expired secret for good.
        e.rotate(RotateSecret::default(), now() + Duration::from_secs(7200))
            .unwrap();
        assert_eq!(e.secrets.len(), 2);
        assert!(e.secrets.iter().all(|s| s.key_id != first));
        let both: RotateSecret = serde_json::from_str(
            r#"{"old_expires_in":"1h","old_expires_at":"2030-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert!(
            e.rotate(both, now())
                .unwrap_err()
                .to_string()
                .contains("not both")
        );
        // Bounded: repeated rotations with long grace hit the ceiling.
        let mut e = ok();
        for _ in 0..MAX_SECRETS - 1 {
            e.rotate(RotateSecret::default(), now()).unwrap();
        }
        assert!(e.rotate(RotateSecret::default(), now()).is_err());
        assert_eq!(e.secrets.len(), MAX_SECRETS);
    }

    #[test]
    fn disable_records_why() {
        let mut e = ok();
        e.disable(DISABLED_GONE, now());
        assert!(!e.enabled);
        assert_eq!(e.disabled_reason.as_deref(), Some("gone"));
        assert_eq!(e.version, 2);
    }
}

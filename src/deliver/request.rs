//! The signed request of an attempt, and the send plan every attempt to one version of an
//! endpoint shares.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::{ATTEMPT_HEADER, REPLAY_HEADER};
use crate::endpoint::{Endpoint, SecretKind};
use crate::id::EndpointId;
use crate::record::DeliveryRecord;
use crate::sender::{OutboundRequest, Target, standard_headers};
use crate::signing::{Ed25519SigningKey, Signer, SignerKey, SigningKey, SigningSecret};

/// The signing keys of `endpoint`'s secrets active at `now`; a secret whose material is not a
/// key of its kind is left out.
fn signing_keys(endpoint: &Endpoint, now: SystemTime) -> Vec<SignerKey> {
    endpoint
        .active_secrets(now)
        .filter_map(|s| {
            let key: SigningKey = match s.kind {
                SecretKind::Hmac => SigningSecret::from_bytes(s.material.expose()).ok()?.into(),
                SecretKind::Ed25519 => Ed25519SigningKey::from_bytes(s.material.expose())
                    .ok()?
                    .into(),
            };
            Some(SignerKey::new(s.key_id.as_str(), key))
        })
        .collect()
}

/// What every attempt to one version of an endpoint shares: its request target and its signer.
/// Built once per endpoint version (and again when one of its secrets expires), not per
/// attempt: parsing the URL and keying the HMACs cost more than signing one body.
pub(super) struct SendPlan {
    version: u64,
    url_text: String,
    target: Result<Target, String>,
    signer: Option<Signer>,
    key_ids: Vec<String>,
    /// The earliest expiry among the active secrets: from then on the signer is stale.
    valid_until: Option<SystemTime>,
}

impl SendPlan {
    /// The plan for `endpoint` as of `now`.
    pub(super) fn build(endpoint: &Endpoint, now: SystemTime) -> SendPlan {
        let signer = Signer::new(&signing_keys(endpoint, now)).ok();
        let key_ids = signer
            .as_ref()
            .map(|s| s.key_ids().map(str::to_owned).collect())
            .unwrap_or_default();
        SendPlan {
            version: endpoint.version,
            url_text: endpoint.url.clone(),
            target: Target::parse(&endpoint.url).map_err(|e| format!("endpoint URL {e}")),
            signer,
            key_ids,
            valid_until: endpoint
                .active_secrets(now)
                .filter_map(|s| s.expires_at)
                .min(),
        }
    }

    /// Whether this plan still describes `endpoint` at `now`.
    pub(super) fn fits(&self, endpoint: &Endpoint, now: SystemTime) -> bool {
        self.version == endpoint.version
            && self.url_text == endpoint.url
            && self.valid_until.is_none_or(|t| now < t)
    }
}

/// `t` in whole seconds since the Unix epoch (0 before it).
fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Why no request could be built.
pub(super) enum Unsendable {
    /// The endpoint has no active signing secret.
    NoKey,
    /// The endpoint's URL does not parse.
    BadUrl(String),
}

/// A request ready to send, and the ids of the keys that signed it.
pub(super) struct Signed {
    /// The request.
    pub(super) request: OutboundRequest,
    /// The ids of the keys its signature headers carry.
    pub(super) key_ids: Vec<String>,
}

/// Builds the signed request for `record` following `plan`, or the reason none can be sent.
pub(super) fn prepare(
    record: &DeliveryRecord,
    plan: &SendPlan,
    attempt: u32,
    now: SystemTime,
) -> Result<Signed, Unsendable> {
    let signer = plan.signer.as_ref().ok_or(Unsendable::NoKey)?;
    let target = plan.target.clone().map_err(Unsendable::BadUrl)?;
    // Room for every header the request ends with: the signature's three, the attempt, a
    // replay id, and what the sender and the HTTP client add (content type, user agent,
    // authorization, host). A map that fills up is rehashed into one twice its size.
    let mut headers = HeaderMap::with_capacity(10);
    let signed = signer.headers(record.event_id.as_str(), unix_secs(now), &record.body);
    for (name, value) in signed.iter() {
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    headers.insert(
        HeaderName::from_static(ATTEMPT_HEADER),
        HeaderValue::from(attempt),
    );
    if let Some(replay) = record
        .replay_id
        .as_deref()
        .and_then(|r| HeaderValue::try_from(r).ok())
    {
        headers.insert(HeaderName::from_static(REPLAY_HEADER), replay);
    }
    // Added here rather than by the sender, so the attempt log shows the headers as sent.
    standard_headers(&mut headers);
    Ok(Signed {
        request: OutboundRequest {
            target,
            headers,
            body: record.body.clone(),
        },
        key_ids: plan.key_ids.clone(),
    })
}

/// The send plans of the endpoints a stage has sent to, at most
/// [`MAX_ENDPOINT_ENTRIES`](crate::limits::MAX_ENDPOINT_ENTRIES) of them.
#[derive(Default)]
pub(super) struct SendPlans(HashMap<EndpointId, Arc<SendPlan>>);

impl SendPlans {
    /// The send plan for `endpoint`, built when it changed or was never used here.
    pub(super) fn plan(&mut self, endpoint: &Endpoint) -> Arc<SendPlan> {
        let now = SystemTime::now();
        if let Some(plan) = self.0.get(&endpoint.id)
            && plan.fits(endpoint, now)
        {
            return plan.clone();
        }
        if self.0.len() >= crate::limits::MAX_ENDPOINT_ENTRIES {
            self.0.clear();
        }
        let plan = Arc::new(SendPlan::build(endpoint, now));
        self.0.insert(endpoint.id.clone(), plan.clone());
        plan
    }
}

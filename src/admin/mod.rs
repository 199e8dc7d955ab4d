//! The admin API: endpoints, secret rotation, event ingest, delivery history and health, as JSON
//! over HTTP (axum), authenticated with bearer tokens.
//!
//! | Route | |
//! |---|---|
//! | `POST /v1/endpoints` | register (201, with the `whsec_` secret once) |
//! | `GET /v1/endpoints?tenant=&cursor=&limit=` | list, by id |
//! | `GET / PATCH / DELETE /v1/endpoints/{id}` | read, change (`enabled: true` re-enables), delete (204) |
//! | `POST /v1/endpoints/{id}/secrets` | rotate (201, new secret once; old ones expire as asked) |
//! | `GET /v1/endpoints/{id}/deliveries?state=&since=&cursor=&limit=` | history, newest first |
//! | `POST /v1/events` | ingest (202 `{"id"}`, idempotent on `id` within `ingest.dedupe_window`) |
//! | `GET /v1/events?tenant=&type=&since=&until=&cursor=&limit=` | a tenant's events, newest first |
//! | `GET /v1/events/{id}/deliveries` | one row per endpoint the event went to |
//! | `GET /v1/deliveries/{id}` | state, every attempt and the request as sent |
//! | `GET /v1/health`, `GET /v1/health/ready` | liveness; readiness (Kafka, endpoint view) |
//!
//! Every error is `{"code","detail"}` ([`error::ApiError`]); the detail names the field or
//! parameter at fault. An operator token sees every tenant; a tenant token sees its own only,
//! and other tenants' things are 404 to it ([`auth`]). Health routes need no token.
//!
//! Bounds: request bodies are limited to the payload limit plus room for the envelope (413
//! beyond), at most [`MAX_CONCURRENT_REQUESTS`] requests are handled at once (503 `unavailable`
//! beyond, rather than queueing without limit), and each gets [`REQUEST_DEADLINE`] (503 after).
//! The health routes are outside both bounds: they answer at once from memory, and a liveness
//! probe that shared the limit would fail while ingest requests wait on an unreachable Kafka.
//!
//! The state is a set of trait objects ([`EndpointStore`], [`DeliveryStore`],
//! [`events::EventSink`]) so the same router runs over Kafka and ScyllaDB in production and
//! over in-memory implementations in `hookline dev` and the tests.

pub mod auth;
pub mod body;
pub mod deliveries;
pub mod endpoints;
pub mod error;
pub mod event_list;
pub mod events;
pub mod health;
pub mod replays;
pub mod sent;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;

use crate::config::AdminConfig;
use crate::registry::EndpointStore;
use crate::storage::DeliveryStore;

use self::error::ApiError;
use self::events::{EventSink, RecentIds};

/// Requests the API's routes handle at once; beyond it they answer 503 at once. The health
/// probes and the 404 and 405 answers do no I/O and are not counted.
pub const MAX_CONCURRENT_REQUESTS: usize = 512;
/// How long one request may take before it is answered 503.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(30);
/// Room allowed around an event's payload in a request body (ids, tenant, type, time).
pub const BODY_SLACK: usize = 16 * 1024;

/// Everything the handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    /// Endpoint reads (its view) and writes.
    pub endpoints: Arc<dyn EndpointStore>,
    /// Delivery history.
    pub deliveries: Arc<dyn DeliveryStore>,
    /// Where ingested events go.
    pub events: Arc<dyn EventSink>,
    /// The bearer tokens.
    pub auth: Arc<AdminConfig>,
    /// Whether Kafka is reachable; whoever owns the Kafka clients keeps it current.
    pub kafka_ready: watch::Receiver<bool>,
    /// Recently ingested event ids (idempotent ingest).
    pub recent_ids: Arc<RecentIds>,
    /// Within this long of the first, the same (tenant, event id) is the same event
    /// (`ingest.dedupe_window`).
    pub dedupe_window: Duration,
    /// Largest event payload accepted (`http.max_payload_bytes`).
    pub max_payload_bytes: usize,
    /// The sender's rules for endpoint URLs, applied at registration where they need no DNS;
    /// `None` checks the URL's shape only.
    pub url_rules: Option<Arc<UrlRules>>,
    /// Runs the replay routes (`POST /v1/deliveries/{id}/replay`, `POST
    /// /v1/endpoints/{id}/replay`, `POST /v1/replays`); `None` answers 503.
    pub replayer: Option<Arc<dyn crate::replay::ApiReplayer>>,
    permits: Arc<Semaphore>,
}

/// What the sender will refuse about a URL without resolving it: plain `http://` unless the
/// dangerous switch is on, and a literal IP host in a blocked range. Refusing these when an
/// endpoint is registered or changed saves every delivery to it a trip to the DLQ. Host names
/// are still checked only at send time, on every resolved address, since DNS answers change.
#[derive(Debug, Clone)]
pub struct UrlRules {
    /// The SSRF policy (`http.allow_cidrs` allowed on top of the fixed block list).
    pub policy: crate::ssrf::Policy,
    /// `http.dangerous_allow_http`.
    pub allow_http: bool,
}

impl UrlRules {
    /// Checks an already normalised endpoint URL; the error names the `url` field.
    pub fn check(&self, url: &str) -> Result<(), ApiError> {
        use crate::ssrf::{UrlError, check_scheme};
        let parsed = url::Url::parse(url)
            .map_err(|e| ApiError::invalid("url", format!("is not a URL ({e})")))?;
        check_scheme(&parsed, self.allow_http)
            .and_then(|()| self.policy.check_url(&parsed))
            .map_err(|e| {
                let hint = match e {
                    UrlError::InsecureScheme => "; use https, or set http.dangerous_allow_http",
                    UrlError::Blocked(_) => "; http.allow_cidrs can allow a range",
                    UrlError::Invalid(_) => "",
                };
                ApiError::invalid("url", format!("{e}{hint}"))
            })
    }
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("endpoints", &self.endpoints.view())
            .field("auth", &self.auth)
            .field("kafka_ready", &*self.kafka_ready.borrow())
            .field("recent_ids", &self.recent_ids)
            .field("dedupe_window", &self.dedupe_window)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("url_rules", &self.url_rules)
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// A state with the default idempotency memory and the default payload limit (256 KiB;
    /// set `max_payload_bytes` from `config.http.max_payload_bytes`).
    pub fn new(
        endpoints: Arc<dyn EndpointStore>,
        deliveries: Arc<dyn DeliveryStore>,
        events: Arc<dyn EventSink>,
        auth: AdminConfig,
        kafka_ready: watch::Receiver<bool>,
    ) -> AdminState {
        AdminState {
            endpoints,
            deliveries,
            events,
            auth: Arc::new(auth),
            kafka_ready,
            recent_ids: Arc::new(RecentIds::default()),
            dedupe_window: events::DEFAULT_RECENT_TTL,
            max_payload_bytes: crate::input::DEFAULT_MAX_PAYLOAD,
            url_rules: None,
            replayer: None,
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_REQUESTS)),
        }
    }

    /// Sets the payload limit (`http.max_payload_bytes`).
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> AdminState {
        self.max_payload_bytes = bytes;
        self
    }

    /// Runs the replay routes with `replayer`.
    pub fn with_replayer(mut self, replayer: Arc<dyn crate::replay::ApiReplayer>) -> AdminState {
        self.replayer = Some(replayer);
        self
    }

    /// Applies the sender's URL rules at registration (see [`UrlRules`]).
    pub fn with_url_rules(mut self, rules: UrlRules) -> AdminState {
        self.url_rules = Some(Arc::new(rules));
        self
    }

    /// Sets `ingest.dedupe_window`: how long a (tenant, event id) stays one event, in the store
    /// and in this instance's memory of recent ids.
    pub fn with_dedupe_window(mut self, window: Duration) -> AdminState {
        self.dedupe_window = window;
        self.recent_ids = Arc::new(RecentIds::new(events::DEFAULT_RECENT_IDS, window));
        self
    }

    /// Replaces the idempotency memory (tests, or a different size).
    pub fn with_recent_ids(mut self, recent: RecentIds) -> AdminState {
        self.recent_ids = Arc::new(recent);
        self
    }
}

/// The whole API as an axum router.
pub fn router(state: AdminState) -> Router {
    let authenticated = Router::new()
        .route(
            "/v1/endpoints",
            post(endpoints::create).get(endpoints::list),
        )
        .route(
            "/v1/endpoints/{id}",
            get(endpoints::get)
                .patch(endpoints::patch)
                .delete(endpoints::delete),
        )
        .route("/v1/endpoints/{id}/secrets", post(endpoints::rotate))
        .route(
            "/v1/endpoints/{id}/deliveries",
            get(deliveries::by_endpoint),
        )
        .route("/v1/events", post(events::ingest).get(event_list::list))
        .route("/v1/events/{id}/deliveries", get(deliveries::by_event))
        .route("/v1/deliveries/{id}", get(deliveries::get))
        .route("/v1/deliveries/{id}/replay", post(replays::replay_delivery))
        .route("/v1/endpoints/{id}/replay", post(replays::replay_endpoint))
        .route(
            "/v1/replays",
            get(replays::list).post(replays::replay_range),
        )
        // route_layer: only matched routes authenticate, so an unknown path is a plain 404;
        // and the token is checked before any body is read.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        // Outside authentication, so a flood of bad tokens is shed too; the health routes
        // below stay outside it, so requests stuck behind an unreachable Kafka cannot make the
        // liveness probe fail and the kubelet restart a pod that a restart would not help.
        .route_layer(middleware::from_fn_with_state(state.clone(), bound));
    let body_limit = state.max_payload_bytes.saturating_add(BODY_SLACK);
    Router::new()
        .route("/v1/health", get(health::live))
        .route("/v1/health/ready", get(health::ready))
        .merge(authenticated)
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::Extension(body::BodyLimit {
            body: body_limit,
            payload: state.max_payload_bytes,
        }))
        .layer(CatchPanicLayer::custom(panicked))
        .with_state(state)
}

/// A handler that panicked still answers: 500 `internal`, with the panic in the log (and the
/// process, the stages in it included, goes on).
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = crate::telemetry::panic_message(&*panic);
    ApiError::Internal(format!("request handler panicked: {what}")).into_response()
}

/// Sheds load beyond [`MAX_CONCURRENT_REQUESTS`] and cuts requests at [`REQUEST_DEADLINE`], on
/// every route but the health probes.
async fn bound(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let Ok(_permit) = Arc::clone(&state.permits).try_acquire_owned() else {
        return ApiError::Unavailable("too many requests in progress; retry shortly".into())
            .into_response();
    };
    match tokio::time::timeout(REQUEST_DEADLINE, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::Unavailable(format!(
            "the request did not finish within {}s",
            REQUEST_DEADLINE.as_secs()
        ))
        .into_response(),
    }
}

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting and lets
/// requests in progress finish (each is bounded by [`REQUEST_DEADLINE`]).
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

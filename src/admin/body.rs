//! Reading JSON request bodies so that every failure names what is wrong.
//!
//! [`ApiJson`] replaces axum's `Json` extractor: it reads the body under the router's size
//! limit (413 beyond it), refuses bodies that declare a non-JSON content type (415; a missing
//! content type is accepted), and deserialises with the path of the failing field, following
//! axum's split: broken JSON is 400 `bad_request`, JSON of the wrong shape (unknown, missing or
//! mistyped field) is 422 `invalid` naming the field.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use super::error::ApiError;

/// A JSON body deserialised into `T`, with errors that name the field.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read(req, state).await?;
        parse(&bytes).map(ApiJson)
    }
}

/// The size limit the router puts on request bodies, as a request extension: the 413 names it.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    /// Largest body accepted, in bytes.
    pub body: usize,
    /// Largest event payload accepted (`http.max_payload_bytes`), from which `body` is derived.
    pub payload: usize,
}

/// The raw body bytes, content type and size checked; for bodies that may be empty or whose
/// bytes must be kept exactly.
pub async fn read<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    check_content_type(req.headers())?;
    let limit = req.extensions().get::<BodyLimit>().copied();
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(match limit {
                Some(BodyLimit { body, payload }) => format!(
                    "the request body is over {body} bytes, the most this server accepts (an \
                     event's payload may have up to {payload} bytes: http.max_payload_bytes)"
                ),
                None => "the request body is larger than the server accepts".into(),
            })
        } else {
            ApiError::BadRequest(format!("the request body could not be read: {rejection}"))
        }
    })
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(
            "the body must be JSON: send Content-Type: application/json".into(),
        ))
    }
}

/// Deserialises `bytes` as `T`; see the module doc for how failures map.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            Category::Data => shape_error(&path, "body", inner),
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::BadRequest(format!("the body is not valid JSON: {inner}"))
            }
        }
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// Deserialises an already-parsed JSON value as `T`, with the same error mapping as [`parse`]
/// (every failure of a value is a shape failure: 422 naming the field).
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| shape_error(&e.path().to_string(), "body", e.into_inner()))
}

/// A 422 for a value of the wrong shape at `path` (serde_path_to_error's form; `.` is the
/// whole of it, named `whole`).
fn shape_error(path: &str, whole: &str, error: impl std::fmt::Display) -> ApiError {
    let field = if path == "." { whole } else { path };
    ApiError::invalid(field, error.to_string())
}

/// A query string deserialised into `T`, failures mapped as a body's fields are: an unknown,
/// repeated or mistyped parameter is 422 `invalid` naming it.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let raw = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(ApiQuery)
            .map_err(|e| shape_error(&e.path().to_string(), "query", e.into_inner()))
    }
}

/// A JSON object whose keys are unique: a repeated key is refused as the typed requests refuse
/// a repeated field, instead of the last one silently winning. For handlers that look at a
/// body's fields before deserialising it into its request type.
#[derive(Debug, Clone, Default)]
pub struct UniqueObject(pub serde_json::Map<String, serde_json::Value>);

impl<'de> serde::Deserialize<'de> for UniqueObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UniqueObject;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UniqueObject, A::Error> {
                let mut out = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate field `{key}`"
                        )));
                    }
                    let value = map.next_value()?;
                    out.insert(key, value);
                }
                Ok(UniqueObject(out))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The body's bytes, read as [`read`] does, for a handler that parses them itself (with
/// [`parse`]) after checks that must come first, such as whether the resource exists.
#[derive(Debug, Clone)]
pub struct JsonBytes(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        read(req, state).await.map(JsonBytes)
    }
}

/// Like [`ApiJson`], but an empty (or all-whitespace) body gives `T::default()`: for requests
/// whose every field is optional, such as a secret rotation.
#[derive(Debug, Clone)]
pub struct OptionalJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = read(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        parse(&bytes).map(OptionalJson)
    }
}

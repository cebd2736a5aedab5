//! Keystone v3 token issue, caching and catalog lookup.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use url::Url;

use super::{AuthError, AuthOptions, AuthType, ClientOptions, Interface, Secret};

/// Re-authenticate this long before the token expires, so that no request is sent with a token about to expire.
const EXPIRY_MARGIN: Duration = Duration::from_secs(120);

/// What a request needs: where to send it and which token to send.
#[derive(Clone, Debug)]
pub(crate) struct AuthState {
    pub token: Option<Secret>,
    pub endpoint: Url,
}

pub(crate) enum Authenticator {
    NoAuth { endpoint: Url },
    Keystone(Box<Keystone>),
}

pub(crate) struct Keystone {
    http: reqwest::Client,
    tokens_url: Url,
    body: Value,
    region: Option<String>,
    interface: Interface,
    endpoint_override: Option<Url>,
    /// Catalog `type` of the service this authenticator finds the endpoint of (`network`, `load-balancer`).
    service_type: &'static str,
    /// Held across the Keystone call so that concurrent requests wait for one re-auth instead of each doing one.
    cache: Mutex<Option<Cached>>,
}

struct Cached {
    token: Secret,
    endpoint: Url,
    refresh_at: Instant,
}

/// Parse an endpoint and give it a trailing slash, so that `Url::join` appends instead of replacing the last segment.
pub(crate) fn parse_base_url(option: &'static str, raw: &str) -> Result<Url, AuthError> {
    let mut s = raw.trim().to_owned();
    if !s.ends_with('/') {
        s.push('/');
    }
    let url = Url::parse(&s).map_err(|e| AuthError::InvalidOption {
        option,
        message: format!("{raw:?}: {e}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(AuthError::InvalidOption {
            option,
            message: format!("{raw:?}: scheme must be http or https"),
        });
    }
    Ok(url)
}

impl Authenticator {
    pub(crate) fn new(
        opts: &ClientOptions,
        http: reqwest::Client,
        service_type: &'static str,
    ) -> Result<Self, AuthError> {
        let endpoint_override = opts
            .endpoint_override
            .as_deref()
            .map(|e| parse_base_url("endpoint_override", e))
            .transpose()?;
        let a = &opts.auth;
        if a.auth_type == AuthType::NoAuth {
            let endpoint =
                endpoint_override.ok_or(AuthError::MissingOption("endpoint_override", AuthType::NoAuth))?;
            return Ok(Self::NoAuth { endpoint });
        }
        let auth_url = a
            .auth_url
            .as_deref()
            .ok_or(AuthError::MissingOption("auth_url", a.auth_type))?;
        let base = parse_base_url("auth_url", auth_url)?;
        // auth_url is given with or without the /v3 suffix in the wild.
        let tokens_path = if base.path().trim_end_matches('/').ends_with("/v3") {
            "auth/tokens"
        } else {
            "v3/auth/tokens"
        };
        let tokens_url = base.join(tokens_path).map_err(|e| AuthError::InvalidOption {
            option: "auth_url",
            message: e.to_string(),
        })?;
        Ok(Self::Keystone(Box::new(Keystone {
            http,
            tokens_url,
            body: request_body(a)?,
            region: opts.region_name.clone(),
            interface: opts.interface,
            endpoint_override,
            service_type,
            cache: Mutex::new(None),
        })))
    }

    /// The token and endpoint to use now; authenticates when there is no valid cached token.
    pub(crate) async fn current(&self) -> Result<AuthState, AuthError> {
        match self {
            Self::NoAuth { endpoint } => Ok(AuthState {
                token: None,
                endpoint: endpoint.clone(),
            }),
            Self::Keystone(k) => k.current().await,
        }
    }

    /// Forget `token` after Neutron rejected it with 401 (unless another task already replaced it).
    pub(crate) async fn invalidate(&self, token: &Secret) {
        if let Self::Keystone(k) = self {
            let mut cache = k.cache.lock().await;
            if cache.as_ref().is_some_and(|c| &c.token == token) {
                *cache = None;
            }
        }
    }
}

impl Keystone {
    async fn current(&self) -> Result<AuthState, AuthError> {
        let mut cache = self.cache.lock().await;
        if let Some(c) = cache.as_ref()
            && Instant::now() < c.refresh_at
        {
            return Ok(AuthState {
                token: Some(c.token.clone()),
                endpoint: c.endpoint.clone(),
            });
        }
        let fresh = self.issue().await?;
        let state = AuthState {
            token: Some(fresh.token.clone()),
            endpoint: fresh.endpoint.clone(),
        };
        *cache = Some(fresh);
        Ok(state)
    }

    async fn issue(&self) -> Result<Cached, AuthError> {
        let started = Instant::now();
        let resp = self
            .http
            .post(self.tokens_url.clone())
            .json(&self.body)
            .send()
            .await
            .map_err(|source| AuthError::Connection {
                url: self.tokens_url.to_string(),
                source,
            })?;
        let status = resp.status().as_u16();
        let token = resp
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(Secret::new);
        let text = resp.text().await.map_err(|source| AuthError::Connection {
            url: self.tokens_url.to_string(),
            source,
        })?;
        tracing::debug!(url = %self.tokens_url, status, latency_ms = started.elapsed().as_millis() as u64, "keystone token request");
        if !(200..300).contains(&status) {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| {
                    v.pointer("/error/message")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| text.chars().take(200).collect());
            return Err(AuthError::Rejected { status, message });
        }
        let token = token.ok_or_else(|| AuthError::InvalidResponse("no X-Subject-Token header".into()))?;
        let body: TokenBody = serde_json::from_str(&text)
            .map_err(|e| AuthError::InvalidResponse(format!("token body: {e}")))?;
        let endpoint = match &self.endpoint_override {
            Some(e) => e.clone(),
            None => select_endpoint(
                &body.token.catalog,
                self.service_type,
                self.region.as_deref(),
                self.interface,
            )?,
        };
        let lifetime = body
            .token
            .expires_at
            .map(|exp| {
                (exp - chrono::Utc::now())
                    .to_std()
                    .map_err(|_| AuthError::InvalidResponse(format!("token already expired at {exp}")))
            })
            .transpose()?
            .unwrap_or(Duration::from_secs(3600));
        // Short-lived tokens: refresh at half-life rather than never using the token.
        let margin = EXPIRY_MARGIN.min(lifetime / 2);
        Ok(Cached {
            token,
            endpoint,
            refresh_at: Instant::now() + (lifetime - margin),
        })
    }
}

/// A domain by id or name.
fn domain(id: &Option<String>, name: &Option<String>) -> Option<Value> {
    match (id, name) {
        (Some(id), _) => Some(json!({ "id": id })),
        (None, Some(name)) => Some(json!({ "name": name })),
        (None, None) => None,
    }
}

/// The user by id, or by name with its domain (what `auth_type` `t` needs).
fn user_ref(a: &AuthOptions, t: AuthType) -> Result<serde_json::Map<String, Value>, AuthError> {
    let mut user = serde_json::Map::new();
    match (&a.user_id, &a.username) {
        (Some(id), _) => {
            user.insert("id".into(), json!(id));
        }
        (None, Some(name)) => {
            user.insert("name".into(), json!(name));
            let d = domain(&a.user_domain_id, &a.user_domain_name)
                .ok_or(AuthError::MissingOption("user_domain_name", t))?;
            user.insert("domain".into(), d);
        }
        (None, None) => return Err(AuthError::MissingOption("username", t)),
    }
    Ok(user)
}

fn request_body(a: &AuthOptions) -> Result<Value, AuthError> {
    match a.auth_type {
        AuthType::Password => {
            let password = a
                .password
                .as_ref()
                .ok_or(AuthError::MissingOption("password", AuthType::Password))?;
            let mut user = user_ref(a, AuthType::Password)?;
            user.insert("password".into(), json!(password.expose()));
            let scope = match (&a.project_id, &a.project_name) {
                (Some(id), _) => json!({ "project": { "id": id } }),
                (None, Some(name)) => {
                    let d = domain(&a.project_domain_id, &a.project_domain_name).ok_or(
                        AuthError::MissingOption("project_domain_name", AuthType::Password),
                    )?;
                    json!({ "project": { "name": name, "domain": d } })
                }
                // An unscoped token has no catalog and no Neutron role: refuse early with a clear message.
                (None, None) => return Err(AuthError::MissingOption("project_name", AuthType::Password)),
            };
            Ok(json!({
                "auth": {
                    "identity": { "methods": ["password"], "password": { "user": user } },
                    "scope": scope,
                }
            }))
        }
        AuthType::ApplicationCredential => {
            let t = AuthType::ApplicationCredential;
            let secret = a
                .application_credential_secret
                .as_ref()
                .ok_or(AuthError::MissingOption("application_credential_secret", t))?;
            let cred = match (&a.application_credential_id, &a.application_credential_name) {
                (Some(id), _) => json!({ "id": id, "secret": secret.expose() }),
                (None, Some(name)) => {
                    let user = user_ref(a, t)?;
                    json!({ "name": name, "secret": secret.expose(), "user": user })
                }
                (None, None) => return Err(AuthError::MissingOption("application_credential_id", t)),
            };
            // Application credentials carry their own scope; keystone rejects an explicit one.
            Ok(json!({
                "auth": {
                    "identity": { "methods": ["application_credential"], "application_credential": cred }
                }
            }))
        }
        AuthType::NoAuth => Err(AuthError::InvalidOption {
            option: "auth_type",
            message: "noauth has no Keystone request".into(),
        }),
    }
}

#[derive(Deserialize)]
struct TokenBody {
    token: TokenInfo,
}

#[derive(Deserialize)]
struct TokenInfo {
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    catalog: Vec<CatalogService>,
}

#[derive(Deserialize)]
struct CatalogService {
    #[serde(rename = "type")]
    service_type: String,
    #[serde(default)]
    endpoints: Vec<CatalogEndpoint>,
}

#[derive(Deserialize)]
struct CatalogEndpoint {
    interface: String,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    region_id: Option<String>,
    url: String,
}

fn select_endpoint(
    catalog: &[CatalogService],
    service_type: &'static str,
    region: Option<&str>,
    interface: Interface,
) -> Result<Url, AuthError> {
    let found = catalog
        .iter()
        .filter(|s| s.service_type == service_type)
        .flat_map(|s| s.endpoints.iter())
        .find(|e| {
            e.interface == interface.as_str()
                && region.is_none_or(|r| e.region_id.as_deref() == Some(r) || e.region.as_deref() == Some(r))
        })
        .ok_or_else(|| AuthError::NoEndpoint {
            service_type,
            interface: interface.as_str(),
            region: region.unwrap_or("(any)").to_owned(),
        })?;
    parse_base_url("catalog endpoint", &found.url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_body_by_names() {
        let a = AuthOptions {
            username: Some("u".into()),
            password: Some(Secret::new("p")),
            user_domain_name: Some("UD".into()),
            project_name: Some("proj".into()),
            project_domain_id: Some("pdid".into()),
            ..AuthOptions::default()
        };
        let b = request_body(&a).expect("body");
        assert_eq!(
            b,
            json!({"auth": {
                "identity": {"methods": ["password"], "password": {"user": {"name": "u", "domain": {"name": "UD"}, "password": "p"}}},
                "scope": {"project": {"name": "proj", "domain": {"id": "pdid"}}}
            }})
        );
    }

    #[test]
    fn missing_options_are_named() {
        let a = AuthOptions {
            username: Some("u".into()),
            password: Some(Secret::new("p")),
            user_domain_name: Some("d".into()),
            ..AuthOptions::default()
        };
        let e = request_body(&a).expect_err("no project");
        assert!(e.to_string().contains("project_name"), "{e}");
        let a = AuthOptions {
            auth_type: AuthType::ApplicationCredential,
            application_credential_id: Some("id".into()),
            ..AuthOptions::default()
        };
        let e = request_body(&a).expect_err("no secret");
        assert!(e.to_string().contains("application_credential_secret"), "{e}");
    }

    #[test]
    fn base_url_gets_trailing_slash() {
        let u = parse_base_url("x", "http://h:9696/networking").expect("url");
        assert_eq!(
            u.join("v2.0/ports").expect("join").as_str(),
            "http://h:9696/networking/v2.0/ports"
        );
        assert!(parse_base_url("x", "ftp://h").is_err());
    }
}

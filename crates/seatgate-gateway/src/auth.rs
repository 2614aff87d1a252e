//! Who is asking, decided by the gateway from the bearer credential alone:
//! a gateway token (`sgt_…`, looked up by its SHA-256) or a JWT access token
//! of the configured OpenID Connect issuer (signature by the issuer's JWKS,
//! `iss`, `aud`, `exp`, `nbf`). The caller's application, user and group
//! come from the credential; nothing in a request body can change them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use seatgate_core::db::Db;
use seatgate_core::protocol::valid_id;

use tracing::warn;

use crate::config::OidcSettings;
use crate::error::{read_file, GatewayError};
use crate::tokens::{now_ms, token_hash, TokenCache, TokenStore, TOKEN_PREFIX};

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// What the rate limit counts by: `token:<id>` or `jwt:<sub>`; also the
    /// credential's name in logs (never the credential).
    pub credential: String,
    /// The application it belongs to.
    pub app: String,
    /// Its user, if the credential names one.
    pub user: Option<String>,
    /// Its group, if the credential names one.
    pub group: Option<String>,
}

/// Why a credential was refused: the `reason` label of
/// `seatgate_gateway_auth_failures_total`, and what the 401 says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// A token nobody issued, or one revoked.
    UnknownToken,
    /// A token past its expiry.
    ExpiredToken,
    /// A JWT, but the gateway accepts none (`gateway.oidc.issuer` empty).
    JwtNotAccepted,
    /// A JWT whose signature, issuer, audience, expiry or not-before fails.
    InvalidJwt,
    /// A JWT without a usable user claim, or one naming an id the
    /// protocol does not allow.
    BadClaims,
}

impl AuthFailure {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::UnknownToken => "unknown_token",
            AuthFailure::ExpiredToken => "expired_token",
            AuthFailure::JwtNotAccepted => "jwt_not_accepted",
            AuthFailure::InvalidJwt => "invalid_jwt",
            AuthFailure::BadClaims => "bad_claims",
        }
    }

    /// Every label, so each series exists from the start.
    pub const ALL: [AuthFailure; 6] = [
        AuthFailure::Missing,
        AuthFailure::UnknownToken,
        AuthFailure::ExpiredToken,
        AuthFailure::JwtNotAccepted,
        AuthFailure::InvalidJwt,
        AuthFailure::BadClaims,
    ];

    /// What the 401 tells the caller.
    pub fn detail(self) -> &'static str {
        match self {
            AuthFailure::Missing => "send the credential as `Authorization: Bearer <token>`",
            AuthFailure::UnknownToken => "this token is not known to the gateway (never issued, or revoked): ask your administrator for a new one",
            AuthFailure::ExpiredToken => "this token has expired: ask your administrator for a new one",
            AuthFailure::JwtNotAccepted => "this gateway accepts no JWT access tokens (gateway.oidc.issuer is not set): use a gateway token",
            AuthFailure::InvalidJwt => "the access token failed verification (signature, issuer, audience, expiry or not-before): get a new one from your identity provider",
            AuthFailure::BadClaims => "the access token names no usable user: its user claim must be 1 to 128 characters of A-Z a-z 0-9 . _ - : @",
        }
    }
}

/// Keys by `kid` (keys without one under "").
type KeySet = HashMap<String, (DecodingKey, Algorithm)>;

/// How soon after a fetch an unknown `kid` may fetch the JWKS again.
const REFETCH_AFTER: Duration = Duration::from_secs(10);

/// Verifies JWT access tokens of one issuer, with its keys from a JWKS file
/// (read at start) or URL (fetched at start, every `jwks_refresh_s`, and
/// when a token names a key it lacks, at most every 10 s: an issuer's key
/// rotation is followed without a restart).
pub(crate) struct Oidc {
    settings: OidcSettings,
    keys: std::sync::RwLock<KeySet>,
    http: Option<reqwest::Client>,
    fetched: tokio::sync::Mutex<Option<Instant>>,
}

impl Oidc {
    /// Loads the issuer's keys. A file that cannot be read or parsed stops
    /// the start; a URL that does not answer yet is logged and tried again
    /// (JWTs are refused until it does).
    pub(crate) async fn load(settings: &OidcSettings) -> Result<Arc<Oidc>, GatewayError> {
        let (keys, http) = if settings.jwks_url.is_empty() {
            let raw = read_file("gateway.oidc.jwks_file", &settings.jwks_file)?;
            (parse_jwks(&raw, &settings.jwks_file)?, None)
        } else {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| GatewayError::Config(format!("cannot make the JWKS client: {e}")))?;
            (KeySet::new(), Some(http))
        };
        let oidc = Arc::new(Oidc {
            settings: settings.clone(),
            keys: std::sync::RwLock::new(keys),
            http,
            fetched: tokio::sync::Mutex::new(None),
        });
        if oidc.http.is_some() {
            if let Err(e) = oidc.fetch().await {
                warn!(error = %e, url = %settings.jwks_url, "cannot fetch the issuer's keys yet; JWTs are refused until they are");
            }
        }
        Ok(oidc)
    }

    /// Fetches `jwks_url` and replaces the keys with what it holds.
    async fn fetch(&self) -> Result<(), GatewayError> {
        let Some(http) = &self.http else {
            return Ok(());
        };
        *self.fetched.lock().await = Some(Instant::now());
        let url = &self.settings.jwks_url;
        let fail = |e: String| GatewayError::Config(format!("gateway.oidc.jwks_url {url}: {e}"));
        let response = http.get(url).send().await.map_err(|e| fail(e.to_string()))?;
        if !response.status().is_success() {
            return Err(fail(format!("answered {}", response.status())));
        }
        let raw = response.bytes().await.map_err(|e| fail(e.to_string()))?;
        let keys = parse_jwks(&raw, url)?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = keys;
        Ok(())
    }

    /// Fetches the keys again every `jwks_refresh_s` while the gateway runs.
    pub(crate) fn refresh_periodically(self: &Arc<Oidc>, shutdown: tokio_util::sync::CancellationToken) {
        if self.http.is_none() || self.settings.jwks_refresh_s == 0 {
            return;
        }
        let oidc = Arc::clone(self);
        let every = Duration::from_secs(self.settings.jwks_refresh_s);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                if let Err(e) = oidc.fetch().await {
                    warn!(error = %e, "cannot refresh the issuer's keys; keeping the ones fetched before");
                }
            }
        });
    }

    /// The key for `kid`, fetching the keys again (at most every 10 s)
    /// when a URL is set and it is not among them.
    async fn key(&self, kid: &str) -> Option<(DecodingKey, Algorithm)> {
        let pick = |keys: &KeySet| {
            keys.get(kid)
                .or_else(|| (keys.len() == 1).then(|| keys.values().next()).flatten())
                .cloned()
        };
        if let Some(found) = pick(&self.keys.read().unwrap_or_else(|p| p.into_inner())) {
            return Some(found);
        }
        if self.http.is_some() {
            let recent = self
                .fetched
                .lock()
                .await
                .is_some_and(|at| at.elapsed() < REFETCH_AFTER);
            if !recent {
                if let Err(e) = self.fetch().await {
                    warn!(error = %e, "cannot fetch the issuer's keys for a key it lacks");
                }
                return pick(&self.keys.read().unwrap_or_else(|p| p.into_inner()));
            }
        }
        None
    }

    async fn verify(&self, jwt: &str) -> Result<Caller, AuthFailure> {
        let header = jsonwebtoken::decode_header(jwt).map_err(|_| AuthFailure::InvalidJwt)?;
        let kid = header.kid.unwrap_or_default();
        let (key, alg) = self.key(&kid).await.ok_or(AuthFailure::InvalidJwt)?;
        if header.alg != alg {
            return Err(AuthFailure::InvalidJwt);
        }
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = self.settings.leeway_s;
        let data = jsonwebtoken::decode::<serde_json::Value>(jwt, &key, &validation)
            .map_err(|_| AuthFailure::InvalidJwt)?;
        let claims = data.claims;
        let user = claims
            .get(&self.settings.user_claim)
            .and_then(|v| v.as_str())
            .filter(|u| valid_id(u))
            .ok_or(AuthFailure::BadClaims)?
            .to_owned();
        let group = if self.settings.group_claim.is_empty() {
            None
        } else {
            match claims.get(&self.settings.group_claim) {
                Some(serde_json::Value::String(g)) => Some(g.clone()),
                Some(serde_json::Value::Array(a)) => a.first().and_then(|g| g.as_str()).map(str::to_owned),
                _ => None,
            }
        };
        if group.as_deref().is_some_and(|g| !valid_id(g)) {
            return Err(AuthFailure::BadClaims);
        }
        Ok(Caller {
            credential: format!("jwt:{user}"),
            app: self.settings.application.clone(),
            user: Some(user),
            group,
        })
    }
}

/// The signing keys of a JWKS document from `source` (a file or URL).
fn parse_jwks(raw: &[u8], source: &str) -> Result<KeySet, GatewayError> {
    let set: JwkSet = serde_json::from_slice(raw)
        .map_err(|e| GatewayError::Config(format!("{source} is not a JWKS document: {e}")))?;
    let mut keys = KeySet::new();
    for jwk in &set.keys {
        let Some(alg) = algorithm(jwk) else {
            continue;
        };
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| GatewayError::Config(format!("a key of {source} cannot verify: {e}")))?;
        keys.insert(jwk.common.key_id.clone().unwrap_or_default(), (key, alg));
    }
    if keys.is_empty() {
        return Err(GatewayError::Config(format!(
            "{source} holds no RSA, EC or Ed25519 signing key"
        )));
    }
    Ok(keys)
}

/// The JWS algorithm a JWK is for, from its `alg` or its key type.
fn algorithm(jwk: &Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm};
    if let Some(alg) = jwk.common.key_algorithm {
        return match alg {
            KeyAlgorithm::RS256 => Some(Algorithm::RS256),
            KeyAlgorithm::RS384 => Some(Algorithm::RS384),
            KeyAlgorithm::RS512 => Some(Algorithm::RS512),
            KeyAlgorithm::PS256 => Some(Algorithm::PS256),
            KeyAlgorithm::ES256 => Some(Algorithm::ES256),
            KeyAlgorithm::ES384 => Some(Algorithm::ES384),
            KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
            _ => None,
        };
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
        _ => None,
    }
}

/// Decides who a bearer credential is.
pub(crate) struct Authenticator {
    tokens: TokenStore,
    cache: TokenCache,
    oidc: Option<Arc<Oidc>>,
}

impl Authenticator {
    pub(crate) fn new(tokens: TokenStore, cache_ttl: Duration, oidc: Option<Arc<Oidc>>) -> Authenticator {
        Authenticator {
            tokens,
            cache: TokenCache::new(cache_ttl),
            oidc,
        }
    }

    /// The caller `authorization` (the header's value, if any) names; a
    /// Redis failure is an `Err(Err(_))` (the caller hears 503, not 401).
    pub(crate) async fn authenticate(
        &self,
        db: &Db,
        authorization: Option<&str>,
    ) -> Result<Caller, Result<AuthFailure, GatewayError>> {
        let credential = authorization
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .ok_or(Ok(AuthFailure::Missing))?;
        if credential.starts_with(TOKEN_PREFIX) {
            return self.token(db, credential).await;
        }
        if credential.split('.').count() == 3 {
            return match &self.oidc {
                Some(oidc) => oidc.verify(credential).await.map_err(Ok),
                None => Err(Ok(AuthFailure::JwtNotAccepted)),
            };
        }
        Err(Ok(AuthFailure::UnknownToken))
    }

    async fn token(&self, db: &Db, token: &str) -> Result<Caller, Result<AuthFailure, GatewayError>> {
        let hash = token_hash(token);
        let record = match self.cache.get(&hash) {
            Some(record) => record,
            None => {
                let record = self.tokens.lookup(&mut db.clone(), &hash).await.map_err(Err)?;
                self.cache.put(&hash, record.clone());
                record
            }
        };
        let record = record.ok_or(Ok(AuthFailure::UnknownToken))?;
        if record.expired(now_ms()) {
            return Err(Ok(AuthFailure::ExpiredToken));
        }
        Ok(Caller {
            credential: format!("token:{}", record.id),
            app: record.app,
            user: record.user,
            group: record.group,
        })
    }
}

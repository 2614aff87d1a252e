//! Who is asking, decided by the gateway from the bearer credential alone:
//! a gateway token (`sgt_…`, looked up by its SHA-256) or a JWT access token
//! of the configured OpenID Connect issuer (signature by the issuer's JWKS,
//! `iss`, `aud`, `exp`, `nbf`). The caller's application, user and group
//! come from the credential; nothing in a request body can change them.

use std::collections::HashMap;
use std::time::Duration;

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use seatgate_core::db::Db;
use seatgate_core::protocol::valid_id;

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

/// Verifies JWT access tokens of one issuer.
pub(crate) struct Oidc {
    settings: OidcSettings,
    /// Keys by `kid`; keys without one under "".
    keys: HashMap<String, (DecodingKey, Algorithm)>,
}

impl Oidc {
    /// Loads the issuer's keys from `gateway.oidc.jwks_file`.
    pub(crate) fn load(settings: &OidcSettings) -> Result<Oidc, GatewayError> {
        let raw = read_file("gateway.oidc.jwks_file", &settings.jwks_file)?;
        let set: JwkSet = serde_json::from_slice(&raw).map_err(|e| {
            GatewayError::Config(format!(
                "gateway.oidc.jwks_file {} is not a JWKS document: {e}",
                settings.jwks_file
            ))
        })?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let Some(alg) = algorithm(jwk) else {
                continue;
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| {
                GatewayError::Config(format!("a key of gateway.oidc.jwks_file cannot verify: {e}"))
            })?;
            keys.insert(jwk.common.key_id.clone().unwrap_or_default(), (key, alg));
        }
        if keys.is_empty() {
            return Err(GatewayError::Config(format!(
                "gateway.oidc.jwks_file {} holds no RSA, EC or Ed25519 signing key",
                settings.jwks_file
            )));
        }
        Ok(Oidc {
            settings: settings.clone(),
            keys,
        })
    }

    fn verify(&self, jwt: &str) -> Result<Caller, AuthFailure> {
        let header = jsonwebtoken::decode_header(jwt).map_err(|_| AuthFailure::InvalidJwt)?;
        let kid = header.kid.unwrap_or_default();
        let (key, alg) = self
            .keys
            .get(&kid)
            .or_else(|| {
                (self.keys.len() == 1)
                    .then(|| self.keys.values().next())
                    .flatten()
            })
            .ok_or(AuthFailure::InvalidJwt)?;
        if header.alg != *alg {
            return Err(AuthFailure::InvalidJwt);
        }
        let mut validation = Validation::new(*alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = self.settings.leeway_s;
        let data = jsonwebtoken::decode::<serde_json::Value>(jwt, key, &validation)
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
    oidc: Option<Oidc>,
}

impl Authenticator {
    pub(crate) fn new(tokens: TokenStore, cache_ttl: Duration, oidc: Option<Oidc>) -> Authenticator {
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
                Some(oidc) => oidc.verify(credential).map_err(Ok),
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

//! `[gateway]`: where the gateway listens, over what TLS, for which `Host`
//! names, whom it believes (tokens, an OpenID Connect issuer), how fast a
//! credential may ask, and the key that signs borrow tokens. The defaults are
//! in config/default.toml; docs/gateway.md describes each setting.

use std::net::SocketAddr;

use serde::Deserialize;

/// `[gateway]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct GatewaySettings {
    /// The address to listen on (`"127.0.0.1:8443"`).
    pub listen: SocketAddr,
    /// PEM certificate chain for HTTPS. Empty: plain HTTP, which only a
    /// loopback `listen` may use unless `allow_plain_http` says otherwise.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Serve plain HTTP on a non-loopback address (behind a TLS-terminating
    /// proxy on the same host, say). Off: such a `listen` needs TLS.
    pub allow_plain_http: bool,
    /// `Host` names the API answers besides IP addresses and loopback names
    /// (421 otherwise): what DNS rebinding cannot point at it.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed to call from a browser (CORS). Empty: none; no
    /// CORS header is ever sent.
    pub cors_allowed_origins: Vec<String>,
    /// How long a request waits for a worker's answer, ms (504 past it).
    pub reply_timeout_ms: u64,
    /// Largest request body, bytes (413 past it).
    pub max_body_bytes: usize,
    /// Largest request head (line and headers), bytes (431 past it).
    pub max_header_bytes: usize,
    /// Time to send a request's head, and to start the next one on a
    /// kept-alive connection, ms: a slow or idle client is disconnected.
    pub header_read_timeout_ms: u64,
    /// Requests per second one credential may make (429 with `Retry-After`
    /// past it); 0 = no limit.
    pub rate_per_second: u32,
    /// Requests one credential may make at once above `rate_per_second`.
    pub rate_burst: u32,
    /// Failed authentications per minute one client address may make before
    /// it is answered 429 without a look at its credential.
    pub auth_failures_per_minute: u32,
    /// How long a gateway may keep what it read of a token, ms: a revoked
    /// token is refused by every gateway within this.
    pub token_cache_ms: u64,
    /// Most SSE streams open at once (503 past it).
    pub max_event_streams: usize,
    /// A comment line on every open SSE stream this often, ms, so that
    /// proxies keep it.
    pub sse_keepalive_ms: u64,
    /// OpenID Connect access tokens.
    pub oidc: OidcSettings,
    /// Signed borrow tokens.
    pub borrow: BorrowSettings,
}

/// `[gateway.oidc]`: JWT access tokens from one issuer. Off while `issuer` is empty.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct OidcSettings {
    /// The `iss` a token must carry; empty: JWTs are not accepted.
    pub issuer: String,
    /// The `aud` a token must carry (one of them, when it has several).
    pub audience: String,
    /// The issuer's public keys, a JWKS document (RFC 7517) on disk.
    pub jwks_file: String,
    /// The issuer's JWKS URL (its `jwks_uri`), instead of `jwks_file`.
    pub jwks_url: String,
    /// How often the keys of `jwks_url` are fetched again, seconds (0: only
    /// at start and when a token names a key they lack).
    pub jwks_refresh_s: u64,
    /// The application a JWT's caller belongs to (one of
    /// `stream.applications` when that is set).
    pub application: String,
    /// The claim naming the user (`sub`).
    pub user_claim: String,
    /// The claim naming the user's group (a string, or an array whose first
    /// entry is taken); empty: JWT callers send no group.
    pub group_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, seconds.
    pub leeway_s: u64,
}

/// `[gateway.borrow]`: the Ed25519 key that signs borrow tokens.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BorrowSettings {
    /// PKCS#8 PEM Ed25519 private key (`seatgate gateway keygen`). Empty: a
    /// borrow through the gateway is refused (no token could be signed).
    pub signing_key_file: String,
    /// Older public keys still published at `/.well-known/jwks.json` during
    /// a rotation: PEM files (SPKI `PUBLIC KEY` or a PKCS#8 private key).
    pub previous_key_files: Vec<String>,
    /// The `iss` of borrow tokens.
    pub issuer: String,
}

impl GatewaySettings {
    /// What is wrong with these settings, if anything: one line naming the
    /// setting.
    pub fn validate(&self) -> Result<(), String> {
        let tls = !self.tls_cert_file.is_empty() || !self.tls_key_file.is_empty();
        if tls && (self.tls_cert_file.is_empty() || self.tls_key_file.is_empty()) {
            return Err("gateway.tls_cert_file and gateway.tls_key_file go together: set both, or neither for plain HTTP on loopback".into());
        }
        if !tls && !self.listen.ip().is_loopback() && !self.allow_plain_http {
            return Err(format!(
                "gateway.listen {} is not a loopback address: set gateway.tls_cert_file and gateway.tls_key_file (HTTPS), or gateway.allow_plain_http = true behind a TLS proxy",
                self.listen
            ));
        }
        for (name, value) in [
            ("gateway.reply_timeout_ms", self.reply_timeout_ms),
            ("gateway.header_read_timeout_ms", self.header_read_timeout_ms),
            ("gateway.sse_keepalive_ms", self.sse_keepalive_ms),
        ] {
            if value == 0 {
                return Err(format!("{name} must be above 0"));
            }
        }
        if self.max_body_bytes < 256 || self.max_header_bytes < 1024 {
            return Err(
                "gateway.max_body_bytes must be at least 256 and gateway.max_header_bytes at least 1024"
                    .into(),
            );
        }
        if self.rate_per_second > 0 && self.rate_burst == 0 {
            return Err("gateway.rate_burst must be at least 1 while gateway.rate_per_second is set".into());
        }
        if self.auth_failures_per_minute == 0 {
            return Err("gateway.auth_failures_per_minute must be at least 1".into());
        }
        let o = &self.oidc;
        if !o.issuer.is_empty() {
            if o.jwks_file.is_empty() == o.jwks_url.is_empty() {
                return Err("set one of gateway.oidc.jwks_file and gateway.oidc.jwks_url while gateway.oidc.issuer is".into());
            }
            for (name, value) in [
                ("gateway.oidc.audience", &o.audience),
                ("gateway.oidc.application", &o.application),
                ("gateway.oidc.user_claim", &o.user_claim),
            ] {
                if value.is_empty() {
                    return Err(format!("{name} must be set while gateway.oidc.issuer is"));
                }
            }
        }
        if self.borrow.issuer.is_empty() {
            return Err("gateway.borrow.issuer must not be empty".into());
        }
        Ok(())
    }

    /// Whether the gateway speaks HTTPS.
    pub fn tls(&self) -> bool {
        !self.tls_cert_file.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The shipped defaults (config/default.toml's `[gateway]`), as a test fixture.
    pub(crate) fn defaults() -> GatewaySettings {
        GatewaySettings {
            listen: "127.0.0.1:8443".parse().expect("an address"),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            allow_plain_http: false,
            allowed_hosts: vec![],
            cors_allowed_origins: vec![],
            reply_timeout_ms: 10_000,
            max_body_bytes: 16_384,
            max_header_bytes: 16_384,
            header_read_timeout_ms: 10_000,
            rate_per_second: 20,
            rate_burst: 40,
            auth_failures_per_minute: 30,
            token_cache_ms: 500,
            max_event_streams: 10_000,
            sse_keepalive_ms: 15_000,
            oidc: OidcSettings {
                issuer: String::new(),
                audience: String::new(),
                jwks_file: String::new(),
                jwks_url: String::new(),
                jwks_refresh_s: 300,
                application: String::new(),
                user_claim: "sub".into(),
                group_claim: String::new(),
                leeway_s: 30,
            },
            borrow: BorrowSettings {
                signing_key_file: String::new(),
                previous_key_files: vec![],
                issuer: "seatgate".into(),
            },
        }
    }

    #[test]
    fn plain_http_only_on_loopback_unless_allowed() {
        let mut s = defaults();
        assert_eq!(s.validate(), Ok(()));
        s.listen = "0.0.0.0:8443".parse().expect("an address");
        let e = s.validate().expect_err("plain on every address");
        assert!(e.contains("gateway.tls_cert_file"), "{e}");
        s.allow_plain_http = true;
        assert_eq!(s.validate(), Ok(()));
        s.tls_cert_file = "cert.pem".into();
        let e = s.validate().expect_err("a certificate without its key");
        assert!(e.contains("go together"), "{e}");
    }

    #[test]
    fn an_issuer_needs_its_audience_keys_and_application() {
        let mut s = defaults();
        s.oidc.issuer = "https://id.example".into();
        s.oidc.jwks_file = "jwks.json".into();
        let e = s.validate().expect_err("no audience");
        assert!(e.contains("gateway.oidc.audience"), "{e}");
        s.oidc.audience = "seatgate".into();
        s.oidc.application = "cad".into();
        assert_eq!(s.validate(), Ok(()));
        s.oidc.jwks_url = "https://id.example/jwks".into();
        let e = s.validate().expect_err("a file and a URL");
        assert!(e.contains("one of"), "{e}");
    }
}

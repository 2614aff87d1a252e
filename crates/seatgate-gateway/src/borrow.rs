//! Borrow tokens: a borrowed seat, taken through the gateway, comes with a
//! JWS (compact, `alg` EdDSA, Ed25519) naming the license, user, hardware id,
//! session and expiry, so that a desktop can check offline, with any JOSE
//! library and the keys of `/.well-known/jwks.json`, that it may run until
//! then. Keys are PKCS#8 PEM files (`seatgate gateway keygen`); each key's
//! `kid` is its RFC 7638 thumbprint. Rotation: docs/gateway.md, "Borrow tokens".

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use serde::Serialize;

use crate::config::BorrowSettings;
use crate::error::{read_file, GatewayError};
use crate::tokens::random_bytes;

/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410), before its 32 key bytes.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The claims of a borrow token.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BorrowClaims {
    /// `gateway.borrow.issuer`.
    pub iss: String,
    /// The user (or, for a credential naming none, the application).
    pub sub: String,
    /// Issued at, Unix seconds.
    pub iat: u64,
    /// Not before, Unix seconds (= `iat`).
    pub nbf: u64,
    /// When the borrow ends, Unix seconds: the seat comes back then.
    pub exp: u64,
    /// A unique id.
    pub jti: String,
    /// The license.
    pub license: String,
    /// The application.
    pub app: String,
    /// The session holding the borrowed seat.
    pub session: String,
    /// The machine the borrow is for, as the request named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hardware_id: Option<String>,
}

/// One public key of the JWKS document.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PublicJwk {
    kty: &'static str,
    crv: &'static str,
    x: String,
    kid: String,
    alg: &'static str,
    #[serde(rename = "use")]
    use_: &'static str,
}

impl PublicJwk {
    fn ed25519(public: &[u8]) -> PublicJwk {
        let x = URL_SAFE_NO_PAD.encode(public);
        // RFC 7638: SHA-256 of the required members in lexicographic order.
        let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
        let kid = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()));
        PublicJwk {
            kty: "OKP",
            crv: "Ed25519",
            x,
            kid,
            alg: "EdDSA",
            use_: "sig",
        }
    }

    /// The key's id.
    pub fn kid(&self) -> &str {
        &self.kid
    }
}

/// Signs borrow tokens and publishes the keys that verify them.
pub struct BorrowSigner {
    issuer: String,
    key: EncodingKey,
    kid: String,
    jwks: serde_json::Value,
}

impl BorrowSigner {
    /// Loads `gateway.borrow`; `None` when no signing key is set.
    pub fn load(settings: &BorrowSettings) -> Result<Option<BorrowSigner>, GatewayError> {
        if settings.signing_key_file.is_empty() {
            return Ok(None);
        }
        let pem = read_file("gateway.borrow.signing_key_file", &settings.signing_key_file)?;
        let public = public_of_private(&pem).ok_or_else(|| {
            GatewayError::Config(format!(
                "gateway.borrow.signing_key_file {} is not a PKCS#8 PEM Ed25519 private key: make one with `seatgate gateway keygen`",
                settings.signing_key_file
            ))
        })?;
        let key = EncodingKey::from_ed_pem(&pem).map_err(|e| {
            GatewayError::Config(format!(
                "gateway.borrow.signing_key_file {} cannot sign: {e}",
                settings.signing_key_file
            ))
        })?;
        let current = PublicJwk::ed25519(&public);
        let kid = current.kid.clone();
        let mut keys = vec![current];
        for file in &settings.previous_key_files {
            let pem = read_file("gateway.borrow.previous_key_files", file)?;
            let public = public_of_private(&pem).or_else(|| public_of_spki(&pem)).ok_or_else(|| {
                GatewayError::Config(format!(
                    "gateway.borrow.previous_key_files: {file} is neither an Ed25519 PUBLIC KEY nor a PKCS#8 private key in PEM"
                ))
            })?;
            let jwk = PublicJwk::ed25519(&public);
            if !keys.contains(&jwk) {
                keys.push(jwk);
            }
        }
        Ok(Some(BorrowSigner {
            issuer: settings.issuer.clone(),
            key,
            kid,
            jwks: serde_json::json!({ "keys": keys }),
        }))
    }

    /// `/.well-known/jwks.json`: the signing key's public half first, then the previous ones.
    pub fn jwks(&self) -> &serde_json::Value {
        &self.jwks
    }

    /// A signed token for a borrowed seat.
    #[allow(clippy::too_many_arguments)]
    pub fn sign(
        &self,
        sub: &str,
        app: &str,
        license: &str,
        session: &str,
        hardware_id: Option<&str>,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<(String, BorrowClaims), GatewayError> {
        let jti = URL_SAFE_NO_PAD.encode(random_bytes::<16>()?);
        let claims = BorrowClaims {
            iss: self.issuer.clone(),
            sub: sub.to_owned(),
            iat: now_ms / 1000,
            nbf: now_ms / 1000,
            exp: until_ms / 1000,
            jti,
            license: license.to_owned(),
            app: app.to_owned(),
            session: session.to_owned(),
            hardware_id: hardware_id.map(str::to_owned),
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        header.typ = Some("JWT".into());
        let token = jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| GatewayError::Internal(format!("cannot sign a borrow token: {e}")))?;
        Ok((token, claims))
    }
}

/// The public key of a PKCS#8 PEM Ed25519 private key.
fn public_of_private(pem: &[u8]) -> Option<Vec<u8>> {
    let der = PrivatePkcs8KeyDer::from_pem_slice(pem).ok()?;
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).ok()?;
    Some(pair.public_key().as_ref().to_vec())
}

/// The key of a PEM Ed25519 SubjectPublicKeyInfo (`PUBLIC KEY`).
fn public_of_spki(pem: &[u8]) -> Option<Vec<u8>> {
    let der = SubjectPublicKeyInfoDer::from_pem_slice(pem).ok()?;
    let bytes = der.as_ref();
    (bytes.len() == 44 && bytes[..12] == ED25519_SPKI_PREFIX).then(|| bytes[12..].to_vec())
}

/// A new Ed25519 private key, PKCS#8 PEM (`seatgate gateway keygen`).
pub fn generate_key_pem() -> Result<String, GatewayError> {
    let rng = ring::rand::SystemRandom::new();
    let der = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| GatewayError::Internal("cannot generate an Ed25519 key".into()))?;
    let body = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    Ok(pem)
}

/// The public half of a PKCS#8 PEM Ed25519 private key, as a PEM `PUBLIC KEY`
/// (for `gateway.borrow.previous_key_files` and for desktops that pin a key).
pub fn public_key_pem(private_pem: &[u8]) -> Option<String> {
    let public = public_of_private(private_pem)?;
    let mut der = ED25519_SPKI_PREFIX.to_vec();
    der.extend_from_slice(&public);
    Some(format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(der)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &tempfile::TempDir, previous: &[&str]) -> BorrowSettings {
        let key = dir.path().join("signing.pem");
        std::fs::write(&key, generate_key_pem().expect("a key")).expect("written");
        BorrowSettings {
            signing_key_file: key.to_string_lossy().into_owned(),
            previous_key_files: previous.iter().map(|s| (*s).to_owned()).collect(),
            issuer: "seatgate-test".into(),
        }
    }

    #[test]
    fn a_token_verifies_with_the_published_key_and_not_once_changed() {
        let dir = tempfile::tempdir().expect("a dir");
        let signer = BorrowSigner::load(&settings(&dir, &[]))
            .expect("loads")
            .expect("a signer");
        let (token, claims) = signer
            .sign(
                "ada",
                "cad",
                "cad-pro",
                "ws-1",
                Some("hw-9"),
                1_800_000_000_000,
                1_800_003_600_000,
            )
            .expect("signed");
        assert_eq!(claims.exp - claims.iat, 3600);
        let jwk: jsonwebtoken::jwk::Jwk =
            serde_json::from_value(signer.jwks()["keys"][0].clone()).expect("a JWK");
        let key = jsonwebtoken::DecodingKey::from_jwk(&jwk).expect("a key");
        let mut v = jsonwebtoken::Validation::new(Algorithm::EdDSA);
        v.validate_exp = false;
        v.set_required_spec_claims::<&str>(&[]);
        let data = jsonwebtoken::decode::<serde_json::Value>(&token, &key, &v).expect("verifies");
        assert_eq!(data.claims["hardware_id"], "hw-9");
        assert_eq!(data.header.kid.as_deref(), Some(signer.kid.as_str()));
        // One byte of the payload changed: refused.
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let mut payload = URL_SAFE_NO_PAD.decode(&parts[1]).expect("base64");
        payload[2] ^= 1;
        parts[1] = URL_SAFE_NO_PAD.encode(payload);
        assert!(jsonwebtoken::decode::<serde_json::Value>(&parts.join("."), &key, &v).is_err());
    }

    #[test]
    fn a_previous_key_is_published_after_the_signing_one() {
        let dir = tempfile::tempdir().expect("a dir");
        let old = dir.path().join("old.pem");
        let old_private = generate_key_pem().expect("a key");
        std::fs::write(&old, public_key_pem(old_private.as_bytes()).expect("public")).expect("written");
        let signer = BorrowSigner::load(&settings(&dir, &[&old.to_string_lossy()]))
            .expect("loads")
            .expect("a signer");
        let keys = signer.jwks()["keys"].as_array().expect("keys").clone();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0]["kid"], signer.kid.as_str());
        assert_ne!(keys[0]["kid"], keys[1]["kid"]);
    }

    #[test]
    fn a_file_that_is_no_ed25519_key_is_named() {
        let dir = tempfile::tempdir().expect("a dir");
        let mut s = settings(&dir, &[]);
        std::fs::write(&s.signing_key_file, "not a key").expect("written");
        let e = BorrowSigner::load(&s).err().expect("refused").to_string();
        assert!(
            e.contains("gateway.borrow.signing_key_file") && e.contains("keygen"),
            "{e}"
        );
        s.signing_key_file.clear();
        assert!(BorrowSigner::load(&s).expect("no key").is_none());
    }
}

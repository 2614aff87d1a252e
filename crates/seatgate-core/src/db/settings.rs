//! How to reach Redis: one node or a cluster, the ACL user and its
//! password, TLS files. The server reads it from `[redis]` in its settings;
//! a client program builds it (or takes [`RedisSettings::default`]).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::error::Error;

/// `[redis]`
#[derive(Debug, Clone, Deserialize)]
pub struct RedisSettings {
    /// redis:// URL, or rediss:// for TLS.
    pub url: String,
    /// Timeout of one non-blocking command, ms.
    pub response_timeout_ms: u64,
    /// TCP connect timeout, ms.
    pub connect_timeout_ms: u64,
    /// Seed nodes of a Redis Cluster; non-empty means cluster mode (`url` is then unused).
    #[serde(default)]
    pub cluster_urls: Vec<String>,
    /// ACL user to log in as; empty = the URL's user (or Redis's `default`).
    #[serde(default)]
    pub username: String,
    /// Password, overriding the URL's. Set from `SEATGATE__REDIS__PASSWORD`
    /// (or `password_file`), so that it is on no command line and in no
    /// shared file; secret so that no `Debug` print shows it.
    #[serde(default)]
    pub password: SecretString,
    /// File whose first line is the password; wins over `password`.
    #[serde(default)]
    pub password_file: String,
    /// PEM CA certificate(s) a rediss:// server's certificate must chain to,
    /// for a private CA; empty = the system's trusted roots.
    #[serde(default)]
    pub tls_ca_file: String,
    /// PEM client certificate chain, for servers that require one
    /// (`--tls-auth-clients yes`); empty = none. Goes with `tls_key_file`.
    #[serde(default)]
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`; empty = none.
    #[serde(default)]
    pub tls_key_file: String,
    /// `[redis.sentinel]`: find the master through Redis Sentinel (`url`
    /// is then unused).
    #[serde(default)]
    pub sentinel: SentinelSettings,
}

/// `[redis.sentinel]`: the Sentinels to ask which node is the master of
/// `master_name`. Non-empty `urls` means Sentinel mode. The master is
/// logged in to as `[redis]` says (`username`, `password`), over TLS when
/// the Sentinel URLs are rediss://, with `[redis]`'s TLS files.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SentinelSettings {
    /// Sentinel addresses, `redis://host:26379` (or rediss://); from the
    /// environment a comma-separated list.
    #[serde(default)]
    pub urls: Vec<String>,
    /// The name the Sentinels monitor the master by (`sentinel monitor <name> …`).
    #[serde(default)]
    pub master_name: String,
    /// ACL user to log in to the Sentinels as; empty = the URL's (or none).
    #[serde(default)]
    pub username: String,
    /// Sentinels' password (`requirepass` in sentinel.conf), overriding
    /// the URL's; from `SEATGATE__REDIS__SENTINEL__PASSWORD` or `password_file`.
    #[serde(default)]
    pub password: SecretString,
    /// File whose first line is the Sentinels' password; wins over `password`.
    #[serde(default)]
    pub password_file: String,
}

impl SentinelSettings {
    /// The Sentinel URLs, blanks dropped.
    pub fn nodes(&self) -> Vec<String> {
        trimmed(&self.urls)
    }

    /// The Sentinels' password, if one is set outside the URLs.
    pub fn password(&self) -> Result<Option<SecretString>, Error> {
        read_password("redis.sentinel", &self.password_file, &self.password)
    }
}

impl RedisSettings {
    /// The password to log in with, if one is set outside the URL:
    /// `password_file` first, then `password`.
    pub fn password(&self) -> Result<Option<SecretString>, Error> {
        read_password("redis", &self.password_file, &self.password)
    }

    /// Whether seatgate talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        !self.cluster_nodes().is_empty()
    }

    /// The cluster seed URLs, blanks dropped (an empty variable means none).
    pub fn cluster_nodes(&self) -> Vec<String> {
        trimmed(&self.cluster_urls)
    }

    /// Whether seatgate finds its master through Redis Sentinel.
    pub fn is_sentinel(&self) -> bool {
        !self.is_cluster() && !self.sentinel.nodes().is_empty()
    }

    /// Whether any TLS file is configured.
    pub fn has_tls_files(&self) -> bool {
        [&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file]
            .iter()
            .any(|f| !f.trim().is_empty())
    }

    /// Reads and checks the configured TLS files, the way rustls will use
    /// them: the CA file must hold trust anchors, the client certificate and
    /// key go together and must match. `None` when no file is configured (a
    /// rediss:// URL then trusts the system's roots). Every error names the
    /// setting, so a person knows which file to fix.
    pub fn tls_certificates(&self) -> Result<Option<redis::TlsCertificates>, Error> {
        if !self.has_tls_files() {
            return Ok(None);
        }
        let (cert, key) = (self.tls_cert_file.trim(), self.tls_key_file.trim());
        if cert.is_empty() != key.is_empty() {
            let (set, unset) = if cert.is_empty() {
                ("redis.tls_key_file", "redis.tls_cert_file")
            } else {
                ("redis.tls_cert_file", "redis.tls_key_file")
            };
            return Err(Error::Config(format!(
                "{set} is set but {unset} is not: a client certificate needs both, or neither"
            )));
        }
        let root_cert = match self.tls_ca_file.trim() {
            "" => None,
            path => {
                let (pem, certs) = read_certificates("redis.tls_ca_file", path)?;
                let mut roots = rustls::RootCertStore::empty();
                for c in certs {
                    roots.add(c).map_err(|e| {
                        Error::Config(format!(
                            "redis.tls_ca_file {path:?} holds an unusable CA certificate: {e}"
                        ))
                    })?;
                }
                Some(pem)
            }
        };
        let client_tls = if cert.is_empty() {
            None
        } else {
            let (client_cert, chain) = read_certificates("redis.tls_cert_file", cert)?;
            let (client_key, key_der) = read_private_key("redis.tls_key_file", key)?;
            // The provider the connection uses (db::use_ring_for_tls, where
            // its deprecation in rustls 0.23.48 is explained).
            #[allow(deprecated)]
            let provider = rustls::crypto::ring::default_provider();
            rustls::sign::CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| {
                Error::Config(format!(
                    "redis.tls_cert_file {cert:?} and redis.tls_key_file {key:?} are not a usable pair: {e}"
                ))
            })?;
            Some(redis::ClientTlsConfig {
                client_cert,
                client_key,
            })
        };
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

/// URLs trimmed, blanks dropped (an empty variable means none).
fn trimmed(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect()
}

/// The password set outside a URL: the first line of `file` when one is
/// named, else `password`; `section` names the settings in errors.
fn read_password(section: &str, file: &str, password: &SecretString) -> Result<Option<SecretString>, Error> {
    if !file.is_empty() {
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::Config(format!("cannot read {section}.password_file {file}: {e}")))?;
        let first = text.lines().next().unwrap_or("");
        if first.is_empty() {
            return Err(Error::Config(format!("{section}.password_file {file} is empty")));
        }
        return Ok(Some(SecretString::from(first)));
    }
    let password = password.expose_secret();
    Ok((!password.is_empty()).then(|| SecretString::from(password)))
}

fn read_pem(key: &str, path: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Config(format!("{key} {path:?} cannot be read: {e}")))
}

/// The PEM file at `path` (redis-rs takes PEM) and the certificates in it:
/// at least one, none malformed.
fn read_certificates(key: &str, path: &str) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), Error> {
    let pem = read_pem(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("{key} {path:?} holds a malformed PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{key} {path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok((pem, certs))
}

/// The PEM file at `path` and the private key in it (PKCS#8, PKCS#1 or SEC1).
fn read_private_key(key: &str, path: &str) -> Result<(Vec<u8>, PrivateKeyDer<'static>), Error> {
    let pem = read_pem(key, path)?;
    let der = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| Error::Config(format!("{key} {path:?} holds no usable PEM private key: {e}")))?;
    Ok((pem, der))
}

impl Default for RedisSettings {
    /// The shipped settings' `[redis]` (config/default.toml): one Redis on
    /// `redis://127.0.0.1:6379`, 5 s per command, 2 s to connect, no ACL
    /// user, no TLS files.
    fn default() -> RedisSettings {
        RedisSettings {
            url: "redis://127.0.0.1:6379".to_owned(),
            response_timeout_ms: 5000,
            connect_timeout_ms: 2000,
            cluster_urls: Vec::new(),
            username: String::new(),
            password: SecretString::default(),
            password_file: String::new(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            sentinel: SentinelSettings::default(),
        }
    }
}

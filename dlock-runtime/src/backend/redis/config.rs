//! Configuration of the Redis engines: `redis://`, `rediss://` (one server) and
//! `redis+cluster://`, `rediss+cluster://` (one URL per seed node); node options `db`, `user`,
//! `pass`, and for TLS `ca`, `cert`, `key`. Anything else is a typo, not an option.
//!
//! Invariants: TLS always verifies the server's certificate (the `#insecure` fragment is
//! refused unless built with `tls-insecure-skip-verify`); passwords never leave this module in
//! clear (`Debug` and every message show URLs through [`redact`]).

use std::fmt;

use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use crate::backend::EngineConfig;
pub(crate) use crate::backend::url::redact;
use crate::backend::url::{EngineUrl, redact_pair, split_authority, split_pair, split_tail};
use crate::error::LockError;

/// The query options of a node URL: the redis client's, and those applied here.
pub(crate) const CLIENT_OPTIONS: [&str; 7] =
    ["protocol", "db", "user", "pass", "ca", "cert", "key"];

/// One server or a cluster.
#[derive(Clone)]
pub(crate) enum RedisConfig {
    Single(String),
    Cluster(Vec<String>),
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            Self::Cluster(seeds) => f
                .debug_tuple("Cluster")
                .field(&seeds.iter().map(|s| redact(s)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl RedisConfig {
    /// `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`.
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        let mut config = match url.scheme.strip_suffix("+cluster") {
            Some(node_scheme) => {
                let hosts = url.hosts(&format!("{}://host1:port1,host2:port2,...", url.scheme))?;
                Self::Cluster(node_urls(url, node_scheme, &hosts))
            }
            None => Self::Single(node_urls(url, url.scheme, &[url.base]).remove(0)),
        };
        url.apply_options(&mut config, &CLIENT_OPTIONS)?;
        Ok(Box::new(config))
    }
}

/// One node URL per host: `node_scheme://host`, plus the URL's client options and fragment.
/// A `user:password@` on the first host (`redis+cluster://user:pw@h1,h2`) is given to every
/// host that has none of its own.
pub(crate) fn node_urls(url: &EngineUrl<'_>, node_scheme: &str, hosts: &[&str]) -> Vec<String> {
    let client_options: Vec<&str> = url
        .options
        .iter()
        .copied()
        .filter(|pair| CLIENT_OPTIONS.contains(&split_pair(pair).0))
        .collect();
    let shared_userinfo = hosts
        .first()
        .and_then(|h| h.rsplit_once('@'))
        .map(|(u, _)| u);
    hosts
        .iter()
        .map(|host| {
            let mut node = format!("{node_scheme}://");
            if let Some(userinfo) = shared_userinfo
                && !host.contains('@')
            {
                node.push_str(userinfo);
                node.push('@');
            }
            node.push_str(host);
            if !client_options.is_empty() {
                node.push('?');
                node.push_str(&client_options.join("&"));
            }
            if let Some(fragment) = url.fragment {
                node.push('#');
                node.push_str(fragment);
            }
            node
        })
        .collect()
}

/// A `rediss://` URL needs the `tls` feature; `#insecure` needs `tls-insecure-skip-verify`.
pub(crate) fn check_tls(url: &str) -> Result<(), LockError> {
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(LockError::config(format!(
            "`{}` needs TLS: enable the `tls` feature of dlock-runtime",
            redact(url)
        )));
    }
    if url.ends_with("#insecure") && !cfg!(feature = "tls-insecure-skip-verify") {
        return Err(LockError::config(format!(
            "`{}`: #insecure turns off TLS certificate verification; trust a private CA with `?ca=/path/ca.pem` instead, or enable the `tls-insecure-skip-verify` feature of dlock-runtime",
            redact(url)
        )));
    }
    Ok(())
}

/// The PEM files a `rediss://` node URL names, read.
#[derive(Default, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// Certificate authorities to trust (`ca`), instead of the webpki roots.
    pub(crate) ca: Option<Vec<u8>>,
    /// Client certificate and its private key (`cert`, `key`), for mutual TLS.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    /// The redis client's form.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.ca,
        }
    }
}

/// One node's settings, from its URL: where and how to connect (RESP3, credentials, db) and
/// the TLS files to use.
pub(crate) struct NodeSettings {
    pub(crate) info: ConnectionInfo,
    pub(crate) tls: TlsFiles,
    /// The URL with its secrets redacted, for messages.
    pub(crate) shown: String,
}

impl NodeSettings {
    /// Reads a node URL: `db`, `user`, `pass` are applied to the connection settings and
    /// `ca`, `cert`, `key` files are read (now, so that a missing file is `InvalidConfig` at
    /// build time); `protocol` goes to the redis client; any other option is `InvalidConfig`.
    pub(crate) fn parse(url: &str) -> Result<Self, LockError> {
        let shown = redact(url);
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            LockError::config(format!(
                "bad redis url `{shown}`: expected redis://host:port"
            ))
        })?;
        // The userinfo is taken out here (a password may hold `#`, `?`, `/` or `@`, which
        // the client's URL parser would read as the URL's next part) and given to the
        // client's settings; the options `user` and `pass` override it.
        let (authority, tail) = split_authority(rest);
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority),
        };
        let (path, query, fragment) = split_tail(tail);
        let mut client_url = format!("{scheme}://{host}{path}");
        let mut kept = Vec::new();
        let (user, pass) = match userinfo {
            Some(userinfo) => userinfo.split_once(':').unwrap_or((userinfo, "")),
            None => ("", ""),
        };
        let given = |text: &str| Some(percent_decode(text)).filter(|t| !t.is_empty());
        let (mut user, mut pass, mut db) = (given(user), given(pass), None);
        let (mut ca, mut cert, mut key) = (None, None, None);
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = split_pair(pair);
            let value = || percent_decode(value);
            match name {
                "user" => user = Some(value()),
                "pass" => pass = Some(value()),
                "db" => {
                    db = Some(value().parse::<i64>().map_err(|_| {
                        LockError::config(format!("`db` must be a database number in `{shown}`"))
                    })?);
                }
                "ca" => ca = Some(value()),
                "cert" => cert = Some(value()),
                "key" => key = Some(value()),
                "protocol" => kept.push(pair),
                _ => {
                    return Err(LockError::config(format!(
                        "unknown option `{}` in `{shown}`; a node URL takes {}",
                        redact_pair(pair),
                        CLIENT_OPTIONS.join(", ")
                    )));
                }
            }
        }
        if !kept.is_empty() {
            client_url.push('?');
            client_url.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            client_url.push('#');
            client_url.push_str(fragment);
        }
        let info = client_url
            .as_str()
            .into_connection_info()
            .map_err(|e| LockError::config(format!("bad redis url `{shown}`: {e}")))?;
        let mut settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        if let Some(user) = user {
            settings = settings.set_username(user);
        }
        if let Some(pass) = pass {
            settings = settings.set_password(pass);
        }
        if let Some(db) = db {
            settings = settings.set_db(db);
        }
        let info = info.set_redis_settings(settings);
        let tls = TlsFiles {
            ca: ca
                .map(|path| read_pem(&path, "CA certificates"))
                .transpose()?,
            client: match (cert, key) {
                (None, None) => None,
                (Some(cert), Some(key)) => Some((
                    read_pem(&cert, "client certificate")?,
                    read_pem(&key, "client key")?,
                )),
                _ => {
                    return Err(LockError::config(format!(
                        "`cert` and `key` go together (a client certificate and its private key) in `{shown}`"
                    )));
                }
            },
        };
        if !tls.is_empty() {
            if scheme != "rediss" {
                return Err(LockError::config(format!(
                    "`ca`, `cert` and `key` are TLS options: use a rediss:// URL in `{shown}`"
                )));
            }
            if !cfg!(feature = "tls") {
                return Err(LockError::config(format!(
                    "`{shown}`: `ca`, `cert` and `key` need the `tls` feature of dlock-runtime"
                )));
            }
        }
        Ok(Self { info, tls, shown })
    }

    /// A client for this one node.
    pub(crate) fn client(self) -> Result<redis::Client, LockError> {
        let bad = |e: redis::RedisError| {
            LockError::config(format!("bad redis url `{}`: {e}", self.shown))
        };
        if self.tls.is_empty() {
            return redis::Client::open(self.info.clone()).map_err(bad);
        }
        #[cfg(feature = "tls")]
        {
            redis::Client::build_with_tls(self.info.clone(), self.tls.clone().certificates())
                .map_err(bad)
        }
        #[cfg(not(feature = "tls"))]
        {
            // `parse` refused TLS files without the feature.
            redis::Client::open(self.info.clone()).map_err(bad)
        }
    }
}

/// Reads a PEM file named by a URL option.
fn read_pem(path: &str, what: &str) -> Result<Vec<u8>, LockError> {
    std::fs::read(path)
        .map_err(|e| LockError::config(format!("cannot read the {what} `{path}`: {e}")))
}

/// `%XX` sequences decoded (a password with `&`, `=` or `#` in a query option must be written
/// so); anything else as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;

//! [`RedisServer::start_tls`]: a TLS-only `redis-server` with a self-signed certificate.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::RedisServer;
use crate::process::temp_dir;

impl RedisServer {
    /// Starts a TLS-only server (no plaintext port) on a free loopback port, with a self-signed
    /// certificate for `127.0.0.1` made by the `openssl` CLI in its temp dir, and waits until it
    /// answers `INFO` over TLS. Clients are not asked for a certificate.
    ///
    /// [`url`](RedisServer::url) is then `rediss://127.0.0.1:<port>/#insecure` (certificate
    /// verification off; [`tls_url_verified`](RedisServer::tls_url_verified) keeps it on).
    /// Panics with installation advice when `redis-server` or `openssl` is missing.
    pub fn start_tls() -> RedisServer {
        let dir = temp_dir("dlock-redis-tls-");
        make_self_signed_cert(dir.path());
        let cert = dir.path().join("cert.pem").display().to_string();
        let key = dir.path().join("key.pem").display().to_string();
        RedisServer::launch(dir, true, |port| {
            [
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-auth-clients",
                "no",
                "--tls-cert-file",
                &cert,
                "--tls-key-file",
                &key,
                "--tls-ca-cert-file",
                &cert,
            ]
            .map(str::to_owned)
            .to_vec()
        })
    }

    /// `rediss://127.0.0.1:<port>` without `#insecure`: certificate verification stays on, so a
    /// client that does not trust the self-signed certificate must refuse the server.
    pub fn tls_url_verified(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The self-signed certificate (PEM) of a TLS server.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }
}

/// Writes `cert.pem` and `key.pem` (self-signed, RSA 2048, one day, CN and SAN 127.0.0.1) into
/// `dir` with the `openssl` CLI. Panics with installation advice when `openssl` is missing.
fn make_self_signed_cert(dir: &Path) {
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes"])
        .args(["-keyout", "key.pem", "-out", "cert.pem", "-days", "1"])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "openssl req (self-signed certificate) failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "openssl not found ({e}); the TLS tests need it to make a certificate: \
             install it with `apt-get install -y openssl`"
        ),
    }
}

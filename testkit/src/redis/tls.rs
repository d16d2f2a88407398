//! [`RedisServer::start_tls`]: a TLS-only `redis-server` with a certificate signed by a test
//! certificate authority made for it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::RedisServer;
use crate::process::temp_dir;

impl RedisServer {
    /// Starts a TLS-only server (no plaintext port) on a free loopback port, with a certificate
    /// for `127.0.0.1` signed by a test CA (both made by the `openssl` CLI in its temp dir), and
    /// waits until it answers `INFO` over TLS. Clients are not asked for a certificate.
    ///
    /// [`url`](RedisServer::url) is then `rediss://127.0.0.1:<port>/?ca=<dir>/ca.pem`: the
    /// lock runtime verifies the server against that CA.
    /// [`tls_url_verified`](RedisServer::tls_url_verified) names no CA, so a client must refuse
    /// the server. Panics with installation advice when `redis-server` or `openssl` is missing.
    pub fn start_tls() -> RedisServer {
        let dir = temp_dir("dlock-redis-tls-");
        make_certs(dir.path());
        let cert = dir.path().join("cert.pem").display().to_string();
        let key = dir.path().join("key.pem").display().to_string();
        let dir_ca = dir.path().join("ca.pem").display().to_string();
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
                &dir_ca,
            ]
            .map(str::to_owned)
            .to_vec()
        })
    }

    /// `rediss://127.0.0.1:<port>` naming no CA: verification against the public roots, so a
    /// client must refuse the test CA's certificate.
    pub fn tls_url_verified(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The server's certificate (PEM) of a TLS server.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// The test CA (PEM) that signed a TLS server's certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// `rediss://127.0.0.1:<port>/#insecure`: certificate verification off (for raw test
    /// clients, and to check that the lock runtime refuses it).
    pub fn insecure_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/#insecure", self.port)
    }
}

/// Writes a test CA (`ca.pem`, `ca-key.pem`) and a server certificate it signs (`cert.pem`,
/// `key.pem`; RSA 2048, one day, CN and SAN 127.0.0.1) into `dir` with the `openssl` CLI.
/// Panics with installation advice when `openssl` is missing.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=dlock test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "key.pem",
            "-out",
            "cert.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("cert.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write the certificate extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "cert.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "1",
            "-extfile",
            "cert.ext",
        ],
    );
}

/// Runs `openssl args` in `dir`; panics with its error output or with installation advice.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "openssl {} failed ({}): {}",
            args.first().copied().unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "openssl not found ({e}); the TLS tests need it to make certificates: \
             install it with `apt-get install -y openssl`"
        ),
    }
}

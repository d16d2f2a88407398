//! [`RedisServer::start_tls`]: a TLS-only `redis-server` with a certificate signed by a test
//! certificate authority made for it; [`RedisServer::start_mutual_tls`]: one that also requires
//! a client certificate of that CA (client certificates of it and of another CA are made too).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Access, RedisServer};
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
        let tls_args = tls_args(dir.path(), false);
        RedisServer::launch(
            dir,
            "redis-server (TLS)",
            1,
            |ports| {
                let mut args = ["--port", "0", "--tls-port", &ports[0].to_string()]
                    .map(str::to_owned)
                    .to_vec();
                args.extend(tls_args.iter().cloned());
                args
            },
            |_| Access::Tls,
        )
    }

    /// Starts a server whose TLS port (on [`port`](RedisServer::port)) requires a client
    /// certificate signed by the test CA (`tls-auth-clients yes`: mutual TLS). The kit itself
    /// probes and inspects it through a second, plaintext port on loopback.
    ///
    /// [`url`](RedisServer::url) is `rediss://127.0.0.1:<port>/?ca=…&cert=…&key=…` with a
    /// client certificate of the test CA; [`url_without_client_cert`] names the CA only, and
    /// [`url_with_foreign_client_cert`] presents a certificate of another CA.
    ///
    /// [`url_without_client_cert`]: RedisServer::url_without_client_cert
    /// [`url_with_foreign_client_cert`]: RedisServer::url_with_foreign_client_cert
    pub fn start_mutual_tls() -> RedisServer {
        let dir = temp_dir("dlock-redis-mtls-");
        make_certs(dir.path());
        make_client_cert(dir.path(), "ca", "client");
        make_foreign_client_cert(dir.path());
        let tls_args = tls_args(dir.path(), true);
        RedisServer::launch(
            dir,
            "redis-server (mutual TLS)",
            2,
            |ports| {
                let mut args = [
                    "--tls-port",
                    &ports[0].to_string(),
                    "--port",
                    &ports[1].to_string(),
                ]
                .map(str::to_owned)
                .to_vec();
                args.extend(tls_args.iter().cloned());
                args
            },
            |ports| Access::MutualTls {
                admin_port: ports[1],
            },
        )
    }

    /// `rediss://127.0.0.1:<port>/?ca=<the test CA>`: the server is trusted, but no client
    /// certificate is presented.
    pub fn url_without_client_cert(&self) -> String {
        format!(
            "rediss://127.0.0.1:{}/?ca={}",
            self.port,
            self.ca_path().display()
        )
    }

    /// Like [`url`](RedisServer::url) but with a client certificate signed by another CA,
    /// which a mutual-TLS server must refuse.
    pub fn url_with_foreign_client_cert(&self) -> String {
        format!(
            "rediss://127.0.0.1:{}/?ca={}&cert={}&key={}",
            self.port,
            self.ca_path().display(),
            self.dir.path().join("foreign-client.pem").display(),
            self.dir.path().join("foreign-client-key.pem").display()
        )
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

/// The server's TLS arguments: its certificate and key, the test CA, and whether clients
/// must present a certificate of that CA.
fn tls_args(dir: &Path, auth_clients: bool) -> Vec<String> {
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        "--tls-auth-clients".to_owned(),
        if auth_clients { "yes" } else { "no" }.to_owned(),
        "--tls-cert-file".to_owned(),
        file("cert.pem"),
        "--tls-key-file".to_owned(),
        file("key.pem"),
        "--tls-ca-cert-file".to_owned(),
        file("ca.pem"),
    ]
}

/// Writes a test CA (`ca.pem`, `ca-key.pem`) and a server certificate it signs (`cert.pem`,
/// `key.pem`; RSA 2048, one day, CN and SAN 127.0.0.1) into `dir` with the `openssl` CLI.
/// Panics with installation advice when `openssl` is missing.
fn make_certs(dir: &Path) {
    make_ca(dir, "ca", "/CN=dlock test CA");
    make_signed_cert(
        dir,
        "ca",
        ("cert", "key.pem"),
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    );
}

/// Writes a self-signed CA into `dir`: `<name>.pem` and its key `<name>-key.pem` (RSA 2048,
/// one day, subject `subject`).
fn make_ca(dir: &Path, name: &str, subject: &str) {
    let (cert, key) = (format!("{name}.pem"), format!("{name}-key.pem"));
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &cert,
            "-days", "1", "-subj", subject,
        ],
    );
}

/// Writes into `dir` a certificate `<stem>.pem` with its private key `key` (RSA 2048, one day,
/// subject `subject`, the openssl extension lines `extensions`), signed by the CA `<ca>.pem` /
/// `<ca>-key.pem` there. The request and the extensions stay beside it (`<stem>.csr`,
/// `<stem>.ext`).
fn make_signed_cert(
    dir: &Path,
    ca: &str,
    (stem, key): (&str, &str),
    subject: &str,
    extensions: &str,
) {
    let (csr, ext, cert) = (
        format!("{stem}.csr"),
        format!("{stem}.ext"),
        format!("{stem}.pem"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", &csr, "-subj", subject,
        ],
    );
    std::fs::write(dir.join(&ext), extensions)
        .unwrap_or_else(|e| panic!("write the extensions of {cert}: {e}"));
    let (ca_cert, ca_key) = (format!("{ca}.pem"), format!("{ca}-key.pem"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_cert,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "1",
            "-extfile",
            &ext,
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

/// Writes `<name>.pem` and `<name>-key.pem` into `dir`: a client certificate (RSA 2048, one
/// day, extended key usage clientAuth) signed by the CA `<ca>.pem` / `<ca>-key.pem` there.
fn make_client_cert(dir: &Path, ca: &str, name: &str) {
    let key = format!("{name}-key.pem");
    make_signed_cert(
        dir,
        ca,
        (name, &key),
        "/CN=dlock test client",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    );
}

/// Writes `foreign-client.pem` and `foreign-client-key.pem`: a client certificate signed by
/// another CA (`foreign-ca.pem`), which the test server does not trust.
fn make_foreign_client_cert(dir: &Path) {
    make_ca(dir, "foreign-ca", "/CN=another CA");
    make_client_cert(dir, "foreign-ca", "foreign-client");
}

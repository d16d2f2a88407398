//! Every server process the benchmark starts: `redis-server` (standalone, Redlock nodes, a
//! Cluster), etcd and ZooKeeper, each on a free loopback port with its files in a temporary
//! directory, killed and cleaned up on drop. Their output is discarded.
//!
//! The rest of the program sees only [`Server`] and its [`url`](Server::url), and one function
//! per kind of server; the shared test process kit is meant to take this module's place.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::BoxError;

/// A server process of our own, killed (and its directory removed) on drop.
pub(crate) struct Server {
    child: Child,
    dir: PathBuf,
    url: String,
}

impl Server {
    /// Where clients connect: `redis://127.0.0.1:<port>`, `http://127.0.0.1:<port>` (etcd),
    /// `127.0.0.1:<port>` (ZooKeeper).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Starts `command` (prepared with its files in `dir`) and waits until `port` accepts
    /// connections.
    async fn spawn(
        mut command: Command,
        dir: PathBuf,
        port: u16,
        url: String,
        package: &str,
    ) -> Result<Server, BoxError> {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                let program = command.get_program().display();
                format!("cannot start {program} ({e}); install it: apt-get install -y {package}")
            })?;
        let server = Server { child, dir, url };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("nothing listens on {port} after 30 s").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port and a fresh directory for the server that will listen on it.
fn port_and_dir(name: &str) -> Result<(u16, PathBuf), BoxError> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir =
        std::env::temp_dir().join(format!("dlock-bench-{name}-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok((port, dir))
}

/// A standalone `redis-server` (or `$DLOCK_REDIS_SERVER`) with no persistence.
pub(crate) async fn redis() -> Result<Server, BoxError> {
    redis_with(&[]).await
}

async fn redis_with(extra: &[&str]) -> Result<Server, BoxError> {
    let (port, dir) = port_and_dir("redis")?;
    let mut command =
        Command::new(std::env::var("DLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()));
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .arg("--dir")
        .arg(&dir);
    let url = format!("redis://127.0.0.1:{port}");
    Server::spawn(command, dir, port, url, "redis-server").await
}

/// A three-master Redis Cluster (no replicas), returned once every node reports
/// `cluster_state:ok`.
pub(crate) async fn redis_cluster() -> Result<Vec<Server>, BoxError> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(
            redis_with(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]).await?,
        );
    }
    let addrs = nodes.iter().map(|n| n.url.trim_start_matches("redis://"));
    let status = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !status.success() {
        return Err("redis-cli --cluster create failed".into());
    }
    let started = Instant::now();
    loop {
        let mut ok = true;
        for n in &nodes {
            let client = redis::Client::open(n.url())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut conn)
                .await?;
            ok &= info.contains("cluster_state:ok");
        }
        if ok {
            return Ok(nodes);
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err("cluster did not reach cluster_state:ok within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A single-member etcd (`etcd` or `$DLOCK_ETCD`).
#[cfg(feature = "cp-engines")]
pub(crate) async fn etcd() -> Result<Server, BoxError> {
    let (client, dir) = port_and_dir("etcd")?;
    let peer = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut command = Command::new(std::env::var("DLOCK_ETCD").unwrap_or_else(|_| "etcd".into()));
    command
        .args(["--name", "n0", "--data-dir"])
        .arg(dir.join("data"))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=n0=http://127.0.0.1:{peer}"));
    let url = format!("http://127.0.0.1:{client}");
    Server::spawn(command, dir, client, url, "etcd-server").await
}

/// A standalone ZooKeeper under `java`, with the Debian package's jars or
/// `$DLOCK_ZOOKEEPER_CLASSPATH`; returned once it grants a session.
#[cfg(feature = "cp-engines")]
pub(crate) async fn zookeeper() -> Result<Server, BoxError> {
    let (port, dir) = port_and_dir("zk")?;
    std::fs::write(
        dir.join("zoo.cfg"),
        format!(
            "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=60000\nforceSync=no\n",
            dir.join("data").display()
        ),
    )?;
    let classpath = std::env::var("DLOCK_ZOOKEEPER_CLASSPATH").unwrap_or_else(|_| {
        "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar".into()
    });
    let mut command = Command::new("java");
    command
        .args(["-XX:+UseSerialGC", "-cp", &classpath])
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(dir.join("zoo.cfg"));
    let url = format!("127.0.0.1:{port}");
    let server = Server::spawn(command, dir, port, url, "zookeeper").await?;
    // The port opens before requests are served: wait for a real session.
    let started = Instant::now();
    while zookeeper_client::Client::connect(server.url())
        .await
        .is_err()
    {
        if started.elapsed() > Duration::from_secs(30) {
            return Err("ZooKeeper did not serve within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(server)
}

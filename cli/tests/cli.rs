//! The `dlock` binary run as a process against servers of the testkit: a redis-server (list,
//! show, force-unlock, JSON, exit statuses, passwords) and ZooKeeper (the same commands, and
//! `watch`), with locks held by a runtime of this test standing for another process.

// Test code: a panic is how a check fails (as in the `tests` package, whose lints leave these
// out).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dlock_runtime::{LockGuard, Runtime};
use dlock_testkit::RedisServer;
use dlock_testkit::zookeeper::ZooKeeperServer;
use serde_json::Value;

const LEASE: Duration = Duration::from_secs(30);

/// Runs `dlock` with `args` (and `DLOCK_URL` only when `env_url` is given) to its end.
fn dlock(args: &[&str], env_url: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.args(args).env_remove("DLOCK_URL");
    if let Some(url) = env_url {
        cmd.env("DLOCK_URL", url);
    }
    tokio::task::block_in_place(|| cmd.output()).expect("run dlock")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the exit status, showing the output when it differs.
fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit status; stdout: {} stderr: {}",
        stdout(out),
        stderr(out)
    );
}

/// `key` taken by `rt` with the tests' lease.
async fn hold(rt: &Runtime, key: &str) -> LockGuard {
    rt.lock(key)
        .lease(LEASE)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire {key}: {e}"))
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON document ({e}): {}", stdout(out)))
}

/// The list / show / unlock commands against `url`, where `holder` holds nothing yet.
async fn commands_on(url: &str, holder: &Runtime, fences: bool) {
    let a = hold(holder, "cli:a").await;
    let _b = hold(holder, "cli:b").await;

    let out = dlock(&["--url", url, "list", "cli:"], None);
    assert_exit(&out, 0, "list with locks");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two rows: {text}");
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("TTL"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("cli:a ") && lines[2].starts_with("cli:b "),
        "{text}"
    );
    let owner_at = lines[0].find("OWNER").expect("an OWNER column");
    assert_eq!(
        lines[1].find('…').map(|at| at > owner_at),
        Some(true),
        "the owner column is aligned and redacted: {text}"
    );

    let out = dlock(&["--url", url, "--json", "list"], None);
    assert_exit(&out, 0, "list --json");
    let all = json(&out);
    let keys: Vec<&str> = all
        .as_array()
        .expect("an array")
        .iter()
        .map(|l| l["key"].as_str().expect("key"))
        .collect();
    assert_eq!(keys, ["cli:a", "cli:b"]);

    let out = dlock(&["show", "cli:a", "--json"], Some(url));
    assert_exit(&out, 0, "show --json of a held key (URL from DLOCK_URL)");
    let shown = json(&out);
    assert_eq!(shown["key"], "cli:a");
    let ttl = shown["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(ttl > 0 && ttl <= 30_000, "ttl_ms {ttl}");
    assert_eq!(shown["holds"], 1);
    assert!(shown["owner"].as_str().expect("owner").ends_with('…'));
    let want_fence = if fences { a.fence() } else { None };
    assert_eq!(shown["fence"].as_u64(), want_fence);

    let out = dlock(&["--url", url, "show", "cli:a"], None);
    assert_exit(&out, 0, "show of a held key");
    assert!(
        stdout(&out).contains("key:    cli:a") && stdout(&out).contains("ttl:"),
        "{}",
        stdout(&out)
    );

    let out = dlock(&["--url", url, "show", "cli:none"], None);
    assert_exit(&out, 1, "show of a free key");
    let out = dlock(&["--url", url, "--json", "show", "cli:none"], None);
    assert_exit(&out, 1, "show --json of a free key");
    assert_eq!(json(&out), Value::Null);
    let out = dlock(&["--url", url, "list", "nothing:"], None);
    assert_exit(&out, 1, "list without locks");
    assert_eq!(stdout(&out), "");

    let out = dlock(&["--url", url, "unlock", "cli:a"], None);
    assert_exit(&out, 2, "unlock without --force");
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert!(
        holder.is_locked("cli:a").await.expect("is_locked"),
        "not unlocked"
    );

    let out = dlock(
        &["--url", url, "--json", "unlock", "--force", "cli:a"],
        None,
    );
    assert_exit(&out, 0, "unlock --force of a held key");
    assert_eq!(json(&out)["unlocked"], true);
    assert!(
        !holder.is_locked("cli:a").await.expect("is_locked"),
        "deleted"
    );
    let out = dlock(&["--url", url, "unlock", "--force", "cli:a"], None);
    assert_exit(&out, 1, "unlock --force of a free key");
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_unlock_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Runtime::from_url(&url).await.expect("runtime");
    commands_on(&url, &holder, false).await;

    // --prefix: another runtime prefix sees other locks.
    let other = Runtime::from_url(&format!("{url}?prefix=other:"))
        .await
        .expect("runtime");
    let _held = hold(&other, "cli:x").await;
    let out = dlock(
        &["--url", &url, "--prefix", "other:", "--json", "list"],
        None,
    );
    assert_exit(&out, 0, "list under another prefix");
    assert_eq!(json(&out)[0]["key"], "cli:x");
    assert_eq!(json(&out).as_array().map(Vec::len), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_unlock_on_zookeeper() {
    let server = tokio::task::block_in_place(ZooKeeperServer::start);
    let url = server.url();
    let holder = Runtime::from_url(&url).await.expect("runtime");
    commands_on(&url, &holder, true).await;
}

/// `watch --count 3` prints the key free, then held (with the holder's fence), then free
/// again, one JSON document per line; the TTL shown on ZooKeeper is the session's, so no
/// line comes between. A watch without `--count` stops with exit 0 on SIGINT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_change_on_zookeeper() {
    let server = tokio::task::block_in_place(ZooKeeperServer::start);
    let url = server.url();
    let holder = Runtime::from_url(&url).await.expect("runtime");
    let key = "cli:watched";
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["--url", &url, "--json", "watch", key, "--count", "3"])
        .env_remove("DLOCK_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock watch");
    let stdout = child.stdout.take().expect("stdout");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let next = async |lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>| -> Value {
        let line = tokio::time::timeout(Duration::from_secs(15), lines.recv())
            .await
            .expect("a watch line within 15 s")
            .expect("the watch printed a line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };

    let first = next(&mut lines).await;
    assert_eq!(
        (first["key"].as_str(), first["held"].as_bool()),
        (Some(key), Some(false))
    );
    let guard = hold(&holder, key).await;
    let held = next(&mut lines).await;
    assert_eq!(held["held"], true, "{held}");
    assert_eq!(held["lock"]["fence"].as_u64(), guard.fence());
    guard.release().await.expect("release");
    let freed = next(&mut lines).await;
    assert_eq!(freed["held"], false, "{freed}");
    let status = tokio::task::block_in_place(|| child.wait()).expect("wait");
    assert_eq!(status.code(), Some(0), "watch --count 3 ends after 3 lines");

    let child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["--url", &url, "watch", key])
        .env_remove("DLOCK_URL")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dlock watch");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pid = child.id().to_string();
    let sent = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    let done = tokio::task::block_in_place(|| child.wait_with_output()).expect("wait");
    assert_eq!(
        done.status.code(),
        Some(0),
        "Ctrl-C ends a watch with exit 0"
    );
    let text = String::from_utf8_lossy(&done.stdout).into_owned();
    assert!(text.contains(&format!("{key} free")), "{text}");
}

/// Passwords, whether in `--url`, in `DLOCK_URL` or passed where clap does not expect them,
/// never appear in what the tool prints; the right one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_never_echoed() {
    let server = RedisServer::start_with_password("right-pw-4711");
    let port = server.port();
    let secret = "wrong-pw-0815";
    let cases: Vec<(Vec<String>, Option<String>, &str)> = vec![
        (
            vec![
                "--url".into(),
                format!("redis://:{secret}@127.0.0.1:{port}"),
                "list".into(),
            ],
            None,
            "a wrong password",
        ),
        (
            vec!["list".into()],
            Some(format!("redis://user:{secret}@127.0.0.1:{port}?bogus=1")),
            "a bad option, URL in DLOCK_URL",
        ),
        (
            vec![
                "--url".into(),
                format!("redis://:{secret}@127.0.0.1:1"),
                "show".into(),
                "k".into(),
            ],
            None,
            "an unreachable server",
        ),
        (
            vec![
                "--url".into(),
                format!("http://:{secret}@127.0.0.1:{port}"),
                "list".into(),
            ],
            None,
            "a bad scheme",
        ),
        (
            vec![format!("redis://:{secret}@127.0.0.1:{port}"), "list".into()],
            None,
            "the URL where a subcommand goes",
        ),
        (
            vec![
                "--url".into(),
                format!("redis://127.0.0.1:{port}?pass={secret}&x=1"),
                "list".into(),
            ],
            None,
            "a password as a query option",
        ),
    ];
    for (args, env_url, what) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = dlock(&args, env_url.as_deref());
        assert_exit(&out, 2, what);
        let (o, e) = (stdout(&out), stderr(&out));
        assert!(!e.is_empty(), "{what}: a message on stderr");
        assert!(
            !o.contains(secret) && !e.contains(secret),
            "{what}: the password is echoed: {o} {e}"
        );
    }
    let out = dlock(&["--url", &server.url(), "list"], None);
    assert_exit(&out, 1, "the right password: no locks");
}

/// Usage errors exit 2 with clap's reason; a URL the runtime refuses too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_and_bad_urls_exit_2() {
    for (args, reason) in [
        (&["--bogus", "list"][..], "--bogus"),
        (&["--url", "memory://", "frobnicate"][..], "frobnicate"),
        (&["--url", "memory://", "show"][..], "<KEY>"),
        (
            &["--url", "memory://", "watch", "k", "--interval", "0s"][..],
            "0s",
        ),
        (&["list"][..], "DLOCK_URL"),
        (
            &["--url", "redis://127.0.0.1:1?lease=soon", "list"][..],
            "soon",
        ),
        (&["--url", "nope", "list"][..], "nope"),
    ] {
        let out = dlock(args, None);
        assert_exit(&out, 2, &format!("{args:?}"));
        assert!(stderr(&out).contains(reason), "{args:?}: {}", stderr(&out));
    }
    let out = dlock(&["--help"], None);
    assert_exit(&out, 0, "--help");
}

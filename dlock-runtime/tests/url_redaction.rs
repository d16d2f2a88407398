//! A password in a lock URL never shows: not in `Display` or `Debug` of the builder, the
//! runtime or an error, not in an error's `source()` chain, not in a log line; whatever
//! characters it holds (`#`, `/`, `?`, `@`, `:`, `%`, `,`, blanks, written as is or
//! percent-encoded), in every URL form of every engine, for URLs that parse and for URLs that
//! fail (an unknown option, a bad port).

// A test's failure is a panic.
#![allow(clippy::expect_used)]

use std::error::Error as _;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_runtime::{LockError, Runtime, RuntimeBuilder};
use proptest::prelude::*;

/// A password: words of capitals from a set that no URL part or message of these cases holds,
/// each followed by printable ASCII that is neither a letter nor a digit, after some of it.
#[derive(Debug, Clone)]
struct Password {
    written: String,
    words: Vec<String>,
}

fn password() -> impl Strategy<Value = Password> {
    let special = "[ -/:-@\\[-`{-~]{0,3}";
    (
        special,
        prop::collection::vec(("[QJXVW]{3,6}", special), 1..4),
        any::<bool>(),
    )
        .prop_map(|(lead, parts, encoded)| {
            let mut written = encode(&lead, encoded);
            let mut words = Vec::new();
            for (word, after) in parts {
                written.push_str(&word);
                written.push_str(&encode(&after, encoded));
                words.push(word);
            }
            Password { written, words }
        })
}

/// `text` with every character but letters and digits percent-encoded when `encoded`.
fn encode(text: &str, encoded: bool) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || !encoded => c.to_string(),
            c => format!("%{:02X}", u32::from(c)),
        })
        .collect()
}

/// Every way of configuring an engine with `userinfo` (`user:password@`, or nothing) on
/// `127.0.0.1:<port>` with `query` appended: a URL for `Runtime::builder().url`, or a builder.
fn configurations(userinfo: &str, port: &str, query: &str) -> Vec<(String, Configure)> {
    let h = format!("{userinfo}127.0.0.1:{port}");
    let urls = [
        format!("redis://{h}{query}"),
        format!("redis://{h}/0{query}"),
        format!("rediss://{h}{query}"),
        format!("redis+cluster://{h},127.0.0.1:2{query}"),
        format!("rediss+cluster://{h},127.0.0.1:2,127.0.0.1:3{query}"),
        format!("redlock://{h},127.0.0.1:2,127.0.0.1:3{query}"),
        format!("redlock://{h},{userinfo}127.0.0.1:2,{userinfo}127.0.0.1:3{query}"),
        format!("etcd://{h},127.0.0.1:2{query}"),
        format!("zk://{h},127.0.0.1:2/chroot{query}"),
        format!("zookeeper://{h}{query}"),
        format!("memory://{userinfo}{query}"),
    ];
    let mut all: Vec<(String, Configure)> = urls
        .into_iter()
        .map(|url| (url.clone(), Configure::Url(url)))
        .collect();
    let node = |port: &str| format!("redis://{userinfo}127.0.0.1:{port}{query}");
    let builders = [
        Configure::Builder(Runtime::builder().redis(node(port))),
        Configure::Builder(Runtime::builder().redis_cluster([node(port), node("2")])),
        Configure::Builder(Runtime::builder().redlock([node(port), node("2"), node("3")])),
        Configure::Builder(Runtime::builder().etcd([format!("http://{h}{query}")])),
        Configure::Builder(Runtime::builder().zookeeper(format!("{h}/chroot{query}"))),
    ];
    all.extend(
        builders
            .into_iter()
            .enumerate()
            .map(|(i, b)| (format!("builder #{i}"), b)),
    );
    all
}

enum Configure {
    Url(String),
    Builder(RuntimeBuilder),
}

/// Everything a user can see of `err`: its message, its `Debug`, and each source's.
fn error_text(err: &LockError) -> String {
    let mut text = format!("{err}\n{err:?}\n");
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!("{cause}\n{cause:?}\n"));
        source = cause.source();
    }
    text
}

/// Log lines, kept for the test to read.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Configures and builds a runtime (nothing listens on these ports: a build that gets as far
/// as connecting fails fast), and returns all it showed: `Debug` of the builder and of the
/// runtime, every error's text, every log line.
fn everything_shown(configure: Configure) -> String {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let mut shown = String::new();
    tracing::subscriber::with_default(subscriber, || {
        let builder = match configure {
            Configure::Url(url) => Runtime::builder().url(&url),
            Configure::Builder(builder) => Ok(builder),
        };
        let builder = match builder {
            Ok(builder) => builder.timeout(Duration::from_millis(200)),
            Err(err) => {
                shown.push_str(&error_text(&err));
                return;
            }
        };
        shown.push_str(&format!("{builder:?}\n"));
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        tokio.block_on(async {
            match builder.build().await {
                Ok(rt) => shown.push_str(&format!("{rt:?}\n")),
                Err(err) => shown.push_str(&error_text(&err)),
            }
            // Let background work of a failed connection log what it logs.
            tokio::time::sleep(Duration::from_millis(10)).await;
        });
    });
    shown.push_str(&String::from_utf8_lossy(
        &lines.0.lock().unwrap_or_else(PoisonError::into_inner),
    ));
    shown
}

/// Panics naming the case when `shown` holds the password or any of its words.
fn assert_hidden(case: &str, password: &Password, shown: &str) {
    assert!(
        !shown.contains(&password.written),
        "{case}: password {:?} shown in:\n{shown}",
        password.written
    );
    for word in &password.words {
        assert!(
            !shown.contains(word.as_str()),
            "{case}: part {word:?} of password {:?} shown in:\n{shown}",
            password.written
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// In `user:password@` before a host, for URLs that parse, that name an unknown option,
    /// and that give a bad port.
    #[test]
    fn passwords_in_userinfo_never_show(
        password in password(),
        user in prop_oneof![Just(""), Just("app")],
        port in prop_oneof![Just("1"), Just("x1"), Just("99999")],
        query in prop_oneof![Just(""), Just("?db=0"), Just("?bogus=1"), Just("?timeout=200ms")],
    ) {
        let userinfo = format!("{user}:{}@", password.written);
        for (case, configure) in configurations(&userinfo, port, query) {
            assert_hidden(&case, &password, &everything_shown(configure));
        }
    }

    /// In a `pass=` (or `password=`) option, percent-encoded as a query value with `&` or `#`
    /// must be, with and without a `user:password@` of the same secret.
    #[test]
    fn passwords_in_options_never_show(
        password in password(),
        name in prop_oneof![Just("pass"), Just("password"), Just("PASS")],
        port in prop_oneof![Just("1"), Just("x1")],
        with_userinfo in any::<bool>(),
    ) {
        let value = encode(&password.written, true);
        let query = format!("?{name}={value}&db=0");
        let userinfo = if with_userinfo { format!(":{}@", password.written) } else { String::new() };
        for (case, configure) in configurations(&userinfo, port, &query) {
            assert_hidden(&case, &password, &everything_shown(configure));
        }
    }
}

//! A Redis password holding the URL's own delimiters (`#`, `/`, `?`, `@`, `:`, `%`, a blank)
//! authenticates whether it is written as is or percent-encoded: the userinfo ends at the
//! last `@` of the URL, not at the first `/`, `?` or `#` (which read `redis://:s3cr#et@host`
//! as the host `:s3cr` and the fragment `et@host`).

use dlock_runtime::Runtime;
use dlock_tests::{AcquireExt, RedisServer};

const PASSWORD: &str = "s3cr#et/?@:%x y";

/// `text` with every byte but letters and digits percent-encoded.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b if b.is_ascii_alphanumeric() => char::from(b).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_password_with_url_delimiters_authenticates_as_is_and_encoded() {
    let server = RedisServer::start();
    // Set here rather than at start: the kit's own client reads its URLs as the client
    // library does, which cuts such a password short.
    let () = server
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("requirepass")
                .arg(PASSWORD),
        )
        .await;
    let port = server.port();
    for written in [PASSWORD.to_owned(), percent_encoded(PASSWORD)] {
        for url in [
            format!("redis://:{written}@127.0.0.1:{port}"),
            format!("redis://default:{written}@127.0.0.1:{port}/0?timeout=2s"),
        ] {
            let rt = Runtime::from_url(&url)
                .await
                .unwrap_or_else(|e| panic!("connect with the password written {written:?}: {e}"));
            let guard = rt.lock("url:password").held("the lock").await;
            guard.release().await.expect("release");
        }
    }
    let wrong = format!("redis://:{PASSWORD}x@127.0.0.1:{port}");
    let err = Runtime::from_url(&wrong)
        .await
        .expect_err("a wrong password is refused");
    assert!(!format!("{err} {err:?}").contains("s3cr"), "{err:?}");
}

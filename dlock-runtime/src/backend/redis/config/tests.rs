use super::*;

#[test]
fn node_options_are_applied_and_taken_out_of_the_url() {
    let node = NodeSettings::parse("redis://h:1/0?db=2&user=app&pass=s%26cret&protocol=resp2")
        .expect("valid");
    let settings = node.info.redis_settings();
    assert_eq!(settings.db(), 2);
    assert_eq!(settings.username(), Some("app"));
    assert_eq!(settings.password(), Some("s&cret"));
    assert_eq!(settings.protocol(), ProtocolVersion::RESP3);
    assert!(node.tls.is_empty());
    assert!(!node.shown.contains("cret"), "{}", node.shown);
    let node = NodeSettings::parse("redis://:pw@h:1").expect("valid");
    assert_eq!(node.info.redis_settings().password(), Some("pw"));
}

#[test]
fn unknown_node_options_are_refused_without_showing_secrets() {
    let err = NodeSettings::parse("redis://:s3cret@h:1?dbb=2")
        .err()
        .expect("a typo");
    let message = err.to_string();
    assert!(
        message.contains("`dbb=2`") && !message.contains("s3cret"),
        "{message}"
    );
    let err = NodeSettings::parse("redis://h:1?password=s3cret")
        .err()
        .expect("not ours");
    let message = err.to_string();
    assert!(message.contains("`password=***`"), "{message}");
}

#[test]
fn tls_files_are_read_and_checked() {
    let err = NodeSettings::parse("rediss://h:1/?ca=/nonexistent/ca.pem&db=2#x")
        .err()
        .expect("missing file");
    assert!(err.is_invalid_config(), "{err}");
    let path = std::env::temp_dir().join(format!("dlock-ca-{}.pem", std::process::id()));
    std::fs::write(&path, b"pem").expect("write a file");
    let p = path.display();
    let node = NodeSettings::parse(&format!("rediss://h:1/?ca={p}&cert={p}&key={p}&db=2"));
    let only_cert = NodeSettings::parse(&format!("rediss://h:1/?cert={p}"));
    let plain = NodeSettings::parse(&format!("redis://h:1/?ca={p}"));
    std::fs::remove_file(&path).ok();
    assert_eq!(
        node.is_ok(),
        cfg!(feature = "tls"),
        "TLS files need the feature"
    );
    match node {
        Ok(node) => {
            assert_eq!(node.tls.ca.as_deref(), Some(&b"pem"[..]));
            assert_eq!(node.tls.client, Some((b"pem".to_vec(), b"pem".to_vec())));
            assert_eq!(node.info.redis_settings().db(), 2);
        }
        Err(err) => assert!(err.is_invalid_config(), "{err}"),
    }
    let err = only_cert.err().expect("cert without key");
    if cfg!(feature = "tls") {
        assert!(err.to_string().contains("`cert` and `key`"), "{err}");
    } else {
        assert!(err.is_invalid_config(), "{err}");
    }
    let err = plain.err().expect("TLS files on a plaintext URL");
    assert!(err.to_string().contains("rediss://"), "{err}");
}

#[test]
fn insecure_needs_its_own_feature() {
    let outcome = check_tls("rediss://h:1/#insecure");
    assert_eq!(
        outcome.is_ok(),
        cfg!(feature = "tls-insecure-skip-verify"),
        "{outcome:?}"
    );
}

#[test]
fn node_urls_carry_client_options_and_reject_others() {
    let url = EngineUrl::parse("redis+cluster://a:1,b:2?db=0#insecure").expect("url");
    assert_eq!(
        node_urls(&url, "redis", &["a:1", "b:2"]),
        vec!["redis://a:1?db=0#insecure", "redis://b:2?db=0#insecure"]
    );
    let url = EngineUrl::parse("redis://a:1?dbb=2").expect("url");
    let err = RedisConfig::from_url(&url).expect_err("typo");
    assert!(err.is_invalid_config());
    assert!(err.to_string().contains("`dbb=2`"), "{err}");
}

#[test]
fn a_password_before_the_first_host_applies_to_every_host() {
    let url = EngineUrl::parse("redis+cluster://app:pw@a:1,b:2,u:own@c:3").expect("url");
    let hosts = url.hosts("h1,h2").expect("hosts");
    assert_eq!(
        node_urls(&url, "redis", &hosts),
        vec![
            "redis://app:pw@a:1",
            "redis://app:pw@b:2",
            "redis://u:own@c:3"
        ]
    );
    let config = RedisConfig::from_url(&url).expect("config");
    let shown = format!("{config:?}");
    assert!(!shown.contains("pw") && !shown.contains("own"), "{shown}");
}

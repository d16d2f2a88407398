//! Unit tests of `args`.

use super::{Args, OnLost, RawArgs};
use proc_macro2::Span;

fn validate(args: &str) -> syn::Result<Args> {
    let raw: RawArgs = syn::parse_str(args)?;
    raw.validate(Span::call_site())
}

fn errors(args: &str) -> Vec<String> {
    match validate(args) {
        Ok(_) => panic!("{args:?} validated"),
        Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn all_arguments() {
    let args = validate(
        r#"key = "stock:{id}", lease = "30s", wait = "250ms", watchdog = false,
           on_lost = "ignore", hold_at_least = "10s", crate = "dl""#,
    )
    .unwrap();
    assert_eq!(args.hold_at_least, Some(10_000));
    assert_eq!(args.keys.len(), 1);
    assert_eq!(args.keys[0].value(), "stock:{id}");
    assert!(!args.multi);
    assert_eq!(args.lease, Some(30_000));
    assert_eq!(args.wait, Some(250));
    assert!(!args.watchdog.unwrap().value);
    assert_eq!(args.on_lost, OnLost::Ignore);
    assert!(args.krate.unwrap().is_ident("dl"));
}

#[test]
fn defaults_stay_unset() {
    let args = validate(r#"key = "k","#).unwrap();
    assert_eq!(args.lease, None);
    assert_eq!(args.wait, None);
    assert!(args.watchdog.is_none());
    assert_eq!(args.on_lost, OnLost::Cancel);
    assert!(args.krate.is_none());
}

#[test]
fn zero_wait_is_fine_but_zero_lease_is_not() {
    assert_eq!(validate(r#"key = "k", wait = "0s""#).unwrap().wait, Some(0));
    assert_eq!(
        errors(r#"key = "k", lease = "0ms""#),
        ["`lease` must be greater than zero, e.g. `lease = \"30s\"`"]
    );
}

#[test]
fn lease_is_at_most_one_year() {
    assert_eq!(
        validate(r#"key = "k", lease = "8760h""#).unwrap().lease,
        Some(31_536_000_000)
    );
    assert_eq!(
        errors(r#"key = "k", lease = "8761h""#),
        [
            "`lease` must be at most one year (\"8760h\"); with the watchdog on, a shorter lease is renewed for as long as the function runs"
        ]
    );
}

#[test]
fn unknown_and_duplicate_arguments() {
    assert_eq!(
        errors(r#"key = "k", ttl = "30s""#),
        [
            "unknown argument `ttl`; expected one of `key`, `keys`, `lease`, `wait`, `watchdog`, `on_lost`, `hold_at_least`, `mode`, `permits`, `fair`, `crate`"
        ]
    );
    assert_eq!(
        errors(r#"key = "k", leese = "30s""#),
        ["unknown argument `leese`; did you mean `lease`?"]
    );
    assert_eq!(
        errors(r#"key = "k", wait = "1s", wait = "2s""#),
        ["duplicate argument `wait`"]
    );
}

#[test]
fn missing_key() {
    assert_eq!(
        errors(r#"lease = "30s""#),
        ["missing required argument `key`, e.g. `#[distributed_lock(key = \"stock:{id}\")]`"]
    );
    assert_eq!(errors("").len(), 1);
    // A key with a bad value is reported once, not also as missing.
    assert_eq!(
        errors("key = id"),
        ["expected a string literal for `key`; to use the parameter `id` write `key = \"{id}\"`"]
    );
}

#[test]
fn value_errors() {
    assert_eq!(
        errors(r#"key = "k", lease = "30x""#),
        ["invalid duration \"30x\": expected a number followed by ms, s, m or h, e.g. \"30s\""]
    );
    assert_eq!(
        errors(r#"key = "k", wait = 5"#),
        ["expected a string literal with a unit for `wait`, e.g. `wait = \"5s\"`"]
    );
    assert_eq!(
        errors(r#"key = "k", watchdog = "false""#),
        [
            "expected `true` or `false` for `watchdog`, found a string literal; write `watchdog = false` without quotes"
        ]
    );
    assert_eq!(
        errors(r#"key = "k", watchdog = 1"#),
        ["expected `true` or `false` for `watchdog`"]
    );
    assert_eq!(
        errors(r#"key = "k", on_lost = "abort""#),
        ["invalid value \"abort\" for `on_lost`; expected \"cancel\" or \"ignore\""]
    );
    assert_eq!(
        errors(r#"key = "k", on_lost = ignore"#),
        ["expected a string literal for `on_lost`; write `on_lost = \"ignore\"`"]
    );
    assert_eq!(
        errors(r#"key = "k", crate = dl"#),
        ["expected a string literal for `crate`; write `crate = \"dl\"`"]
    );
    assert_eq!(
        errors(r#"key = "k", crate = "not a path""#),
        ["invalid path \"not a path\" for `crate`; expected a path such as \"dlock_runtime\""]
    );
    assert_eq!(
        errors(r#"key = "k", watchdog"#),
        ["argument `watchdog` needs a value, e.g. `watchdog = false`"]
    );
}

#[test]
fn collects_every_error() {
    assert_eq!(
        errors(r#"ttl = "1s", lease = "0s", wait = "1", on_lost = "x""#).len(),
        5 // four bad arguments and the missing key
    );
}

#[test]
fn syntax_errors_stop_the_parse() {
    assert_eq!(errors(r#"key: "k""#), ["expected `=` after `key`"]);
    assert_eq!(errors(r#"key = "k" lease = "1s""#), ["expected `,`"]);
}

#[test]
fn hold_at_least_is_at_most_the_lease() {
    assert_eq!(
        errors(r#"key = "job", lease = "30s", hold_at_least = "1m""#),
        [
            "`hold_at_least = \"1m\"` is longer than `lease = \"30s\"`; the key stays taken at most for the lease: shorten `hold_at_least` or lengthen `lease`"
        ]
    );
    // Equal is fine; without a lease the runtime checks against its default lease.
    let args = validate(r#"key = "job", hold_at_least = "30s", lease = "30s""#).unwrap();
    assert_eq!(args.hold_at_least, Some(30_000));
    let args = validate(r#"key = "job", hold_at_least = "2m""#).unwrap();
    assert_eq!(args.hold_at_least, Some(120_000));
    assert_eq!(
        errors(r#"key = "job", hold_at_least = 30"#),
        [
            "expected a string literal with a unit for `hold_at_least`, e.g. `hold_at_least = \"30s\"`"
        ]
    );
}

#[test]
fn keys_and_fair() {
    let args = validate(r#"keys = ["acct:{from}", "acct:{to}"], fair = true"#).unwrap();
    let keys: Vec<String> = args.keys.iter().map(|k| k.value()).collect();
    assert_eq!(keys, ["acct:{from}", "acct:{to}"]);
    assert!(args.multi);
    assert!(args.fair.unwrap().value);
    let one = validate(r#"keys = ["a"]"#).unwrap();
    assert!(one.multi, "keys with one key is still a multi-key lock");
}

#[test]
fn keys_mistakes() {
    assert_eq!(
        errors(r#"key = "a", keys = ["b"]"#),
        [
            "`key` and `keys` cannot be used together; `key` is already given: use `keys = [..]` \
          alone for several keys, e.g. `keys = [\"acct:{from}\", \"acct:{to}\"]`"
        ]
    );
    assert_eq!(
        errors(r#"keys = []"#),
        ["`keys` needs at least one key, e.g. `keys = [\"acct:{from}\", \"acct:{to}\"]`"]
    );
    assert_eq!(
        errors(r#"keys = ["a", 1, b]"#),
        [
            "expected a string literal in `keys`, e.g. `\"acct:{from}\"`",
            "expected a string literal in `keys`, e.g. `\"acct:{from}\"`"
        ]
    );
    assert_eq!(
        errors(r#"keys = "a""#),
        [
            "expected an array of string literals for `keys`; write `keys = [\"a\"]`, or `key = \"a\"` for one key"
        ]
    );
    assert_eq!(
        errors(r#"key = "a", fair = "true""#),
        [
            "expected `true` or `false` for `fair`, found a string literal; write `fair = true` without quotes"
        ]
    );
}

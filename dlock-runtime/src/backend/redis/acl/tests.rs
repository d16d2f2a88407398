use super::*;
use crate::backend::redis::script::Scripts;

#[test]
fn refusals_name_the_missing_grant() {
    let names = Names::new("app{1}:");
    let scripts = Scripts::new();
    let explain = |message: &str, script: Option<&Lua>| {
        denial(message, script, &names, "SPUBLISH").unwrap_or_default()
    };
    assert!(
        explain(
            "NoPerm: this user has no permissions to run the 'evalsha' command",
            None
        )
        .contains("`+evalsha`")
    );
    assert!(
        explain(
            "NoPerm: this user has no permissions to run the 'cluster|slots' command",
            None
        )
        .contains("`+cluster|slots`")
    );
    assert!(
        explain(
            "NoPerm: this user has no permissions to access one of the keys used as arguments",
            None
        )
        .contains("`~app%7B1%7D:*`")
    );
    assert!(
        explain(
            "NoPerm: this user has no permissions to access one of the channels used as arguments",
            None
        )
        .contains("`&app%7B1%7D:*`")
    );
    let pttl_line = acquire_line_of("'PTTL'");
    let message = format!(
        "ResponseError: The user executing the script can't run this command or subcommand script: abc, on @user_script:{pttl_line}."
    );
    let text = explain(&message, Some(&scripts.acquire));
    assert!(
        text.contains("`+pttl` ") || text.contains("`+pttl`)"),
        "{text}"
    );
    assert!(text.contains("acquire script"), "{text}");
    let publish_line = release_line_of("redis.call(ARGV[2]");
    let message = format!(
        "ResponseError: The user executing the script can't run this command or subcommand script: abc, on @user_script:{publish_line}."
    );
    assert!(explain(&message, Some(&scripts.release)).contains("`+spublish`"));
    assert!(
        explain(
            "ResponseError: The user executing the script can't publish to the channel mentioned in the command script: abc, on @user_script:19.",
            Some(&scripts.release)
        )
        .contains("`&app%7B1%7D:*`")
    );
    assert!(denial("ERR wrong number of arguments", None, &names, "PUBLISH").is_none());
}

/// The 1-based line of the acquire script containing `needle`.
fn acquire_line_of(needle: &str) -> usize {
    line_of(super::super::script::ACQUIRE_LUA, needle)
}

fn release_line_of(needle: &str) -> usize {
    line_of(super::super::script::RELEASE_LUA, needle)
}

fn line_of(src: &str, needle: &str) -> usize {
    src.lines()
        .position(|l| l.contains(needle))
        .expect("the line exists")
        + 1
}

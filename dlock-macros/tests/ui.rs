//! Compile-time behaviour of `#[distributed_lock]`: `ui/pass` must compile (and run an empty
//! `main`), `ui/fail` must fail with exactly the committed `.stderr`.
//!
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite cargo test -p dlock-macros --test ui`
//! and read every one before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}

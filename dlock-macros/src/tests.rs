//! Unit tests of `lib`.

use super::hint::edit_distance;
use super::{LockedFn, check_signature, guard, similar_name};
use quote::quote;

#[test]
fn edit_distances() {
    assert_eq!(edit_distance("", ""), 0);
    assert_eq!(edit_distance("lease", "lease"), 0);
    assert_eq!(edit_distance("leese", "lease"), 1);
    assert_eq!(edit_distance("ttl", "key"), 3);
    assert_eq!(edit_distance("onlost", "on_lost"), 1);
}

#[test]
fn similar_names() {
    let args = || ["key", "lease", "wait"].map(str::to_owned);
    assert_eq!(similar_name("leas", args()), Some("lease".to_owned()));
    assert_eq!(similar_name("ttl", args()), None);
    assert_eq!(
        similar_name("idd", ["id".to_owned()]),
        Some("id".to_owned())
    );
}

fn signature_errors(item: proc_macro2::TokenStream) -> Vec<String> {
    let func: LockedFn = syn::parse2(item).unwrap();
    check_signature(&func)
        .into_iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn signature_checks() {
    assert!(
        signature_errors(quote!(
            async fn f() {}
        ))
        .is_empty()
    );
    assert_eq!(
        signature_errors(quote!(
            fn f() {}
        )),
        ["`#[distributed_lock]` can only be used on an `async fn`; add `async` before `fn`"]
    );
    assert_eq!(
        signature_errors(quote!(
            const fn f() {}
        )),
        ["`#[distributed_lock]` cannot be used on a `const fn`; remove `const`"]
    );
    assert_eq!(
        signature_errors(quote!(
            extern "C" fn f() {}
        )),
        [
            "`#[distributed_lock]` cannot be used on an `extern \"C\"` function; remove `extern \"C\"`"
        ]
    );
    assert_eq!(
        signature_errors(quote!(
            async fn f(&self);
        )),
        ["`#[distributed_lock]` needs a function body; put it on the implementations of `f`"]
    );
    assert_eq!(
        signature_errors(quote!(
            fn f<'life0, 'async_trait>(
                &'life0 self,
            ) -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>> {
                Box::pin(async move {})
            }
        )),
        [
            "`#[distributed_lock]` cannot be used inside `#[async_trait]`; use a native `async fn` in the trait instead"
        ]
    );
}

#[test]
fn keeps_inner_attributes_and_body_tokens() {
    let func: LockedFn = syn::parse2(quote!(
        #[doc = "x"]
        pub async fn f() {
            #![allow(unused)]
            let x = 1;
        }
    ))
    .unwrap();
    assert_eq!(func.attrs.len(), 1);
    assert_eq!(func.inner_attrs.len(), 1);
    assert_eq!(func.body.to_string(), quote!(let x = 1;).to_string());
}

#[test]
fn rejects_items_that_are_not_functions() {
    let error = syn::parse2::<LockedFn>(quote!(
        struct S;
    ))
    .err()
    .unwrap();
    assert!(
        error
            .to_string()
            .starts_with("`#[distributed_lock]` can only be used on an `async fn`")
    );
}

/// The messages `guard` reports for `args` on a function that is not `async`.
fn sync_buy_errors(args: proc_macro2::TokenStream) -> Vec<String> {
    let error = guard(
        args,
        quote!(
            fn buy(id: u64) -> Result<(), E> {
                Ok(())
            }
        ),
    )
    .err()
    .unwrap();
    error.into_iter().map(|e| e.to_string()).collect()
}

#[test]
fn reports_argument_key_and_signature_errors_together() {
    let messages = sync_buy_errors(quote!(key = "{idd}", lease = "0s"));
    assert_eq!(messages.len(), 2, "{messages:?}");
    let messages = sync_buy_errors(quote!(key = "{idd}"));
    assert_eq!(
        messages,
        [
            "key placeholder `{idd}` names no parameter of `buy`; did you mean `{id}`?",
            "`#[distributed_lock]` can only be used on an `async fn`; add `async` before `fn`",
        ]
    );
}

#[test]
fn expansion_shape() {
    let expanded = guard(
        quote!(
            key = "stock:{id}:{{x}}",
            lease = "30s",
            wait = "0s",
            watchdog = false,
            on_lost = "ignore",
            crate = "dl"
        ),
        quote!(
            pub async fn buy(id: u64) -> Result<impl Display, E> {
                Ok(id)
            }
        ),
    )
    .unwrap()
    .to_string();
    for expected in [
        "pub async fn buy (id : u64) -> Result < impl Display , E >",
        "let __dlock_key = :: std :: format ! (\"stock:{}:{{x}}\" , id) ;",
        "dl :: __private :: run (dl :: __private :: lock (__dlock_key) . lease (dl :: __private :: Duration :: from_millis (30000)) . wait (dl :: __private :: Duration :: from_millis (0)) . watchdog (false) , dl :: __private :: OnLost :: Ignore , async move {",
        "let __dlock_fake_return : Result < _ , E > = loop { } ;",
        "{ Ok (id) } } ,) . await",
    ] {
        assert!(
            expanded.contains(expected),
            "{expected}\nnot in\n{expanded}"
        );
    }
}

#[test]
fn constant_key_and_defaults() {
    let expanded = guard(
        quote!(key = "jobs:{{nightly}}"),
        quote!(
            async fn f() -> R {
                x
            }
        ),
    )
    .unwrap()
    .to_string();
    assert!(
        expanded.contains(
            "let __dlock_key = :: std :: string :: String :: from (\"jobs:{nightly}\") ;"
        ),
        "{expanded}"
    );
    assert!(expanded.contains(":: dlock_runtime :: __private :: lock (__dlock_key) , :: dlock_runtime :: __private :: OnLost :: Cancel"), "{expanded}");
}

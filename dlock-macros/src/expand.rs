//! Code generation: the only module that calls `quote!`.
//!
//! The function keeps its attributes, visibility and signature; its body becomes
//!
//! ```text
//! {
//!     let __dlock_key = ::std::format!("stock:{}", id);
//!     match ::dlock_runtime::__private::run(
//!         ::dlock_runtime::__private::lock(__dlock_key).lease(..).wait(..).watchdog(..),
//!         ::dlock_runtime::__private::OnLost::Cancel,
//!         async move {
//!             if false { let __dlock_fake_return: ReturnType = loop {}; return __dlock_fake_return; }
//!             { original body }
//!         },
//!     )
//!     .await
//!     {
//!         Ok(__dlock_out) => __dlock_out,
//!         Err(__dlock_err) => ::dlock_runtime::__private::LockResult::from_lock_error(__dlock_err),
//!     }
//! }
//! ```
//!
//! With `keys = [..]` the local is a `Vec` of the formatted keys and the lock is
//! `__private::lock_all(__dlock_key)`; `fair = true` adds `.fair(true)`.
//!
//! The key is formatted before the `async move` block takes the parameters. The unreachable
//! `return` pins the block's output to the declared return type (with `impl Trait` erased to
//! `_`), so `?` and `return` in the body infer exactly as they did before; the body itself is
//! emitted untouched.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{GenericArgument, Ident, PathArguments, ReturnType, Type, TypeInfer};

use crate::LockedFn;
use crate::args::{Args, OnLost};
use crate::key::{KeyPart, Root};

/// The guarded function.
pub(crate) fn expand(func: &LockedFn, args: &Args, keys: &[Vec<KeyPart>]) -> TokenStream {
    let LockedFn {
        attrs,
        vis,
        defaultness,
        sig,
        inner_attrs,
        body,
        ..
    } = func;

    let (return_type, return_span) = declared_return_type(func);
    let blame = lock_result_blame(func);
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::dlock_runtime),
    };
    // `run(..).await` is located at the return type: a type that cannot carry a `LockError`
    // fails the `R: LockResult` bound of `run`, and the error should point at that type (or at
    // `E` in `Result<T, E>`), not at the attribute. rustc reports the bound on the call and
    // again on the `.await`, so the path, the parentheses, the async block argument and the
    // `.await` all get the span; anything left at the call site shows up as a second error.
    let run = respan(quote!(#krate::__private::run), blame);

    let key_local = Ident::new("__dlock_key", Span::mixed_site());
    let out_local = Ident::new("__dlock_out", Span::mixed_site());
    let err_local = Ident::new("__dlock_err", Span::mixed_site());
    // The same bound as `run`'s, located at the same place (the parentheses too; the local
    // keeps its own hygiene): rustc reports it once.
    let from_lock_error = respan(
        quote!(#krate::__private::LockResult::from_lock_error),
        blame,
    );
    let mut err_arg = Group::new(Delimiter::Parenthesis, err_local.to_token_stream());
    err_arg.set_span(blame);
    let fake_return = Ident::new("__dlock_fake_return", Span::mixed_site());
    let key = match (args.multi, keys) {
        (false, [key]) => key_expression(key),
        _ => {
            let keys = keys.iter().map(|key| key_expression(key));
            quote!(::std::vec![#(#keys),*])
        }
    };
    let lock = if args.multi {
        quote!(lock_all)
    } else {
        quote!(lock)
    };
    let fair = args.fair.as_ref().map(|on| quote!(.fair(#on)));
    let lease = args.lease.map(|millis| {
        let millis = Literal::u64_unsuffixed(millis);
        quote!(.lease(#krate::__private::Duration::from_millis(#millis)))
    });
    let wait = args.wait.map(|millis| {
        let millis = Literal::u64_unsuffixed(millis);
        quote!(.wait(#krate::__private::Duration::from_millis(#millis)))
    });
    let watchdog = args.watchdog.as_ref().map(|on| quote!(.watchdog(#on)));
    let hold_at_least = args.hold_at_least.map(|millis| {
        let millis = Literal::u64_unsuffixed(millis);
        quote!(.hold_at_least(#krate::__private::Duration::from_millis(#millis)))
    });
    let read = args.read.then(|| quote!(.read()));
    let builder = match args.permits {
        Some(permits) => {
            let permits = Literal::u32_unsuffixed(permits);
            quote!(#krate::__private::semaphore(#key_local, #permits))
        }
        None => quote!(#krate::__private::#lock(#key_local)),
    };
    let on_lost = match args.on_lost {
        OnLost::Cancel => quote!(Cancel),
        OnLost::Ignore => quote!(Ignore),
    };

    let fake_return_edge = quote_spanned! {return_span=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #fake_return: #return_type = loop {};
            return #fake_return;
        }
    };

    let mut block = Group::new(
        Delimiter::Brace,
        quote! {
            #fake_return_edge
            { #body }
        },
    );
    block.set_span(blame);
    let body_future = quote_spanned!(blame=> async move #block);

    let mut run_args = Group::new(
        Delimiter::Parenthesis,
        quote! {
            #builder #read #lease #wait #watchdog #hold_at_least #fair,
            #krate::__private::OnLost::#on_lost,
            #body_future,
        },
    );
    run_args.set_span(blame);
    let await_run = quote_spanned!(blame=> .await);

    quote! {
        #(#attrs)*
        #vis #defaultness #sig {
            #(#inner_attrs)*
            let #key_local = #key;
            match #run #run_args #await_run {
                ::core::result::Result::Ok(#out_local) => #out_local,
                ::core::result::Result::Err(#err_local) => #from_lock_error #err_arg,
            }
        }
    }
}

/// `String::from("jobs:nightly")` for a constant key, else one `format!`.
fn key_expression(parts: &[KeyPart]) -> TokenStream {
    let mut format = String::new();
    let mut values = Vec::new();
    for part in parts {
        match part {
            KeyPart::Text(text) => {
                format.push_str(&text.replace('{', "{{").replace('}', "}}"));
            }
            KeyPart::Value { root, members } => {
                format.push_str("{}");
                let root = match root {
                    Root::SelfValue(token) => token.to_token_stream(),
                    Root::Binding(ident) => ident.to_token_stream(),
                };
                values.push(quote!(#root #(. #members)*));
            }
        }
    }
    if values.is_empty() {
        // Every brace was doubled above; undo that for the plain literal.
        let text: String = parts
            .iter()
            .filter_map(|part| match part {
                KeyPart::Text(text) => Some(text.as_str()),
                KeyPart::Value { .. } => None,
            })
            .collect();
        quote!(::std::string::String::from(#text))
    } else {
        quote!(::std::format!(#format, #(#values),*))
    }
}

/// The declared return type with `impl Trait` replaced by `_`, and a span located at it.
fn declared_return_type(func: &LockedFn) -> (TokenStream, Span) {
    match &func.sig.output {
        ReturnType::Type(_, ty) => {
            let span = generated_at(ty.span());
            let mut erased = (**ty).clone();
            ImplTraitEraser.visit_type_mut(&mut erased);
            (erased.into_token_stream(), span)
        }
        // No return type: `()`, located at the function's name.
        ReturnType::Default => (quote!(()), generated_at(func.sig.ident.span())),
    }
}

/// A span that diagnostics show at `location` but that still counts as macro-generated, so
/// lints (`unused_qualifications`, clippy) treat the tokens as ours rather than the user's.
fn generated_at(location: Span) -> Span {
    Span::call_site().located_at(location)
}

/// Where an unsatisfied `R: LockResult` should point: at `E` in `Result<T, E>` (the type that
/// lacks `From<LockError>`), else at the whole return type, or at the name when there is none.
fn lock_result_blame(func: &LockedFn) -> Span {
    let ReturnType::Type(_, ty) = &func.sig.output else {
        return generated_at(func.sig.ident.span());
    };
    if let Type::Path(path) = &**ty
        && path.qself.is_none()
        && let Some(last) = path.path.segments.last()
        && last.ident == "Result"
        && let PathArguments::AngleBracketed(generic) = &last.arguments
    {
        let types: Vec<&Type> = generic
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect();
        if let [_, error] = types.as_slice() {
            return generated_at(error.span());
        }
    }
    generated_at(ty.span())
}

/// Replaces `impl Trait` with `_` so the type can annotate a `let`.
struct ImplTraitEraser;

impl VisitMut for ImplTraitEraser {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            *ty = Type::Infer(TypeInfer {
                attrs: Vec::new(),
                underscore_token: syn::Token![_](impl_trait.impl_token.span),
            });
            return;
        }
        visit_mut::visit_type_mut(self, ty);
    }
}

/// Gives every token of `tokens` the span `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut respanned = Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                token = TokenTree::Group(respanned);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

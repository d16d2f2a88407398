//! Tracing: the spans `dlock.acquire` and `dlock.held`, renewals at debug, renewal failures at
//! warn, losses at error, seen by a recording subscriber installed as the global default (a
//! test binary of its own: one subscriber for the process).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_runtime::with_lock;
use dlock_tests::{HoldExt, lost_while_paused, redis_with_timeout};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One recorded span: its name and fields (as recorded so far).
#[derive(Debug, Clone)]
struct SpanRec {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

/// One recorded event: level, message, fields, and the names of the spans it happened in,
/// outermost first.
#[derive(Debug, Clone)]
struct EventRec {
    level: Level,
    message: String,
    fields: BTreeMap<String, String>,
    spans: Vec<&'static str>,
}

/// A layer that keeps every span and event.
#[derive(Clone, Default)]
struct Recorder {
    spans: Arc<Mutex<Vec<(u64, SpanRec)>>>,
    events: Arc<Mutex<Vec<EventRec>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name();
        self.spans
            .lock()
            .unwrap()
            .push((id.into_u64(), SpanRec { name, fields }));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.spans.lock().unwrap();
        // Ids are reused once a span closes: the latest span with this id.
        if let Some((_, span)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.from_root().map(|s| s.name()).collect())
            .unwrap_or_default();
        self.events.lock().unwrap().push(EventRec {
            level: *event.metadata().level(),
            message,
            fields,
            spans,
        });
    }
}

impl Recorder {
    fn spans_named(&self, name: &str) -> Vec<SpanRec> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|(_, s)| s.name == name)
            .map(|(_, s)| s.clone())
            .collect()
    }

    fn events(&self) -> Vec<EventRec> {
        self.events.lock().unwrap().clone()
    }

    /// The first event at `level` whose message starts with `message` and whose `key` is
    /// `key`.
    fn find(&self, level: Level, message: &str, key: &str) -> Option<EventRec> {
        self.events().into_iter().find(|e| {
            e.level == level
                && e.message.starts_with(message)
                && e.fields.get("key").map(String::as_str) == Some(key)
        })
    }
}

/// Under a subscriber, an annotated-style call (`with_lock`) on Redis shows: the span
/// `dlock.acquire` with the key, the engine, the fence and the wait; the body running inside
/// the span `dlock.held` (with key and fence); each renewal as a debug event naming the key.
/// A server that stops answering then shows renewal failures at warn and the loss at error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_acquire_and_body_renewals_at_debug_failures_at_warn_and_the_loss_at_error() {
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .expect("the only subscriber of this test binary");
    let (mut server, rt) = redis_with_timeout(Duration::from_millis(200)).await;

    let key = "tracing:held";
    let fence = with_lock(rt.lock(key).lease(Duration::from_millis(900)), async {
        tracing::info!("inside the body");
        tokio::time::sleep(Duration::from_millis(700)).await;
        dlock_runtime::current_fence()
    })
    .await
    .expect("with_lock")
    .expect("a fence on Redis");

    let acquire = recorder.spans_named("dlock.acquire");
    let acquire = acquire
        .iter()
        .find(|s| s.fields.get("key").map(String::as_str) == Some(key))
        .unwrap_or_else(|| panic!("no dlock.acquire span for {key}: {acquire:?}"));
    assert_eq!(
        acquire.fields.get("engine").map(String::as_str),
        Some("redis")
    );
    assert_eq!(acquire.fields.get("fence"), Some(&fence.to_string()));
    assert!(
        acquire.fields.contains_key("waited_ms"),
        "no waited_ms: {acquire:?}"
    );
    let held = recorder.spans_named("dlock.held");
    let held = held
        .iter()
        .find(|s| s.fields.get("key").map(String::as_str) == Some(key))
        .unwrap_or_else(|| panic!("no dlock.held span for {key}: {held:?}"));
    assert_eq!(held.fields.get("fence"), Some(&fence.to_string()));
    let body = recorder
        .events()
        .into_iter()
        .find(|e| e.message == "inside the body")
        .expect("the body's event");
    assert_eq!(
        body.spans,
        vec!["dlock.held"],
        "the body's event ran in {body:?}"
    );
    assert!(
        recorder.find(Level::DEBUG, "lease renewed", key).is_some(),
        "no renewal at debug: {:?}",
        recorder.events()
    );

    let key = "tracing:lost";
    let guard = rt.hold(key, Duration::from_millis(1500)).await;
    lost_while_paused(&mut server, &guard, Duration::from_secs(4)).await;
    assert!(
        recorder.find(Level::WARN, "renewal failed", key).is_some(),
        "no renewal failure at warn: {:?}",
        recorder.events()
    );
    assert!(
        recorder.find(Level::ERROR, "lease lost", key).is_some(),
        "no loss at error: {:?}",
        recorder.events()
    );
}

//! The connection's state machine: the line of requests (written by their caller when nothing
//! is in flight, else by the connection's task), who writes now, and the task that connects,
//! writes, reads and answers.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::{RedisError, RedisResult, Value};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::dial::{Target, connect};
use super::reply::{ReadBuf, protocol_error};
use super::request::{Packed, Slot};
use crate::backend::Wakeups;

/// A read takes at least this much room in the buffer.
const READ_CHUNK: usize = 16 * 1024;

/// What the callers and the connection's task share.
pub(super) struct Shared {
    state: Mutex<State>,
    /// Where to connect, and the handshake to send first.
    pub(super) target: Target,
    /// Told when an established connection is lost: notifications may have been missed
    /// (every waiter looks again), and a Redlock node may have restarted (its run id is read
    /// again before its next grant counts).
    on_lost: Arc<dyn Wakeups>,
}

struct State {
    phase: Phase,
    /// Bytes of requests in `slots` not yet handed to the task's writer.
    out: Vec<u8>,
    /// How many requests `out` holds (what the socket did not take of a caller's write
    /// counts as one): when a caller writes a batch.
    out_count: usize,
    /// Requests made while no connection was up, waiting for the next one.
    waiting: VecDeque<(Vec<u8>, Slot)>,
    /// The reply slots of the requests written or in `out`, in order.
    slots: VecDeque<Slot>,
    /// Who writes to the socket now: nobody, a caller (its own request, outside the lock),
    /// or the task (`out`). Only the writer writes, so bytes go out in the order of `slots`.
    writer: Writer,
    /// Counts connections made, so that a caller writing outside the lock can tell that the
    /// connection it wrote to is gone.
    generation: u64,
    /// The task's waker, for a request that needs it.
    task: Option<Waker>,
    /// The task has been started (by the first request).
    started: bool,
    /// The last handle is gone.
    closed: bool,
    /// When the connection up now last delivered a reply (or was made).
    last_read: Instant,
    /// A request timed out on a connection that had delivered nothing for as long: the task
    /// closes it, and the next request opens a new one.
    silent: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Writer {
    Nobody,
    /// A caller, outside the lock: its own request, or a full batch ([`CALLER_BATCH`]).
    Caller,
    /// The task, woken to write `out`, holding none of its bytes yet (it yields once first).
    Task,
    /// The task, writing bytes it took from `out`.
    TaskWriting,
}

enum Phase {
    /// No connection, none being made (at first for a lazy one, and after a failure).
    Down,
    /// The task is connecting for the requests in `waiting`.
    Connecting,
    Up(Arc<TcpStream>),
}

impl Shared {
    /// The state of a connection to `target`, down until the first request.
    pub(super) fn new(target: Target, on_lost: Arc<dyn Wakeups>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                phase: Phase::Down,
                out: Vec::new(),
                out_count: 0,
                waiting: VecDeque::new(),
                slots: VecDeque::new(),
                writer: Writer::Nobody,
                generation: 0,
                task: None,
                started: false,
                closed: false,
                last_read: Instant::now(),
                silent: false,
            }),
            target,
            on_lost,
        })
    }

    /// A request timed out after `timeout`: if the connection up now has delivered no reply
    /// for as long while requests wait on it (a peer that reads and never answers: a black
    /// hole, a frozen server, a dropped NAT entry), it is closed; its requests fail and the
    /// next one connects again. A connection that answers slowly is kept.
    pub(super) fn note_timeout(&self, timeout: Duration) {
        let mut state = self.lock();
        let silent = matches!(state.phase, Phase::Up(_))
            && !state.slots.is_empty()
            && state.last_read.elapsed() >= timeout;
        if silent && !state.silent {
            state.silent = true;
            let task = state.task.take();
            drop(state);
            tracing::debug!(
                ?timeout,
                "redis connection silent for the request timeout; replacing it"
            );
            if let Some(task) = task {
                task.wake();
            }
        }
    }

    /// The socket of the connection up now, if any.
    #[cfg(test)]
    pub(super) fn stream(&self) -> Option<Arc<TcpStream>> {
        match &self.lock().phase {
            Phase::Up(stream) => Some(stream.clone()),
            _ => None,
        }
    }

    /// The last handle is gone: the task fails what is in flight and ends.
    pub(super) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let task = state.task.take();
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is updated in steps that cannot panic half-way: a poisoned lock holds a
        // consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes `bytes` (requests whose slots are in line, ahead of `out`) as the writer, outside
    /// the lock, then hands over: what the socket did not take goes before what was queued
    /// meanwhile, and the task writes that. The lock again, and whether the task must be
    /// woken (it may have found the caller writing and gone to wait).
    fn write_as_caller<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        stream: &TcpStream,
        bytes: &[u8],
    ) -> (MutexGuard<'a, State>, bool) {
        let generation = state.generation;
        state.writer = Writer::Caller;
        drop(state);
        let written = write_now(stream, bytes);
        let mut state = self.lock();
        if state.generation != generation || state.writer != Writer::Caller {
            // The connection failed meanwhile: the requests failed with it.
            return (state, false);
        }
        if written < bytes.len() {
            state.out.splice(0..0, bytes[written..].iter().copied());
            state.out_count += 1;
        }
        let wake = !state.out.is_empty();
        state.writer = if wake { Writer::Task } else { Writer::Nobody };
        (state, wake)
    }

    /// Puts one request in line (see the module documentation).
    pub(super) fn queue(self: &Arc<Self>, request: Packed<'_>, slot: Slot) -> RedisResult<()> {
        let mut state = self.lock();
        if state.closed {
            return Err(dropped("the connection is closed"));
        }
        let wake = match &state.phase {
            Phase::Up(stream) if state.slots.is_empty() && state.writer == Writer::Nobody => {
                // Nothing in flight: the caller writes, outside the lock (a loopback write
                // runs the server's side of TCP too); requests made meanwhile go after it.
                let stream = stream.clone();
                state.slots.push_back(slot);
                let wake;
                (state, wake) = self.write_as_caller(state, &stream, &request.to_vec());
                wake
            }
            Phase::Up(_) => {
                state.slots.push_back(slot);
                request.write(&mut state.out);
                state.out_count += 1;
                match (&state.phase, state.writer) {
                    (_, Writer::Nobody) => {
                        state.writer = Writer::Task;
                        true
                    }
                    (Phase::Up(stream), Writer::Task) if state.out_count >= CALLER_BATCH => {
                        // The task has not taken `out` yet (it lets the callers ready to run
                        // add to it first): a full batch is written now by the caller that
                        // filled it, so that the server works while the others run.
                        let stream = stream.clone();
                        let bytes = std::mem::take(&mut state.out);
                        state.out_count = 0;
                        let wake;
                        (state, wake) = self.write_as_caller(state, &stream, &bytes);
                        wake
                    }
                    // The writer (the task, or a caller that hands over to it) writes them.
                    _ => false,
                }
            }
            Phase::Connecting => {
                state.waiting.push_back((request.to_vec(), slot));
                false
            }
            Phase::Down => {
                state.waiting.push_back((request.to_vec(), slot));
                state.phase = Phase::Connecting;
                if state.started {
                    true
                } else {
                    // First use (or the task's tokio runtime is gone): the task starts, on
                    // the caller's runtime, and connects.
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        state.phase = Phase::Down;
                        let waiting = std::mem::take(&mut state.waiting);
                        drop(state);
                        drop(waiting);
                        return Err(dropped("no tokio runtime to run the connection on"));
                    };
                    state.started = true;
                    runtime.spawn(run(self.clone()));
                    false
                }
            }
        };
        let task = if wake { state.task.clone() } else { None };
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
        Ok(())
    }
}

/// The connection's task: connects when requests wait, then writes what callers queued and
/// reads replies until the connection fails; then fails what was in flight and waits for the
/// next request. Ends when the last [`Wire`](super::Wire) handle is dropped.
async fn run(shared: Arc<Shared>) {
    let _ended = Ended(shared.clone());
    loop {
        // Wait until a request needs a connection.
        let go = std::future::poll_fn(|cx| {
            let mut state = shared.lock();
            if state.closed {
                return Poll::Ready(false);
            }
            if matches!(state.phase, Phase::Connecting) {
                return Poll::Ready(true);
            }
            state.task = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        if !go {
            fail_all(&shared, &dropped("the connection is closed"));
            return;
        }
        let stream = match connect(&shared.target).await {
            Ok(stream) => Arc::new(stream),
            Err(e) => {
                let mut state = shared.lock();
                state.phase = Phase::Down;
                let waiting = std::mem::take(&mut state.waiting);
                drop(state);
                for (_, slot) in waiting {
                    let _ = slot.tx.send(Err(e.clone()));
                }
                continue;
            }
        };
        {
            let mut state = shared.lock();
            // The requests made meanwhile go first, in order; those whose caller is gone
            // are not sent.
            let waiting = std::mem::take(&mut state.waiting);
            for (bytes, slot) in waiting {
                if !slot.tx.is_closed() {
                    state.out.extend_from_slice(&bytes);
                    state.out_count += 1;
                    state.slots.push_back(slot);
                }
            }
            state.writer = if state.out.is_empty() {
                Writer::Nobody
            } else {
                Writer::Task
            };
            state.generation += 1;
            state.last_read = Instant::now();
            state.silent = false;
            state.phase = Phase::Up(stream.clone());
        }
        let failure = serve(&shared, &stream).await;
        if !shared.lock().closed {
            shared.on_lost.wake_all();
        }
        fail_all(&shared, &failure);
    }
}

/// Marks the connection's task gone when it ends, also when its tokio runtime shuts down
/// (the task is dropped then): requests in flight fail, and the next request starts a task
/// on its own runtime.
struct Ended(Arc<Shared>);

impl Drop for Ended {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.started = false;
        state.task = None;
        // A caller writing outside the lock sees the connection gone.
        state.generation += 1;
        drop(state);
        fail_all(&self.0, &dropped("the connection's task ended"));
    }
}

/// Fails every request in flight or waiting with `err`, and marks the connection down.
fn fail_all(shared: &Shared, err: &RedisError) {
    let mut state = shared.lock();
    if !state.closed {
        state.phase = Phase::Down;
    }
    state.out.clear();
    state.out_count = 0;
    state.writer = Writer::Nobody;
    let slots = std::mem::take(&mut state.slots);
    let waiting = std::mem::take(&mut state.waiting);
    drop(state);
    for slot in slots.into_iter().chain(waiting.into_iter().map(|(_, s)| s)) {
        let _ = slot.tx.send(Err(err.clone()));
    }
}

/// Writes what callers queue and answers replies, until the connection fails or the last
/// handle is dropped; returns the error to fail the requests in flight with.
async fn serve(shared: &Shared, stream: &TcpStream) -> RedisError {
    let mut io = Io {
        pending: Vec::new(),
        sent: 0,
        read: ReadBuf::new(READ_CHUNK),
        seen: 0,
        values: Vec::new(),
        yielding: None,
    };
    std::future::poll_fn(|cx| io.poll(shared, stream, cx)).await
}

/// The task's side of one connection.
struct Io {
    /// Bytes taken from `out`, written up to `sent`.
    pending: Vec<u8>,
    sent: usize,
    /// Bytes read and not yet parsed.
    read: ReadBuf,
    /// Replies the front slot has taken so far.
    seen: usize,
    /// Replies parsed in this read, answered under one lock.
    values: Vec<Value>,
    /// A yield before taking `out`, so that the callers ready to run append to it first.
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Io {
    fn poll(
        &mut self,
        shared: &Shared,
        stream: &TcpStream,
        cx: &mut Context<'_>,
    ) -> Poll<RedisError> {
        {
            let mut state = shared.lock();
            if state.closed {
                return Poll::Ready(dropped("the connection is closed"));
            }
            if state.silent {
                return Poll::Ready(silent());
            }
            let stale = state
                .task
                .as_ref()
                .is_none_or(|task| !task.will_wake(cx.waker()));
            if stale {
                state.task = Some(cx.waker().clone());
            }
        }
        loop {
            let wrote = match self.poll_write(shared, stream, cx) {
                Ok(progress) => progress,
                Err(e) => return Poll::Ready(e),
            };
            let read = match self.poll_read(shared, stream, cx) {
                Ok(progress) => progress,
                Err(e) => return Poll::Ready(e),
            };
            if !wrote && !read {
                return Poll::Pending;
            }
        }
    }

    /// Writes queued bytes while the socket takes them; true if it wrote any.
    fn poll_write(
        &mut self,
        shared: &Shared,
        stream: &TcpStream,
        cx: &mut Context<'_>,
    ) -> RedisResult<bool> {
        let mut progress = false;
        loop {
            if self.sent == self.pending.len() {
                self.pending.clear();
                self.sent = 0;
                let mut state = shared.lock();
                if state.writer == Writer::TaskWriting {
                    state.writer = Writer::Task;
                }
                if state.writer != Writer::Task {
                    // Nothing to write, or a caller is writing (it hands over when done).
                    return Ok(progress);
                }
                if state.out.is_empty() {
                    state.writer = Writer::Nobody;
                    return Ok(progress);
                }
                drop(state);
                let yielding = self
                    .yielding
                    .get_or_insert_with(|| Box::pin(tokio::task::yield_now()));
                if yielding.as_mut().poll(cx).is_pending() {
                    return Ok(progress);
                }
                self.yielding = None;
                let mut state = shared.lock();
                if state.writer != Writer::Task {
                    // A caller took a full batch meanwhile (it hands back when done).
                    return Ok(progress);
                }
                if state.out.is_empty() {
                    state.writer = Writer::Nobody;
                    return Ok(progress);
                }
                std::mem::swap(&mut self.pending, &mut state.out);
                state.out_count = 0;
                state.writer = Writer::TaskWriting;
            }
            match stream.poll_write_ready(cx) {
                Poll::Pending => return Ok(progress),
                Poll::Ready(ready) => ready?,
            }
            match stream.try_write(&self.pending[self.sent..]) {
                Ok(n) => {
                    self.sent += n;
                    progress = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads and answers replies while the socket has bytes; true if it read any.
    fn poll_read(
        &mut self,
        shared: &Shared,
        stream: &TcpStream,
        cx: &mut Context<'_>,
    ) -> RedisResult<bool> {
        match stream.poll_read_ready(cx) {
            Poll::Pending => return Ok(false),
            Poll::Ready(ready) => ready?,
        }
        match self.read.fill(stream) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Err(e) => return Err(e.into()),
        }
        while let Some(value) = self.read.next_reply()? {
            // Pushes (none is subscribed here; a client-side caching invalidation, say)
            // answer no request.
            if !matches!(value, Value::Push { .. }) {
                self.values.push(value);
            }
        }
        if !self.values.is_empty() {
            self.answer(shared)?;
        }
        Ok(true)
    }

    /// Hands the parsed replies to their slots, in order.
    fn answer(&mut self, shared: &Shared) -> RedisResult<()> {
        let mut done = Vec::new();
        {
            let mut state = shared.lock();
            state.last_read = Instant::now();
            for value in self.values.drain(..) {
                let Some(front) = state.slots.front_mut() else {
                    return Err(protocol_error("a reply no request waits for"));
                };
                if front.take(value, &mut self.seen) {
                    self.seen = 0;
                    if let Some(slot) = state.slots.pop_front() {
                        done.push(slot);
                    }
                }
            }
        }
        for slot in done {
            let _ = slot.tx.send(Ok(slot.got));
        }
        Ok(())
    }
}

/// Writes what the socket takes of `bytes` now, without waiting; how many bytes it took.
/// A full socket (or a failing one: the task's read or write meets the error) stops it.
fn write_now(stream: &TcpStream, bytes: &[u8]) -> usize {
    let mut written = 0;
    while written < bytes.len() {
        match stream.try_write(&bytes[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    written
}

/// Requests queued behind the task's yield that the caller adding the last of them writes at
/// once (see [`Writer::Caller`]): the server starts on them while the callers still ready to
/// run queue theirs.
pub(super) const CALLER_BATCH: usize = 16;

/// The error of the requests on a connection closed for its silence.
fn silent() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::TimedOut,
        "no reply within the request timeout: the connection was closed and is opened again",
    ))
}

pub(super) fn dropped(what: &'static str) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::ConnectionReset, what))
}

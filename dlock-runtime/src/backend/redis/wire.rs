//! The command connection to one plaintext server: a TCP connection of the runtime's own,
//! through which every command of a single-server backend goes (the client library's
//! connection manager keeps the subscriptions and their pushes).
//!
//! Why: the client library hands each request to a task of its connection, which writes it
//! and reads the reply: two task hops a round trip, about a third of a loopback round trip.
//! Here a request is written by the task that makes it when nothing else is in flight (the
//! sequential case: one hop, the reply's), and otherwise appended to the bytes the
//! connection's task writes next (the loaded case: one write for many requests, as in the
//! client library). The task yields once before it takes them, so that the callers ready to
//! run add theirs; the caller whose request makes a batch of [`CALLER_BATCH`] writes the batch
//! itself at once, so that the server works on it while the other callers run (left to the
//! task, the whole round went out in one write after all of them had run, and the server
//! waited for it).
//!
//! The one rule: **a request is queued when it is made**, before its future is first polled:
//! its bytes are written, or appended to the connection's buffer, and its reply slot is in
//! line, under one lock. Requests therefore reach the server in the order they were made,
//! which Redlock's undo of a lost attempt relies on (its release must run before the next
//! attempt of the same owner, made right after it; see `redlock/fanout.rs`). This holds across
//! a reconnection too: a request made while the connection is down waits in line for the next
//! connection, and one whose caller has gone by then is not sent.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, RedisError, RedisResult, Value};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::frame;
use crate::backend::Wakeups;

/// A read takes at least this much room in the buffer.
const READ_CHUNK: usize = 16 * 1024;

/// The command connection to one server (see the module documentation). Dropping the last
/// handle closes it: requests in flight then fail.
pub(super) struct Wire {
    shared: Arc<Shared>,
}

/// What the callers and the connection's task share.
struct Shared {
    state: Mutex<State>,
    /// Where to connect, and the handshake to send first.
    target: Target,
    /// Told when an established connection is lost: notifications may have been missed
    /// (every waiter looks again), and a Redlock node may have restarted (its run id is read
    /// again before its next grant counts).
    on_lost: Arc<dyn Wakeups>,
}

struct Target {
    host: String,
    port: u16,
    /// `HELLO 3` with `AUTH` when the URL has credentials, then `SELECT` when it names a db.
    handshake: Vec<u8>,
    /// How many replies the handshake gets.
    handshake_replies: usize,
    /// The database the handshake selects.
    db: i64,
    connect_timeout: Duration,
    /// Connection attempts after a failed one before the waiting requests fail.
    retries: usize,
    max_delay: Duration,
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

/// Where the replies of one request go: it expects `count` replies and answers the last
/// `keep` of them.
struct Slot {
    count: usize,
    keep: usize,
    got: Got,
    tx: oneshot::Sender<RedisResult<Got>>,
}

/// The replies a request answers: one (most requests: no vector), or several.
enum Got {
    One(Option<Value>),
    Many(Vec<Value>),
}

impl Slot {
    fn new(count: usize, keep: usize) -> (Self, oneshot::Receiver<RedisResult<Got>>) {
        let (tx, rx) = oneshot::channel();
        let keep = keep.clamp(1, count.max(1));
        let slot = Self {
            count: count.max(1),
            keep,
            got: if keep == 1 {
                Got::One(None)
            } else {
                Got::Many(Vec::with_capacity(keep))
            },
            tx,
        };
        (slot, rx)
    }

    /// Takes one reply; true when it was the last one expected.
    fn take(&mut self, value: Value, seen: &mut usize) -> bool {
        *seen += 1;
        if *seen > self.count - self.keep {
            match &mut self.got {
                Got::One(one) => *one = Some(value),
                Got::Many(many) => many.push(value),
            }
        }
        *seen == self.count
    }
}

/// A request, packed into the connection's buffer (or the caller's) when it is made.
#[derive(Clone, Copy)]
pub(super) enum Packed<'a> {
    Cmd(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline),
}

impl Packed<'_> {
    fn write(self, out: &mut Vec<u8>) {
        match self {
            Self::Cmd(cmd) => cmd.write_packed_command(out),
            Self::Pipeline(pipe) if pipe.is_transaction() => {
                out.extend_from_slice(&pipe.get_packed_pipeline());
            }
            Self::Pipeline(pipe) => {
                for cmd in pipe.cmd_iter() {
                    cmd.write_packed_command(out);
                }
            }
        }
    }

    fn to_vec(self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(128);
        self.write(&mut bytes);
        bytes
    }
}

impl Wire {
    /// A connection to the server of `info` if it is a plaintext TCP one (none for TLS or a
    /// Unix socket: those go through the client library). Connects on first use.
    pub(super) fn for_server(
        info: &ConnectionInfo,
        connect_timeout: Duration,
        retries: usize,
        max_delay: Duration,
        on_lost: Arc<dyn Wakeups>,
    ) -> Option<Self> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        let mut handshake = redis::pipe();
        let hello = handshake.cmd("HELLO").arg(3);
        if let Some(password) = settings.password() {
            hello
                .arg("AUTH")
                .arg(settings.username().unwrap_or("default"))
                .arg(password);
        }
        let mut handshake_replies = 1;
        if settings.db() != 0 {
            handshake.cmd("SELECT").arg(settings.db());
            handshake_replies += 1;
        }
        let target = Target {
            host: host.clone(),
            port: *port,
            handshake: handshake.get_packed_pipeline(),
            handshake_replies,
            db: settings.db(),
            connect_timeout,
            retries,
            max_delay,
        };
        let shared = Arc::new(Shared {
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
            }),
            target,
            on_lost,
        });
        Some(Self { shared })
    }

    /// A handle for calls (see [`Request`]).
    pub(super) fn caller(&self) -> Caller {
        Caller {
            shared: self.shared.clone(),
        }
    }

    /// Connects now, failing like a request would (for a backend that connects eagerly).
    pub(super) async fn ping(&self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        let reply = self.caller().send_one(Packed::Cmd(&ping)).await?;
        reply.extract_error().map(drop)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        let task = state.task.take();
        drop(state);
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// A cheap handle through which requests are made.
#[derive(Clone)]
pub(super) struct Caller {
    shared: Arc<Shared>,
}

impl Caller {
    /// The database the connection uses (the URL's).
    pub(super) fn db(&self) -> i64 {
        self.shared.target.db
    }

    /// Queues `request` (one command) now, and answers its reply (a server error as a value).
    pub(super) fn send_one(
        &self,
        request: Packed<'_>,
    ) -> impl Future<Output = RedisResult<Value>> + Send + use<> {
        let answer = self.send_packed(request, 1, 1);
        async move {
            match answer.await? {
                Got::One(Some(value)) => Ok(value),
                Got::Many(mut many) if many.len() == 1 => Ok(many.remove(0)),
                _ => Err(protocol_error("no reply to a command")),
            }
        }
    }

    /// Queues `request` (expecting `count` replies) now, and answers the last `keep` replies
    /// (server errors among them as values).
    pub(super) fn send(
        &self,
        request: Packed<'_>,
        count: usize,
        keep: usize,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + use<> {
        let answer = self.send_packed(request, count, keep);
        async move {
            Ok(match answer.await? {
                Got::One(one) => one.into_iter().collect(),
                Got::Many(many) => many,
            })
        }
    }

    fn send_packed(
        &self,
        request: Packed<'_>,
        count: usize,
        keep: usize,
    ) -> impl Future<Output = RedisResult<Got>> + Send + use<> {
        let (slot, rx) = Slot::new(count, keep);
        let queued = self.shared.queue(request, slot);
        async move {
            queued?;
            match rx.await {
                Ok(answer) => answer,
                Err(_) => Err(dropped("the connection closed before the reply")),
            }
        }
    }
}

impl Shared {
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
    fn queue(self: &Arc<Self>, request: Packed<'_>, slot: Slot) -> RedisResult<()> {
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
/// next request. Ends when the last [`Wire`] handle is dropped.
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

/// Opens the TCP connection and runs the handshake, with the retries of `target`.
async fn connect(target: &Target) -> RedisResult<TcpStream> {
    let mut delay = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        let tried = tokio::time::timeout(target.connect_timeout, connect_once(target)).await;
        let err = match tried {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => e,
            Err(_) => RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no connection within {:?}", target.connect_timeout),
            )),
        };
        if attempt >= target.retries || err.kind() != redis::ErrorKind::Io {
            return Err(err);
        }
        attempt += 1;
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(target.max_delay);
    }
}

async fn connect_once(target: &Target) -> RedisResult<TcpStream> {
    let stream = TcpStream::connect((target.host.as_str(), target.port)).await?;
    stream.set_nodelay(true)?;
    let mut written = 0;
    while written < target.handshake.len() {
        stream.writable().await?;
        match stream.try_write(&target.handshake[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut buf = ReadBuf::new(1024);
    let mut replies = 0;
    while replies < target.handshake_replies {
        match buf.next_reply()? {
            Some(value) => {
                value.extract_error()?;
                replies += 1;
            }
            None => {
                stream.readable().await?;
                match buf.fill(&stream) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    if !buf.is_empty() {
        return Err(protocol_error("bytes after the handshake's replies"));
    }
    Ok(stream)
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

/// Bytes read from a connection: `buf[start..end]` not yet parsed.
struct ReadBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn new(size: usize) -> Self {
        Self {
            buf: vec![0; size],
            start: 0,
            end: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Reads what the socket has (one `read`); an end of stream is an error.
    fn fill(&mut self, stream: &TcpStream) -> io::Result<()> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                // A reply larger than the buffer.
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        match stream.try_read(&mut self.buf[self.end..])? {
            0 => Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the server closed the connection",
            )),
            n => {
                self.end += n;
                Ok(())
            }
        }
    }

    /// The next complete reply, if the buffer holds one.
    fn next_reply(&mut self) -> RedisResult<Option<Value>> {
        let rest = &self.buf[self.start..self.end];
        let Some(len) = frame::reply_len(rest).map_err(malformed)? else {
            return Ok(None);
        };
        let value = parse(&rest[..len])?;
        self.start += len;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Ok(Some(value))
    }
}

/// The value of one complete reply (`frame`, framed by [`frame::reply_len`]): the shapes the
/// runtime's requests get (simple strings, integers, bulk strings, nulls, booleans, and
/// arrays of those) read directly, any other by the client library's parser (which builds a
/// decoder and copies the bytes for each value).
fn parse(frame: &[u8]) -> RedisResult<Value> {
    match simple(frame) {
        Some((value, used)) if used == frame.len() => Ok(value),
        _ => redis::parse_redis_value(frame),
    }
}

/// One value of a common shape at the start of `buf` and the bytes it took, or `None`.
fn simple(buf: &[u8]) -> Option<(Value, usize)> {
    let (&kind, _) = buf.split_first()?;
    let line_end = buf.iter().position(|&b| b == b'\r')?;
    let line = &buf[1..line_end];
    let after = line_end + 2;
    let number = || std::str::from_utf8(line).ok()?.parse::<i64>().ok();
    match kind {
        b'+' if line == b"OK" => Some((Value::Okay, after)),
        b'+' => Some((
            Value::SimpleString(std::str::from_utf8(line).ok()?.to_owned()),
            after,
        )),
        b':' => Some((Value::Int(number()?), after)),
        b'_' => Some((Value::Nil, after)),
        b'#' => match line {
            b"t" => Some((Value::Boolean(true), after)),
            b"f" => Some((Value::Boolean(false), after)),
            _ => None,
        },
        b'$' => match number()? {
            -1 => Some((Value::Nil, after)),
            len => {
                let len = usize::try_from(len).ok()?;
                let data = buf.get(after..after + len)?;
                Some((Value::BulkString(data.to_vec()), after + len + 2))
            }
        },
        b'*' => match number()? {
            -1 => Some((Value::Nil, after)),
            len => {
                let len = usize::try_from(len).ok()?;
                let mut items = Vec::with_capacity(len.min(1024));
                let mut at = after;
                for _ in 0..len {
                    let (item, used) = simple(buf.get(at..)?)?;
                    items.push(item);
                    at += used;
                }
                Some((Value::Array(items), at))
            }
        },
        _ => None,
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
/// run queue theirs. Measured with 64 tasks on distinct keys (the benchmark's `peer` section):
/// 16 gave 1.03-1.22x rslock's pairs a second, 8 gave 0.96-1.03x, 24 and 32 0.87-1.01x, and
/// leaving every batch to the task 0.87-1.03x.
const CALLER_BATCH: usize = 16;

fn dropped(what: &'static str) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::ConnectionReset, what))
}

fn protocol_error(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, what))
}

fn malformed(e: frame::Malformed) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, "malformed reply", e.to_string()))
}

#[cfg(test)]
mod tests {
    //! The connection against a scripted server on loopback: these check the connection's own
    //! rules (order, reply routing, reconnection); the engine suites run it against real
    //! servers.
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Counts the connection's reports of a lost connection.
    #[derive(Default)]
    struct Losses(std::sync::atomic::AtomicUsize);

    impl Wakeups for Losses {
        fn wake(&self, _key: &str) {}
        fn wake_all(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Losses {
        fn seen(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn wire_to(port: u16, retries: usize) -> Wire {
        wire_telling(port, retries, Arc::new(Losses::default()))
    }

    fn wire_telling(port: u16, retries: usize, losses: Arc<Losses>) -> Wire {
        use redis::IntoConnectionInfo;
        let info = format!("redis://127.0.0.1:{port}")
            .into_connection_info()
            .unwrap();
        Wire::for_server(
            &info,
            Duration::from_secs(5),
            retries,
            Duration::from_millis(100),
            losses,
        )
        .expect("a TCP address has a wire")
    }

    /// Accepts one connection, answers the handshake, and returns it.
    async fn accept(listener: &TcpListener) -> tokio::net::TcpStream {
        let (mut sock, _) = listener.accept().await.unwrap();
        let hello = redis::cmd("HELLO").arg(3).get_packed_command();
        let mut buf = vec![0; hello.len()];
        sock.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, hello);
        sock.write_all(b"%1\r\n+server\r\n+redis\r\n")
            .await
            .unwrap();
        sock
    }

    /// Reads exactly the bytes of `cmds` from `sock`, in that order.
    async fn expect_commands(sock: &mut tokio::net::TcpStream, cmds: &[&redis::Cmd]) {
        let want: Vec<u8> = cmds.iter().flat_map(|c| c.get_packed_command()).collect();
        let mut got = vec![0; want.len()];
        sock.read_exact(&mut got).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }

    #[test]
    fn common_replies_parse_as_the_client_library_parses_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":-42\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"_\r\n",
            b"#t\r\n",
            b"#f\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n$2\r\nab\r\n*2\r\n_\r\n+x\r\n",
            // Read by the client library's parser.
            b"-ERR no\r\n",
            b"%1\r\n+a\r\n:1\r\n",
            b"*2\r\n:1\r\n,1.5\r\n",
            b">2\r\n+message\r\n+x\r\n",
        ];
        for reply in replies {
            let ours = parse(reply).unwrap();
            let theirs = redis::parse_redis_value(reply).unwrap();
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{reply:?}");
        }
        assert!(simple(b"-ERR no\r\n").is_none());
    }

    /// While the connection's task has yet to take the queued requests (it yields once
    /// first), the caller whose request fills a batch writes the batch itself: on a
    /// current-thread runtime, where the task cannot run between the calls, a first request
    /// and a full batch behind it reach the server before the runtime runs anything else.
    #[test]
    fn a_full_batch_is_written_by_the_caller_that_fills_it() {
        let batch = CALLER_BATCH;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (told, counted) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let mut sock = accept(&listener).await;
                let ping = redis::cmd("PING").get_packed_command();
                let mut first = vec![0; ping.len()];
                sock.read_exact(&mut first).await.unwrap();
                sock.write_all(b"+PONG\r\n").await.unwrap();
                // Then what arrives until the batch is complete, or for a second.
                let mut got = Vec::new();
                let until = tokio::time::Instant::now() + Duration::from_secs(1);
                while got.len() < (batch + 1) * ping.len() {
                    let mut buf = [0; 4096];
                    match tokio::time::timeout_at(until, sock.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                told.send(got.len() / ping.len()).unwrap();
                let rest = batch + 1 - got.len() / ping.len();
                let mut buf = vec![0; rest * ping.len()];
                sock.read_exact(&mut buf).await.unwrap();
                sock.write_all(&b"+PONG\r\n".repeat(batch + 1))
                    .await
                    .unwrap();
                let _ = sock.read(&mut [0; 16]).await;
            });
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let wire = wire_to(port, 0);
            wire.ping().await.expect("the first ping");
            let ping = redis::cmd("PING");
            let caller = wire.caller();
            let answers: Vec<_> = (0..=batch)
                .map(|_| caller.send_one(Packed::Cmd(&ping)))
                .collect();
            // Blocks the runtime: only what the callers wrote has gone out.
            let arrived = counted.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(
                arrived,
                batch + 1,
                "the first request and a full batch of {batch} are written by their callers"
            );
            for answer in answers {
                assert_eq!(answer.await.unwrap(), Value::SimpleString("PONG".into()));
            }
            drop(wire);
        });
        // The connection's task (and its socket) goes with the runtime; the server then ends.
        drop(rt);
        server.join().unwrap();
    }

    #[tokio::test]
    async fn requests_reach_the_server_in_the_order_they_were_made_not_polled() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let wire = wire_to(listener.local_addr().unwrap().port(), 0);
        let server = tokio::spawn(async move {
            let mut sock = accept(&listener).await;
            let (a, b, c) = (
                redis::cmd("GET").arg("a").clone(),
                redis::cmd("GET").arg("b").clone(),
                redis::cmd("GET").arg("c").clone(),
            );
            expect_commands(&mut sock, &[&a]).await;
            sock.write_all(b"$1\r\nA\r\n").await.unwrap();
            expect_commands(&mut sock, &[&b, &c]).await;
            sock.write_all(b"$1\r\nB\r\n$1\r\nC\r\n").await.unwrap();
            sock
        });
        let caller = wire.caller();
        let first = caller.send(Packed::Cmd(redis::cmd("GET").arg("a")), 1, 1);
        assert_eq!(first.await.unwrap(), vec![Value::BulkString(b"A".to_vec())]);
        // Made in the order b, c; polled c first: the server still sees b first, and each
        // answer goes to its own request.
        let b = caller.send(Packed::Cmd(redis::cmd("GET").arg("b")), 1, 1);
        let c = caller.send(Packed::Cmd(redis::cmd("GET").arg("c")), 1, 1);
        assert_eq!(c.await.unwrap(), vec![Value::BulkString(b"C".to_vec())]);
        assert_eq!(b.await.unwrap(), vec![Value::BulkString(b"B".to_vec())]);
        drop(server.await.unwrap());
    }

    #[tokio::test]
    async fn a_pipeline_answers_its_last_replies_and_server_errors_stay_values() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let wire = wire_to(listener.local_addr().unwrap().port(), 0);
        let server = tokio::spawn(async move {
            let mut sock = accept(&listener).await;
            let mut buf = vec![0; 4096];
            let _ = sock.read(&mut buf).await.unwrap();
            // Split mid-reply: the connection waits for the rest.
            sock.write_all(b"+OK\r\n:4").await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            sock.write_all(b"2\r\n-ERR nope\r\n").await.unwrap();
            sock
        });
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI").cmd("INCR").arg("n").cmd("BAD");
        let replies = wire
            .caller()
            .send(Packed::Pipeline(&pipe), 3, 2)
            .await
            .unwrap();
        assert_eq!(replies[0], Value::Int(42));
        assert!(replies[1].clone().extract_error().is_err());
        drop(server.await.unwrap());
    }

    #[tokio::test]
    async fn a_lost_connection_fails_what_was_in_flight_is_reported_and_the_next_request_reconnects()
     {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let losses = Arc::new(Losses::default());
        let wire = wire_telling(listener.local_addr().unwrap().port(), 0, losses.clone());
        let caller = wire.caller();
        let get = |k: &str| caller.send(Packed::Cmd(redis::cmd("GET").arg(k)), 1, 1);
        let in_flight = get("a");
        let mut sock = accept(&listener).await;
        expect_commands(&mut sock, &[redis::cmd("GET").arg("a")]).await;
        drop(sock);
        let err = in_flight.await.unwrap_err();
        assert!(err.is_connection_dropped(), "{err}");
        // Reported before the requests in flight fail (a Redlock node's run id is read again
        // before the next grant counts).
        assert_eq!(losses.seen(), 1);

        // Made while down, one of them given up before the connection is back: that one is
        // not sent.
        let gone = get("gone");
        drop(gone);
        let kept = get("kept");
        let mut sock = accept(&listener).await;
        expect_commands(&mut sock, &[redis::cmd("GET").arg("kept")]).await;
        sock.write_all(b"$1\r\nK\r\n").await.unwrap();
        assert_eq!(kept.await.unwrap(), vec![Value::BulkString(b"K".to_vec())]);
        drop(sock);
        // An idle connection lost is reported too (nothing was in flight to fail).
        tokio::time::timeout(Duration::from_secs(5), async {
            while losses.seen() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the idle connection's loss is reported");
        drop(wire);
    }

    /// A server on a thread of its own that answers the handshake and every `PING`.
    fn pong_server() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                loop {
                    let mut sock = accept(&listener).await;
                    tokio::spawn(async move {
                        let ping = redis::cmd("PING").get_packed_command();
                        let mut buf = vec![0; ping.len()];
                        while sock.read_exact(&mut buf).await.is_ok() {
                            assert_eq!(buf, ping);
                            if sock.write_all(b"+PONG\r\n").await.is_err() {
                                break;
                            }
                        }
                    });
                }
            });
        });
        port
    }

    #[test]
    fn a_wire_outlives_the_tokio_runtime_its_task_ran_on() {
        let port = pong_server();
        let wire = wire_to(port, 0);
        let first = tokio::runtime::Runtime::new().unwrap();
        first.block_on(wire.ping()).unwrap();
        drop(first);
        // Its task went with the first runtime: the next request starts one on its own.
        let second = tokio::runtime::Runtime::new().unwrap();
        second.block_on(wire.ping()).unwrap();
        drop(second);
        // Outside any tokio runtime a request fails (no panic).
        use futures_util::FutureExt;
        let outside = wire.ping().now_or_never().expect("fails at once");
        assert!(outside.is_err());
    }

    #[tokio::test]
    async fn a_server_that_is_down_fails_the_request() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let wire = wire_to(port, 0);
        let err = wire.ping().await.unwrap_err();
        assert!(err.is_connection_refusal(), "{err}");
    }

    #[tokio::test]
    async fn dropping_the_wire_fails_requests_in_flight() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let wire = wire_to(listener.local_addr().unwrap().port(), 0);
        let caller = wire.caller();
        let in_flight = caller.send(Packed::Cmd(redis::cmd("GET").arg("a")), 1, 1);
        let sock = accept(&listener).await;
        drop(wire);
        assert!(in_flight.await.is_err());
        let err = caller
            .send(Packed::Cmd(redis::cmd("GET").arg("b")), 1, 1)
            .await
            .unwrap_err();
        assert!(err.is_connection_dropped(), "{err}");
        drop(sock);
    }
}

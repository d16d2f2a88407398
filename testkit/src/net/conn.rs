//! One proxied connection: both directions in one task, so that a fault reaches the whole
//! connection at once. Every socket call is non-blocking (`readable`/`try_read`,
//! `writable`/`try_write`), so a peer that stops reading (a frozen server) holds back only the
//! bytes for it, never the task's reaction to a fault.

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{Direction, Shared};

/// Bound on connecting to the server for a new client.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// One read takes at most this much.
const CHUNK: usize = 16 * 1024;

/// The fault epochs a connection started with (see `Epochs`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    resets: u64,
    blackholes: u64,
    half_closes: u64,
}

impl Seen {
    pub(super) fn now(shared: &Shared) -> Seen {
        let e = &shared.epochs;
        Seen {
            resets: e.resets.load(Ordering::SeqCst),
            blackholes: e.blackholes.load(Ordering::SeqCst),
            half_closes: e.half_closes.load(Ordering::SeqCst),
        }
    }
}

/// Sets `SO_LINGER` 0 on each socket, so that dropping it sends a RST; counts one reset.
pub(super) fn reset(shared: &Shared, sockets: &[&TcpStream]) {
    for socket in sockets {
        let _ = socket.set_zero_linger();
    }
    shared.counters.resets.fetch_add(1, Ordering::SeqCst);
}

/// Counts the connection open while it lives.
struct Open<'a>(&'a Shared);

impl<'a> Open<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.counters.open.fetch_add(1, Ordering::SeqCst);
        Open(shared)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.counters.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Bytes of one direction on their way: read from the source, waiting for their delivery time
/// or for the sink to take them.
struct Pipe {
    dir: Direction,
    queue: VecDeque<(Instant, Vec<u8>)>,
    /// The latest delivery time given: later chunks never overtake it.
    last_due: Instant,
    /// The source has not ended (EOF or error) yet.
    reading: bool,
    /// The sink is not shut down.
    writing: bool,
}

/// What a pipe waits for before its next write.
enum Next {
    Nothing,
    Until(Instant),
    Writable,
}

impl Pipe {
    fn new(dir: Direction) -> Pipe {
        Pipe {
            dir,
            queue: VecDeque::new(),
            last_due: Instant::now(),
            reading: true,
            writing: true,
        }
    }

    fn next(&self) -> Next {
        match self.queue.front() {
            None => Next::Nothing,
            Some((due, _)) if *due > Instant::now() => Next::Until(*due),
            Some(_) => Next::Writable,
        }
    }

    /// Drops what waits; returns how many bytes that was.
    fn clear(&mut self) -> u64 {
        let bytes = self.queue.iter().map(|(_, b)| b.len() as u64).sum();
        self.queue.clear();
        bytes
    }

    /// Queues `bytes` for delivery after the direction's latency.
    fn push(&mut self, shared: &Shared, bytes: Vec<u8>) {
        let due = (Instant::now() + shared.delay(self.dir)).max(self.last_due);
        self.last_due = due;
        self.queue.push_back((due, bytes));
    }

    /// Writes what is due and the sink takes now; then, once the source ended and nothing
    /// waits, shuts the sink's write side down (passes the FIN on).
    fn write_due(&mut self, shared: &Shared, sink: &TcpStream) -> io::Result<()> {
        let now = Instant::now();
        while let Some((due, bytes)) = self.queue.front_mut() {
            if *due > now {
                break;
            }
            match sink.try_write(bytes) {
                Ok(n) => {
                    count(shared, self.dir, n);
                    if n == bytes.len() {
                        self.queue.pop_front();
                    } else {
                        bytes.drain(..n);
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        if !self.reading && self.queue.is_empty() && self.writing {
            self.writing = false;
            let _ = socket2::SockRef::from(sink).shutdown(Shutdown::Write);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        !self.reading && self.queue.is_empty()
    }
}

/// Counts `n` bytes delivered travelling `dir`.
fn count(shared: &Shared, dir: Direction, n: usize) {
    let counter = match dir {
        Direction::ToServer => &shared.counters.to_server,
        Direction::ToClient => &shared.counters.to_client,
    };
    counter.fetch_add(n as u64, Ordering::SeqCst);
}

/// What one read gave.
enum Read {
    Bytes(Vec<u8>),
    /// Nothing now (a spurious wake-up).
    Nothing,
    Eof,
    Failed,
}

fn read_from(source: &TcpStream) -> Read {
    let mut buf = vec![0; CHUNK];
    match source.try_read(&mut buf) {
        Ok(0) => Read::Eof,
        Ok(n) => {
            buf.truncate(n);
            Read::Bytes(buf)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Read::Nothing,
        Err(_) => Read::Failed,
    }
}

/// Waits for what `pipe` needs before it can write to `sink`.
async fn ready(next: Next, sink: &TcpStream) {
    match next {
        Next::Nothing => std::future::pending().await,
        Next::Until(due) => tokio::time::sleep_until(due).await,
        Next::Writable => {
            let _ = sink.writable().await;
        }
    }
}

/// Serves one accepted connection: forwards it to `upstream`, or black-holes it from the start
/// (`None`), until both sides are done or a fault ends it. `seen` is the fault epochs when it
/// was accepted.
pub(super) async fn serve(
    shared: Arc<Shared>,
    client: TcpStream,
    upstream: Option<SocketAddr>,
    seen: Seen,
) {
    let _open = Open::new(&shared);
    let mut changed = shared.changed.subscribe();
    let server = match upstream {
        None => None,
        Some(addr) => {
            match tokio::time::timeout(CONNECT_WITHIN, TcpStream::connect(addr)).await {
                Ok(Ok(server)) => {
                    let _ = server.set_nodelay(true);
                    Some(server)
                }
                // The server refuses (or does not answer): so does the link.
                _ => return reset(&shared, &[&client]),
            }
        }
    };
    let mut link = Link {
        shared: &shared,
        seen,
        to_server: Pipe::new(Direction::ToServer),
        to_client: Pipe::new(Direction::ToClient),
        dead: server.is_none(),
        half_closed: false,
    };
    link.run(&client, server.as_ref(), &mut changed).await;
}

struct Link<'a> {
    shared: &'a Shared,
    seen: Seen,
    to_server: Pipe,
    to_client: Pipe,
    /// Black-holed: everything read is dropped, nothing is sent, for good.
    dead: bool,
    /// Half-closed toward the client: the client got a FIN, the server's bytes are dropped.
    half_closed: bool,
}

/// How a connection ends.
enum End {
    /// Both sides done, or the client left a dead connection: close normally.
    Close,
    /// A fault, or a side that failed: reset both.
    Reset,
}

impl Link<'_> {
    async fn run(
        &mut self,
        client: &TcpStream,
        server: Option<&TcpStream>,
        changed: &mut tokio::sync::watch::Receiver<()>,
    ) {
        let end = loop {
            if let Some(end) = self.apply_faults(client) {
                break end;
            }
            let step = match (self.dead, server) {
                (false, Some(server)) => self.forward(client, server, changed).await,
                (_, server) => self.drop_everything(client, server, changed).await,
            };
            if let Some(end) = step {
                break end;
            }
        };
        if let End::Reset = end {
            let sockets: Vec<&TcpStream> = std::iter::once(client).chain(server).collect();
            reset(self.shared, &sockets);
        }
    }

    /// Applies the faults set since the connection began: a reset ends it; a black hole
    /// kills it; a half-close shuts the client's read side.
    fn apply_faults(&mut self, client: &TcpStream) -> Option<End> {
        let now = Seen::now(self.shared);
        if now.resets != self.seen.resets {
            return Some(End::Reset);
        }
        if now.blackholes != self.seen.blackholes && !self.dead {
            self.dead = true;
            let dropped = self.to_server.clear() + self.to_client.clear();
            self.shared
                .counters
                .dropped
                .fetch_add(dropped, Ordering::SeqCst);
        }
        if now.half_closes != self.seen.half_closes && !self.half_closed && !self.dead {
            self.half_closed = true;
            let dropped = self.to_client.clear();
            self.shared
                .counters
                .dropped
                .fetch_add(dropped, Ordering::SeqCst);
            self.to_client.writing = false;
            let _ = socket2::SockRef::from(client).shutdown(Shutdown::Write);
        }
        self.seen = now;
        None
    }

    /// One step of a live connection: a fault, a read, or a write.
    async fn forward(
        &mut self,
        client: &TcpStream,
        server: &TcpStream,
        changed: &mut tokio::sync::watch::Receiver<()>,
    ) -> Option<End> {
        let (to_server, to_client) = (self.to_server.next(), self.to_client.next());
        tokio::select! {
            _ = changed.changed() => {}
            _ = client.readable(), if self.to_server.reading => {
                match read_from(client) {
                    Read::Bytes(bytes) => self.to_server.push(self.shared, bytes),
                    Read::Nothing => {}
                    Read::Eof => self.to_server.reading = false,
                    Read::Failed => return Some(End::Reset),
                }
            }
            _ = server.readable(), if self.to_client.reading => {
                match read_from(server) {
                    Read::Bytes(bytes) if self.half_closed => {
                        self.shared.counters.dropped.fetch_add(bytes.len() as u64, Ordering::SeqCst);
                    }
                    Read::Bytes(bytes) => self.to_client.push(self.shared, bytes),
                    Read::Nothing => {}
                    Read::Eof => self.to_client.reading = false,
                    Read::Failed => return Some(End::Reset),
                }
            }
            _ = ready(to_server, server) => {}
            _ = ready(to_client, client) => {}
        }
        // A fault set meanwhile applies before anything more is written (what was just read
        // may have come after it).
        if Seen::now(self.shared) != self.seen {
            return None;
        }
        if self.to_server.write_due(self.shared, server).is_err() {
            return Some(End::Reset);
        }
        if !self.half_closed && self.to_client.write_due(self.shared, client).is_err() {
            return Some(End::Reset);
        }
        let to_client_done = self.to_client.done() || self.half_closed;
        (self.to_server.done() && to_client_done).then_some(End::Close)
    }

    /// One step of a dead connection: read both sides and drop it all, until the client
    /// leaves (then the server side is closed too).
    async fn drop_everything(
        &mut self,
        client: &TcpStream,
        server: Option<&TcpStream>,
        changed: &mut tokio::sync::watch::Receiver<()>,
    ) -> Option<End> {
        let reading = self.to_client.reading;
        let server_readable = async {
            match server {
                Some(server) if reading => server.readable().await,
                _ => std::future::pending().await,
            }
        };
        let dropped = |bytes: Vec<u8>| {
            self.shared
                .counters
                .dropped
                .fetch_add(bytes.len() as u64, Ordering::SeqCst);
        };
        tokio::select! {
            _ = changed.changed() => None,
            _ = client.readable() => match read_from(client) {
                Read::Bytes(bytes) => {
                    dropped(bytes);
                    None
                }
                Read::Nothing => None,
                Read::Eof | Read::Failed => Some(End::Close),
            },
            _ = server_readable => {
                match server.map(read_from) {
                    Some(Read::Bytes(bytes)) => dropped(bytes),
                    Some(Read::Eof | Read::Failed) => self.to_client.reading = false,
                    _ => {}
                }
                None
            }
        }
    }
}

//! Network faults between one client and one server: [`FaultProxy`], a TCP proxy on a free
//! loopback port that forwards to a server's port and, on the test's command, delays, black-holes,
//! resets, half-closes or cuts the link, then heals it.
//!
//! One proxy is one link: a test points a runtime's URL at [`FaultProxy::port`] instead of the
//! server's, and every connection the runtime makes to that server goes through it. The faults:
//!
//! | call | what the client sees |
//! |---|---|
//! | [`set_latency`](FaultProxy::set_latency) / [`latency`](FaultProxy::latency) | every chunk delivered `delay ± jitter` after it arrived, per direction, never reordered |
//! | [`blackhole`](FaultProxy::blackhole) | nothing: its writes succeed (the proxy keeps reading), no byte or FIN or RST comes back, nothing reaches the server; new connections are accepted and silent too |
//! | [`reset`](FaultProxy::reset) | `ECONNRESET` on every open connection (RST, `SO_LINGER` 0, also to the server); new ones pass |
//! | [`half_close`](FaultProxy::half_close) | EOF on every open connection (FIN from the server's side) while its own bytes still reach the server |
//! | [`cut`](FaultProxy::cut) / [`cut_for`](FaultProxy::cut_for) | every open connection reset, every new one accepted and reset at once, until healed |
//! | [`heal`](FaultProxy::heal), [`heal_after`](FaultProxy::heal_after) | new connections pass again, without latency |
//!
//! A connection that was black-holed stays silent after the heal, for good: its bytes are gone
//! (like a dropped NAT entry or a peer that lost its state), so only a client that gives up on
//! it and connects again is served. [`set_upstream`](FaultProxy::set_upstream) re-routes new
//! connections to another server (a working path). [`stats`](FaultProxy::stats) counts
//! connections and bytes, so a test can tell whether its client connected again.
//!
//! Each proxy runs on a thread of its own with a single-threaded tokio runtime: a test that
//! blocks its own runtime's threads does not stall the link, and the handle's methods are plain
//! calls usable from sync and async code alike. Dropping the handle stops the thread and every
//! task on it (open connections are closed) and frees the port.
//!
//! Why written here and not the `noxious` crate (a Toxiproxy port in Rust, 1.0.4), measured on
//! this machine in December 2026: its library can be embedded (`ProxyRunner::run_proxy` with a
//! toxic channel), and on top of this workspace it builds 7 more crates (itself, `bmrng`,
//! `mockall_double`, `tokio-util` 0.6, `rand` 0.8 with `rand_chacha` and `rand_core` 0.6) in
//! about 9 s of wall time (3.8 s CPU) on the loaded 2 cores; the build cost is not the reason.
//! Its toxics are latency with jitter, timeout (a black hole, per direction), bandwidth, slow
//! close, slicer and limit-data: it has no reset (Toxiproxy's `reset_peer` came later), no
//! half-close, no cut of existing connections (only disabling a proxy in its server binary),
//! and no way to learn the port it bound (it binds a string address: choosing a port first
//! races other processes). Its last release is from April 2021 (one dependency bump since, in
//! 2023). What is needed here is about 500 lines on tokio and `socket2`, both already in the
//! build, with a unit test per fault.

use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{oneshot, watch};

use crate::process::RESERVED_PORTS;

mod conn;
#[cfg(test)]
mod tests;

/// A direction of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server (requests).
    ToServer,
    /// From the server to the client (replies).
    ToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ToServer => 0,
            Direction::ToClient => 1,
        }
    }
}

/// What a link does with new connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    /// Forward (with the latency set).
    Open,
    /// Accept, read and drop everything, answer nothing.
    Blackhole,
    /// Accept and reset at once.
    Cut,
}

/// Latency of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Latency {
    delay: Duration,
    jitter: Duration,
}

/// What the handle sets and the connections read.
struct Control {
    upstream: SocketAddr,
    state: LinkState,
    latency: [Latency; 2],
    /// xorshift state for the jitter.
    rng: u64,
    /// Counts faults and heals, so that a timed heal only heals the fault it was set for.
    generation: u64,
}

/// Counters the connections compare against the values they started with: a fault applies to
/// every connection open when it was set, however soon it is healed.
#[derive(Default)]
struct Epochs {
    resets: AtomicU64,
    blackholes: AtomicU64,
    half_closes: AtomicU64,
}

/// Connection and byte counts of a proxy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted so far.
    pub accepted: u64,
    /// Connections open now.
    pub open: u64,
    /// Bytes delivered to the server.
    pub to_server: u64,
    /// Bytes delivered to the client.
    pub to_client: u64,
    /// Bytes read and dropped (black hole, half-close).
    pub dropped: u64,
    /// Connections ended with a reset (a fault, or a peer's reset passed on).
    pub resets: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
    to_server: AtomicU64,
    to_client: AtomicU64,
    dropped: AtomicU64,
    resets: AtomicU64,
}

/// What the handle and the proxy's tasks share.
struct Shared {
    control: Mutex<Control>,
    epochs: Epochs,
    counters: Counters,
    /// Woken at every command: connections look at the epochs again.
    changed: watch::Sender<()>,
}

impl Shared {
    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The delay of a chunk read now, travelling `dir`: `delay ± jitter` (never below zero).
    fn delay(&self, dir: Direction) -> Duration {
        let mut control = self.control();
        let Latency { delay, jitter } = control.latency[dir.index()];
        if jitter.is_zero() {
            return delay;
        }
        let mut x = control.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        control.rng = x;
        let span = 2 * jitter.as_micros() as u64 + 1;
        let offset = Duration::from_micros(x % span);
        (delay + offset).saturating_sub(jitter)
    }

    fn notify(&self) {
        self.changed.send_replace(());
    }
}

/// A TCP proxy for one client↔server link on a free loopback port, with faults set at run
/// time (see the [module documentation](self)). Stops, closing every connection, when dropped.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let control = self.shared.control();
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("upstream", &control.upstream)
            .field("state", &control.state)
            .field("latency", &control.latency)
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `127.0.0.1:<port>`.
    pub fn to_port(port: u16) -> FaultProxy {
        FaultProxy::start((Ipv4Addr::LOCALHOST, port).into())
    }

    /// A proxy on a free loopback port (never one of the engines' default ports) forwarding
    /// to `upstream`. The link is open, without latency.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = loop {
            let listener =
                StdListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
            let port = listener.local_addr().expect("local address").port();
            if !RESERVED_PORTS.contains(&port) {
                break listener;
            }
        };
        let port = listener.local_addr().expect("local address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
            | 1;
        let shared = Arc::new(Shared {
            control: Mutex::new(Control {
                upstream,
                state: LinkState::Open,
                latency: [Latency::default(); 2],
                rng: seed,
                generation: 0,
            }),
            epochs: Epochs::default(),
            counters: Counters::default(),
            changed: watch::channel(()).0,
        });
        let (stop, stopped) = oneshot::channel();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the fault proxy's tokio runtime");
                let _ = handle_tx.send(runtime.handle().clone());
                runtime.block_on(accept_loop(thread_shared, listener, stopped));
                // Dropping the runtime drops every connection task, closing its sockets.
            })
            .expect("start the fault proxy's thread");
        let runtime = handle_rx.recv().expect("the fault proxy's runtime started");
        FaultProxy {
            port,
            shared,
            runtime,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        (Ipv4Addr::LOCALHOST, self.port).into()
    }

    /// `127.0.0.1:<port>`, as a host for a URL.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where new connections are forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.control().upstream
    }

    /// Forwards new connections to `upstream` from now on (open ones keep their server).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        self.shared.control().upstream = upstream;
    }

    /// Delays every chunk travelling `dir` by `delay ± jitter` (uniformly; bytes are never
    /// reordered: a chunk waits for the one before it). Applies to chunks read from now on, on
    /// open and new connections. Zero `delay` and `jitter` turn it off.
    pub fn set_latency(&self, dir: Direction, delay: Duration, jitter: Duration) {
        assert!(
            jitter <= delay,
            "jitter {jitter:?} above the delay {delay:?}"
        );
        self.shared.control().latency[dir.index()] = Latency { delay, jitter };
    }

    /// [`set_latency`](FaultProxy::set_latency) in both directions: a round trip takes at
    /// least twice `delay - jitter` longer.
    pub fn latency(&self, delay: Duration, jitter: Duration) {
        self.set_latency(Direction::ToServer, delay, jitter);
        self.set_latency(Direction::ToClient, delay, jitter);
    }

    /// Black-holes the link: every open connection and every new one is accepted and read,
    /// and nothing is delivered either way (no byte, no FIN, no RST); bytes waiting for their
    /// latency are dropped. Connections black-holed stay so after [`heal`](FaultProxy::heal).
    pub fn blackhole(&self) {
        self.set_state(LinkState::Blackhole);
        self.shared.epochs.blackholes.fetch_add(1, Ordering::SeqCst);
        self.shared.notify();
    }

    /// Resets every open connection (RST to the client and to the server, `SO_LINGER` 0). The
    /// link's state does not change: new connections pass if it is open.
    pub fn reset(&self) {
        self.shared.epochs.resets.fetch_add(1, Ordering::SeqCst);
        self.shared.notify();
    }

    /// Half-closes every open connection toward its client: the client reads EOF (a FIN, as if
    /// the server had shut its side down) and what the server sends afterwards is dropped,
    /// while the client's bytes still reach the server. New connections pass.
    pub fn half_close(&self) {
        self.shared
            .epochs
            .half_closes
            .fetch_add(1, Ordering::SeqCst);
        self.shared.notify();
    }

    /// Cuts the link until [`heal`](FaultProxy::heal): every open connection is reset, every
    /// new one accepted and reset at once (what a client sees of a peer that refuses it).
    pub fn cut(&self) {
        self.set_state(LinkState::Cut);
        self.reset();
    }

    /// [`cut`](FaultProxy::cut), healed by itself after `period` (unless another fault or
    /// heal came meanwhile).
    pub fn cut_for(&self, period: Duration) {
        self.cut();
        self.heal_after(period);
    }

    /// Ends the faults: new connections pass, without latency. Connections black-holed or
    /// half-closed stay so.
    pub fn heal(&self) {
        let mut control = self.shared.control();
        control.state = LinkState::Open;
        control.latency = [Latency::default(); 2];
        control.generation += 1;
        drop(control);
        self.shared.notify();
    }

    /// [`heal`](FaultProxy::heal)s after `period`, unless another fault or heal came
    /// meanwhile. Returns at once.
    pub fn heal_after(&self, period: Duration) {
        let generation = self.shared.control().generation;
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(period).await;
            let mut control = shared.control();
            if control.generation == generation {
                control.state = LinkState::Open;
                control.latency = [Latency::default(); 2];
                control.generation += 1;
                drop(control);
                shared.notify();
            }
        });
    }

    /// Whether the link is open (not black-holed or cut; latency may be set).
    pub fn is_open(&self) -> bool {
        self.shared.control().state == LinkState::Open
    }

    /// Connection and byte counts so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            accepted: c.accepted.load(Ordering::SeqCst),
            open: c.open.load(Ordering::SeqCst),
            to_server: c.to_server.load(Ordering::SeqCst),
            to_client: c.to_client.load(Ordering::SeqCst),
            dropped: c.dropped.load(Ordering::SeqCst),
            resets: c.resets.load(Ordering::SeqCst),
        }
    }

    fn set_state(&self, state: LinkState) {
        let mut control = self.shared.control();
        control.state = state;
        control.generation += 1;
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until `stopped`; each runs in a task of its own.
async fn accept_loop(
    shared: Arc<Shared>,
    listener: StdListener,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener =
        tokio::net::TcpListener::from_std(listener).expect("register the proxy's listener");
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else {
            // Out of file descriptors or similar: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.counters.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        // The epochs before the state: a fault set meanwhile reaches this connection either
        // way (see `Epochs`).
        let seen = conn::Seen::now(&shared);
        let (state, upstream) = {
            let control = shared.control();
            (control.state, control.upstream)
        };
        match state {
            LinkState::Cut => conn::reset(&shared, &[&client]),
            LinkState::Blackhole => {
                tokio::spawn(conn::serve(shared.clone(), client, None, seen));
            }
            LinkState::Open => {
                tokio::spawn(conn::serve(shared.clone(), client, Some(upstream), seen));
            }
        }
    }
}

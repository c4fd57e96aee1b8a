//! The connections of `dlframe serve`, and who gets one when they run short.
//!
//! At most `max_connections` are open at once, and at most `max_per_peer` from one address. When
//! a new connection finds either full, it takes the place of a connection with no call open:
//! one that has not authenticated yet (a silent one first, the oldest first), else the one
//! quiet the longest; a peer at its own cap makes way among its own connections. Only
//! when every connection in its way is busy is the new one closed. So one holder of the token
//! who opens every slot with one call each, or a peer that reopens unauthenticated sockets as
//! they close, pushes out its own idle connections, not the next client. The connection that
//! gives way is closed at once, so the caps bound the descriptors too. (The server has one
//! token, so a cap per token would be the total cap: the peer and the calls are what tell
//! callers apart.) A connection that has made no authenticated call within `idle` is closed
//! too. An accept error (out of descriptors) waits a moment instead of spinning.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A connection's random id (see [`ConnInfo::caller`]).
pub(crate) type Caller = [u8; 16];

/// Who holds a prepared statement or asked for a query: its caller (None where calls come
/// without connection info).
pub(crate) type Owner = Option<Caller>;

/// The bounds on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one address.
    pub max_per_peer: usize,
    /// How long a connection may stay without an authenticated call.
    pub idle: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits { max_connections: 256, max_per_peer: 128, idle: Duration::from_secs(10) }
    }
}

/// What the server knows of a connection while it is open: whether a call has authenticated,
/// the calls open on it, and when one last started or ended.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    authenticated: AtomicBool,
    /// Whether the peer has sent a byte (a silent socket gives way before one that speaks).
    spoke: AtomicBool,
    calls: AtomicUsize,
    last_call_ms: AtomicU64,
}

impl ConnState {
    pub(crate) fn authenticate(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
    }

    /// Counts a call open from now until the returned guard drops (at the end of its response).
    pub(crate) fn open_call(self: &Arc<Self>) -> OpenCall {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.last_call_ms.store(now_ms(), Ordering::Relaxed);
        OpenCall(self.clone())
    }
}

/// A call open on a connection (see [`ConnState::open_call`]).
pub(crate) struct OpenCall(Arc<ConnState>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.0.last_call_ms.store(now_ms(), Ordering::Relaxed);
        self.0.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Milliseconds since the first call of this function in the process.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// What a call learns of its connection: the peer, its id and its state.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    pub tcp: TcpConnectInfo,
    /// A random id of the connection: the caller that owns its prepared statements and may
    /// cancel its queries (callers share the token, so the connection is what tells them apart).
    pub caller: Caller,
    pub state: Arc<ConnState>,
}

/// A connection's socket, shared between its connection and the table of open ones, so that a
/// connection that gives way is closed at once (its descriptor freed), not when its task next
/// runs. None once closed.
type Socket = Arc<Mutex<Option<TcpStream>>>;

/// The open connections, for choosing which one gives way to a new one.
struct Open {
    limits: ConnLimits,
    next: u64,
    conns: HashMap<u64, Entry>,
}

struct Entry {
    peer: Option<IpAddr>,
    opened_ms: u64,
    state: Arc<ConnState>,
    socket: Socket,
    /// Wakes the connection's task once its socket is closed, so that it ends.
    wake: oneshot::Sender<()>,
}

/// Every connection in a new one's way has a call open.
#[derive(Debug, PartialEq, Eq)]
struct Busy;

impl Open {
    fn new(limits: ConnLimits) -> Self {
        Open { limits, next: 0, conns: HashMap::new() }
    }

    /// Lets a connection from `peer` in, closing an idle one where a cap is reached. Returns its
    /// key, its state and what wakes it when it is closed.
    fn admit(
        &mut self,
        peer: Option<IpAddr>,
        socket: Socket,
    ) -> Result<(u64, Arc<ConnState>, oneshot::Receiver<()>), Busy> {
        let from_peer = self.conns.values().filter(|e| e.peer == peer).count();
        let in_the_way = if from_peer >= self.limits.max_per_peer {
            Some(true)
        } else if self.conns.len() >= self.limits.max_connections {
            Some(false)
        } else {
            None
        };
        if let Some(same_peer) = in_the_way {
            let victim = self.idlest(|e| !same_peer || e.peer == peer).ok_or(Busy)?;
            let entry = self.conns.remove(&victim).expect("a key just chosen");
            drop(lock(&entry.socket).take());
            // A connection that has ended meanwhile has dropped its receiver: nothing to wake.
            let _ = entry.wake.send(());
        }
        let key = self.next;
        self.next += 1;
        let state = Arc::new(ConnState::default());
        let (wake, woken) = oneshot::channel();
        self.conns.insert(key, Entry { peer, opened_ms: now_ms(), state: state.clone(), socket, wake });
        Ok((key, state, woken))
    }

    /// The connection that gives way first among those `eligible` with no call open: one that
    /// has not authenticated (a silent one before one that has spoken, the oldest first), else
    /// the one whose last call ended the longest ago. A socket has spoken once the server has
    /// read from it, or once bytes wait in it unread (a client's first bytes arrive before the
    /// server's task gets to read them).
    fn idlest(&self, eligible: impl Fn(&Entry) -> bool) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, e)| eligible(e) && e.state.calls.load(Ordering::Relaxed) == 0)
            .min_by_key(|(key, e)| {
                // Keys count up: among equal times, the older connection gives way.
                let state = &e.state;
                if state.authenticated.load(Ordering::Relaxed) {
                    (2, state.last_call_ms.load(Ordering::Relaxed), **key)
                } else {
                    (u8::from(state.spoke.load(Ordering::Relaxed) || unread(&e.socket)), e.opened_ms, **key)
                }
            })
            .map(|(k, _)| *k)
    }
}

/// Whether bytes wait unread in `socket` (false once it is closed, or where this cannot be told).
fn unread(socket: &Socket) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let guard = lock(socket);
        let Some(stream) = guard.as_ref() else { return false };
        let mut byte = 0u8;
        // SAFETY: the descriptor is the open socket of `stream`, held by the lock for the call;
        // recv writes at most one byte into `byte`. MSG_PEEK leaves the byte in the socket and
        // MSG_DONTWAIT keeps the call from blocking.
        let n = unsafe {
            libc::recv(stream.as_raw_fd(), (&raw mut byte).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        n > 0
    }
    #[cfg(not(unix))]
    {
        let _ = socket;
        false
    }
}

/// One accepted connection.
pub(crate) struct Conn {
    socket: Socket,
    info: ConnInfo,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Ready once the socket has been closed for a new connection; None once it has been ready.
    woken: Option<oneshot::Receiver<()>>,
    open: Arc<Mutex<Open>>,
    key: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        lock(&self.open).conns.remove(&self.key);
    }
}

/// Locks a mutex whose data stays consistent through a panic (the table changes by one insert
/// or remove, a socket by one take), taking over a poisoned lock.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl Conn {
    /// Runs `io` on the socket, unless the connection's deadline has passed without an
    /// authenticated call or the socket has been closed for a new connection.
    fn with_socket<R>(
        &mut self,
        cx: &mut Context<'_>,
        io: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if !self.info.state.authenticated.load(Ordering::Relaxed)
            && self.deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no authenticated call in time",
            )));
        }
        // Polled only to be woken; a receiver is polled until it is ready, never after.
        if let Some(rx) = &mut self.woken
            && Pin::new(rx).poll(cx).is_ready()
        {
            self.woken = None;
        }
        match lock(&self.socket).as_mut() {
            Some(stream) => io(Pin::new(stream), cx),
            None => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "gave way to a new connection",
            ))),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = self.with_socket(cx, |s, cx| s.poll_read(cx, buf));
        let spoke = &self.info.state.spoke;
        if buf.filled().len() > before && !spoke.load(Ordering::Relaxed) {
            spoke.store(true, Ordering::Relaxed);
        }
        polled
    }
}

// Writes check the deadline too: a client that sends without reading stalls the server's
// writes, and then no read is polled.
impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.with_socket(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with_socket(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match lock(&self.socket).as_mut() {
            Some(stream) => Pin::new(stream).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// The accepted connections of `listener`, within `limits`.
pub(crate) fn incoming(listener: TcpListener, limits: ConnLimits) -> impl Stream<Item = io::Result<Conn>> {
    let open = Arc::new(Mutex::new(Open::new(limits)));
    futures::stream::unfold((listener, open), move |(listener, open)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let tcp =
                        TcpConnectInfo { local_addr: stream.local_addr().ok(), remote_addr: Some(peer) };
                    let socket = Arc::new(Mutex::new(Some(stream)));
                    // Where nothing can give way the connection is closed at once (the socket
                    // dropped): the client sees a reset.
                    let Ok((key, state, woken)) = lock(&open).admit(Some(peer.ip()), socket.clone()) else {
                        continue;
                    };
                    let mut caller = [0u8; 16];
                    // The system's random source; `serve` checks at start that there is one.
                    getrandom::fill(&mut caller).expect("the system's random source");
                    let conn = Conn {
                        socket,
                        info: ConnInfo { tcp, caller, state },
                        deadline: Box::pin(tokio::time::sleep(limits.idle)),
                        woken: Some(woken),
                        open: open.clone(),
                        key,
                    };
                    return Some((Ok(conn), (listener, open)));
                }
                // Out of descriptors, or a connection reset before it was accepted: wait a moment
                // (others close meanwhile) rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

/// Raises the soft limit on open files to the hard limit, so the connection cap, not the
/// descriptors, is what bounds the connections. Returns the soft limit now in force.
#[allow(clippy::unnecessary_cast, reason = "rlim_t is u64 on Linux and macOS, i64 on some BSDs")]
pub(crate) fn raise_open_files() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            // SAFETY: `raised` is a valid rlimit, within the hard limit just read.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                return Some(raised.rlim_cur as u64);
            }
        }
        Some(lim.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_per_peer: usize) -> ConnLimits {
        ConnLimits { max_connections, max_per_peer, idle: Duration::from_secs(10) }
    }

    const A: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)));

    fn none() -> Socket {
        Arc::new(Mutex::new(None))
    }

    /// Whether the connection admitted as `rx` has been asked to give way.
    fn asked(rx: &mut oneshot::Receiver<()>) -> bool {
        rx.try_recv().is_ok()
    }

    #[test]
    fn an_unauthenticated_connection_gives_way_first_then_the_longest_quiet() {
        let mut open = Open::new(limits(3, 3));
        let (_, s0, mut r0) = open.admit(A, none()).unwrap();
        let (_, s1, mut r1) = open.admit(A, none()).unwrap();
        let (_, _s2, mut r2) = open.admit(A, none()).unwrap();
        s0.authenticate();
        s1.authenticate();
        drop(s1.open_call());
        s1.last_call_ms.store(1_000, Ordering::Relaxed);
        // Full: the one that never authenticated (the newest) gives way, not the older quiet ones.
        let (_, s3, _r3) = open.admit(B, none()).unwrap();
        assert!(asked(&mut r2) && !asked(&mut r0) && !asked(&mut r1));
        s3.authenticate();
        // Then the one quiet the longest: s0 never called, s1 called and ended.
        open.admit(B, none()).unwrap();
        assert!(asked(&mut r0) && !asked(&mut r1));
    }

    #[test]
    fn a_silent_socket_gives_way_before_one_that_has_spoken() {
        let mut open = Open::new(limits(2, 2));
        let (_, s0, mut r0) = open.admit(A, none()).unwrap();
        let (_, _, mut r1) = open.admit(A, none()).unwrap();
        s0.spoke.store(true, Ordering::Relaxed);
        open.admit(B, none()).unwrap();
        assert!(asked(&mut r1) && !asked(&mut r0));
    }

    #[test]
    fn a_connection_with_a_call_open_never_gives_way() {
        let mut open = Open::new(limits(2, 2));
        let (_, s0, mut r0) = open.admit(A, none()).unwrap();
        let (_, s1, mut r1) = open.admit(A, none()).unwrap();
        let c0 = s0.open_call();
        let c1 = s1.open_call();
        assert_eq!(open.admit(B, none()).unwrap_err(), Busy);
        assert!(!asked(&mut r0) && !asked(&mut r1));
        drop(c1);
        open.admit(B, none()).unwrap();
        assert!(asked(&mut r1) && !asked(&mut r0));
        drop(c0);
    }

    #[test]
    fn a_peer_at_its_cap_makes_way_among_its_own() {
        let mut open = Open::new(limits(10, 2));
        let (_, _, mut rb) = open.admit(B, none()).unwrap();
        let (_, _, mut ra0) = open.admit(A, none()).unwrap();
        let (_, sa1, mut ra1) = open.admit(A, none()).unwrap();
        // B's unauthenticated connection is older, but A's third connection replaces one of A's.
        let (_, sa2, _) = open.admit(A, none()).unwrap();
        assert!(asked(&mut ra0) && !asked(&mut ra1) && !asked(&mut rb));
        // With A's two busy, A gets no more, while B still does.
        let (_c1, _c2) = (sa1.open_call(), sa2.open_call());
        assert_eq!(open.admit(A, none()).unwrap_err(), Busy);
        open.admit(B, none()).unwrap();
        assert!(!asked(&mut rb));
    }

    #[tokio::test]
    async fn a_socket_with_bytes_waiting_counts_as_spoken() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut open = Open::new(limits(2, 2));
        let mut talker = TcpStream::connect(addr).await.unwrap();
        let (first, _) = listener.accept().await.unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let (second, _) = listener.accept().await.unwrap();
        let (first, second) = (Arc::new(Mutex::new(Some(first))), Arc::new(Mutex::new(Some(second))));
        open.admit(A, first.clone()).unwrap();
        open.admit(A, second.clone()).unwrap();
        // The older socket has sent bytes that nobody has read: the newer, silent one gives way.
        talker.write_all(b"PRI").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(unread(&first) && !unread(&second));
        open.admit(A, none()).unwrap();
        assert!(lock(&first).is_some() && lock(&second).is_none());
    }

    #[tokio::test]
    async fn the_socket_that_gives_way_is_closed_at_once() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (served, _) = listener.accept().await.unwrap();
        let mut open = Open::new(limits(1, 1));
        let socket = Arc::new(Mutex::new(Some(served)));
        let (_, _, mut woken) = open.admit(A, socket.clone()).unwrap();
        open.admit(A, none()).unwrap();
        assert!(lock(&socket).is_none() && woken.try_recv().is_ok());
        assert_eq!(open.conns.len(), 1);
        // The client reads the end of the stream without anything else running on the server.
        let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut [0u8; 8])).await.unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}

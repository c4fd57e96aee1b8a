//! The connections of `dlframe serve`: at most `max_connections` at once (one past it is closed
//! as soon as it is accepted), and a connection that has made no authenticated call within
//! `idle` is closed, so a flood of idle connections cannot take the file descriptors that real
//! clients need. An accept error (out of descriptors) waits a moment instead of spinning.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The bounds on connections.
/// A connection's random id (see [`ConnInfo::caller`]).
pub(crate) type Caller = [u8; 16];

/// Who holds a prepared statement or asked for a query: its caller (None where calls come
/// without connection info).
pub(crate) type Owner = Option<Caller>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a connection may stay without an authenticated call.
    pub idle: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits { max_connections: 256, idle: Duration::from_secs(10) }
    }
}

/// What a call learns of its connection: the peer, and the flag it sets once authenticated.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    pub tcp: TcpConnectInfo,
    /// A random id of the connection: the caller that owns its prepared statements and may
    /// cancel its queries (callers share the token, so the connection is what tells them apart).
    pub caller: Caller,
    pub authenticated: Arc<AtomicBool>,
}

/// One accepted connection.
pub(crate) struct Conn {
    stream: TcpStream,
    info: ConnInfo,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl Conn {
    /// Fails the connection once its deadline has passed without an authenticated call.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.info.authenticated.load(Ordering::Relaxed) && self.deadline.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no authenticated call in time"));
        }
        Ok(())
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_idle(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

// Writes check the deadline too: a client that sends without reading stalls the server's
// writes, and then no read is polled.
impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check_idle(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_idle(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The accepted connections of `listener`, within `limits`.
pub(crate) fn incoming(listener: TcpListener, limits: ConnLimits) -> impl Stream<Item = io::Result<Conn>> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    futures::stream::unfold((listener, slots), move |(listener, slots)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    // Past the cap the connection is closed at once: the client sees a reset.
                    let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
                    let _ = stream.set_nodelay(true);
                    let tcp = TcpConnectInfo {
                        local_addr: stream.local_addr().ok(),
                        remote_addr: stream.peer_addr().ok(),
                    };
                    let mut caller = [0u8; 16];
                    // The system's random source; `serve` checks at start that there is one.
                    getrandom::fill(&mut caller).expect("the system's random source");
                    let info = ConnInfo { tcp, authenticated: Arc::new(AtomicBool::new(false)), caller };
                    let conn = Conn {
                        stream,
                        info,
                        deadline: Box::pin(tokio::time::sleep(limits.idle)),
                        _slot: slot,
                    };
                    return Some((Ok(conn), (listener, slots)));
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

//! A `dlframe serve` process on `127.0.0.1:0` and a gRPC channel to it, for the Flight SQL
//! tests; the process is killed on drop unless it was stopped.

use tonic::transport::Channel;

use super::process::{LIMIT, Process};

/// A `dlframe serve` process and its address.
pub struct Server {
    pub process: Process,
    pub addr: String,
}

impl Server {
    /// Starts `dlframe serve --listen 127.0.0.1:0 ARGS...` and waits for its address.
    pub fn start(args: &[&str]) -> Server {
        let mut process = Process::start(&[&["serve", "--listen", "127.0.0.1:0"], args].concat());
        let addr = process.address("listening on ");
        Server { process, addr }
    }

    /// A plain-text channel to the server, every call bounded by [`LIMIT`].
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(LIMIT)
            .timeout(LIMIT)
            .connect()
            .await
            .unwrap()
    }
}

//! Which connection made each job on `dlframe scheduler`, so that a job's status, its
//! cancellation and its data belong to the client that made it: clients share the cluster
//! token, so the connection is what tells them apart (a Ballista client asks for a job and
//! follows it on one connection). Another connection is told the job is unknown, whether it
//! exists or not. The table keeps the newest [`MAX_JOBS`] jobs; an older one belongs to no one.
//!
//! A job's id is also what an executor serves its results by, to any caller with the cluster
//! token. Ballista's own ids are snowflakes (the millisecond and a count): a client could find
//! the id of a job made between two of its own and read its results. So the scheduler makes ids
//! of 128 bits from the system's random source ([`RandomJobIds`]), told only to the connection
//! that made the job: the id is the capability to read its results.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;

use ballista_scheduler::scheduler_server::JobIdGenerator;
use tonic::{Request, Status};

/// How many jobs the table remembers.
pub(crate) const MAX_JOBS: usize = 65_536;

/// The connection a call came on, as axum gives it to the scheduler's handlers.
pub(crate) fn peer<T>(request: &Request<T>) -> Option<SocketAddr> {
    request.extensions().get::<axum::extract::ConnectInfo<SocketAddr>>().map(|c| c.0)
}

/// Job ids of 128 bits from the system's random source, as 32 lowercase hex digits: nothing in
/// one id tells another.
pub(crate) struct RandomJobIds;

#[tonic::async_trait]
impl JobIdGenerator for RandomJobIds {
    async fn next_id(&self) -> String {
        let mut bits = [0u8; 16];
        getrandom::fill(&mut bits).expect("the system's random source");
        bits.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Each job's owner, the oldest forgotten first.
#[derive(Debug, Default)]
pub(crate) struct Jobs(Mutex<Table>);

#[derive(Debug, Default)]
struct Table {
    owners: HashMap<String, SocketAddr>,
    order: VecDeque<String>,
}

impl Jobs {
    /// Records that the connection `owner` made job `id`.
    pub(crate) fn made(&self, id: &str, owner: Option<SocketAddr>) {
        let Some(owner) = owner else { return };
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if t.owners.insert(id.to_string(), owner).is_none() {
            t.order.push_back(id.to_string());
        }
        while t.order.len() > MAX_JOBS {
            let old = t.order.pop_front().expect("a job past the limit");
            t.owners.remove(&old);
        }
    }

    /// Refuses a call about job `id` from a connection other than its maker's. `same_host`
    /// lets any connection from the maker's address through (for read-only metrics, which
    /// Ballista's client asks for on a connection of their own).
    pub(crate) fn check(&self, id: &str, from: Option<SocketAddr>, same_host: bool) -> Result<(), Status> {
        let t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let ok = match (t.owners.get(id), from) {
            (Some(owner), Some(from)) => *owner == from || (same_host && owner.ip() == from.ip()),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(Status::not_found(format!("dlframe cluster: no job {id:?} of this connection")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_job_belongs_to_the_connection_that_made_it() {
        let jobs = Jobs::default();
        jobs.made("a1", at("10.0.0.1:4000"));
        assert!(jobs.check("a1", at("10.0.0.1:4000"), false).is_ok());
        for other in ["10.0.0.1:4001", "10.0.0.2:4000"] {
            let e = jobs.check("a1", at(other), false).unwrap_err();
            assert_eq!(e.code(), tonic::Code::NotFound, "{other}");
        }
        // The same words for a job that does not exist.
        let unknown = jobs.check("zz", at("10.0.0.1:4000"), false).unwrap_err();
        assert_eq!(
            unknown.message().replace("zz", "a1"),
            jobs.check("a1", at("10.0.0.1:4001"), false).unwrap_err().message()
        );
        assert!(jobs.check("a1", at("10.0.0.1:4001"), true).is_ok());
        assert!(jobs.check("a1", at("10.0.0.2:4000"), true).is_err());
        assert!(jobs.check("a1", None, true).is_err());
    }

    #[tokio::test]
    async fn job_ids_are_random_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        let mut ones = 0u32;
        for _ in 0..4096 {
            let id = RandomJobIds.next_id().await;
            assert_eq!(id.len(), 32, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{id}");
            ones += u128::from_str_radix(&id, 16).unwrap().count_ones();
            assert!(seen.insert(id), "an id came twice");
        }
        // Half the 4096 x 128 bits set, within 1% (the sum's deviation is 362 bits).
        let half = 4096 * 64;
        assert!(ones.abs_diff(half) < half / 100, "{ones} bits set of {}", 2 * half);
    }

    #[test]
    fn the_table_forgets_the_oldest_jobs_past_its_size() {
        let jobs = Jobs::default();
        for i in 0..MAX_JOBS + 10 {
            jobs.made(&format!("j{i}"), at("10.0.0.1:4000"));
        }
        assert!(jobs.check("j0", at("10.0.0.1:4000"), false).is_err());
        assert!(jobs.check(&format!("j{}", MAX_JOBS + 9), at("10.0.0.1:4000"), false).is_ok());
        let t = jobs.0.lock().unwrap();
        assert_eq!((t.owners.len(), t.order.len()), (MAX_JOBS, MAX_JOBS));
    }
}

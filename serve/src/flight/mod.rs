//! `dlframe serve`'s Flight SQL service and what keeps it safe to expose: the read-only rule
//! and the limits on a query's shape (`guard`), the threads whose stacks planning runs on
//! (`planning`), the bounds on running queries (`run`), the runtimes they run on (`threads`)
//! and the pace of each of their operators (`paced`), the functions exposed and the constants
//! a plan may build (`functions`), the bounds on each call's result (`bounded`, `growth`), the
//! prepared statements and their parameters (`prepared`), the token (`auth`), the connections
//! (`conn`) and the calls open on each (`calls`), and the errors clients read (`error`). The
//! service (`service`) answers the catalog calls through `catalog` and writes and reads its
//! tickets through `ticket`.

pub(crate) mod auth;
pub(crate) mod bounded;
pub(crate) mod calls;
pub(crate) mod catalog;
pub(crate) mod conn;
pub(crate) mod error;
pub(crate) mod functions;
pub(crate) mod growth;
pub(crate) mod guard;
pub(crate) mod paced;
pub(crate) mod planning;
pub(crate) mod prepared;
pub(crate) mod run;
pub(crate) mod service;
pub(crate) mod threads;
pub(crate) mod ticket;

//! `dlframe serve`'s Flight SQL service and what keeps it safe to expose: the read-only rule
//! and the limits on a query's shape (`guard`), the threads whose stacks planning runs on
//! (`planning`), the bounds on running queries (`run`) and on
//! the functions that build large values from small inputs (`bounded`), the prepared
//! statements and their parameters (`prepared`), the token (`auth`), the connections
//! (`conn`), and the errors clients read (`error`).

pub(crate) mod auth;
pub(crate) mod bounded;
pub(crate) mod conn;
pub(crate) mod error;
pub(crate) mod guard;
pub(crate) mod planning;
pub(crate) mod prepared;
pub(crate) mod run;
pub(crate) mod service;

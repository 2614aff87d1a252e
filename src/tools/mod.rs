//! Tools behind the `tools` cargo feature: `seatgate bench` and private
//! redis-server processes and clusters for the benchmark and the tests. A
//! The history checker (`history`) runs seatgate's real processes under
//! faults and checks what they did against a model. A
//! library user does not get them (nor hdrhistogram and tempfile) by default.

pub mod bench;
pub mod history;
pub mod local_redis;

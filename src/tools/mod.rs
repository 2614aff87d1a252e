//! Tools behind the `tools` cargo feature: `seatgate bench` and private
//! redis-server processes and clusters for the benchmark and the tests. A
//! library user does not get them (nor hdrhistogram and tempfile) by default.

pub mod bench;
pub mod local_redis;

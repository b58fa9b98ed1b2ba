//! The replicated store mode (issue 17): several `stowage serve` replicas on a real etcd and a real
//! S3-compatible object store (Garage), behind a real TCP load balancer (haproxy), all started on
//! 127.0.0.1 by these tests. `scripts/test.sh` installs etcd and haproxy and builds Garage; a
//! missing one fails the tests, never skips them.
//!
//! The long load tests (`failover_under_load`, `rolling_restart_under_load`) take minutes; their
//! client count and duration come from `STOWAGE_FAILOVER_CLIENTS`, `STOWAGE_FAILOVER_SECS` and
//! `STOWAGE_ROLLING_SECS`.

mod api;
mod cluster;
mod etcd;
mod garage;
mod haproxy;
mod load;
mod load_check;
mod load_watch;
mod process;
mod retry;
mod scenario;

mod compacted;
mod events_sweep;
mod failover;
mod gc_race;
mod handover;
mod observability;
mod pieces;
mod registry_view;
mod rolling;
mod smoke;
mod watch_resume;

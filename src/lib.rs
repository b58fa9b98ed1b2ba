//! Stowage: a Kubernetes aggregated API server that stores unpacked bundle content in an embedded,
//! compressed, content-addressed store and serves it through the Kubernetes API.
//!
//! Data flows one way: request → [`auth`] → [`apiserver`] → [`storage`]; [`unpack`] turns untrusted
//! archives into validated file trees written through the same storage interface.
//! See `ARCHITECTURE.md` for the code map and invariants.

pub mod api;
pub mod apiserver;
pub mod auth;
pub mod certs;
pub mod client;
#[doc(hidden)]
pub mod fuzzing;
pub mod plugin;
pub mod serve;
pub mod storage;
pub mod unpack;

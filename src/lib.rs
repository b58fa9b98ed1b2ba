//! Stowage: a Kubernetes aggregated API server that stores unpacked bundle content in an embedded,
//! compressed, content-addressed store and serves it through the Kubernetes API.
//!
//! Rust clients (provisioners, controllers) depend on the two small crates this one re-exports,
//! not on the server:
//! - [`api`] (crate `stowage-api`): the typed model — `Bundle`, `BundleContent`, their spec and
//!   status — implementing `kube::Resource`, so `kube::Api::<Bundle>::namespaced(client, ns)`
//!   works as for any kind;
//! - [`client`] (crate `stowage-client`): fetching a Bundle's content into a directory (resumable
//!   `Range` pieces, verified against its digest) and pushing a directory or archive into an
//!   upload Bundle.
//!
//! Everything else is the server itself (`stowage serve`, the `kubectl stowage` plugin): public
//! only so the binaries, the tests and the fuzz targets reach it, hidden from the docs, no stable
//! interface.
//! Data flows one way: request → `auth` → `apiserver` → `storage`; `unpack` writes through the
//! same storage interface, and every layer reads objects through [`api`]. See `ARCHITECTURE.md`.

pub use stowage_api as api;
pub use stowage_client as client;

#[doc(hidden)]
pub mod apiserver;
#[doc(hidden)]
pub mod auth;
#[doc(hidden)]
pub mod certs;
#[doc(hidden)]
pub mod events;
#[doc(hidden)]
pub mod fuzzing;
#[doc(hidden)]
pub mod plugin;
#[doc(hidden)]
pub mod serve;
#[doc(hidden)]
pub mod storage;
#[doc(hidden)]
pub mod strategy;
#[doc(hidden)]
pub mod unpack;

//! Black-box conformance tests for `stowage serve`.
//!
//! Every test starts its own server (the binary Cargo built for this package) in its own
//! temporary data directory and talks to it only the way users do: kubectl and HTTPS with the
//! admin client certificate the server generated. Nothing is shared between tests.
//!
//! Needs `kubectl` on PATH; a missing tool fails the tests, it never skips them. The bundles they
//! use are generated (`fixtures/`, from a fixed seed); `STOWAGE_CORPUS=DIR` runs them on a corpus
//! of real bundles of the same layout instead.

// A test fails by panicking: unwrap, expect, panic and indexing are how these tests assert.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod fault_ops;
mod fixtures;
#[path = "fixtures/tests.rs"]
mod fixtures_tests;
mod git_server;
mod harness;
mod hostile_http;
mod http_server;
mod load_workers;
mod raw_client;
mod registry;
mod store_check;
mod stub_apiserver;
mod tarutil;
mod tmpfs;

mod api;
mod apply;
mod auth;
mod bad_input;
mod big;
mod chunked_upload;
mod content;
mod crash;
mod delegated_auth;
mod delegated_server;
mod deploy;
mod deploy_overlays;
mod discovery;
mod early_refusals;
mod events;
mod faults;
mod fidelity;
mod full_disk;
mod git_limits;
mod health;
mod hostile_params;
mod hostile_registry;
mod http2_abuse;
mod idle_connections;
mod image;
mod impersonation;
mod kube_client;
mod kubectl;
mod kubectl_auth;
mod kubectl_conventions;
mod lifecycle;
mod load;
mod logs;
mod many_files;
mod metrics;
mod oci_clients;
mod oci_view;
mod paging;
mod pinned;
mod plain_messages;
mod plugin;
mod plugin_completion;
mod provisioner;
mod range;
mod readme;
mod resume;
mod rollback;
mod slow_clients;
mod source_git;
mod source_http;
mod source_image;
mod source_trust;
mod source_versions;
mod unpack;
mod unpack_image;
mod upload_expansion;
mod upload_spec_change;
mod watch;

mod replicated;

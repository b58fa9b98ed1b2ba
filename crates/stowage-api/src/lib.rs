//! The typed API model of `content.stowage.dev/v1alpha1`, shared by the stowage server, its
//! unpacker and every Rust client, as kube-rs shares `kube-core`: [`Bundle`] and [`BundleContent`]
//! with their spec, status and conditions, sources and the pins they resolve to, defaults and
//! validation (field-path [`Cause`]s), and the name, label and duration rules.
//!
//! Both kinds implement `kube_core::Resource`, so a provisioner writes
//! `kube::Api::<Bundle>::namespaced(client, ns)`. The crate depends on serde, k8s-openapi and
//! kube-core only (plus chrono for timestamps and node-semver for version ranges); it picks neither
//! a k8s-openapi version feature nor a TLS provider, so it adds nothing to a client's choices. How
//! the server stores, prints and defaults each kind is the server's (its `strategy` module).

/// `kube_core::Resource` for a namespaced kind of this group with `KIND` and `PLURAL` consts and a
/// `metadata` field: what `kube::Api::<T>` needs.
macro_rules! namespaced_resource {
    ($kind:ty) => {
        impl kube_core::Resource for $kind {
            type DynamicType = ();
            type Scope = kube_core::NamespaceResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$kind>::KIND)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($crate::GROUP)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($crate::VERSION)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed(<$kind>::PLURAL)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
use namespaced_resource;

mod bundle;
mod cause;
mod content;
pub mod event;
pub mod meta;
pub mod schema;
mod source;
mod status;
pub mod versions;

pub use bundle::{Bundle, BundleSpec, Format, DEFAULT_HISTORY_LIMIT, FORMATS, MIN_POLL_INTERVAL, REFRESH_ANNOTATION};
pub use cause::Cause;
pub use content::{content_name, BundleContent, BundleContentSpec, BUNDLE_LABEL};
pub use source::{
    GitRef, GitSource, HttpSource, ImageSource, Releases, ResolvedSource, Source, UploadSource, SOURCE_KINDS,
};
pub use status::{
    AvailableVersions, BundleStatus, Condition, FormatDetails, Served, AVAILABLE, PAUSED, REVISION_NOT_FOUND,
    UNFINISHED_REASONS, UNPACKED,
};

pub const GROUP: &str = "content.stowage.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "content.stowage.dev/v1alpha1";

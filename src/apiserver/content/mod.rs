//! The `content` subresource: upload (PUT on bundles) and download (GET on bundles and
//! bundlecontents) of a revision — the whole deterministic tar, one file, a subtree, or a JSON
//! listing — with ETags and byte ranges, streamed both ways.

mod download;
mod upload;

pub use download::get_content;
pub use upload::put_bundle_content;

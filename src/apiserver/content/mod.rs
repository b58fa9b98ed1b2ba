//! The `content` subresource: upload (PUT on bundles) and download (GET on bundles and
//! bundlecontents) of a revision — the whole deterministic tar, one file, a subtree, or a JSON
//! listing — with ETags and byte ranges, streamed both ways — and chunked, resumable uploads
//! (POST/PATCH/PUT/DELETE with `?uploads` / `?upload=ID`), ingested as their pieces arrive
//! ([`upload`]).

pub(crate) mod download;
pub mod stream;
pub mod upload;

pub use download::get_content;
pub(crate) use upload::piece as content_range_piece;
pub use upload::{delete_bundle_content, patch_bundle_content, post_bundle_content, put_bundle_content};

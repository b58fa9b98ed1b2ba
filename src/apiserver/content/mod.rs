//! The `content` subresource: upload (PUT on bundles) and download (GET on bundles and
//! bundlecontents) of a revision — the whole deterministic tar, one file, a subtree, or a JSON
//! listing — with ETags and byte ranges, streamed both ways — and chunked, resumable uploads
//! (POST/PATCH/PUT/DELETE with `?uploads` / `?upload=ID`, see [`upload_session`]), in the
//! embedded store ingested as their pieces arrive ([`upload_early`]).

mod download;
pub mod stream;
mod upload;
pub mod upload_early;
mod upload_session;
mod upload_shared;
pub mod upload_spool;

pub use download::get_content;
pub use upload::put_bundle_content;
pub(crate) use upload_session::piece as content_range_piece;
pub use upload_session::{delete_bundle_content, patch_bundle_content, post_bundle_content};

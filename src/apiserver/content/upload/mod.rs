//! Uploads of content, in three layers, each using only the ones below it: [`ingest`] (an archive
//! into a committed revision), [`early`] and [`session`] (a chunked upload's session: its pieces,
//! its ingest while they arrive, its commit), and [`routes`] (the handlers).

mod early;
mod ingest;
mod routes;
mod session;

pub use early::EarlyIngests;
pub use routes::{
    delete_bundle_content, patch_bundle_content, post_bundle_content, put_bundle_content, session_status,
};
pub(crate) use session::piece;
pub use session::UPLOAD_PARAM;

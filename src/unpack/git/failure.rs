//! What a failed git request means for a Bundle, read in one place from gix's typed errors (the
//! HTTP status reqwest kept, gix-transport's authentication marker, gix's error classes) rather
//! than from their text.

use gix::error::Class;

/// How a failed gix request is reported and retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GitFailure {
    /// HTTP 404: the repository does not exist; waits for a spec change or the next poll.
    NotFound,
    /// HTTP 401/403 or credentials refused: waits for a spec change or the next poll.
    Denied,
    /// gix refused to hold a git object in memory (a resource limit).
    TooLarge,
    /// Anything else: retried.
    Other,
}

pub(super) fn classify(err: &gix::Error) -> GitFailure {
    if let Some(status) = err.downcast_any_ref::<reqwest::Error>().and_then(reqwest::Error::status) {
        match status.as_u16() {
            404 => return GitFailure::NotFound,
            401 | 403 => return GitFailure::Denied,
            _ => {}
        }
    }
    if err.downcast_any_ref::<gix::protocol::transport::client::AuthenticationRequired>().is_some() {
        return GitFailure::Denied;
    }
    if err.classify().is_resource_exhausted() {
        GitFailure::TooLarge
    } else if err.classify().any(|c| matches!(c.class(), Class::Unauthenticated)) {
        GitFailure::Denied
    } else {
        GitFailure::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gix::error::ResourceExhaustionKind;

    /// A failed response as gix-transport's reqwest backend reports it: the reqwest error, with its
    /// status, inside an I/O error.
    fn http(status: u16) -> gix::Error {
        let response = http::Response::builder().status(status).body(Vec::<u8>::new()).unwrap();
        let error = reqwest::Response::from(response).error_for_status().unwrap_err();
        gix::Error::from_error(std::io::Error::other(gix::Error::from_error(error)))
    }

    #[test]
    fn a_missing_repository_is_not_found() {
        assert_eq!(classify(&http(404)), GitFailure::NotFound);
    }

    #[test]
    fn refused_credentials_are_denied() {
        assert_eq!(classify(&http(401)), GitFailure::Denied);
        assert_eq!(classify(&http(403)), GitFailure::Denied);
        let required = gix::protocol::transport::client::AuthenticationRequired::default();
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, required);
        assert_eq!(classify(&gix::Error::from_error(io)), GitFailure::Denied);
    }

    #[test]
    fn an_object_over_the_memory_limit_is_too_large() {
        let limit = gix::error::resource_exhaustion(ResourceExhaustionKind::AllocationLimit, "Entry too large");
        assert_eq!(classify(&gix::Error::from_error(std::io::Error::other(limit))), GitFailure::TooLarge);
    }

    #[test]
    fn server_errors_and_the_rest_are_retried() {
        assert_eq!(classify(&http(500)), GitFailure::Other);
        assert_eq!(classify(&http(429)), GitFailure::Other);
        assert_eq!(classify(&gix::Error::from_error(std::io::Error::other("connection reset"))), GitFailure::Other);
    }
}

//! Reading one blob from a blocking thread: the check that the bytes are exactly the ones the
//! descriptor names (sha256 and size), computed as they flow (the stream is read ahead by
//! [`SourceContext::read_ahead`](crate::unpack::source::SourceContext::read_ahead)).

use std::io::{self, Read};

use sha2::{Digest, Sha256};

use crate::unpack::error::UnpackError;

/// Hashes and counts the raw bytes of a blob. Reads stop one byte past the expected size (a
/// registry sending more than it should cannot make us read forever); at the end of the stream
/// a wrong size or digest becomes [`UnpackError::DigestMismatch`], so an archive reader on top
/// fails with it instead of finishing.
pub struct VerifyingReader<R> {
    inner: io::Take<R>,
    what: String,
    expected_digest: String,
    expected_size: u64,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> VerifyingReader<R> {
    /// `expected_digest` is `sha256:<hex>` (checked by the caller); `what` names the blob in errors.
    pub fn new(inner: R, what: String, expected_digest: String, expected_size: u64) -> Self {
        VerifyingReader {
            inner: inner.take(expected_size.saturating_add(1)),
            what,
            expected_digest,
            expected_size,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    /// Reads whatever the consumer left unread and checks size and digest.
    pub fn finish(mut self) -> Result<(), UnpackError> {
        io::copy(&mut self, &mut io::sink()).map_err(|e| UnpackError::from_io(&self.what, e))?;
        self.check()
    }

    /// After the consumer gave up: reads at most `max` more bytes and returns the digest or size
    /// mismatch if the blob ended by then and was not the expected one.
    pub fn mismatch_within(mut self, max: u64) -> Option<UnpackError> {
        let mut rest = (&mut self).take(max);
        match io::copy(&mut rest, &mut io::sink()) {
            Ok(n) if n < max => self.check().err(),
            Err(e) => {
                Some(UnpackError::from_io(&self.what, e)).filter(|e| matches!(e, UnpackError::DigestMismatch { .. }))
            }
            Ok(_) => None,
        }
    }

    fn check(&self) -> Result<(), UnpackError> {
        let actual = format!("sha256:{}", hex::encode(self.hasher.clone().finalize()));
        if self.read != self.expected_size {
            let got = if self.read > self.expected_size { "more".to_owned() } else { self.read.to_string() };
            return Err(UnpackError::DigestMismatch {
                what: self.what.clone(),
                expected: format!("{} ({} bytes)", self.expected_digest, self.expected_size),
                actual: format!("{got} bytes"),
            });
        }
        if actual != self.expected_digest {
            return Err(UnpackError::DigestMismatch {
                what: self.what.clone(),
                expected: self.expected_digest.clone(),
                actual,
            });
        }
        Ok(())
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            // oci-client verifies too and fails the stream's last read on a mismatch: report it
            // as ours, with the same meaning.
            Err(e) if e.get_ref().is_some_and(|i| i.is::<oci_client::errors::DigestError>()) => {
                let actual = match e.into_inner().map(|i| i.downcast::<oci_client::errors::DigestError>()) {
                    Some(Ok(d)) => match *d {
                        oci_client::errors::DigestError::VerificationError { actual, .. } => actual,
                        other => other.to_string(),
                    },
                    _ => "a different digest".to_owned(),
                };
                let (what, expected) = (self.what.clone(), self.expected_digest.clone());
                return Err(UnpackError::DigestMismatch { what, expected, actual }.into_io());
            }
            Err(e) => return Err(e),
        };
        if let Some(data) = buf.get(..n) {
            self.hasher.update(data);
        }
        self.read = self.read.saturating_add(n as u64);
        if n == 0 || self.read > self.expected_size {
            self.check().map_err(UnpackError::into_io)?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(data: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(data)))
    }

    #[test]
    fn accepts_the_exact_bytes() {
        let data = b"hello blob";
        let mut r = VerifyingReader::new(&data[..], "b".into(), digest(data), data.len() as u64);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        r.finish().unwrap();
    }

    #[test]
    fn rejects_other_bytes_short_and_long_blobs() {
        let data = b"hello blob";
        let cases: [(&[u8], u64); 3] = [(b"hellO blob", 10), (b"hello", 10), (b"hello blob and more", 10)];
        for (body, size) in cases {
            let mut r = VerifyingReader::new(body, "b".into(), digest(data), size);
            let err = io::copy(&mut r, &mut io::sink()).unwrap_err();
            let err = UnpackError::from_io("b", err);
            assert!(matches!(err, UnpackError::DigestMismatch { .. }), "{err:?}");
        }
        let r = VerifyingReader::new(&b"hello"[..], "b".into(), digest(data), 10);
        assert!(matches!(r.finish(), Err(UnpackError::DigestMismatch { .. })));
    }
}

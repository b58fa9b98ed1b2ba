//! gix's http transport (its blocking reqwest client) with every response body counted.
//!
//! Before the pack, a git server sends its refs (the advertisement, `ls-refs`) and negotiation
//! answers, which gix keeps in memory as they arrive: a server streaming an endless list of refs
//! would grow it without end. So a response may carry at most [`MAX_LISTING_BYTES`] until pack
//! bytes flow; the pack itself is metered by [`super::meter::Meter`] (`--max-git-fetch-bytes`).
//!
//! The extra CAs of `--source-ca-file` reach gix's reqwest client through its backend options
//! (`configure_client`), set on the options gix hands the transport before connecting.

use std::any::Any;
use std::io::{self, BufRead, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use gix::remote::Direction;
use gix_transport::client::blocking_io::http::reqwest::{Options as ReqwestOptions, Remote};
use gix_transport::client::blocking_io::http::{GetResponse, Http, Options, PostBodyDataKind, PostResponse, Transport};

/// Bytes one response may carry before the pack: refs and negotiation. Protocol v2 lists only
/// the refs asked for; a v0 server advertising a hundred thousand refs sends some 7 MiB.
pub const MAX_LISTING_BYTES: u64 = 32 << 20;

/// What the transport and the fetch's meter share.
#[derive(Default)]
pub(super) struct Listing {
    /// Set by the meter once pack bytes flow: from then on, the meter bounds the response.
    pub pack_started: AtomicBool,
    /// Set when a response passed [`MAX_LISTING_BYTES`] before the pack.
    pub too_large: AtomicBool,
}

/// The http transport for `remote`, its responses counted against `listing`, trusting `roots`
/// besides the system's certificate authorities.
pub(super) fn connect<'a, 'repo>(
    remote: &'a gix::Remote<'repo>,
    listing: Arc<Listing>,
    roots: Vec<reqwest::Certificate>,
) -> gix::Result<gix::remote::Connection<'a, 'static, 'repo, Transport<Counting>>> {
    let (url, version) = remote.sanitized_url_and_version(Direction::Fetch)?;
    let http = Counting { inner: Remote::default(), listing, roots };
    Ok(remote.to_connection_with_transport(Transport::new_http(http, url, version, false)))
}

pub(super) struct Counting {
    inner: Remote,
    listing: Arc<Listing>,
    roots: Vec<reqwest::Certificate>,
}

impl Counting {
    fn count<B>(&self, body: B) -> Counted<B> {
        Counted { inner: body, read: 0, listing: self.listing.clone() }
    }
}

impl Http for Counting {
    type Headers = <Remote as Http>::Headers;
    type ResponseBody = Counted<<Remote as Http>::ResponseBody>;
    type PostBody = <Remote as Http>::PostBody;

    fn get(
        &mut self,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> gix::Result<GetResponse<Self::Headers, Self::ResponseBody>> {
        let GetResponse { headers, body } = self.inner.get(url, base_url, headers)?;
        Ok(GetResponse { headers, body: self.count(body) })
    }

    fn post(
        &mut self,
        url: &str,
        base_url: &str,
        headers: impl IntoIterator<Item = impl AsRef<str>>,
        body: PostBodyDataKind,
    ) -> gix::Result<PostResponse<Self::Headers, Self::ResponseBody, Self::PostBody>> {
        let PostResponse { post_body, headers, body } = self.inner.post(url, base_url, headers, body)?;
        Ok(PostResponse { post_body, headers, body: self.count(body) })
    }

    fn configure(&mut self, config: &dyn Any) -> gix::Result {
        let Some(options) = config.downcast_ref::<Options>() else {
            return self.inner.configure(config);
        };
        if self.roots.is_empty() {
            return self.inner.configure(options);
        }
        let roots = self.roots.clone();
        let backend = ReqwestOptions {
            configure_client: Some(Box::new(move |builder| Ok(builder.tls_certs_merge(roots.clone())))),
            configure_request: None,
        };
        let mut options = options.clone();
        options.backend = Some(Arc::new(Mutex::new(backend)));
        self.inner.configure(&options)
    }

    fn redirected_base_url(&self) -> Option<String> {
        self.inner.redirected_base_url()
    }
}

/// A response body that fails once it passes the listing bound before the pack started.
pub(super) struct Counted<B> {
    inner: B,
    read: u64,
    listing: Arc<Listing>,
}

impl<B> Counted<B> {
    fn check(&self) -> io::Result<()> {
        if self.read > MAX_LISTING_BYTES && !self.listing.pack_started.load(Ordering::Relaxed) {
            self.listing.too_large.store(true, Ordering::Relaxed);
            return Err(io::Error::other(format!("the server sent more than {MAX_LISTING_BYTES} bytes before a pack")));
        }
        Ok(())
    }
}

impl<B: Read> Read for Counted<B> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        let n = self.inner.read(buf)?;
        self.read = self.read.saturating_add(n as u64);
        Ok(n)
    }
}

impl<B: BufRead> BufRead for Counted<B> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.check()?;
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
        self.read = self.read.saturating_add(amount as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_stops_at_the_bound_unless_the_pack_started() {
        let listing = Arc::new(Listing::default());
        let endless = || io::BufReader::new(io::repeat(b'r'));
        let mut refs = Counted { inner: endless(), read: 0, listing: listing.clone() };
        let err = io::copy(&mut refs, &mut io::sink()).unwrap_err();
        assert!(err.to_string().contains("before a pack") && listing.too_large.load(Ordering::Relaxed), "{err}");
        assert!(refs.read <= MAX_LISTING_BYTES + (64 << 10), "{}", refs.read);

        let listing = Arc::new(Listing::default());
        listing.pack_started.store(true, Ordering::Relaxed);
        let mut pack = Counted { inner: endless().take(MAX_LISTING_BYTES * 2), read: 0, listing };
        assert_eq!(io::copy(&mut pack, &mut io::sink()).unwrap(), MAX_LISTING_BYTES * 2);
    }
}

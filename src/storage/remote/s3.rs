//! Blocks in S3-compatible object storage: each block is one object `blocks/<id>`, written whole
//! (the same record a pack file holds: header, directory, payload) and never changed. A PUT that
//! returned is durable, so there is nothing to sync.
//!
//! Deleting is the collector's: it only ever deletes blocks older than the grace period
//! ([`super::RemoteOptions::block_grace`]), because another replica may have written a block whose
//! chunks it has not indexed yet; writers index within a fraction of that period or give up.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::metrics::op;
use super::{remote_error, DiskBlocks, Remote, RemoteOptions};
use crate::storage::packs::{encode_record, scan_records, BlockAt, Member, ScannedBlock};
use crate::storage::{Result, StorageError};

pub(super) fn connect(options: &RemoteOptions) -> Result<Arc<dyn ObjectStore>> {
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&options.s3_bucket)
        .with_region(&options.s3_region)
        .with_virtual_hosted_style_request(!options.s3_path_style);
    if let Some(endpoint) = &options.s3_endpoint {
        builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
    }
    if let (Some(id), Some(secret)) = (&options.s3_access_key_id, &options.s3_secret_access_key) {
        builder = builder.with_access_key_id(id).with_secret_access_key(secret);
    }
    let store = builder.build().map_err(|e| remote_error("object storage configuration", e))?;
    Ok(Arc::new(store))
}

/// The blocks of a replicated store.
pub struct S3Blocks {
    remote: Arc<Remote>,
    /// Blocks read before, on this replica's disk.
    cache: Option<DiskBlocks>,
}

fn block_path(id: u64) -> Path {
    Path::from(format!("blocks/{id:016x}"))
}

fn parse_block_path(path: &Path) -> Option<u64> {
    u64::from_str_radix(path.filename()?, 16).ok()
}

impl S3Blocks {
    /// The bucket's blocks, with hot ones kept in `cache_dir` (up to `--block-cache-bytes`).
    pub fn new(remote: Arc<Remote>, cache_dir: &std::path::Path) -> S3Blocks {
        let cache = DiskBlocks::open(cache_dir, remote.options.block_cache_bytes, remote.metrics().clone());
        S3Blocks { remote, cache }
    }

    /// The grace period: see the module doc.
    pub fn grace(&self) -> Duration {
        self.remote.options.block_grace
    }

    /// Writes a block as a new object; returns once it is durable.
    pub fn append(&self, codec: u8, raw_len: u32, members: &[Member], payload: &[u8]) -> Result<BlockAt> {
        let (record, payload_offset) = encode_record(codec, raw_len, members, payload)?;
        // Random ids: replicas never coordinate to name a block.
        let id = uuid::Uuid::new_v4().as_u64_pair().0;
        let s3 = self.remote.s3.clone();
        let path = block_path(id);
        self.remote
            .block_on(
                self.remote
                    .metrics()
                    .object_storage(op::PUT, async move { s3.put(&path, PutPayload::from(Bytes::from(record))).await }),
            )
            .map_err(|e| remote_error("writing a block to object storage", e))?;
        let at = BlockAt { pack: id, payload_offset, stored_len: payload.len() as u32, codec, raw_len };
        // Written through: what a replica just stored is what it is likeliest to be asked for
        // next (an upload's first downloads), so that read costs no bucket round trip.
        if let Some(cache) = &self.cache {
            cache.put(&at, payload);
        }
        Ok(at)
    }

    pub fn read_payload(&self, at: &BlockAt) -> Result<Vec<u8>> {
        if let Some(payload) = self.cache.as_ref().and_then(|cache| cache.get(at)) {
            return Ok(payload);
        }
        let s3 = self.remote.s3.clone();
        let path = block_path(at.pack);
        let range = at.payload_offset..at.payload_offset + at.stored_len as u64;
        let get = async move { s3.get_range(&path, range).await };
        let bytes = self.remote.block_on(self.remote.metrics().object_storage(op::GET, get)).map_err(|e| match e {
            object_store::Error::NotFound { .. } => {
                StorageError::Corrupt(format!("block {:016x} is missing from object storage", at.pack))
            }
            other => remote_error("reading a block from object storage", other),
        })?;
        if bytes.len() != at.stored_len as usize {
            return Err(StorageError::Corrupt(format!("block {:016x}: short read", at.pack)));
        }
        if let Some(cache) = &self.cache {
            cache.put(at, &bytes);
        }
        Ok(bytes.to_vec())
    }

    /// Blocks older than the grace period (the only ones collection may touch).
    pub fn list(&self) -> Result<Vec<u64>> {
        let s3 = self.remote.s3.clone();
        let grace = self.grace();
        // The whole listing (every page of it) is one measurement.
        self.remote.block_on(self.remote.metrics().object_storage(op::LIST, async move {
            let mut ids = Vec::new();
            let mut listing = s3.list(Some(&Path::from("blocks")));
            let now = SystemTime::now();
            while let Some(meta) = listing.next().await {
                let meta = meta.map_err(|e| remote_error("listing blocks in object storage", e))?;
                let age = now.duration_since(SystemTime::from(meta.last_modified)).unwrap_or_default();
                if age >= grace {
                    ids.extend(parse_block_path(&meta.location));
                }
            }
            Ok(ids)
        }))
    }

    pub fn size(&self, id: u64) -> Result<u64> {
        let s3 = self.remote.s3.clone();
        let path = block_path(id);
        let meta = self
            .remote
            .block_on(self.remote.metrics().object_storage(op::HEAD, async move { s3.head(&path).await }))
            .map_err(|e| remote_error("reading a block's size in object storage", e))?;
        Ok(meta.size)
    }

    pub fn scan(&self, id: u64, visit: impl FnMut(ScannedBlock) -> Result<()>) -> Result<()> {
        let s3 = self.remote.s3.clone();
        let path = block_path(id);
        let bytes = self
            .remote
            .block_on(self.remote.metrics().object_storage(op::GET, async move { s3.get(&path).await?.bytes().await }))
            .map_err(|e| remote_error("reading a block from object storage", e))?;
        scan_records(id, &mut std::io::Cursor::new(bytes), visit)
    }

    pub fn remove(&self, id: u64) -> Result<()> {
        if let Some(cache) = &self.cache {
            cache.forget_block(id);
        }
        let s3 = self.remote.s3.clone();
        let path = block_path(id);
        match self
            .remote
            .block_on(self.remote.metrics().object_storage(op::DELETE, async move { s3.delete(&path).await }))
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error("deleting a block in object storage", e)),
        }
    }
}

//! Upload sessions remembered across runs, so a push that was interrupted (Ctrl-C, a lost
//! connection, a killed process) takes up where it stopped when run again with the same content:
//! one small JSON file per (server, namespace, Bundle, archive: [`crate::client::Archive::identity`]) under
//! `$XDG_STATE_HOME/stowage/uploads` (default `~/.local/state/stowage/uploads`, else the temporary
//! directory). Best effort: a file that cannot be read or written only means starting afresh.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What identifies an upload worth resuming.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub server: String,
    pub namespace: String,
    pub name: String,
    /// [`crate::client::Archive::identity`].
    pub archive: String,
}

#[derive(Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    key: Key,
    #[serde(rename = "uploadID")]
    upload_id: String,
}

pub struct Sessions {
    dir: PathBuf,
}

impl Sessions {
    pub fn new() -> Sessions {
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".local/state"))
            })
            .unwrap_or_else(std::env::temp_dir);
        Sessions { dir: state.join("stowage").join("uploads") }
    }

    fn path(&self, key: &Key) -> PathBuf {
        let mut sha = Sha256::new();
        for part in [&key.server, &key.namespace, &key.name, &key.archive] {
            sha.update(part.as_bytes());
            sha.update([0]);
        }
        self.dir.join(format!("{}.json", hex::encode(sha.finalize().get(..16).unwrap_or_default())))
    }

    /// The session an earlier push of the same archive to the same Bundle started.
    pub fn recall(&self, key: &Key) -> Option<String> {
        let text = std::fs::read(self.path(key)).ok()?;
        let record: Record = serde_json::from_slice(&text).ok()?;
        (record.key == *key).then_some(record.upload_id)
    }

    pub fn remember(&self, key: &Key, upload_id: &str) {
        let record = Record { key: key.clone(), upload_id: upload_id.to_string() };
        let (path, staged) = (self.path(key), self.dir.join(format!(".{}.tmp", uuid::Uuid::new_v4())));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(&staged, serde_json::to_vec(&record).unwrap_or_default()))
            .and_then(|()| std::fs::rename(&staged, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&staged);
            tracing::warn!(path = %path.display(), error = %e, "cannot remember the upload session");
        }
    }

    pub fn forget(&self, key: &Key) {
        let _ = std::fs::remove_file(self.path(key));
    }
}

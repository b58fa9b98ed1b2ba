//! Re-reading the policy file when it changes.
//!
//! [`PolicyWatcher`] holds the current [`Policy`] behind an `RwLock<Arc<Policy>>`: a request clones the
//! `Arc` (or authorizes under the read lock, which only a swap ever waits for) and a reload swaps in a
//! whole new policy, so a request sees either the old or the new file, never a mix. A change is noticed
//! from the file's size, modification and change times, inode and device (so both in-place writes and
//! atomic renames, e.g. a ConfigMap volume's symlink swap, count). A file that cannot be read or
//! parsed keeps the previous policy and logs the error once per change; the service never falls back
//! to allow-all or deny-all.

use std::fs::Metadata;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use super::{Policy, PolicyError};
use crate::auth::attributes::{Attributes, Decision};

/// How often [`PolicyWatcher::spawn`]'s task looks at the file by default.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// What one look at the file did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// The file is as it was when last read (or last found unreadable).
    Unchanged,
    /// The file changed and its new policy is now in force.
    Reloaded,
    /// The file cannot be read, or changed and cannot be parsed: the previous policy stays in force.
    Failed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    device: u64,
    changed: (i64, i64),
}

impl Fingerprint {
    fn of(metadata: &Metadata) -> Self {
        #[cfg(unix)]
        let (inode, device, changed) = {
            use std::os::unix::fs::MetadataExt;
            (metadata.ino(), metadata.dev(), (metadata.ctime(), metadata.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (inode, device, changed) = (0, 0, (0, 0));
        Fingerprint { len: metadata.len(), modified: metadata.modified().ok(), inode, device, changed }
    }
}

/// What the last look found: the file's fingerprint, or `None` when it could not be examined.
type Seen = Option<Fingerprint>;

#[derive(Debug)]
struct Shared {
    path: PathBuf,
    current: RwLock<Arc<Policy>>,
    seen: Mutex<Seen>,
}

/// The policy of a file, kept current. Dropping the watcher stops its polling task.
#[derive(Debug)]
pub struct PolicyWatcher {
    inner: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PolicyWatcher {
    /// Loads the policy file without polling it (see [`Self::reload_if_changed`]). An error here is
    /// final: there is no previous policy to keep.
    pub fn load(path: impl Into<PathBuf>) -> Result<Self, PolicyError> {
        let path = path.into();
        let seen = std::fs::metadata(&path).ok().map(|m| Fingerprint::of(&m));
        let policy = Policy::load(&path)?;
        tracing::info!(path = %path.display(), "authorization policy loaded: {}", policy.stats());
        let shared = Shared { path, current: RwLock::new(Arc::new(policy)), seen: Mutex::new(seen) };
        Ok(PolicyWatcher { inner: Arc::new(shared), task: None })
    }

    /// Loads the policy file and starts a task on the current tokio runtime that looks at it every
    /// `interval` ([`POLL_INTERVAL`] is the usual choice).
    pub fn spawn(path: impl Into<PathBuf>, interval: Duration) -> Result<Self, PolicyError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| PolicyError::NoRuntime)?;
        let mut watcher = Self::load(path)?;
        let weak = Arc::downgrade(&watcher.inner);
        watcher.task = Some(runtime.spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(shared) = weak.upgrade() else { break };
                if let Err(e) = tokio::task::spawn_blocking(move || shared.reload_if_changed()).await {
                    tracing::error!(error = %e, "authorization policy reload task failed");
                }
            }
        }));
        Ok(watcher)
    }

    /// The file being watched.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.inner.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// [`Policy::authorize`] with the policy in force.
    pub fn authorize(&self, attributes: &Attributes) -> Decision {
        self.inner.current.read().unwrap_or_else(PoisonError::into_inner).authorize(attributes)
    }

    /// Looks at the file now and reloads it if it changed since it was last looked at.
    pub fn reload_if_changed(&self) -> ReloadOutcome {
        self.inner.reload_if_changed()
    }
}

impl Drop for PolicyWatcher {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Shared {
    fn reload_if_changed(&self) -> ReloadOutcome {
        // Held throughout, so that two looks never reload concurrently.
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let path = self.path.display();
        let now = match std::fs::metadata(&self.path) {
            Ok(metadata) => Some(Fingerprint::of(&metadata)),
            Err(e) => {
                if seen.is_some() {
                    tracing::error!(path = %path, error = %e, "authorization policy file unreadable; keeping the previous policy");
                }
                *seen = None;
                return ReloadOutcome::Failed;
            }
        };
        if now == *seen {
            return ReloadOutcome::Unchanged;
        }
        // Remember the fingerprint taken before reading: a write racing the read is seen next time.
        *seen = now;
        match Policy::load(&self.path) {
            Ok(policy) => {
                tracing::info!(path = %path, "authorization policy reloaded: {}", policy.stats());
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                tracing::error!(path = %path, error = %e, "authorization policy not reloaded; keeping the previous policy");
                ReloadOutcome::Failed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::UserInfo;

    const READERS: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules: [{apiGroups: [\"\"], resources: [pods], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects: [{kind: User, name: alice}]
";

    fn get_pods(user: &str) -> Attributes {
        let user = UserInfo { name: user.into(), ..UserInfo::default() };
        let r = crate::auth::attributes::ResourceAttributes {
            verb: "get".into(),
            resource: "pods".into(),
            ..Default::default()
        };
        Attributes::resource(user, r)
    }

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn reload_picks_up_changes_and_keeps_the_last_good_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        write(&path, READERS);
        let watcher = PolicyWatcher::load(&path).unwrap();
        assert!(watcher.authorize(&get_pods("alice")).is_allowed());
        assert!(!watcher.authorize(&get_pods("bob")).is_allowed());
        assert_eq!(watcher.reload_if_changed(), ReloadOutcome::Unchanged);

        write(&path, &READERS.replace("name: alice", "name: bob"));
        assert_eq!(watcher.reload_if_changed(), ReloadOutcome::Reloaded);
        assert!(!watcher.authorize(&get_pods("alice")).is_allowed());
        assert!(watcher.authorize(&get_pods("bob")).is_allowed());

        write(&path, "kind: [this is not\n");
        assert_eq!(watcher.reload_if_changed(), ReloadOutcome::Failed);
        assert_eq!(watcher.reload_if_changed(), ReloadOutcome::Unchanged);
        assert!(watcher.authorize(&get_pods("bob")).is_allowed());

        std::fs::remove_file(&path).unwrap();
        assert_eq!(watcher.reload_if_changed(), ReloadOutcome::Failed);
        assert!(watcher.authorize(&get_pods("bob")).is_allowed());

        // An atomic replace, as a ConfigMap volume does it.
        let staged = dir.path().join("staged.yaml");
        write(&staged, &READERS.replace("name: alice", "name: carol"));
        std::fs::rename(&staged, &path).unwrap();
        assert_eq!(watcher.reload_if_changed(), ReloadOutcome::Reloaded);
        assert!(watcher.authorize(&get_pods("carol")).is_allowed());
        assert_eq!(watcher.policy().stats().cluster_role_bindings, 1);
    }

    #[test]
    fn initial_load_errors_are_final() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        assert!(matches!(PolicyWatcher::load(&path), Err(PolicyError::Io { .. })));
        write(&path, "apiVersion: v1\nkind: Pod\n");
        let message = PolicyWatcher::load(&path).unwrap_err().to_string();
        assert!(message.contains("document 1: unsupported kind \"Pod\""), "{message}");
        // Printed with its causes (`{:#}`, as the command line does), the problem appears once.
        write(&path, "kind: [\n");
        let message = format!("{:#}", anyhow::Error::from(PolicyWatcher::load(&path).unwrap_err()));
        assert_eq!(message.matches("did not find expected").count(), 1, "{message}");
        assert!(matches!(PolicyWatcher::spawn(&path, POLL_INTERVAL), Err(PolicyError::NoRuntime)));
    }

    #[tokio::test]
    async fn the_polling_task_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        write(&path, READERS);
        let watcher = PolicyWatcher::spawn(&path, Duration::from_millis(20)).unwrap();
        write(&path, &READERS.replace("name: alice", "name: dave"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !watcher.authorize(&get_pods("dave")).is_allowed() {
            assert!(tokio::time::Instant::now() < deadline, "the policy was not reloaded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!watcher.authorize(&get_pods("alice")).is_allowed());
    }
}

//! The standalone certificates survive a power cut right after they were written (the server
//! hands them out from then on): written by rename, they are only durable once their directory is
//! synced, and so is the directory's own entry.

use std::path::Path;

use crate::trace::Trace;

const FILES: [&str; 6] = ["ca.crt", "ca.key", "serving.crt", "serving.key", "admin.crt", "admin.key"];

/// The child: writes the certificates into the traced root.
pub fn run(root: &Path) {
    stowage::auth::pki::ensure_standalone(root).unwrap();
}

pub fn suite(work: &Path, shim: &Path) -> bool {
    let (dir, ok) = crate::traced_child(work, shim, "pki", 0, None);
    assert!(ok, "pki_power_cut: the traced child failed");
    let trace = Trace::read(&dir.join("trace.bin"));
    // Cut right after the last operation, with synced data only and strict directories.
    let state = dir.join("crash");
    trace.materialize(trace.ops.len(), None, &|_| false, &state);
    let mut lost = Vec::new();
    for name in FILES {
        let written = std::fs::read(dir.join("root/pki").join(name)).unwrap();
        if std::fs::read(state.join("pki").join(name)).ok() != Some(written) {
            lost.push(name);
        }
    }
    if lost.is_empty() {
        println!("pki_power_cut: ok");
        true
    } else {
        println!("pki_power_cut: FAILED: after a power cut these files are gone or differ: {lost:?}");
        false
    }
}

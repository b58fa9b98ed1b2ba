//! The deterministic tar format every revision is served as.
//!
//! The same entry list always yields the same bytes: sorted paths (by the store: a directory, whose
//! path ends with `/`, comes right before its contents), ustar headers with fixed metadata
//! (uid/gid 0, mtime 0, no user names), the entry's permission bits (0777 for symlinks), and PAX
//! extended headers only where ustar cannot hold a path, link target or size. Because each header's
//! length is a pure function of the entry, the store can compute every entry's offset at commit
//! time and serve any byte range without materialising the archive.

/// Size of a tar block; headers and data are padded to it.
pub const BLOCK: u64 = 512;
/// The end-of-archive marker: two zero blocks.
pub const TRAILER_LEN: u64 = 2 * BLOCK;

/// Largest size a ustar size field (11 octal digits) can hold.
const USTAR_MAX_SIZE: u64 = 0o77777777777;

/// What a tar header needs to know about an entry.
pub struct HeaderSpec<'a> {
    /// A directory's ends with `/` (added if missing).
    pub path: &'a str,
    pub kind: Kind<'a>,
    /// Permission bits (masked to 0o777; ignored for symlinks, which are 0777).
    pub mode: u32,
}

/// The type of a tar entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind<'a> {
    File {
        size: u64,
    },
    /// A symbolic link to the target.
    Symlink(&'a str),
    Directory,
}

/// Bytes of data plus padding to the next block boundary.
pub fn padded(len: u64) -> u64 {
    len.div_ceil(BLOCK) * BLOCK
}

/// The header bytes (optional PAX header + ustar header) that precede an entry's data.
pub fn header_bytes(spec: &HeaderSpec<'_>) -> Vec<u8> {
    let mut pax = Vec::new();
    let path = match spec.kind {
        Kind::Directory if !spec.path.ends_with('/') => std::borrow::Cow::Owned(format!("{}/", spec.path)),
        _ => std::borrow::Cow::Borrowed(spec.path),
    };
    let (prefix, name) = match split_ustar_path(path.as_bytes()) {
        Some(split) => split,
        None => {
            pax_record(&mut pax, "path", &path);
            (&b""[..], truncate(path.as_bytes(), 100))
        }
    };
    let link = match spec.kind {
        Kind::Symlink(target) => target,
        Kind::File { .. } | Kind::Directory => "",
    };
    if link.len() > 100 {
        pax_record(&mut pax, "linkpath", link);
    }
    let size = match spec.kind {
        Kind::File { size } => size,
        Kind::Symlink(_) | Kind::Directory => 0,
    };
    if size > USTAR_MAX_SIZE {
        pax_record(&mut pax, "size", &size.to_string());
    }

    let mut out = Vec::with_capacity(if pax.is_empty() { 512 } else { 1536 + pax.len() });
    if !pax.is_empty() {
        let pax_len = pax.len() as u64;
        out.extend_from_slice(&ustar_block(b"", b"PaxHeader", 0o644, pax_len, b'x', b""));
        out.extend_from_slice(&pax);
        out.resize(out.len() + (padded(pax_len) - pax_len) as usize, 0);
    }
    let (mode, kind) = match spec.kind {
        Kind::File { .. } => (spec.mode & 0o777, b'0'),
        Kind::Symlink(_) => (0o777, b'2'),
        Kind::Directory => (spec.mode & 0o777, b'5'),
    };
    let size_field = if size > USTAR_MAX_SIZE { 0 } else { size };
    out.extend_from_slice(&ustar_block(prefix, name, mode, size_field, kind, truncate(link.as_bytes(), 100)));
    out
}

/// Length of `header_bytes(spec)` without building it twice in hot loops.
pub fn header_len(spec: &HeaderSpec<'_>) -> u64 {
    header_bytes(spec).len() as u64
}

/// Splits a path into ustar `prefix` (≤155) and `name` (≤100) fields, if it fits.
fn split_ustar_path(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.len() <= 100 {
        return Some((b"", path));
    }
    // Split at the last '/' that leaves a name of at most 100 bytes and a prefix of at most 155.
    path.iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'/')
        .filter_map(|(i, _)| Some((path.get(..i)?, path.get(i + 1..)?)))
        .find(|(prefix, name)| prefix.len() <= 155 && name.len() <= 100 && !name.is_empty())
}

fn truncate(bytes: &[u8], max: usize) -> &[u8] {
    bytes.get(..max).unwrap_or(bytes)
}

/// Appends one PAX record: "LEN key=value\n", where LEN counts the whole record including itself.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &str) {
    let body = key.len() + value.len() + 3; // ' ' + '=' + '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(format!("{len} {key}={value}\n").as_bytes());
}

fn ustar_block(prefix: &[u8], name: &[u8], mode: u32, size: u64, kind: u8, link: &[u8]) -> [u8; 512] {
    let mut h = [0u8; 512];
    put(&mut h, 0, name, 100);
    octal(&mut h, 100, 8, mode as u64);
    octal(&mut h, 108, 8, 0); // uid
    octal(&mut h, 116, 8, 0); // gid
    octal(&mut h, 124, 12, size);
    octal(&mut h, 136, 12, 0); // mtime
    put(&mut h, 156, &[kind], 1);
    put(&mut h, 157, link, 100);
    put(&mut h, 257, b"ustar\0", 6);
    put(&mut h, 263, b"00", 2);
    put(&mut h, 345, prefix, 155);
    // The checksum is computed with its own field set to spaces.
    put(&mut h, 148, b"        ", 8);
    let sum: u32 = h.iter().map(|b| *b as u32).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes(), 8);
    h
}

/// Copies `bytes` (at most `width` of them) into the header field at `at`. Callers pass what fits
/// (`split_ustar` and the PAX fallback check the lengths); `get_mut` keeps this free of panics.
fn put(header: &mut [u8; 512], at: usize, bytes: &[u8], width: usize) {
    let bytes = truncate(bytes, width);
    if let Some(field) = header.get_mut(at..at + bytes.len()) {
        field.copy_from_slice(bytes);
    }
}

/// Writes `value` as zero-padded octal digits followed by a NUL into the `len`-byte field at `at`.
fn octal(header: &mut [u8; 512], at: usize, len: usize, value: u64) {
    let width = len - 1;
    let digits = format!("{value:0width$o}");
    let digits = digits.as_bytes();
    let start = digits.len().saturating_sub(width);
    put(header, at, digits.get(start..).unwrap_or_default(), width);
    put(header, at + width, &[0], 1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn archive(entries: &[(HeaderSpec<'_>, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (spec, data) in entries {
            out.extend(header_bytes(spec));
            out.extend_from_slice(data);
            out.resize(out.len() + (padded(data.len() as u64) - data.len() as u64) as usize, 0);
        }
        out.resize(out.len() + TRAILER_LEN as usize, 0);
        out
    }

    #[test]
    fn readers_see_paths_modes_links_and_data() {
        let long = format!("{}/{}", "d".repeat(150), "f".repeat(120));
        let long_dir = format!("{}/{}/", "d".repeat(150), "e".repeat(99));
        let tar = archive(&[
            (HeaderSpec { path: "a/b.yaml", kind: Kind::File { size: 5 }, mode: 0o644 }, b"hello"),
            (HeaderSpec { path: "bin/run", kind: Kind::File { size: 2 }, mode: 0o755 }, b"#!"),
            (HeaderSpec { path: &long, kind: Kind::File { size: 1 }, mode: 0o600 }, b"x"),
            (HeaderSpec { path: "l", kind: Kind::Symlink("a/b.yaml"), mode: 0o644 }, b""),
            (HeaderSpec { path: "charts/", kind: Kind::Directory, mode: 0o700 }, b""),
            (HeaderSpec { path: &long_dir, kind: Kind::Directory, mode: 0o4755 }, b""),
        ]);
        let mut seen = Vec::new();
        let mut ar = tar::Archive::new(&tar[..]);
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mode = e.header().mode().unwrap();
            let link = e.link_name().unwrap().map(|l| l.to_string_lossy().into_owned());
            let kind = e.header().entry_type();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            seen.push((path, mode, link, data, kind));
        }
        assert_eq!(seen[0], ("a/b.yaml".into(), 0o644, None, b"hello".to_vec(), tar::EntryType::Regular));
        assert_eq!(seen[1].1, 0o755);
        assert_eq!((seen[2].0.as_str(), seen[2].1), (long.as_str(), 0o600));
        assert_eq!((seen[3].1, seen[3].2.as_deref()), (0o777, Some("a/b.yaml")));
        assert_eq!(seen[4], ("charts/".into(), 0o700, None, vec![], tar::EntryType::Directory));
        // A long directory path keeps its slash (ustar prefix + name); setuid is never kept.
        assert_eq!((seen[5].0.as_str(), seen[5].1, seen[5].4), (long_dir.as_str(), 0o755, tar::EntryType::Directory));
    }

    #[test]
    fn pax_record_length_counts_itself() {
        let mut out = Vec::new();
        pax_record(&mut out, "path", &"p".repeat(95));
        let text = String::from_utf8(out).unwrap();
        let (len, _) = text.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), text.len());
    }

    #[test]
    fn header_is_deterministic_and_block_aligned() {
        let spec = HeaderSpec { path: &"x/".repeat(200), kind: Kind::File { size: 9 }, mode: 0o644 };
        assert_eq!(header_bytes(&spec), header_bytes(&spec));
        assert_eq!(header_len(&spec) % BLOCK, 0);
    }
}

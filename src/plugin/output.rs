//! What the plugin prints: lines on stdout that end quietly when the reader goes away (`| head`),
//! listings as kubectl prints tables (or `-o json`, `-o name`), and failures as kubectl prints
//! them — `Error from server (Reason): message` for a refusal, `error: …` for anything else — once.

use std::io::Write;

use crate::client::{chain, ClientError, FileList};

/// `ls -o`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The `BundleContentFileList` object, as the server sends it.
    Json,
    /// One path per line.
    Name,
}

/// An error followed by a line of advice.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Hinted {
    pub error: ClientError,
    pub hint: String,
}

/// Writes `lines` to stdout. A closed pipe ends the output without an error: the reader has all
/// it wanted (`println!` would panic).
pub fn print_lines(lines: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = lines.into_iter().try_for_each(|line| writeln!(out, "{line}")).and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the output"))
        }
        _ => Ok(()),
    }
}

/// `ls`: a table with a header (MODE SIZE SHA256 PATH; a directory has no hash, a symlink shows its
/// target), or the listing as JSON, or the paths.
pub fn print_listing(list: &FileList, format: Option<Format>) -> anyhow::Result<()> {
    match format {
        Some(Format::Json) => {
            let text = serde_json::to_string_pretty(list)?;
            print_lines([text])
        }
        Some(Format::Name) => print_lines(list.files.iter().map(|f| f.path.clone())),
        None => {
            let rows = list.files.iter().map(|f| {
                let link = f.target.as_ref().map(|t| format!(" -> {t}")).unwrap_or_default();
                let short: String = match f.kind.as_str() {
                    "directory" => "-".into(),
                    _ => f.sha256.chars().take(12).collect(),
                };
                [format!("{:o}", f.mode), f.size.to_string(), short, format!("{}{link}", f.path)]
            });
            let header = ["MODE", "SIZE", "SHA256", "PATH"].map(String::from);
            print_lines(table(std::iter::once(header).chain(rows).collect()))
        }
    }
}

/// kubectl's table layout: left-aligned columns three spaces apart, the last one unpadded.
fn table<const N: usize>(rows: Vec<[String; N]>) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
                match i + 1 == N {
                    true => line.push_str(cell),
                    false => line.push_str(&format!("{cell:<width$}   ")),
                }
            }
            line
        })
        .collect()
}

/// Prints a failure on stderr the way kubectl does. Best effort: a closed stderr is not a panic.
pub fn print_error(error: &anyhow::Error) {
    let _ = writeln!(std::io::stderr(), "{}", error_text(error));
}

fn error_text(error: &anyhow::Error) -> String {
    if let Some(hinted) = error.downcast_ref::<Hinted>() {
        return format!("{}\n{}", client_error_text(&hinted.error), hinted.hint);
    }
    // A refusal from the server reads as kubectl prints it, whatever context was added to it.
    match error.chain().find_map(|e| e.downcast_ref::<ClientError>()).filter(|e| e.status().is_some()) {
        Some(refusal) => refusal.to_string(),
        None => format!("error: {}", chain(error.as_ref())),
    }
}

fn client_error_text(error: &ClientError) -> String {
    match error.status() {
        Some(_) => error.to_string(),
        None => format!("error: {}", chain(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let rows = vec![["MODE", "PATH"].map(String::from), ["644", "a"].map(String::from)];
        assert_eq!(table(rows), vec!["MODE   PATH", "644    a"]);
    }

    #[test]
    fn a_refusal_is_printed_as_kubectl_prints_it_once() {
        let status = kube::core::Status::failure("bundles.content.stowage.dev \"x\" not found", "NotFound");
        let error = anyhow::Error::new(ClientError::from(kube::Error::Api(Box::new(status.with_code(404)))));
        let text = error_text(&error.context("pushing"));
        assert_eq!(text, "Error from server (NotFound): bundles.content.stowage.dev \"x\" not found");
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let error = anyhow::Error::new(ClientError::Io { path: "x".into(), source: io });
        assert_eq!(error_text(&error), "error: x: No such file or directory");
    }
}

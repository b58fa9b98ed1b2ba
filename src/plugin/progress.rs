//! Progress bars (bytes, rate, ETA; `indicatif`) on stderr, drawn only when stderr is a terminal:
//! piped or redirected output gets nothing but the result line.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::client::Transferred;

const KNOWN: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}";
const UNKNOWN: &str = "{msg} {bytes} {bytes_per_sec}";

pub struct Bar(ProgressBar);

impl Bar {
    /// A bar labelled `message`, of `total` bytes when known.
    pub fn new(message: &str, total: Option<u64>) -> Bar {
        let target = match std::io::stderr().is_terminal() {
            true => ProgressDrawTarget::stderr(),
            false => ProgressDrawTarget::hidden(),
        };
        let bar = ProgressBar::with_draw_target(total, target);
        bar.set_style(style(total.is_some()));
        bar.set_message(message.to_string());
        Bar(bar)
    }

    /// Starts from `done` bytes already there (a resumed push): the rate counts only what moves now.
    pub fn start_at(&self, done: u64) {
        self.0.set_position(done);
        self.0.reset_eta();
        self.0.reset_elapsed();
    }

    pub fn update(&self, moved: Transferred) {
        if let Some(total) = moved.total.filter(|t| self.0.length() != Some(*t)) {
            self.0.set_length(total);
            self.0.set_style(style(true));
        }
        self.0.set_position(moved.done);
    }

    pub fn set_message(&self, message: &str) {
        self.0.set_message(message.to_string());
    }

    /// Leaves the last state on screen (a failure keeps where it stopped).
    pub fn finish(&self, succeeded: bool) {
        match succeeded {
            true => self.0.finish(),
            false => self.0.abandon(),
        }
    }
}

fn style(known_total: bool) -> ProgressStyle {
    let template = if known_total { KNOWN } else { UNKNOWN };
    ProgressStyle::with_template(template)
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

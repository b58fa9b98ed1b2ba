//! Static bearer tokens (`--token-auth-file`), in kube-apiserver's format: one
//! `token,user,uid,"group1,group2"` record per line (`token_file/csv.rs` has the exact dialect).
//!
//! As in kube-apiserver: the groups column is optional and split on `,`; columns after the fourth are
//! ignored; a record with an empty token is skipped with a warning; a duplicate token is logged and the
//! later record wins. Stricter than kube-apiserver: an empty user name is an error, and empty group
//! names are dropped. Lines starting with `#` are comments.
//!
//! Only the SHA-256 digests of the tokens are kept, and a presented token is looked up by its digest,
//! so no comparison ever runs over secret token bytes (lookup time depends only on the digest of the
//! presented token) and the tokens never sit in memory or in `Debug` output.
//!
//! [`TokenFile::authenticate`] returns the user exactly as the file describes it; like every
//! authenticator, it leaves adding `system:authenticated` to the authentication chain
//! ([`UserInfo::with_authenticated_group`], kube-apiserver's `AuthenticatedGroupAdder`).

mod csv;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::UserInfo;
pub use csv::SyntaxProblem;

/// Why a token file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    // The underlying error is part of the message, not a `source()` a caller would print again;
    // the path is the caller's to name (`reading --token-auth-file PATH: …`).
    #[error("{error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{error}")]
    InFile { path: PathBuf, error: Box<TokenFileError> },
    #[error("line {line}: {problem}")]
    Syntax { line: usize, problem: SyntaxProblem },
}

/// The users of a token file, by token digest.
#[derive(Clone, Default)]
pub struct TokenFile {
    users: HashMap<[u8; 32], UserInfo>,
}

impl fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenFile").field("tokens", &self.users.len()).finish()
    }
}

impl TokenFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| TokenFileError::Io { path: path.to_owned(), error })?;
        Self::parse(&text).map_err(|e| TokenFileError::InFile { path: path.to_owned(), error: Box::new(e) })
    }

    /// Parses the text of a token file.
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let records = csv::records(text).map_err(|(line, problem)| TokenFileError::Syntax { line, problem })?;
        let mut users = HashMap::with_capacity(records.len());
        for record in records {
            let line = record.line;
            let found = record.fields.len();
            let mut fields = record.fields.into_iter();
            let (Some(token), Some(name), Some(uid)) = (fields.next(), fields.next(), fields.next()) else {
                return Err(TokenFileError::Syntax { line, problem: SyntaxProblem::TooFewColumns { found } });
            };
            if token.is_empty() {
                tracing::warn!(line, "token file: empty token, record skipped");
                continue;
            }
            if name.is_empty() {
                return Err(TokenFileError::Syntax { line, problem: SyntaxProblem::EmptyUserName });
            }
            let groups = fields
                .next()
                .map(|g| g.split(',').filter(|g| !g.is_empty()).map(str::to_owned).collect())
                .unwrap_or_default();
            let user = UserInfo { name, uid, groups, ..UserInfo::default() };
            if users.insert(digest(&token), user).is_some() {
                tracing::warn!(line, "token file: duplicate token, this later record replaces the earlier one");
            }
        }
        Ok(TokenFile { users })
    }

    /// The user `token` belongs to, if any (without `system:authenticated`; see the module doc).
    pub fn authenticate(&self, token: &str) -> Option<UserInfo> {
        if token.is_empty() {
            return None;
        }
        self.users.get(&digest(token)).cloned()
    }

    /// How many tokens the file defines.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, uid: &str, groups: &[&str]) -> UserInfo {
        let groups = groups.iter().map(|g| g.to_string()).collect();
        UserInfo { name: name.into(), uid: uid.into(), groups, ..UserInfo::default() }
    }

    fn syntax(text: &str) -> Option<(usize, SyntaxProblem)> {
        match TokenFile::parse(text) {
            Err(TokenFileError::Syntax { line, problem }) => Some((line, problem)),
            _ => None,
        }
    }

    #[test]
    fn parses_users_uids_and_groups() -> Result<(), TokenFileError> {
        let file = TokenFile::parse(
            "# admin first\n\
             s3cret,admin,1,\"system:masters,ops\"\n\
             \n\
             alice-token,alice,2\n\
             \"bob,token\",bob,3,dev,ignored\n\
             carol-token,carol,4,\"\"\n\
             ,nobody,5\n",
        )?;
        assert_eq!(file.len(), 4);
        assert_eq!(file.authenticate("s3cret"), Some(user("admin", "1", &["system:masters", "ops"])));
        assert_eq!(file.authenticate("alice-token"), Some(user("alice", "2", &[])));
        assert_eq!(file.authenticate("bob,token"), Some(user("bob", "3", &["dev"])));
        assert_eq!(file.authenticate("carol-token"), Some(user("carol", "4", &[])));
        assert_eq!(file.authenticate("s3cre"), None);
        assert_eq!(file.authenticate(""), None);
        assert!(!format!("{file:?}").contains("s3cret"));
        Ok(())
    }

    #[test]
    fn duplicate_tokens_last_wins() -> Result<(), TokenFileError> {
        let file = TokenFile::parse("t,first,1\nt,second,2,g\n")?;
        assert_eq!(file.len(), 1);
        assert_eq!(file.authenticate("t"), Some(user("second", "2", &["g"])));
        Ok(())
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(syntax("a,b,c\n# x\nd,e\n"), Some((3, SyntaxProblem::TooFewColumns { found: 2 })));
        assert_eq!(syntax("\njust-a-token\n"), Some((2, SyntaxProblem::TooFewColumns { found: 1 })));
        assert_eq!(syntax("a,b,c\nt,,1\n"), Some((2, SyntaxProblem::EmptyUserName)));
        assert_eq!(syntax("a,b\"c,d,e\n"), Some((1, SyntaxProblem::BareQuote)));
        let message = TokenFile::parse("ok,a,1\nbad\n").unwrap_err().to_string();
        assert_eq!(message, "line 2: expected at least 3 columns (token, user name, user uid), found 1");
    }

    #[test]
    fn load_keeps_the_path_and_says_the_problem_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.csv");
        assert!(matches!(TokenFile::load(&path), Err(TokenFileError::Io { .. })));
        std::fs::write(&path, "t,u,1\n\"x\n").unwrap();
        let error = TokenFile::load(&path).unwrap_err();
        assert!(matches!(&error, TokenFileError::InFile { path: p, .. } if *p == path));
        // Printed with its causes (`{:#}`, as the command line does), the problem appears once.
        let message = format!("{:#}", anyhow::Error::from(error));
        assert_eq!(message, "line 2: quoted field is never closed");
        std::fs::write(&path, "t,u,1\n").unwrap();
        assert_eq!(TokenFile::load(&path).unwrap().authenticate("t").map(|u| u.name).as_deref(), Some("u"));
    }
}

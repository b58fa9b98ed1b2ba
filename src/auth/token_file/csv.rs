//! The CSV dialect of kube-apiserver's token file (Go's `encoding/csv` with variable field counts):
//! fields separated by `,`, a field that starts with `"` is quoted (`""` inside is a quote, and it may
//! span lines), a `"` inside an unquoted field is an error, `\r\n` reads as `\n`. Unlike Go's reader
//! (and as documented for `--token-auth-file`), lines starting with `#` and lines of only whitespace
//! are skipped.

use std::fmt;

/// One record and the line it starts on (1-based).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub line: usize,
    pub fields: Vec<String>,
}

/// What is wrong with the text at a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyntaxProblem {
    BareQuote,
    ExtraneousQuote,
    UnterminatedQuote,
    TooFewColumns { found: usize },
    EmptyUserName,
}

impl fmt::Display for SyntaxProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyntaxProblem::BareQuote => f.write_str("bare \" in a field that is not quoted"),
            SyntaxProblem::ExtraneousQuote => f.write_str("extraneous \" in a quoted field (\"\" writes a quote)"),
            SyntaxProblem::UnterminatedQuote => f.write_str("quoted field is never closed"),
            SyntaxProblem::TooFewColumns { found } => {
                write!(f, "expected at least 3 columns (token, user name, user uid), found {found}")
            }
            SyntaxProblem::EmptyUserName => f.write_str("the user name (second column) is empty"),
        }
    }
}

/// Splits `text` into records; the error carries the line it was found on (for a quote that is never
/// closed, the line its record starts on).
pub(super) fn records(text: &str) -> Result<Vec<Record>, (usize, SyntaxProblem)> {
    let text = text.replace("\r\n", "\n");
    let mut cursor = Cursor { text: &text, pos: 0, line: 1 };
    let mut out = Vec::new();
    while cursor.peek().is_some() {
        let current = cursor.rest_of_line();
        if current.trim().is_empty() || current.starts_with('#') {
            cursor.skip_line();
            continue;
        }
        let line = cursor.line;
        let fields = read_record(&mut cursor).map_err(|problem| match problem {
            SyntaxProblem::UnterminatedQuote => (line, problem),
            problem => (cursor.line, problem),
        })?;
        out.push(Record { line, fields });
    }
    Ok(out)
}

struct Cursor<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<char> {
        self.text.get(self.pos..).and_then(|rest| rest.chars().next())
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn rest_of_line(&self) -> &str {
        let rest = self.text.get(self.pos..).unwrap_or("");
        rest.split('\n').next().unwrap_or("")
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.next() {
            if c == '\n' {
                break;
            }
        }
    }
}

fn read_record(cursor: &mut Cursor<'_>) -> Result<Vec<String>, SyntaxProblem> {
    let mut fields = Vec::new();
    loop {
        let mut field = String::new();
        if cursor.peek() == Some('"') {
            cursor.next();
            loop {
                match cursor.next() {
                    None => return Err(SyntaxProblem::UnterminatedQuote),
                    Some('"') => match cursor.peek() {
                        Some('"') => {
                            cursor.next();
                            field.push('"');
                        }
                        Some(',') => {
                            cursor.next();
                            break;
                        }
                        Some('\n') | None => {
                            cursor.next();
                            fields.push(field);
                            return Ok(fields);
                        }
                        Some(_) => return Err(SyntaxProblem::ExtraneousQuote),
                    },
                    Some(c) => field.push(c),
                }
            }
        } else {
            loop {
                match cursor.next() {
                    None | Some('\n') => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => return Err(SyntaxProblem::BareQuote),
                    Some(c) => field.push(c),
                }
            }
        }
        fields.push(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> Vec<Vec<String>> {
        records(text).unwrap().into_iter().map(|r| r.fields).collect()
    }

    #[test]
    fn quoting_follows_go_encoding_csv() {
        assert_eq!(fields("a,b,c\n"), vec![vec!["a", "b", "c"]]);
        assert_eq!(fields("a,\"b,\"\"x\"\"\",\"\"\r\n"), vec![vec!["a", "b,\"x\"", ""]]);
        assert_eq!(fields("a,\"multi\nline\",c"), vec![vec!["a", "multi\nline", "c"]]);
        assert_eq!(fields("a,b,"), vec![vec!["a", "b", ""]]);
        assert_eq!(fields(" a , b "), vec![vec![" a ", " b "]]);
    }

    #[test]
    fn records_know_their_line_and_skip_comments_and_blanks() {
        let got = records("# c\n\n  \na,b,c\n#x,y\n\"q\n\",b,c\nz,y,x").unwrap();
        let lines: Vec<usize> = got.iter().map(|r| r.line).collect();
        assert_eq!(lines, vec![4, 6, 8]);
    }

    #[test]
    fn quote_errors_name_their_line() {
        assert_eq!(records("ok,a,b\nx\"y,a,b").err(), Some((2, SyntaxProblem::BareQuote)));
        assert_eq!(records("ok,a,b\n\n\"x\"y,a,b").err(), Some((3, SyntaxProblem::ExtraneousQuote)));
        assert_eq!(records("\"open,a,b\nmore").err(), Some((1, SyntaxProblem::UnterminatedQuote)));
        assert_eq!(records(" \"x\",a,b").err(), Some((1, SyntaxProblem::BareQuote)));
    }
}

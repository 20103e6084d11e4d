//! RFC 4180 CSV, read with the `csv` crate: fields separated by commas,
//! records by line ends (`\n`, `\r\n`, or a lone `\r` as in Python's
//! `csv`); a field in double quotes may hold commas, newlines and doubled
//! quotes (`""` for one `"`). The movie-reviews file needs all three. Blank
//! lines are skipped, as Python's `csv.DictReader` (which produced the
//! tests' expected counts) skips them.
//!
//! Two things are added to the crate's reader. It never fails on malformed
//! quoting (it reads `"a"b` as `ab` and runs an unclosed quote to the end of
//! the file; a strict mode is BurntSushi/rust-csv#77, still open), while a
//! stray quote in a file of reviews most likely means a mangled file whose
//! records have shifted: `check_quotes` rejects those first. And the line
//! it gives a record is where the previous record's terminator began, before
//! any blank line or the `\n` of a `\r\n`: `record_line` counts those in.

use csv::{ReaderBuilder, StringRecord};

/// One record and the line it starts on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvRecord {
    /// The line where the record starts.
    pub line: usize,
    /// Its fields, unquoted.
    pub fields: Vec<String>,
}

/// Where in a multi-line record the fault is, when not on its first line.
fn on(line: usize, start: usize) -> String {
    if line == start {
        String::new()
    } else {
        format!(" (on line {line})")
    }
}

/// Parses `text`; an error gives the line where the bad record starts
/// (1-based) and what is wrong.
pub fn parse_csv(text: &str) -> Result<Vec<CsvRecord>, (usize, String)> {
    check_quotes(text)?;
    ReaderBuilder::new()
        .has_headers(false)
        // Records of the wrong length are the caller's to report, by column.
        .flexible(true)
        .from_reader(text.as_bytes())
        .into_records()
        .map(|record| {
            // `text` is UTF-8 in memory and the reader is flexible: nothing
            // is left to fail but the reader's own invariants.
            let record = record.map_err(|e| {
                let line = e.position().map_or(1, |p| p.line() as usize);
                (line, e.to_string())
            })?;
            Ok(CsvRecord {
                line: record_line(text, &record),
                fields: record.iter().map(str::to_string).collect(),
            })
        })
        .collect()
}

/// The line `record` starts on: the reader's line and byte are where the
/// previous record's terminator began, so the `\r`s and `\n`s there (blank
/// lines, the rest of a `\r\n`) are counted in. A record cannot start with
/// either: it would be a terminator.
fn record_line(text: &str, record: &StringRecord) -> usize {
    let position = record.position().expect("the reader sets positions");
    let skipped = text.as_bytes()[position.byte() as usize..]
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .filter(|&&b| b == b'\n')
        .count();
    position.line() as usize + skipped
}

/// Where the scan of [`check_quotes`] is within a field.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    /// Nothing read yet: a quote here opens a quoted field.
    Start,
    /// Inside an unquoted field.
    Bare,
    /// Inside quotes.
    Quoted,
    /// Just after the closing quote: only a comma or a line end may follow.
    Closed,
}

/// The quoting faults RFC 4180 forbids and the `csv` crate reads past: a
/// character after a closing quote, a quote inside an unquoted field, a
/// quoted field never closed. The error gives the line the record starts
/// on, and the fault's own line when that differs.
fn check_quotes(text: &str) -> Result<(), (usize, String)> {
    let (mut line, mut start) = (1, 1);
    let mut field = Field::Start;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        field = match (field, c) {
            (Field::Quoted, '"') if chars.next_if_eq(&'"').is_some() => Field::Quoted,
            (Field::Quoted, '"') => Field::Closed,
            (Field::Quoted, _) => Field::Quoted,
            (_, ',' | '\r' | '\n') => Field::Start,
            (Field::Start, '"') => Field::Quoted,
            (Field::Closed, _) => {
                return Err((
                    start,
                    format!(
                        "{c:?} after a closing quote{} (a field's quotes must enclose all of it)",
                        on(line, start)
                    ),
                ));
            }
            (Field::Bare, '"') => {
                return Err((
                    start,
                    format!("a quote inside an unquoted field{}", on(line, start)),
                ));
            }
            (Field::Start | Field::Bare, _) => Field::Bare,
        };
        if c == '\n' {
            line += 1;
            if field == Field::Start {
                start = line;
            }
        }
    }
    if field == Field::Quoted {
        return Err((start, "a quoted field is never closed".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each record's line number and fields, for comparing with a literal.
    fn lines_and_fields(records: &[CsvRecord]) -> Vec<(usize, Vec<&str>)> {
        records
            .iter()
            .map(|r| (r.line, r.fields.iter().map(String::as_str).collect()))
            .collect()
    }

    #[test]
    fn quotes_commas_and_newlines() {
        let text = "text,label\n\"a, b\",1\r\n\"say \"\"hi\"\"\nthere\",0\nplain,1";
        let records = parse_csv(text).unwrap();
        let got = lines_and_fields(&records);
        assert_eq!(
            got,
            [
                (1, vec!["text", "label"]),
                (2, vec!["a, b", "1"]),
                (3, vec!["say \"hi\"\nthere", "0"]),
                (5, vec!["plain", "1"]),
            ]
        );
        assert_eq!(parse_csv("a,\"b\nc\n").unwrap_err().0, 1);
        assert_eq!(parse_csv("x\n\"b\"c,1\n").unwrap_err().0, 2);
        assert_eq!(parse_csv("x\nab\"c,1\n").unwrap_err().0, 2);
        assert_eq!(parse_csv("a,\"\"\n").unwrap()[0].fields, ["a", ""]);
        // A fault on a record's second line is reported at its first.
        assert_eq!(
            parse_csv("h\n\"a\nb\"c,1\n").unwrap_err(),
            (
                2,
                "'c' after a closing quote (on line 3) (a field's quotes must enclose all of it)"
                    .to_string()
            )
        );
        assert_eq!(
            parse_csv("\"a\nb\",x\"y\n").unwrap_err(),
            (
                1,
                "a quote inside an unquoted field (on line 2)".to_string()
            )
        );
        // A header-only file and an empty one.
        assert_eq!(parse_csv("h1,h2").unwrap()[0].fields, ["h1", "h2"]);
        assert!(parse_csv("").unwrap().is_empty());
    }

    /// Lines counted by hand (blank lines 2 and 4); the `csv` crate alone
    /// reports where the previous record's terminator began.
    #[test]
    fn lines_after_blank_lines_and_crlf() {
        let records = parse_csv("h\n\nx,1\r\n\r\ny\rz\n").unwrap();
        let got = lines_and_fields(&records);
        assert_eq!(
            got,
            [
                (1, vec!["h"]),
                (3, vec!["x", "1"]),
                (5, vec!["y"]),
                (5, vec!["z"]),
            ]
        );
    }
}

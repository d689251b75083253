//! Parquet files (what verl's data preprocessing and Hugging Face `datasets` write), read row by
//! row with the `parquet` crate's record API: each row becomes a JSON object (lists, structs and
//! maps nested as in the file) and goes through the same [`Columns`](super::Columns) mapping as
//! a JSONL line. Snappy and gzip pages are supported.

use crate::{Result, RolloutError};
use parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::{Map, Value};
use std::path::Path;

/// The rows of a Parquet file as JSON objects, with their 1-based numbers.
pub(super) fn rows(path: &Path) -> Result<Vec<(usize, Map<String, Value>)>> {
    let err = |row: usize, msg: String| RolloutError::Dataset {
        path: path.into(),
        line: row,
        msg,
    };
    let file = std::fs::File::open(path).map_err(|e| err(0, format!("cannot read: {e}")))?;
    let reader = SerializedFileReader::new(file).map_err(|e| {
        err(
            0,
            format!("not a readable Parquet file ({e}); write it with pyarrow, pandas or datasets"),
        )
    })?;
    let iter = reader
        .get_row_iter(None)
        .map_err(|e| err(0, format!("cannot read the rows: {e}")))?;
    let mut out = Vec::new();
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|e| {
            err(
                i + 1,
                format!(
                    "row {}: cannot decode ({e}); rlft reads uncompressed, snappy and gzip pages",
                    i + 1
                ),
            )
        })?;
        match row.to_json_value() {
            Value::Object(m) => out.push((i + 1, m)),
            other => return Err(err(i + 1, format!("row {}: not a record: {other}", i + 1))),
        }
    }
    Ok(out)
}

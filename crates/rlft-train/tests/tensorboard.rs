//! TensorBoard event files read back without the writer's code: TFRecord framing and CRC32C
//! checked here, the `Event` protobuf decoded by hand. Every scalar of `metrics.jsonl` is found
//! at its step, once, also after a resume from an earlier checkpoint.

mod common;

use common::root;
use rlft_train::{Recipe, Trainer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn masked(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// The records of a TFRecord file, checking both checksums of each.
fn records(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).unwrap();
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let len = u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
        assert_eq!(u32_at(at + 8), masked(&b[at..at + 8]), "length CRC at {at}");
        let data = &b[at + 12..at + 12 + len];
        assert_eq!(u32_at(at + 12 + len), masked(data), "data CRC at {at}");
        out.push(data.to_vec());
        at += 16 + len;
    }
    out
}

/// Protobuf fields of a message: `(field number, wire type, value)`, the value the varint or
/// fixed bits, or the bytes of a length-delimited field.
enum Field {
    Int(u64),
    Bytes(Vec<u8>),
}

fn varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = b[*at];
        *at += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    v
}

fn fields(b: &[u8]) -> Vec<(u64, Field)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let key = varint(b, &mut at);
        let f = match key & 7 {
            0 => Field::Int(varint(b, &mut at)),
            1 => {
                at += 8;
                Field::Int(u64::from_le_bytes(b[at - 8..at].try_into().unwrap()))
            }
            2 => {
                let len = varint(b, &mut at) as usize;
                at += len;
                Field::Bytes(b[at - len..at].to_vec())
            }
            5 => {
                at += 4;
                Field::Int(u32::from_le_bytes(b[at - 4..at].try_into().unwrap()) as u64)
            }
            w => panic!("wire type {w}"),
        };
        out.push((key >> 3, f));
    }
    out
}

/// `(step, tag, scalar)` of every simple value in an event file; histogram tags with `None`.
fn scalars(path: &Path) -> Vec<(i64, String, Option<f32>)> {
    let mut out = Vec::new();
    for r in records(path) {
        let event = fields(&r);
        let step = event
            .iter()
            .find_map(|(n, f)| match (n, f) {
                (2, Field::Int(s)) => Some(*s as i64),
                _ => None,
            })
            .unwrap_or(0);
        for (n, f) in &event {
            let (5, Field::Bytes(summary)) = (n, f) else {
                continue;
            };
            for (n, f) in fields(summary) {
                let (1, Field::Bytes(value)) = (n, f) else {
                    continue;
                };
                let mut tag = String::new();
                let mut simple = None;
                for (n, f) in fields(&value) {
                    match (n, f) {
                        (1, Field::Bytes(t)) => tag = String::from_utf8(t).unwrap(),
                        (2, Field::Int(bits)) => simple = Some(f32::from_bits(bits as u32)),
                        _ => {}
                    }
                }
                out.push((step, tag, simple));
            }
        }
    }
    out
}

fn tb_files(run: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(run.join("tensorboard"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("tfevents"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_scalar_once_at_its_step_also_after_a_resume() {
    let run = std::env::temp_dir().join(format!("rlft-tb-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    let mut sets = common::tiny_lagged_run(&run, 4);
    sets.extend([
        "eval.every=2".into(),
        "checkpoint.every=2".into(),
        "checkpoint.keep=3".into(),
        "logging.tensorboard=true".into(),
    ]);
    let recipe = || Recipe::load(&root().join("recipes/quickstart.toml"), &sets).unwrap();
    Trainer::new(recipe(), None).unwrap().run(None).unwrap();
    assert_eq!(tb_files(&run).len(), 1);
    // Resume from the step-2 checkpoint: steps 3 and 4 are computed again.
    Trainer::new(recipe(), Some(&run.join("step-2")))
        .unwrap()
        .run(None)
        .unwrap();
    let files = tb_files(&run);
    assert_eq!(files.len(), 2, "a resumed run writes a new event file");
    let mut seen: BTreeMap<(i64, String), f32> = BTreeMap::new();
    let mut histograms = 0;
    for f in &files {
        for (step, tag, v) in scalars(f) {
            match v {
                Some(v) => {
                    let dup = seen.insert((step, tag.clone()), v);
                    assert!(dup.is_none(), "{tag} at step {step} written twice");
                }
                None => histograms += 1,
            }
        }
    }
    assert!(histograms > 0, "staleness / ratio histograms");
    let metrics = rlft_train::metrics::read_metrics(&run.join("metrics.jsonl")).unwrap();
    let steps: Vec<i64> = metrics
        .iter()
        .map(|m| m["step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2, 3, 4]);
    let mut n = 0;
    for m in &metrics {
        let step = m["step"].as_i64().unwrap();
        for (k, v) in m {
            let (Value::Number(x), true) = (v, k != "step") else {
                continue;
            };
            let got = seen.remove(&(step, k.clone()));
            assert_eq!(got, Some(x.as_f64().unwrap() as f32), "{k} at step {step}");
            n += 1;
        }
    }
    assert!(n > 100, "{n} scalars");
    assert!(
        seen.is_empty(),
        "scalars not in metrics.jsonl: {:?}",
        seen.keys().take(5).collect::<Vec<_>>()
    );
    std::fs::remove_dir_all(&run).ok();
}

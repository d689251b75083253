//! `report.html`: one self-contained page per run (summary table, every picture inlined as a
//! PNG data URI, the recipe) that opens offline and can be mailed as one file.

use crate::Result;
use crate::metrics::{read_metrics, summary_rows};
use base64::Engine;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// HTML-escapes text.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes `run/report.html` from the run's metrics, the PNG files among `pictures` (the
/// stale-samples lecture's figures first, then the metric curves) and `run/recipe.toml`; returns its path.
pub fn write_report(run: &Path, pictures: &[PathBuf]) -> Result<PathBuf> {
    let rows = read_metrics(&run.join("metrics.jsonl"))?;
    let recipe = std::fs::read_to_string(run.join("recipe.toml")).unwrap_or_default();
    let steps = rows
        .iter()
        .filter_map(|m| m.get("step")?.as_u64())
        .max()
        .unwrap_or(0);
    let seconds: f64 = rows
        .iter()
        .filter_map(|m| m.get("time/step_s")?.as_f64())
        .sum();
    let name = run
        .file_name()
        .map_or_else(|| run.display().to_string(), |n| n.to_string_lossy().into());
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>rlft run {n}</title><style>\
         body{{font-family:sans-serif;margin:2em;max-width:1200px}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 10px;\
         text-align:right}}th:first-child,td:first-child{{text-align:left}}\
         figure{{display:inline-block;margin:8px}}img{{max-width:100%}}\
         pre{{background:#f6f6f6;padding:1em;overflow:auto}}</style></head><body>\n\
         <h1>rlft run {n}</h1>\n<p>{steps} RL steps, {seconds:.1} s of steps.</p>\n\
         <h2>Summary</h2>\n<table><tr><th>metric</th><th>first</th><th>last</th><th>max</th></tr>\n",
        n = esc(&name),
    );
    for (k, first, last, max) in summary_rows(&rows) {
        let _ = writeln!(
            html,
            "<tr><td>{k}</td><td>{first:.4}</td><td>{last:.4}</td><td>{max:.4}</td></tr>"
        );
    }
    html.push_str("</table>\n<h2>Pictures</h2>\n");
    let (curves, figures): (Vec<&PathBuf>, Vec<&PathBuf>) = pictures
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .partition(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("plot_"))
        });
    for p in figures.into_iter().chain(curves) {
        let bytes = std::fs::read(p).map_err(crate::io_err(p))?;
        let stem = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let _ = writeln!(
            html,
            "<figure><img alt=\"{a}\" src=\"data:image/png;base64,{b}\"><figcaption>{a}\
             </figcaption></figure>",
            a = esc(&stem),
            b = base64::engine::general_purpose::STANDARD.encode(bytes),
        );
    }
    let _ = write!(
        html,
        "<h2>Recipe</h2>\n<pre>{}</pre>\n</body></html>\n",
        esc(&recipe)
    );
    let path = run.join("report.html");
    crate::write_atomic(&path, html.as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_markup() {
        assert_eq!(
            super::esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
